"""The progress watchdog: a replay that goes round in circles stops with a clear verdict.

Progress is a request finishing, or a forward pass writing a position no earlier pass wrote for
that request (past its high-water mark: recomputing what a preemption threw away is not
progress). While requests are alive, a run with no progress for ``window`` steps is a livelock
(docs/engine.md, "The watchdog"). The window is ``WATCHDOG_STEPS`` plus twice the store
completion delay, longer than any legitimate wait: a load or a deferred lookup lasts a few
completion delays, and a request waiting for blocks waits on others that do progress.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Collection, Iterable, Sequence

WATCHDOG_STEPS = 1000


@dataclass(frozen=True)
class Livelock:
    step: int  # the step the run stopped at
    window: int  # steps without progress
    last_progress_step: int
    preemptions: dict[str, int]  # per request, within the window: the cycle
    alive: tuple[str, ...]  # requests alive when it stopped

    def describe(self) -> str:
        cycle = ", ".join(f"{req_id} x{count}" for req_id, count in sorted(
            self.preemptions.items(), key=lambda item: (-item[1], item[0]))[:8]) or "none"
        return (f"livelock: no request finished and no new token was computed for {self.window} steps "
                f"(last progress at step {self.last_progress_step}); {sum(self.preemptions.values())} "
                f"preemptions in that window ({cycle}); {len(self.alive)} requests alive")

    def as_dict(self) -> dict:
        return {"step": self.step, "window": self.window, "last_progress_step": self.last_progress_step,
                "preemptions": dict(self.preemptions), "alive": list(self.alive)}


class ProgressWatchdog:
    def __init__(self, store_completion_steps: int, window: int | None = None):
        self.window = window if window is not None else WATCHDOG_STEPS + 2 * store_completion_steps
        self._high_water: dict[str, int] = {}  # request -> positions written so far, at most
        self._last_progress = 0
        self._finished = 0
        self._preemptions: Counter[str] = Counter()

    def preempted(self, req_id: str) -> None:
        self._preemptions[req_id] += 1

    def observe(self, step: int, scheduled: Sequence, finished: int, alive: Collection[str]) -> Livelock | None:
        """After a step of the simulator: note its progress; a verdict once the window passed
        without any."""
        return self.observe_ends(step, ((item.live.req_id, item.start + item.num_tokens) for item in scheduled),
                                 finished, alive)

    def observe_ends(self, step: int, written_ends: Iterable[tuple[str, int]], finished: int,
                     alive: Collection[str]) -> Livelock | None:
        """After a step, given per scheduled request the position its pass wrote up to (any
        engine: the vLLM replays call this directly)."""
        progressed = finished != self._finished
        self._finished = finished
        high_water = self._high_water
        for req_id, end in written_ends:
            if end > high_water.get(req_id, 0):
                high_water[req_id] = end
                progressed = True
        if progressed or not alive:  # nothing alive: waiting for arrivals is not a livelock
            self._last_progress = step
            self._preemptions.clear()
            return None
        if step - self._last_progress < self.window:
            return None
        return Livelock(step, step - self._last_progress, self._last_progress, dict(self._preemptions),
                        tuple(alive))
