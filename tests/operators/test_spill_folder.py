"""Where a Spark task keeps its files: dead-letter spills, bulk-load CSV files (``core/task_files.py``)."""

from __future__ import annotations


def test_a_tasks_spill_goes_to_the_executors_own_folder_when_spark_names_one(tmp_path, monkeypatch):
    from airflow_eo.core.task_files import task_folder

    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path},/elsewhere")
    assert task_folder() == str(tmp_path)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "gone"))
    assert task_folder() is None  # the system's temporary folder


def test_kept_batches_give_every_pass_the_same_batches_while_the_stream_is_read_once(tmp_path, monkeypatch):
    """A pass cut short (a deadlock's victim) and the next pass: the next sees every batch from the first, the
    stream's batches are read once, and the files go with the block."""
    import pyarrow as pa

    from airflow_eo.arrow.kept_batches import KeptBatches

    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    read: list[int] = []

    def stream():
        for i in range(4):
            read.append(i)
            yield pa.RecordBatch.from_pydict({"n": [i, i]})

    with KeptBatches(stream()) as kept:
        first = kept.batches()
        assert [next(first).column(0)[0].as_py() for _ in range(2)] == [0, 1]
        first.close()  # cut short after two batches
        assert [b.column(0)[0].as_py() for b in kept.batches()] == [0, 1, 2, 3]
        assert [b.column(0)[0].as_py() for b in kept.batches()] == [0, 1, 2, 3]
        assert len(list(tmp_path.iterdir())) == 2
    assert read == [0, 1, 2, 3]
    assert list(tmp_path.iterdir()) == []
