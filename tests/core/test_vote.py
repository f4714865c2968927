"""The held write and its vote side by side (core/vote.py)."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_eo.core.vote import write_while_voting


def test_the_write_runs_while_the_vote_waits_and_both_results_come_back():
    written = threading.Event()

    def vote() -> bool:  # answers only once the write has run: they overlap, or this test hangs until the timeout
        return written.wait(timeout=10)

    def write() -> int:
        written.set()
        return 42

    assert write_while_voting(vote, write) == (True, 42)
    assert write_while_voting(lambda: False, lambda: 7) == (False, 7)


def test_a_failed_write_raises_without_waiting_for_a_vote_that_never_answers():
    never = threading.Event()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="disk full"):
        write_while_voting(lambda: never.wait(timeout=30), lambda: (_ for _ in ()).throw(RuntimeError("disk full")))
    assert time.monotonic() - started < 5


def test_a_failed_vote_is_raised_in_the_writers_thread():
    def vote() -> bool:
        raise ConnectionError("barrier lost")

    with pytest.raises(ConnectionError, match="barrier lost"):
        write_while_voting(vote, lambda: 1)
