"""In-memory fakes of the roles of the commit protocol (``airflow_eo.core.protocol``) for ``test_protocol.py``,
``test_operations.py`` and ``test_sink_registry.py``; one module per role.

- :class:`FakeStore` copies :class:`airflow_eo.sqlstore.store.SqlOffsetStore`: every write after a
  take is fenced by the attempt's epoch (the pipeline's, or in interval mode the interval's), the commit point
  is one atomic compare-and-set of every partition's offset plus the batch state, transitions follow
  ``core.batch_states``, ``adopt_batch`` resets a batch to ``planned`` and drops its xids, ``abort_batch`` frees
  the run (``run_key`` NULL), batch ids are ``MAX + 1``, a run has one batch (continuous mode) and an interval
  one batch (interval mode).
- :class:`FakeSource` is the input topic: per partition a list of records with timestamps.
- :class:`FakeEngine` reads exactly a batch's ranges from it and writes them through the sink (it is also
  the ``PartitionRunner``).
- Three sinks, each over a shared server whose state outlives the attempts: :class:`FakeXaSink` (prepared
  branches, invisible until committed after the commit point), :class:`FakeUpsertSink` (visible at once,
  idempotent per record key) and :class:`FakeKafkaSink` (its own commit is the commit point).

A :class:`Process` is the OS process of one task attempt. Every fake the attempt uses reports each of its
steps to it, and the process can be killed there (:class:`Killed`: like SIGKILL, nothing after it runs, no
cleanup either), fail there with an ordinary exception (cleanup runs), or pause there while other attempts
run to completion (so that it continues as a zombie).
"""

