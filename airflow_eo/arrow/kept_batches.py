"""Arrow batches a Spark task keeps on the executor's local disk (:func:`~airflow_eo.core.task_files.task_folder`)
instead of in memory: a partition's bad records while its good rows are written, or the rows of a transaction that
may have to run again from its first row (an XA branch rolled back whole as a deadlock's victim)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

from airflow_eo.core.task_files import task_folder


class KeptBatches:
    """Batches kept in Arrow stream files: those :meth:`add` gave and those read from ``stream`` so far.

    :meth:`batches` reads all kept batches back in order, then the rest of ``stream`` (kept as they are read), so
    every pass sees the same batches while ``stream`` itself is read once. The files go when the block ends."""

    def __init__(self, stream: Iterable[Any] = ()) -> None:
        self._stream = iter(stream)
        self._files: list[str] = []  # closed files, in order
        self._writer: Any = None  # the file being written: the last one

    def add(self, batch: Any) -> None:
        import pyarrow as pa

        if self._writer is None:
            fd, path = tempfile.mkstemp(prefix="airflow_eo_kept_", suffix=".arrows", dir=task_folder())
            os.close(fd)
            self._files.append(path)
            self._writer = pa.ipc.new_stream(path, batch.schema)
        self._writer.write_batch(batch)

    def batches(self) -> Iterator[Any]:
        import pyarrow as pa

        self._close()  # batches read from here on go to a new file: a file is read only once it is whole
        for path in list(self._files):
            with pa.memory_map(path) as source:
                yield from pa.ipc.open_stream(source)
        for batch in self._stream:
            self.add(batch)
            yield batch

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> KeptBatches:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()
        for path in self._files:
            os.unlink(path)
