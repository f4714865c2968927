"""The Airflow UI plugin of airflow_eo: the "Exactly-once" tab on the DAG page and the "In-doubt work" page of the
Browse menu (read-only).

Every Airflow process loads plugins (each task's too), so this module stays light: the tab's FastAPI app
(:mod:`airflow_eo.plugins.exactly_once`, which imports Airflow's core API, ~0.8 s measured here) is built on the
api-server's first request to it, never in a task.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/exactly-once"
TAB_ROUTE = "exactly-once"
IN_DOUBT_ROUTE = "exactly-once-in-doubt"


class TabApp:
    """An ASGI app that builds the tab's FastAPI app when the api-server first routes a request to it (Airflow
    mounts a plugin's app with Starlette's ``Mount``, which takes any ASGI app)."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from airflow_eo.plugins.exactly_once import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class ExactlyOncePlugin(AirflowPlugin):
    """Registered through the ``airflow.plugins`` entry point and the provider info's ``plugins`` entry."""

    name = "airflow_eo"
    fastapi_apps = [{"app": TabApp(), "url_prefix": URL_PREFIX, "name": "airflow_eo exactly-once"}]
    external_views = [{
        "name": "Exactly-once",
        "href": URL_PREFIX + "/dags/{DAG_ID}",
        "destination": "dag",
        "url_route": TAB_ROUTE,
    }, {
        # `airflow eo verify --all` as a page: every in-doubt branch of ours, whatever its pipeline.
        "name": "In-doubt work",
        "href": URL_PREFIX + "/in-doubt",
        "destination": "nav",
        "category": "browse",
        "url_route": IN_DOUBT_ROUTE,
    }]
