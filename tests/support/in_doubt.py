"""An XA attempt that dies right after its commit point: its branches stay prepared, the batch in doubt."""

from __future__ import annotations

from typing import Any


class KilledAfterCommitPoint(BaseException):
    """The attempt's process dies right after the store's commit point (as SIGKILL would: nothing cleans up)."""


class DiesBeforeXaCommit:
    """The XA sink adapter of an attempt that dies after the commit point, before ``XA COMMIT``."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)

    def finalize(self, batch: Any, xids: Any) -> None:
        raise KilledAfterCommitPoint()
