"""Airflow connections → :class:`~airflow_eo.ops.service.PipelineOperations` (what ``airflow eo`` runs)."""

from __future__ import annotations

import logging
import os
import pwd
import socket
from typing import Any

from airflow_eo import CONFIG_SECTION, DEFAULT_OFFSET_STORE_CONN_ID
from airflow_eo.core.config import SinkRecord
from airflow_eo.core.planning import Interval
from airflow_eo.core.protocol import Sink
from airflow_eo.core.stores import ManagedOffsetStore
from airflow_eo.core.verify import TaskRun
from airflow_eo.hooks.connected_sinks import AirflowConnectionResolver
from airflow_eo.hooks.kafka import KafkaClusterHook
from airflow_eo.hooks.offset_store import OffsetStoreHook
from airflow_eo.kafka.offsets import KafkaOffsetSource
from airflow_eo.ops.service import PipelineOperations
from airflow_eo.sinks import sink_kind, spec_from_record

log = logging.getLogger(__name__)


class AirflowConnections:
    """The store, the source cluster and the sinks through Airflow connections, as the operator finds them.

    :param offset_store_conn_id: ``mysql`` (MySQL / MariaDB) or ``postgres`` (PostgreSQL) connection of the
        offset store.
    :param kafka_conn_id: ``kafka`` connection of the source cluster.
    :param sink_conn_id: another connection of the sink's database (XA branches or prepared transactions, dead
        letters), whatever the sink's kind; None: the connection the pipeline's sink declared (recorded in the store).
    :param mysql_conn_id: deprecated (``--mysql-conn-id``): ``sink_conn_id`` for a MySQL / MariaDB sink only.
    """

    def __init__(self, offset_store_conn_id: str = DEFAULT_OFFSET_STORE_CONN_ID,
                 kafka_conn_id: str = "kafka_default", sink_conn_id: str | None = None,
                 read_only: bool = False, mysql_conn_id: str | None = None) -> None:
        self.offset_store_conn_id = offset_store_conn_id
        self.read_only = read_only
        self.kafka_conn_id = kafka_conn_id
        self.sink_conn_id = sink_conn_id
        self.mysql_conn_id = mysql_conn_id

    def store(self) -> ManagedOffsetStore:
        store = OffsetStoreHook(self.offset_store_conn_id).get_store()
        if self.read_only:
            store.read_only = True
        return store

    def offset_source(self) -> KafkaOffsetSource:
        return KafkaClusterHook(self.kafka_conn_id).get_offset_source()

    def sink(self, pipeline_id: str, record: SinkRecord) -> Sink:
        kind = sink_kind(record.kind)
        spec = spec_from_record(record, self.sink_conn_override(kind.capabilities.connection_type))
        return kind.build(spec, pipeline_id, AirflowConnectionResolver(), None)

    def sink_conn_override(self, connection_type: str) -> str | None:
        """The connection given for a sink whose registered kind has ``connection_type`` (None: the recorded one).

        :param connection_type: ``sink_kind(record.kind).capabilities.connection_type``.
        """
        if self.sink_conn_id:
            return self.sink_conn_id
        # The deprecated --mysql-conn-id overrode a MySQL / MariaDB sink's connection only, as it still does.
        return self.mysql_conn_id if connection_type == "mysql" else None


class AirflowTaskRuns:
    """A pipeline's task runs as Airflow's metadata database has them (``airflow eo verify``, the DAG tab's check);
    read in the CLI's or the api-server's process, which hold the database session."""

    def task_runs(self, dag_id: str, task_id: str) -> list[TaskRun]:
        from airflow.models.dagrun import DagRun
        from airflow.models.renderedtifields import RenderedTaskInstanceFields as Rendered
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import select

        # The rendered pipeline_id of each run, where Airflow kept it (the newest runs' only): a run of the task
        # whose pipeline_id was another then is that pipeline's.
        query = (select(TaskInstance.run_id, TaskInstance.state, DagRun.data_interval_start, DagRun.data_interval_end,
                        Rendered.rendered_fields, TaskInstance.start_date)
                 .join(DagRun, (DagRun.dag_id == TaskInstance.dag_id) & (DagRun.run_id == TaskInstance.run_id))
                 .outerjoin(Rendered, (Rendered.dag_id == TaskInstance.dag_id)
                            & (Rendered.task_id == TaskInstance.task_id) & (Rendered.run_id == TaskInstance.run_id)
                            & (Rendered.map_index == TaskInstance.map_index))
                 .where(TaskInstance.dag_id == dag_id, TaskInstance.task_id == task_id))
        with create_session() as session:
            found = session.execute(query).all()
        return [TaskRun(run_id, None if state is None else str(getattr(state, "value", state)),
                        Interval(start, end) if start is not None and end is not None and start < end else None,
                        _rendered_pipeline_id(rendered), started)
                for run_id, state, start, end, rendered, started in found]


