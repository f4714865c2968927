"""The Kafka Connect worker with Debezium's PostgreSQL connector: scripts/stack_connect.py, given the stack's
folders and process helpers."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace

from airflow_eo.core.failpoints import running
from stack_services.kafka import kafka_up, kafka_version
from stack_services.layout import CACHE, STACK
from stack_services.postgres import postgres_settings
from stack_services.processes import die, pid_alive, port_open, require, spawn, stop, wait_for


def connect_module() -> ModuleType:
    """scripts/stack_connect.py, the stack's Kafka Connect worker (a fresh import: its port is read at import)."""
    spec = importlib.util.spec_from_file_location("eo_stack_connect",
                                                  Path(__file__).resolve().parent.parent / "stack_connect.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stack_helpers() -> SimpleNamespace:
    """What scripts/stack_connect.py takes from the stack (its ``stack`` argument)."""
    return SimpleNamespace(STACK=STACK, CACHE=CACHE, die=die, require=require, port_open=port_open,
                           pid_alive=pid_alive, wait_for=wait_for, spawn=spawn, stop=stop, running=running,
                           kafka_up=kafka_up, kafka_version=kafka_version, postgres_settings=postgres_settings)


def connect() -> str:
    """``make connect``: the Kafka Connect worker with Debezium's PostgreSQL connector (started, or found running);
    its REST URL."""
    return connect_module().up(stack_helpers())


def connect_down() -> None:
    connect_module().down(stack_helpers())


def connect_kill() -> None:
    """SIGKILL the worker (started again by ``connect``)."""
    connect_module().kill(stack_helpers())
