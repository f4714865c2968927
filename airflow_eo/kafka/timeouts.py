"""How long airflow_eo waits on the Kafka cluster, in one place (both clients of the room read them here)."""

#: Admin requests: metadata, offsets, configs, consumer-group offsets (retried while the error is transient).
ADMIN_TIMEOUT_S = 30.0
#: The transactional producer's calls (init, flush of a batch's output, send offsets, commit, abort) and the wait
#: for a just-committed transaction's group offsets to become stable: each may cover a whole batch's output.
TRANSACTION_TIMEOUT_S = 60.0