def _rendered_pipeline_id(rendered: object) -> str | None:
    """The ``pipeline_id`` a run's task rendered (``rendered_task_instance_fields``), None when not kept."""
    value = rendered.get("pipeline_id") if isinstance(rendered, dict) else None
    return value if isinstance(value, str) else None


#: The connection types an offset store runs on (core/stores.py registers them).
STORE_CONNECTION_TYPES = ("mysql", "postgres", "postgresql")


def listable_connections() -> list[str]:
    """The connection ids Airflow can list: ``AIRFLOW_CONN_*`` environment variables and the metadata database's
    connections (a secrets backend's cannot be listed)."""
    found = {name[len("AIRFLOW_CONN_"):].lower() for name in os.environ if name.startswith("AIRFLOW_CONN_")}
    try:
        from airflow.models.connection import Connection
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            found.update(session.scalars(select(Connection.conn_id)).all())
    except Exception:  # no metadata database here: the environment's connections only
        log.debug("the metadata database's connections could not be listed", exc_info=True)
    return sorted(found)


def locate_pipeline(pipeline_id: str, exclude: str) -> tuple[list[str], list[str]]:
    """Which offset stores hold ``pipeline_id``, among the listable ``mysql`` / ``postgres`` connections other than
    ``exclude`` (the default store, asked already): the connections of the stores that know it (one per database),
    and every connection looked at. Read-only: a database without our tables is skipped, never migrated.

    :param pipeline_id: the pipeline.
    :param exclude: the connection id asked already.
    """
    from airflow.sdk import BaseHook

    found: dict[tuple[Any, ...], str] = {}
    checked = []
    for conn_id in listable_connections():
        if conn_id == exclude:
            continue
        try:
            connection = BaseHook.get_connection(conn_id)
        except Exception:
            continue
        if connection.conn_type not in STORE_CONNECTION_TYPES:
            continue
        checked.append(conn_id)
        where = (connection.conn_type.replace("postgresql", "postgres"), connection.host, connection.port,
                 connection.schema)
        try:
            store = OffsetStoreHook(conn_id).get_store()
            store.read_only = True  # never create our tables in somebody's database
            if store.pipelines(pipeline_id) and where not in found:
                found[where] = conn_id
        except Exception:  # not an offset store (no eo tables), or not reachable from here
            log.debug("connection %s holds no offset store at hand", conn_id, exc_info=True)
    return sorted(found.values()), checked


def local_actor() -> str:
    """Who runs a command on this machine, for the audit log: the name of the process's real uid (not ``$USER`` or
    ``$LOGNAME``, which anyone sets), with sudo's caller where sudo set it, and the host: ``alice@host``,
    ``root (sudo from alice)@host``. Advisory: whoever can write the store can write any audit row."""
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:  # no passwd entry (a container's arbitrary uid)
        user = f"uid {uid}"
    caller = os.environ.get("SUDO_USER")
    if caller and caller != user:
        user = f"{user} (sudo from {caller})"
    return f"{user}@{socket.gethostname()}"


def default_offset_store_conn_id() -> str:
    """``[eo] offset_store_conn_id``, else ``eo_offset_store`` (the operator's default)."""
    from airflow.configuration import conf

    return conf.get(CONFIG_SECTION, "offset_store_conn_id", fallback=DEFAULT_OFFSET_STORE_CONN_ID)


def pipeline_operations(offset_store_conn_id: str | None = None, kafka_conn_id: str | None = None,
                        sink_conn_id: str | None = None, actor: str | None = None,
                        read_only: bool = False, error_details: bool = True,
                        mysql_conn_id: str | None = None) -> PipelineOperations:
    """Operations over Airflow connections (what ``airflow eo`` and the UI tab run).

    :param offset_store_conn_id: ``mysql`` (MySQL / MariaDB) or ``postgres`` (PostgreSQL) connection of the
        offset store (None: ``[eo] offset_store_conn_id``, else ``eo_offset_store``, the operator's default).
    :param kafka_conn_id: ``kafka`` connection of the source cluster (None: ``[eo] kafka_conn_id``, else
        ``kafka_default``).
    :param sink_conn_id: another connection of the sink's database, for any sink kind (None: the recorded one).
    :param actor: who runs them (default: the OS user and host).
    :param read_only: only reads (the UI): the store is never migrated; a schema behind is refused.
    :param error_details: notes quote a dependency's error (False, the UI: its kind and a logged reference only).
    :param mysql_conn_id: deprecated: ``sink_conn_id`` for a MySQL / MariaDB sink only (``--mysql-conn-id``).
    """
    from airflow.configuration import conf

    store = offset_store_conn_id or default_offset_store_conn_id()
    kafka = kafka_conn_id or conf.get(CONFIG_SECTION, "kafka_conn_id", fallback="kafka_default")
    return PipelineOperations(AirflowConnections(store, kafka, sink_conn_id, read_only, mysql_conn_id),
                              actor or local_actor(), error_details, runs=AirflowTaskRuns())
