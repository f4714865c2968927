"""The "Exactly-once" tab on the DAG page of the Airflow 3 UI, and the "In-doubt work" page of its Browse menu.

A FastAPI app mounted by the api-server (``fastapi_apps``) renders, for one DAG, every pipeline its
tasks own: ``airflow eo verify``'s findings, lag per partition, a chart of the recent batches, the batch history
with ranges, in-doubt branches (XA, PostgreSQL prepared transactions) with their age, dead letters and the audit
trail (rewinds, recoveries). The in-doubt page is ``airflow eo verify --all`` for every pipeline of the store (guarded
by the custom view :data:`IN_DOUBT_VIEW`). An
``external_views`` entry with ``destination: "dag"`` shows it as a tab of every DAG page (Airflow has
no per-DAG condition: a DAG without micro-batch tasks gets a page that says so). Every endpoint is
guarded by Airflow's own ``requires_access_dag("GET")``: the browser's session cookie identifies the
user, as for the UI's own API calls. Read-only: changes go through ``airflow eo`` (audited).

Everything shown comes from :class:`~airflow_eo.ops.service.PipelineOperations`, the module the CLI
runs; this one only finds the DAG's tasks and draws. Settings (``[eo]`` section, see the provider's
``config``): ``offset_store_conn_id``, ``kafka_conn_id``, ``in_doubt_warning_seconds``, ``ui_batch_limit``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.configuration import conf
from airflow.models.dagbag import DBDagBag
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from airflow_eo import CONFIG_SECTION
from airflow_eo.ops.reports import InDoubtReport, PipelinePage
from airflow_eo.ops.service import PipelineOperations

log = logging.getLogger(__name__)
T = TypeVar("T")
#: The custom view a user needs for the in-doubt page (every pipeline's, so not one DAG's access): with the simple
#: auth manager, viewers have it; with FAB or Keycloak, grant it as the roles that run ``airflow eo`` would have.
IN_DOUBT_VIEW = "airflow_eo.in_doubt"

# The phases of a batch as the protocol times them (BatchSummary.seconds), in the order they run; "execute"
# holds read_transform and write, so the chart stacks only its rest ("spark_other": job set-up, counting,
# dead letters). A one-pass batch has no read_transform: its write is the whole Spark job.
PHASES = ("plan", "read_transform", "write", "spark_other", "commit", "finalize")
PHASE_COLOURS = ("#9e9e9e", "#42a5f5", "#66bb6a", "#80deea", "#ffa726", "#ab47bc")

_templates = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                         autoescape=select_autoescape(["html"]))


def dag_task_ids(dag_id: str, session: Any) -> list[str]:
    """The task ids of the DAG's latest serialized version (404 if the DAG is unknown)."""
    dag = DBDagBag().get_latest_version_of_dag(dag_id, session=session)
    if dag is None:
        raise HTTPException(404, f"The Dag with ID: `{dag_id}` was not found")
    return list(dag.task_ids)


# Reads run here so that a handler answers within ui_timeout_seconds even when a dependency hangs (a read stuck
# for its driver's full timeout keeps its worker; a bounded pool keeps them from piling up).
_READERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="eo-tab")


def _ui_operations() -> PipelineOperations:
    """Operations over the connections of ``[eo]`` (the CLI's defaults); a GET never migrates the store (reads must
    not write), and notes give a failed read's kind and a reference, never its text (hosts, users)."""
    from airflow_eo.hooks.operations import pipeline_operations  # hooks import the Airflow SDK: at call time

    return pipeline_operations(actor="airflow-ui", read_only=True, error_details=False)


