"""The workload's side of a run: when each request arrives and when a scripted abort fires.

A root request arrives at its ``arrival_step``; a follow-up arrives ``think_steps`` steps after
its parent finished (so the arrival order of a multi-turn run depends on the run itself).
"""

from __future__ import annotations

from typing import Sequence

from kvoffload.core.types import ConfigError
from kvoffload.engine.requests import RequestSpec


class ArrivalFeed:
    def __init__(self, requests: Sequence[RequestSpec]):
        specs = {spec.req_id: spec for spec in requests}
        if len(specs) != len(requests):
            raise ConfigError("request ids must be unique")
        self._children: dict[str, list[RequestSpec]] = {}  # parent id -> follow-ups, in order
        self._arrivals: list[tuple[int, int, RequestSpec]] = []  # (step, order, spec), sorted
        for order, spec in enumerate(requests):
            if spec.parent is None:
                self._arrivals.append((spec.arrival_step, order, spec))
            elif spec.parent not in specs:
                raise ConfigError(f"request {spec.req_id}: unknown parent {spec.parent!r}")
            else:
                self._children.setdefault(spec.parent, []).append(spec)
        self._arrivals.sort(key=lambda item: (item[0], item[1]))
        self._arrival_order = len(requests)
        self._aborts: dict[int, list[str]] = {}  # step -> requests to abort then

    def has_pending(self) -> bool:
        """Requests still to arrive (follow-ups count once their parent finished)."""
        return bool(self._arrivals)

    def next_arrival_step(self) -> int | None:
        """The step of the next arrival already known (follow-ups join once their parent finished)."""
        return self._arrivals[0][0] if self._arrivals else None

    def arrivals(self, step: int) -> list[RequestSpec]:
        """The requests arriving at ``step``, in order; their scripted aborts are scheduled."""
        arrived = []
        arrivals = self._arrivals
        while arrivals and arrivals[0][0] <= step:
            spec = arrivals.pop(0)[2]
            if spec.abort_after_steps is not None:
                self._aborts.setdefault(step + spec.abort_after_steps, []).append(spec.req_id)
            arrived.append(spec)
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
            index = len(self._arrivals)
            while index > 0 and self._arrivals[index - 1][0] > arrival:
                index -= 1
            self._arrivals.insert(index, (arrival, self._arrival_order, child))
