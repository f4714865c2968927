"""A task attempt's OS process (:class:`Process`): its steps, and the kill, failure or pause at one of them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the engine reports its steps to a process
    from tests.core.fakes.engine import FakeEngine


class Killed(BaseException):
    """The attempt's process was killed (SIGKILL) at a step: nothing after it runs, no cleanup either.

    A BaseException so that no ``except Exception`` catches it; the protocol's ``except BaseException``
    still does, which is why the fake sinks' ``discard`` does nothing in a killed process.
    """


class InjectedError(RuntimeError):
    """An ordinary failure at a step (a lost connection, a failed Spark job): cleanup code runs."""


Trigger = int | str | tuple[str, int] | None  # the n-th step of the process | a step's name | (name, n-th time)


class Process:
    """The OS process of one task attempt: the steps it went through, and where it dies, fails or pauses.

    :param kill_at: the step where the process is killed (:class:`Killed`).
    :param fail_at: the step that raises :class:`InjectedError` (unless ``no_fail(step)``).
    :param pause_at: the step before which ``on_pause`` runs (e.g. whole newer attempts), once.
    """

    def __init__(self, *, kill_at: Trigger = None, fail_at: Trigger = None, pause_at: Trigger = None,
                 on_pause: Callable[[], None] | None = None, no_fail: Callable[[str], bool] | None = None) -> None:
        self.kill_at, self.fail_at, self.pause_at, self.on_pause = kill_at, fail_at, pause_at, on_pause
        self.no_fail = no_fail
        self.trace: list[str] = []
        self.dead = False
        self.epoch: int | None = None  # what the attempt's take returned
        self.engine: FakeEngine | None = None
        self.sink: Any = None
        self._seen: Counter[str] = Counter()

    def step(self, name: str) -> None:
        if self.dead:
            raise AssertionError(f"step {name!r} ran in a killed process (killed at {self.trace[-1]!r})")
        self.trace.append(name)
        self._seen[name] += 1
        if self.on_pause is not None and self._hit(self.pause_at, name):
            on_pause, self.on_pause = self.on_pause, None
            on_pause()
        if self._hit(self.kill_at, name):
            self.dead = True
            raise Killed(name)
        if self._hit(self.fail_at, name) and not (self.no_fail is not None and self.no_fail(name)):
            raise InjectedError(f"injected failure at {name}")

    def _hit(self, trigger: Trigger, name: str) -> bool:
        if trigger is None:
            return False
        if isinstance(trigger, int):
            return len(self.trace) == trigger
        if isinstance(trigger, str):
            return name == trigger and self._seen[name] == 1
        return name == trigger[0] and self._seen[name] == trigger[1]


#: The running attempts' processes, innermost last (a paused attempt runs newer attempts inside its pause).
RUNNING: list[Process] = []


def failpoint(point: str, scope: str = "") -> None:
    """Stands in for ``protocol.failpoint``: the protocol's failpoints are steps of the running process."""
    if RUNNING:
        RUNNING[-1].step(f"crash:{point}")


class Stepped:
    """An attempt's handle on a shared fake: every call is a step of the attempt's process before it runs,
    and the writes (``writes``) are a step ``<name>:done`` again after they took effect."""

    def __init__(self, target: Any, proc: Process, prefix: str, writes: frozenset[str] = frozenset()) -> None:
        self._target, self._proc, self._prefix, self._writes = target, proc, prefix, writes

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._proc.step(f"{self._prefix}.{name}")
            result = attr(*args, **kwargs)
            if name.startswith("take_"):
                self._proc.epoch = result
            if name in self._writes:
                self._proc.step(f"{self._prefix}.{name}:done")
            return result

        return call