def read_within(read: Callable[[], T], what: str, timeout_s: float | None = None) -> tuple[T | None, str | None]:
    """``read()``'s answer, or an error that says what is wrong (the store is unreachable...), within ``timeout_s``
    (None: ``[eo] ui_timeout_seconds``). The full text of a failure (hosts, users, SQL) goes to the api-server's log
    only, under a reference the page shows."""
    if timeout_s is None:
        timeout_s = conf.getfloat(CONFIG_SECTION, "ui_timeout_seconds", fallback=30.0)

    def guarded() -> tuple[T | None, str | None]:
        try:
            return read(), None
        except Exception as exc:
            reference = uuid.uuid4().hex[:8]
            log.exception("%s (reference %s)", what, reference)
            return None, (f"{type(exc).__name__}: the offset store or Kafka could not be read; the details are in "
                          f"the api-server's log (reference {reference})")

    future = _READERS.submit(guarded)
    try:
        return future.result(timeout=timeout_s)
    except FutureTimeout:
        future.cancel()  # not started yet (the pool is busy with hung reads): never starts
        log.error("%s: no answer within %.0f s", what, timeout_s)
        return None, (f"the offset store or Kafka did not answer within {timeout_s:.0f} s ([eo] ui_timeout_seconds); "
                      "see the api-server's log")


def dag_pages(dag_id: str, task_ids: Sequence[str], limit: int,
              timeout_s: float | None = None) -> tuple[list[PipelinePage], str | None]:
    """The pages of the DAG's pipelines, or an error that says what is wrong, within ``timeout_s``."""

    def read() -> list[PipelinePage]:
        ops = _ui_operations()
        owned = ops.pipelines_of_dag(dag_id, task_ids)
        return [ops.page(pipeline_id, limit, task_id, verify=True) for pipeline_id, task_id in owned.items()]

    pages, error = read_within(read, f"exactly-once tab of {dag_id}", timeout_s)
    return pages or [], error


def in_doubt_everywhere(timeout_s: float | None = None) -> tuple[InDoubtReport | None, str | None]:
    """``airflow eo verify --all``'s report (every in-doubt branch of ours on every database the store's pipelines
    recorded, and the Kafka-sink pipelines' open transactions), or an error, within ``timeout_s``."""
    return read_within(lambda: _ui_operations().in_doubt_everywhere(), "in-doubt page", timeout_s)


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    colour: str
    title: str


def phase_seconds(seconds: dict[str, float]) -> dict[str, float]:
    """A batch's seconds per charted phase (``execute`` split into its timed parts and the rest)."""
    timed = seconds.get("read_transform", 0.0) + seconds.get("write", 0.0)
    return {**{p: seconds.get(p, 0.0) for p in PHASES}, "spark_other": max(0.0, seconds.get("execute", 0.0) - timed)}


def batch_bars(batches: Sequence[dict[str, Any]], height: float = 110.0, width: float = 380.0) -> dict[str, Any]:
    """SVG geometry of the two charts: records per batch, and seconds per phase (stacked), oldest first."""
    ordered = sorted(batches, key=lambda b: b["batch_id"])
    slot = width / max(len(ordered), 12)  # a few batches stay thin bars, not a wall
    most_records = max([b["records_in"] or 0 for b in ordered] + [1])
    phases_of = {b["batch_id"]: phase_seconds(b["seconds"]) for b in ordered}
    most_seconds = max([sum(p.values()) for p in phases_of.values()] + [1e-9])
    records: list[Bar] = []
    phases: list[Bar] = []
    for i, b in enumerate(ordered):
        x = i * slot + slot * 0.15
        w = slot * 0.7
        n = b["records_in"] or 0
        h = height * n / most_records
        records.append(Bar(x, height - h, w, h, "#1976d2", f"batch {b['batch_id']}: {n} records"))
        top = height
        for phase, colour in zip(PHASES, PHASE_COLOURS, strict=True):
            seconds = phases_of[b["batch_id"]][phase]
            h = height * seconds / most_seconds
            top -= h
            phases.append(Bar(x, top, w, h, colour, f"batch {b['batch_id']} {phase}: {seconds:.2f} s"))
    labels = [(i * slot + slot / 2, b["batch_id"]) for i, b in enumerate(ordered)]
    return {"records": records, "phases": phases, "labels": labels, "height": height, "width": width,
            "most_records": most_records, "most_seconds": most_seconds,
            "legend": list(zip(PHASES, PHASE_COLOURS, strict=True))}


