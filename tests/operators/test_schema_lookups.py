"""A batch's schema-registry look-ups, at the level of our own lookup contract (no registry server runs here: the
registry is a fake of that contract, ``id -> schema text``, ``LookupError`` for an id it does not give): each distinct
id asked once per batch, keys and values alike; an unknown id remembered, with why, for the rest of the batch; no
more ids asked than the limit; a failure that is not about the id fails the batch. And how a registry's HTTP answer
is classified (``kafka/schema_registry.py``)."""

from __future__ import annotations

import pytest

from airflow_eo.kafka.schema_registry import refusal_for_id
from airflow_eo.spark.avro import NOT_SUPPLIED, SchemaLookups


class FakeRegistry:
    """Our lookup contract over a dict; ``refused`` ids raise what the registry client raises for a 4xx about them."""

    def __init__(self, schemas: dict[int, str], refused: dict[int, int]) -> None:
        self.schemas, self.refused = schemas, refused
        self.asked: list[int] = []

    def __call__(self, schema_id: int) -> str | None:
        self.asked.append(schema_id)
        if schema_id in self.refused:
            error = refusal_for_id(schema_id, self.refused[schema_id], "Subject not authorized")
            assert error is not None
            raise error
        return self.schemas.get(schema_id)


def test_each_id_asked_once_per_batch_unknown_ids_remembered_with_why():
    registry = FakeRegistry({1: "s1", 2: "s2"}, refused={7: 403})
    lookups = SchemaLookups(registry)
    found, unknown = lookups.resolve([2, 1, 9, 7, 2, 9])  # the values' ids
    assert found == {1: "s1", 2: "s2"}
    assert unknown == {9: NOT_SUPPLIED, 7: "not in writer_schemas; the schema registry answered HTTP 403 for id 7: "
                                           "Subject not authorized"}
    found, unknown = lookups.resolve([9, 2, 7, 1])  # the keys' ids: answered already, nothing asked again
    assert (found, sorted(unknown)) == ({1: "s1", 2: "s2"}, [7, 9])
    assert sorted(registry.asked) == [1, 2, 7, 9]


def test_no_more_ids_asked_than_the_limit():
    registry = FakeRegistry({i: f"s{i}" for i in range(10)}, refused={})
    lookups = SchemaLookups(registry, limit=3)
    found, unknown = lookups.resolve(range(5))
    assert sorted(found) == [0, 1, 2] and registry.asked == [0, 1, 2] and lookups.remaining == 0
    assert unknown == {3: lookups.not_asked(), 4: lookups.not_asked()}
    assert "more than 3 schema ids" in lookups.not_asked()
    assert lookups.resolve([1, 8]) == ({1: "s1"}, {8: lookups.not_asked()}) and registry.asked == [0, 1, 2]


def test_a_failure_not_about_the_id_fails_the_batch():
    def down(schema_id: int) -> str:
        raise ConnectionError("registry unreachable")

    with pytest.raises(ConnectionError):
        SchemaLookups(down).resolve([1])


@pytest.mark.parametrize(("status", "about_the_id"), [(404, True), (403, True), (422, True), (400, True),
                                                      (401, False), (407, False), (408, False), (429, False),
                                                      (500, False), (503, False), (-1, False)])
def test_registry_answers_about_one_id_are_bad_records_the_rest_fail_the_batch(status, about_the_id):
    refusal = refusal_for_id(5, status, "msg")
    assert (refusal is not None) is about_the_id
    if refusal is not None:
        assert isinstance(refusal, LookupError) and f"HTTP {status} for id 5: msg" in str(refusal)
