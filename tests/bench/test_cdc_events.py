"""The change-data-capture benchmark's synthetic Debezium events (``scripts/bench/cdc.py``): the shape of the recorded
real ones, positions increasing in source order, a delete or an update only of a row that exists, a create only of one
that does not, and a ground truth that is their replay. No stack needed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from airflow_eo.core.changes import postgres_position

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "debezium" / "without_schema"
sys.path.insert(0, str(REPO / "scripts"))

from bench import cdc  # noqa: E402 (scripts/ is not a package of the repository)


def _fields(value: dict) -> tuple[set[str], set[str], set[str]]:
    return set(value), set(value["source"]), set(value["transaction"])


def test_synthetic_events_have_the_recorded_shape_and_replay_into_the_ground_truth():
    records, changes = cdc.change_events(5000, 500, seed=7)
    assert len(records) == changes.events == 5000 and changes.keys == 500
    recorded = {case: json.loads((FIXTURES / f"{case}.json").read_text())["records"][0]
                for case in ("create", "update", "delete")}
    state: dict[int, tuple[str, int]] = {}
    last = b""
    ops = {"c": 0, "u": 0, "d": 0}
    for key, value in records:
        event, key_id = json.loads(value), json.loads(key)["id"]
        op = event["op"]
        ops[op] += 1
        model = recorded[{"c": "create", "u": "update", "d": "delete"}[op]]
        assert json.loads(key).keys() == model["key"].keys()
        assert _fields(event) == _fields(model["value"])
        assert (event["before"] is None, event["after"] is None) == (model["value"]["before"] is None,
                                                                     model["value"]["after"] is None)
        sequence = json.loads(event["source"]["sequence"])
        assert len(sequence) == 2 and sequence[1] == str(event["source"]["lsn"])
        assert event["source"]["sequence"] == json.dumps(sequence, separators=(",", ":"))  # as Debezium spells it
        position = postgres_position(op, event["source"]["lsn"], event["source"]["sequence"])
        assert position > last, "positions increase in source order"
        last = position
        if op == "c":
            assert key_id not in state and event["after"]["id"] == key_id
            state[key_id] = (event["after"]["name"], event["after"]["qty"])
        else:
            assert key_id in state and event["before"] == {"id": key_id, "name": state[key_id][0],
                                                           "qty": state[key_id][1]}
            if op == "d":
                del state[key_id]
            else:
                state[key_id] = (event["after"]["name"], event["after"]["qty"])
    assert state == changes.truth and ops == dict(changes.ops)
    # 70% updates, 10% deletes, the rest creates (the first events can only be creates)
    assert abs(ops["u"] / 5000 - 0.7) < 0.03 and abs(ops["d"] / 5000 - 0.1) < 0.02
    # a deleted key is created again
    created = [json.loads(k)["id"] for k, v in records if json.loads(v)["op"] == "c"]
    assert len(created) > len(set(created))