def may_read_records(dag_id: str, user: Any, auth_manager: Any = None) -> bool:
    """Whether ``user`` may see the raw keys and values of the DAG's dead letters: records of the topic, as
    sensitive as what its tasks log, so the same access as the DAG's task logs (DAG read access alone shows
    where the bad records are and why, not what they hold)."""
    if auth_manager is None:
        from airflow.api_fastapi.app import get_auth_manager

        auth_manager = get_auth_manager()
    return bool(auth_manager.is_authorized_dag(method="GET", access_entity=DagAccessEntity.TASK_LOGS,
                                               details=DagDetails(id=dag_id), user=user))


def pages_as_shown(pages: Sequence[PipelinePage], may_read: bool) -> list[dict[str, Any]]:
    """The pages as JSON, the dead letters' keys, values and headers hidden unless ``may_read``."""
    shown = [p.to_dict() for p in pages]
    if not may_read:
        for page in shown:
            for letter in page.get("dead_letters") or []:
                letter.update(key=None, value=None, headers=None, hidden=True)
    return shown


def create_app() -> FastAPI:
    # No /docs, /redoc or /openapi.json: they would be served without Airflow's login.
    app = FastAPI(title="airflow_eo exactly-once", description="Read-only view of airflow_eo pipelines per DAG.",
                  docs_url=None, redoc_url=None, openapi_url=None)
    guard = [Depends(requires_access_dag("GET"))]

    @app.get("/api/dags/{dag_id}", dependencies=guard)
    def dag_pipelines(dag_id: str, session: SessionDep, user: GetUserDep) -> dict[str, Any]:
        """The DAG's pipelines as JSON (what the tab shows)."""
        limit = conf.getint(CONFIG_SECTION, "ui_batch_limit", fallback=20)
        pages, error = dag_pages(dag_id, dag_task_ids(dag_id, session), limit)
        if error is not None:
            raise HTTPException(503, error)
        return {"dag_id": dag_id, "pipelines": pages_as_shown(pages, may_read_records(dag_id, user))}

    @app.get("/dags/{dag_id}", response_class=HTMLResponse, dependencies=guard)
    def dag_tab(dag_id: str, session: SessionDep, user: GetUserDep) -> HTMLResponse:
        """The tab (an HTML page the DAG page shows in a frame)."""
        limit = conf.getint(CONFIG_SECTION, "ui_batch_limit", fallback=20)
        warn_after = conf.getfloat(CONFIG_SECTION, "in_doubt_warning_seconds", fallback=300.0)
        pages, error = dag_pages(dag_id, dag_task_ids(dag_id, session), limit)
        pipelines = [{**page, "chart": batch_bars(page["batches"])}
                     for page in pages_as_shown(pages, may_read_records(dag_id, user))]
        html = _templates.get_template("exactly_once_tab.html").render(
            dag_id=dag_id, pipelines=pipelines, error=error, warn_after=warn_after, phases=PHASES)
        return HTMLResponse(html, status_code=503 if error else 200)

    def in_doubt_access(user: GetUserDep) -> None:
        from airflow.api_fastapi.app import get_auth_manager

        if not get_auth_manager().is_authorized_custom_view(method="GET", resource_name=IN_DOUBT_VIEW, user=user):
            raise HTTPException(403, f"Forbidden: this page needs the custom view {IN_DOUBT_VIEW!r}")

    @app.get("/api/in-doubt", dependencies=[Depends(in_doubt_access)])
    def in_doubt_json() -> dict[str, Any]:
        """``airflow eo verify --all --output json --older-than 0`` (what the page shows)."""
        report, error = in_doubt_everywhere()
        if report is None:
            raise HTTPException(503, error)
        return report.to_dict(conf.getfloat(CONFIG_SECTION, "in_doubt_warning_seconds", fallback=300.0))

    @app.get("/in-doubt", response_class=HTMLResponse, dependencies=[Depends(in_doubt_access)])
    def in_doubt_page() -> HTMLResponse:
        """Every in-doubt branch of ours, in every pipeline (a Browse menu page)."""
        warn_after = conf.getfloat(CONFIG_SECTION, "in_doubt_warning_seconds", fallback=300.0)
        report, error = in_doubt_everywhere()
        doc = report.to_dict(warn_after) if report is not None else None
        html = _templates.get_template("in_doubt.html").render(report=doc, error=error, warn_after=warn_after)
        return HTMLResponse(html, status_code=503 if error else 200)

    return app
