"""The REST API (``/api/v2``) of a throwaway Airflow deployment, as a user's client calls it: the base of
tests/scheduler/airflow_services.py's ``AirflowServices`` (which starts the deployment and opens the client).

Auth: ``SimpleAuthManager`` with ``[core] simple_auth_manager_all_admins`` makes ``GET /auth/token`` hand out an
admin JWT without credentials (``api_fastapi/auth/managers/simple/routes/login.py``). With ``all_admins=False``
an ``admin:ADMIN`` user whose password is in ``[core] simple_auth_manager_passwords_file`` logs in through
``POST /auth/token``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import httpx

from tests.scheduler.service_processes import AirflowServicesError

TERMINAL_RUN_STATES = frozenset({"success", "failed"})


def from_iso(value: str) -> datetime:
    """A datetime from the API's ISO-8601 strings (``...Z`` included, which Python 3.10 does not parse)."""
    return datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)


def iso(moment: datetime | str) -> str:
    """An ISO-8601 string for a timezone-aware datetime (strings pass through)."""
    if isinstance(moment, str):
        return moment
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} has no timezone; Airflow needs aware datetimes")
    return moment.isoformat()


class AirflowRestApi:
    """Calls of the REST API with a bearer token (``SimpleAuthManager``: ``all_admins``, else ``admin``'s login)."""

    def __init__(self, all_admins: bool) -> None:
        self.all_admins = all_admins
        self._admin_password = secrets.token_urlsafe(12)
        self._token: str | None = None
        self._token_expires_at = 0.0
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            raise AirflowServicesError("services are not started")
        return self._client

    @property
    def admin_password(self) -> str:
        """The ``admin`` user's password (``all_admins=False``), for a browser's login form."""
        return self._admin_password

    def token(self) -> str:
        """A JWT for the REST API, fetched again after 50 minutes (it lasts ``[api_auth] jwt_expiration_time``)."""
        if self._token and time.monotonic() < self._token_expires_at:
            return self._token
        if self.all_admins:
            response = self.client.get("/auth/token")
        else:
            response = self.client.post("/auth/token", json={"username": "admin", "password": self._admin_password})
        if response.status_code != 201:
            raise AirflowServicesError(f"token request failed: {response.status_code} {response.text}")
        self._token = str(response.json()["access_token"])
        self._token_expires_at = time.monotonic() + 3000  # the default expiration is 24 h
        return self._token

    def api(
        self,
        method: str,
        path: str,
        json: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        ok: Iterable[int] = (200, 201, 204),
        attempts: int = 10,
    ) -> Any:
        """Call ``/api/v2<path>`` with the bearer token; the decoded JSON body (``None`` if empty).

        Retried (``attempts`` in all): 503 on any method -- SQLite ``database is locked``, which e.g.
        ``POST /backfills`` maps to 503 after cleaning up (``api_fastapi/core_api/routes/public/backfills.py``) --
        and 500 on GET: Airflow 3.3.2 fails to serialise an asset event whose created run is still queued
        (``start_date`` NULL, apache/airflow#71360, fixed after 3.3.2 by #71379).
        """
        url = path if path.startswith("/api/") else f"/api/v2{path}"
        retry_on = {503, 500} if method.upper() == "GET" else {503}
        for attempt in range(1, attempts + 1):
            response = self.client.request(
                method, url, json=json, params=params, headers={"Authorization": f"Bearer {self.token()}"}
            )
            if response.status_code not in retry_on or attempt == attempts:
                break
            time.sleep(min(0.5 * attempt, 3.0))
        if response.status_code not in set(ok):
            raise AirflowServicesError(f"{method} {url} -> {response.status_code}: {response.text[:2000]}")
        return response.json() if response.content else None

    def health(self) -> dict[str, Any]:
        """GET /api/v2/monitor/health (no auth needed)."""
        return dict(self.client.get("/api/v2/monitor/health").json())

    # ------------------------------------------------------------------ DAGs and runs

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        """GET /dags/{dag_id}, or None while the dag-processor has not serialised it."""
        response = self.client.get(f"/api/v2/dags/{dag_id}", headers={"Authorization": f"Bearer {self.token()}"})
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise AirflowServicesError(f"GET dag {dag_id} -> {response.status_code}: {response.text[:2000]}")
        return dict(response.json())

    def import_errors(self) -> list[dict[str, Any]]:
        """GET /importErrors: DAG files that failed to parse."""
        return list(self.api("GET", "/importErrors")["import_errors"])

    def unpause(self, dag_id: str) -> dict[str, Any]:
        """PATCH /dags/{dag_id} is_paused=False."""
        return dict(self.api("PATCH", f"/dags/{dag_id}", {"is_paused": False}))

    def pause(self, dag_id: str) -> dict[str, Any]:
        """PATCH /dags/{dag_id} is_paused=True."""
        return dict(self.api("PATCH", f"/dags/{dag_id}", {"is_paused": True}))

    def trigger(
        self, dag_id: str, conf: Mapping[str, Any] | None = None, logical_date: datetime | str | None = None
    ) -> dict[str, Any]:
        """POST /dags/{dag_id}/dagRuns: a manual run (``logical_date`` None = a run without one)."""
        body = {"logical_date": None if logical_date is None else iso(logical_date), "conf": dict(conf or {})}
        return dict(self.api("POST", f"/dags/{dag_id}/dagRuns", body))

    def dag_runs(self, dag_id: str, run_type: str | None = None) -> list[dict[str, Any]]:
        """All runs of ``dag_id`` (GET /dags/{dag_id}/dagRuns, paged), oldest first; optionally one run type
        (``backfill``, ``scheduled``, ``manual``, ``asset_triggered``)."""
        params = {"order_by": "id", **({"run_type": run_type} if run_type else {})}
        return self.paged(f"/dags/{dag_id}/dagRuns", "dag_runs", params)

    def paged(self, path: str, items_key: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every item of a GET collection endpoint (``limit``/``offset`` pages of 100)."""
        items: list[dict[str, Any]] = []
        while True:
            page = self.api("GET", path, params={**(params or {}), "limit": 100, "offset": len(items)})
            items.extend(page[items_key])
            if not page[items_key] or len(items) >= page["total_entries"]:
                return items


    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """GET /dags/{dag_id}/dagRuns/{run_id}/taskInstances (paged)."""
        return self.paged(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", "task_instances")

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task attempt's log as text, via the REST API (what the UI shows)."""
        body = self.api(
            "GET",
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
        )
        lines = []
        for entry in body.get("content", []):
            if isinstance(entry, str):
                lines.append(entry)
                continue
            extra = {k: v for k, v in entry.items() if k not in ("timestamp", "event", "level", "logger")}
            lines.append(
                f"{entry.get('timestamp', '')} {entry.get('level', '')} {entry.get('event', '')}"
                + (f" {extra}" if extra else "")
            )
        return "\n".join(lines)

    # ------------------------------------------------------------------ backfills

    def create_backfill(
        self,
        dag_id: str,
        from_date: datetime | str,
        to_date: datetime | str,
        reprocess_behavior: str = "none",
        max_active_runs: int = 10,
        dag_run_conf: Mapping[str, Any] | None = None,
        run_backwards: bool = False,
    ) -> dict[str, Any]:
        """POST /backfills, the request the UI's Trigger -> Backfill dialog sends (``BackfillPostBody``).

        ``from_date``/``to_date`` are both inclusive logical dates; ``reprocess_behavior`` is ``none``,
        ``failed`` or ``completed``.
        """
        body = {
            "dag_id": dag_id,
            "from_date": iso(from_date),
            "to_date": iso(to_date),
            "run_backwards": run_backwards,
            "dag_run_conf": dict(dag_run_conf) if dag_run_conf is not None else None,
            "reprocess_behavior": reprocess_behavior,
            "max_active_runs": max_active_runs,
        }
        return dict(self.api("POST", "/backfills", body))

    def backfills(self, dag_id: str) -> list[dict[str, Any]]:
        """GET /backfills?dag_id=..., oldest first."""
        return self.paged("/backfills", "backfills", {"dag_id": dag_id})

    def backfill_runs(self, backfill: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Backfill-type runs whose logical date is in the backfill's (inclusive) range, oldest first.

        The REST API does not expose ``dag_run.backfill_id``; a run cleared by a later backfill becomes that
        backfill's run (same run id, ``run_type`` stays ``backfill``).
        """
        start, end = from_iso(backfill["from_date"]), from_iso(backfill["to_date"])
        return [
            r
            for r in self.dag_runs(backfill["dag_id"], run_type="backfill")
            if r["logical_date"] and start <= from_iso(r["logical_date"]) <= end
        ]

    # ------------------------------------------------------------------ assets

    def asset_events(self, **filters: Any) -> list[dict[str, Any]]:
        """GET /assets/events with filters such as ``source_dag_id``, ``source_run_id``, ``asset_id``."""
        return self.paged("/assets/events", "asset_events", {"order_by": "timestamp", **filters})

    def upstream_asset_events(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """The asset events that triggered an asset-triggered run."""
        return list(self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/upstreamAssetEvents")["asset_events"])

