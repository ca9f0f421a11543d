"""Foreign code is bounded: an engine step that does not end within ``seconds`` (a connector call
that never returns, a copy thread waited on forever) stops the run with a verdict naming the
connector call in progress and its request.

One alarm per step (``SIGALRM`` on a real-time interval timer), not one per call: the replay's
call wrappers only note which connector call is running (:class:`CallsInProgress`), which costs
two assignments; the alarm's handler raises :class:`ConnectorTimeout` in the stuck call, whose
message names it. A blocking wait (a lock, a sleep, a pipe) is interrupted too: Python runs the
handler when the system call returns EINTR.

An alarm already armed outside (the test suite's per-test bound, tests/conftest.py) is kept:
this bound takes the earlier of the two deadlines, hands an outer expiry to the outer handler,
and re-arms the outer alarm with what is left of it. Off the main thread (where signals cannot
be handled) and where there is no SIGALRM, steps run unbounded.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable, Iterator

DEFAULT_STEP_BOUND_S = 120.0  # a step of these replays takes milliseconds; a loaded machine, seconds
START_BOUND_S = 600.0
REARM_S = 5.0  # building a vLLM engine and its connector (model load, KV caches): minutes at most


class ConnectorTimeout(Exception):
    """A step (or a start) ran past its bound: the run's verdict names the call and request."""


class CallsInProgress:
    """Which connector calls are running now, innermost last: (name, request id or None)."""

    def __init__(self) -> None:
        self.stack: list[tuple[str, str | None]] = []

    def describe(self) -> str:
        if not self.stack:
            return "no connector call was running (the engine's own code)"
        name, req_id = self.stack[-1]
        return f"in {name}" + (f" for request {req_id}" if req_id is not None else "")


def request_id_of(args: tuple) -> str | None:
    """The request a connector call is about: its first argument with a ``request_id``."""
    for arg in args[:1]:
        req_id = getattr(arg, "request_id", None)
        if isinstance(req_id, str):
            return req_id
    return None


def bound_methods(target, names, calls: CallsInProgress) -> None:
    """Wrap each named method of ``target`` so that ``calls`` knows it is running."""
    for name in names:
        method = getattr(target, name, None)
        if method is None:
            continue

        def tracked(*args, _method=method, _name=name, **kwargs):
            calls.stack.append((_name, request_id_of(args)))
            try:
                return _method(*args, **kwargs)
            finally:
                calls.stack.pop()

        setattr(target, name, tracked)


def _usable() -> bool:
    return hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _alarm(seconds: float, interval: float, on_alarm: Callable[[], None]) -> Iterator[None]:
    """Run ``on_alarm`` every ``interval`` seconds, the first time after ``seconds``, keeping an
    alarm armed outside (its handler runs when its deadline comes first; it is re-armed after)."""
    outer_handler = signal.getsignal(signal.SIGALRM)
    outer_left, _ = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()

    def expire(signum, frame):
        if outer_left and time.monotonic() - started >= outer_left - 0.01 and callable(outer_handler):
            signal.signal(signal.SIGALRM, outer_handler)
            outer_handler(signum, frame)  # the outer bound is due first: its verdict
        on_alarm()

    first = min(seconds, outer_left) if outer_left else seconds
    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, first, min(interval, outer_left) if outer_left else interval)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer_handler)
        if outer_left:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - started), 0.01))


@contextlib.contextmanager
def deadline(seconds: float | None, message: Callable[[], str]) -> Iterator[None]:
    """Raise ConnectorTimeout(message()) inside the block once it has run ``seconds`` (None: no
    bound), and again every few seconds should the code swallow it."""
    if seconds is None or not _usable():
        yield
        return

    def expired() -> None:
        raise ConnectorTimeout(message())

    with _alarm(seconds, REARM_S, expired):
        yield


class StepBound:
    """The per-step bound of one replay: ``with bound.watching():`` around the step loop, and
    ``bound.at(n)`` as each step starts (an assignment: no system call per step). The alarm fires
    every ``seconds``; when the step has not changed since the previous alarm, the step has run
    at least ``seconds`` (at most twice that): ConnectorTimeout naming the call in progress."""

    def __init__(self, seconds: float | None = DEFAULT_STEP_BOUND_S, calls: CallsInProgress | None = None):
        if seconds is not None and not seconds > 0:
            raise ValueError(f"a step bound must be above 0 seconds, got {seconds!r}")
        self.seconds = seconds
        self.calls = calls or CallsInProgress()
        self._step = 0
        self._ticks = 0  # steps started: what the alarm compares
        self._ticks_seen = -1

    def at(self, step: int) -> None:
        self._step = step
        self._ticks += 1

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        if self.seconds is None or not _usable():
            yield
            return
        seconds = self.seconds
        self._ticks_seen = -1

        def check() -> None:
            if self._ticks != self._ticks_seen:
                self._ticks_seen = self._ticks
                return
            raise ConnectorTimeout(f"step {self._step} did not finish within {seconds:g} s: {self.calls.describe()}")

        with _alarm(seconds, seconds, check):
            yield

    def start(self):
        """A bound on building the engine and the connector (minutes: model load, KV caches)."""
        seconds = None if self.seconds is None else max(START_BOUND_S, self.seconds)
        return deadline(seconds, lambda: f"the connector did not start within {seconds:g} s: "
                                         f"{self.calls.describe()}")
