"""Database drivers, by connection type: which client library a room's sinks and offset store use, the extra of
the ``airflow-eo`` distribution that installs it, and the errors it raises (``airflow eo`` turns them into one
line, not a traceback).

A room declares its driver with :func:`register_driver` in its ``__init__.py``, without importing it (a DAG file
imports every room through ``airflow_eo.sinks``; the driver may not be installed): the errors are read from the
driver's module only when one is asked about. :func:`require_driver` is the check every use of a room's database
makes first (:func:`~airflow_eo.core.sink_kinds.register_sink` wraps the kind's factory with it,
:func:`~airflow_eo.core.stores.store_for` calls it): a missing driver is a :class:`ConfigurationError` naming the
extra to install, not an ``ImportError`` from deep inside.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from airflow_eo.core.errors import ConfigurationError

#: the distribution's name (``pip install 'airflow-eo[mysql]'``), as ``pyproject.toml`` spells it
DISTRIBUTION = "airflow-eo"


def _str(exc: BaseException) -> str:
    return str(exc)


@dataclass(frozen=True)
class Driver:
    """A database's client library, as its room declares it."""

    #: the Airflow connection type whose sinks and offset store use it (``mysql``, ``postgres``)
    conn_type: str
    #: what the user reads in a message (``MySQL / MariaDB``)
    database: str
    #: the module to import (``pymysql``)
    module: str
    #: the dotted names of its error base classes in that module (``err.MySQLError``)
    errors: tuple[str, ...]
    #: the extra of the distribution that installs it; empty when a required dependency does
    extra: str = ""
    #: an error's text (default ``str``); made one line by :func:`describe_driver_error`
    describe: Callable[[BaseException], str] = _str

    def error_classes(self) -> tuple[type[BaseException], ...]:
        """Its error classes; empty when the driver is not installed (it raised nothing then)."""
        try:
            module = importlib.import_module(self.module)
        except ImportError:
            return ()
        classes: list[type[BaseException]] = []
        for dotted in self.errors:
            found: object = module
            path = self.module
            for part in dotted.split("."):
                path = f"{path}.{part}"
                # a submodule its package does not import itself (pyiceberg.exceptions)
                found = getattr(found, part) if hasattr(found, part) else importlib.import_module(path)
            if isinstance(found, type) and issubclass(found, BaseException):
                classes.append(found)
        return tuple(classes)


_DRIVERS: dict[str, Driver] = {}


def register_driver(driver: Driver) -> None:
    """Declare the driver of a connection type's database (once per type)."""
    _DRIVERS[driver.conn_type] = driver


def drivers() -> dict[str, Driver]:
    """Every declared driver, by connection type."""
    return dict(_DRIVERS)


def driver_errors() -> tuple[type[BaseException], ...]:
    """The error classes of every declared driver that is installed (what ``airflow eo`` reports in one line)."""
    return tuple(cls for driver in _DRIVERS.values() for cls in driver.error_classes())


def describe_driver_error(exc: BaseException) -> str | None:
    """``exc`` as one line naming its database (``PostgreSQL error: connection failed: ...``) when a declared
    driver raised it; else None."""
    for driver in _DRIVERS.values():
        classes = driver.error_classes()
        if classes and isinstance(exc, classes):
            return f"{driver.database} error: {' '.join(driver.describe(exc).split())}"
    return None


def require_driver(conn_type: str) -> None:
    """Nothing when the driver of ``conn_type``'s database is installed (or none is declared); else a
    :class:`ConfigurationError` naming the extra that installs it."""
    driver = _DRIVERS.get(conn_type)
    if driver is None:
        return
    try:
        importlib.import_module(driver.module)
    except ImportError as exc:
        install = f"pip install '{DISTRIBUTION}[{driver.extra}]'" if driver.extra else f"pip install {driver.module}"
        raise ConfigurationError(
            f"{driver.database} (the registered driver {conn_type!r}) needs the {driver.module} library, which is not "
            f"installed ({exc}): {install}") from None
