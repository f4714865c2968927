"""Importing this module registers every integration's kinds (sinks, offset stores, drivers): it imports the rooms
named in the entry-point group ``airflow_eo.integrations`` of every installed distribution. This package names its
own in its ``pyproject.toml``; a separately installed distribution adds a database or a table format by naming its
room there, with no edit to this package. Each room registers its kinds when imported
(``airflow_eo/<room>/__init__.py``).
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

log = logging.getLogger(__name__)

GROUP = "airflow_eo.integrations"
OWN = "airflow_eo."


def load_integrations() -> dict[str, str]:
    """Import every room of the group: ``{name: module}`` of those loaded.

    A room of this package that fails to import raises (a bug, or a broken install). Another distribution's is
    logged and left out: its kinds are then unknown, and a pipeline using one fails saying so, while the others run.
    """
    loaded: dict[str, str] = {}
    for point in sorted(entry_points(group=GROUP), key=lambda p: (not p.value.startswith(OWN), p.name)):
        if point.name in loaded:
            log.warning("integration %r of %s is not loaded: %s already has that name", point.name,
                        point.value, loaded[point.name])
            continue
        try:
            point.load()
        except Exception as exc:
            if point.value.startswith(OWN):
                raise
            log.warning("integration %r (%s) could not be imported and is left out: %s", point.name, point.value,
                        exc)
            continue
        loaded[point.name] = point.value
    if not any(module.startswith(OWN) for module in loaded.values()):
        raise ImportError(f"airflow_eo's integrations are not registered: its distribution's entry points (group "
                          f"{GROUP!r}) are missing. Install the package (`pip install airflow-eo`, or `pip install "
                          f"-e .` / `make venv` in a checkout) rather than only putting it on sys.path")
    return loaded


#: The rooms imported: ``{name: module}``.
LOADED = load_integrations()
