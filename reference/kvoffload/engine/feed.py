"""The workload's side of a run: when each request arrives and when a scripted abort fires.

A root request arrives at its ``arrival_step``; a follow-up arrives ``think_steps`` steps after
its parent finished (so the arrival order of a multi-turn run depends on the run itself).

A streamed workload (``workloads/stream.py``: a trace, first turns only, in arrival order) is
pulled lazily: the feed reads its (arrival step, build) pairs one ahead and builds a request only
at its arrival step, so a request's tokens exist from its arrival until the engine drops it
(``docs/performance.md``, "Memory and work that follow what is live"). Any other sequence is
taken whole, as it is already in memory.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

from kvoffload.core.types import ConfigError
from kvoffload.engine.requests import RequestSpec

_DONE = None


class ArrivalFeed:
    def __init__(self, requests: Sequence[RequestSpec], check: Callable[[RequestSpec], None] = lambda spec: None):
        """``check(spec)`` runs on every request before it joins the run (the engine's fit check):
        on all of them now for an in-memory list, on each at its arrival for a stream."""
        self._check = check
        self._children: dict[str, list[RequestSpec]] = {}  # parent id -> follow-ups, in order
        self._arrivals: list[tuple[int, int, RequestSpec]] = []  # (step, order, spec), sorted
        self._aborts: dict[int, list[str]] = {}  # step -> requests to abort then
        self._stream: Iterator[tuple[int, Callable[[], RequestSpec]]] | None = None
        self._next: tuple[int, Callable[[], RequestSpec]] | None = _DONE  # the stream's next arrival
        self.num_built = 0  # requests built from the stream so far
        if getattr(requests, "roots_only", False):
            self._stream = requests.arrivals()
            self._next = next(self._stream, _DONE)
            self._arrival_order = 0
            return
        specs = {spec.req_id: spec for spec in requests}
        if len(specs) != len(requests):
            raise ConfigError("request ids must be unique")
        for spec in requests:
            check(spec)
        for order, spec in enumerate(requests):
            if spec.parent is None:
                self._arrivals.append((spec.arrival_step, order, spec))
            elif spec.parent not in specs:
                raise ConfigError(f"request {spec.req_id}: unknown parent {spec.parent!r}")
            else:
                self._children.setdefault(spec.parent, []).append(spec)
        self._arrivals.sort(key=lambda item: (item[0], item[1]))
        self._arrivals.reverse()  # popped from the end: the next arrival is last
        self._arrival_order = len(requests)

    def has_pending(self) -> bool:
        """Requests still to arrive (follow-ups count once their parent finished)."""
        return bool(self._arrivals) or self._next is not _DONE

    def next_arrival_step(self) -> int | None:
        """The step of the next arrival already known (follow-ups join once their parent finished)."""
        steps = [self._arrivals[-1][0]] if self._arrivals else []
        if self._next is not _DONE:
            steps.append(self._next[0])
        return min(steps) if steps else None

    def arrivals(self, step: int) -> list[RequestSpec]:
        """The requests arriving at ``step``, in order; their scripted aborts are scheduled.
        (A stream's arrivals of one step come before follow-ups due then: streams hold no follow-ups.)"""
        arrived = []
        while self._next is not _DONE and self._next[0] <= step:
            spec = self._next[1]()
            self.num_built += 1
            self._check(spec)
            arrived.append(spec)
            self._next = next(self._stream, _DONE)
        arrivals = self._arrivals
        while arrivals and arrivals[-1][0] <= step:
            arrived.append(arrivals.pop()[2])
        for spec in arrived:
            if spec.abort_after_steps is not None:
                self._aborts.setdefault(step + spec.abort_after_steps, []).append(spec.req_id)
        return arrived

    def aborts(self, step: int) -> list[str]:
        return self._aborts.pop(step, [])

    def has_follow_ups(self, req_id: str) -> bool:
        """Whether follow-ups still wait for ``req_id`` to finish."""
        return req_id in self._children

    def parent_finished(self, parent_id: str, step: int) -> None:
        """Queue the follow-ups of a finished request: each arrives after its think time."""
        for child in self._children.pop(parent_id, ()):
            arrival = step + 1 + child.think_steps
            self._arrival_order += 1
            # Reversed order: insert before every arrival due later than this one (ties after it).
            index = 0
            while index < len(self._arrivals) and self._arrivals[index][0] > arrival:
                index += 1
            self._arrivals.insert(index, (arrival, self._arrival_order, child))
