"""``EoBacklogTrigger`` against the real Kafka and offset store, its ``run()`` (and the triggerer's shared stream)
driven by asyncio in the test: one event per backlog, held until a batch commits past it; no event while the store
does not answer, one when it does; two watchers of one pipeline, one poll."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from airflow.triggers.shared_stream import SharedStreamManager

from airflow_eo.core.batch import BatchSummary
from airflow_eo.core.ranges import OffsetRange
from airflow_eo.hooks.offset_store import OffsetStoreHook
from airflow_eo.triggers.events import EoBacklogTrigger
from tests.support.kafka import create_topic, produce_json

POLL = 0.3  # seconds between looks: a hold is tested over several of them


@pytest.fixture
def store():
    return OffsetStoreHook().get_store()


@pytest.fixture
def pipeline(bootstrap, topic_name) -> tuple[str, str]:
    create_topic(bootstrap, topic_name, 2)
    return f"events_{uuid.uuid4().hex[:8]}", topic_name


def produce(bootstrap: str, topic: str, n: int) -> None:
    produce_json(bootstrap, topic, [{"i": i} for i in range(n)])


async def collect(events: AsyncIterator[Any], into: asyncio.Queue) -> None:
    async for event in events:
        await into.put(event.payload)


async def none_within(queue: asyncio.Queue, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        event = await asyncio.wait_for(queue.get(), seconds)
        pytest.fail(f"an event the trigger should have held: {event}")


async def within(queue: asyncio.Queue, seconds: float = 60.0) -> dict[str, Any]:
    return dict(await asyncio.wait_for(queue.get(), seconds))


def test_fires_once_per_backlog_and_again_only_after_a_commit_past_it(bootstrap, store, pipeline):
    pipeline_id, topic = pipeline
    trigger = EoBacklogTrigger(pipeline_id, [topic], min_records=5, poll_interval=POLL, min_interval=600)

    async def scenario() -> None:
        events: asyncio.Queue = asyncio.Queue()
        task = asyncio.create_task(collect(trigger.run(), events))
        try:
            await asyncio.sleep(1)
            await asyncio.to_thread(produce, bootstrap, topic, 4)
            await none_within(events, 2)  # below min_records
            await asyncio.to_thread(produce, bootstrap, topic, 6)
            first = await within(events)
            assert first["pipeline_id"] == pipeline_id and first["reason"] == "backlog" and first["total"] == 10
            await asyncio.to_thread(produce, bootstrap, topic, 10)
            await none_within(events, 3)  # the run is queued: more records, no second event

            # the run plans the 20 records (its batch in flight), more arrive, then it commits
            epoch = await asyncio.to_thread(store.take_pipeline, pipeline_id)
            lso = await asyncio.to_thread(trigger.kafka_hook.get_offset_source().last_stable,
                                          trigger.kafka_hook.get_offset_source().partitions([topic]))
            ranges = [OffsetRange(t, p, 0, end) for (t, p), end in sorted(lso.items())]
            assert sum(r.size for r in ranges) == 20
            batch = await asyncio.to_thread(store.insert_batch, pipeline_id, epoch, "run_1", ranges, [])
            await asyncio.to_thread(produce, bootstrap, topic, 6)
            await none_within(events, 3)  # held: no batch committed since the event
            await asyncio.to_thread(store.commit_batch, batch, epoch, BatchSummary.of(batch, "run_1", epoch))
            second = await within(events)  # committed past the first backlog: the 6 records after it are new
            assert second["reason"] == "backlog" and second["total"] == 6
            await none_within(events, 3)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def forward(listen_port: int, target: tuple[str, int]) -> asyncio.base_events.Server:
    """A TCP forwarder on ``listen_port`` to ``target``: the store answers through it once it listens."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def serve(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*target)
        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    return await asyncio.start_server(serve, "127.0.0.1", listen_port)


def test_a_store_that_does_not_answer_is_retried_never_an_event(bootstrap, mysql_kwargs, pipeline, monkeypatch,
                                                                capsys):
    pipeline_id, topic = pipeline
    port = free_port()  # nothing listens there yet: the store is unreachable
    k = mysql_kwargs
    monkeypatch.setenv("AIRFLOW_CONN_EO_STORE_LATER",
                       f"mysql://{k['user']}:{k['password']}@127.0.0.1:{port}/{k['database']}")
    produce(bootstrap, topic, 7)
    trigger = EoBacklogTrigger(pipeline_id, [topic], min_records=5, poll_interval=POLL,
                               offset_store_conn_id="eo_store_later")

    async def scenario() -> None:
        events: asyncio.Queue = asyncio.Queue()
        task = asyncio.create_task(collect(trigger.run(), events))
        server = None
        try:
            await none_within(events, 5)  # backoff 0.6, 1.2, 2.4 s: three looks failed
            server = await forward(port, (k["host"], int(k["port"])))
            event = await within(events, 90)  # the next look after the backoff answers
            assert event["total"] == 7 and event["reason"] == "backlog"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if server is not None:
                server.close()

    asyncio.run(scenario())
    logged = capsys.readouterr().out  # the trigger's log
    failed = [line for line in logged.splitlines() if "did not answer" in line]
    assert failed and all(pipeline_id in m and "Connection refused" in m and "no event" in m for m in failed), logged
    assert len(failed) <= 5  # backed off: not one failure per poll interval


def test_two_watchers_of_one_pipeline_share_one_poll(bootstrap, pipeline, monkeypatch):
    pipeline_id, topic = pipeline
    looks: list[int] = []  # the poller of each look
    plain_look = EoBacklogTrigger.look

    def counted(self: EoBacklogTrigger) -> Any:
        looks.append(id(self))
        return plain_look(self)

    monkeypatch.setattr(EoBacklogTrigger, "look", counted)
    small = EoBacklogTrigger(pipeline_id, [topic], min_records=3, poll_interval=POLL)
    large = EoBacklogTrigger(pipeline_id, [topic], min_records=8, poll_interval=POLL)
    assert small.serialize() != large.serialize()  # two triggers (two rows) in Airflow's table
    assert small.shared_stream_key() == large.shared_stream_key()

    async def scenario() -> None:
        manager = SharedStreamManager()  # what the triggerer runs the watchers through (Airflow 3.3)
        key = small.shared_stream_key()
        queues: dict[int, asyncio.Queue] = {1: asyncio.Queue(), 2: asyncio.Queue()}
        tasks = [asyncio.create_task(collect(watcher.filter_shared_stream(
                     manager.subscribe(trigger_id=i, trigger=watcher, key=key)), queues[i]))
                 for i, watcher in ((1, small), (2, large))]
        try:
            await asyncio.to_thread(produce, bootstrap, topic, 5)
            assert (await within(queues[1]))["total"] == 5  # its threshold only
            await none_within(queues[2], 2)
            await asyncio.to_thread(produce, bootstrap, topic, 5)
            assert (await within(queues[2]))["total"] == 10
            await none_within(queues[1], 1)  # held: no batch committed
            polled, seconds = len(looks), 3.0
            await asyncio.sleep(seconds)
            assert len(looks) - polled <= seconds / POLL + 2  # one poll for both, not two
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for i in (1, 2):
                await manager.unsubscribe(i, key)

    asyncio.run(scenario())
    assert len(set(looks)) == 1  # one poller made every look
