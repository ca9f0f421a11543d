"""One replay of a workload through a connector configuration, into a result dict.

Shared by ``kvoffload run``, ``kvoffload bench`` and the ASV suite so the three agree on what
a run is.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from kvoffload.choice import ConnectorChoice
from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S
from kvoffload.engine.record import POISONED_LISTED, RunRecord
from kvoffload.engines import SIMULATOR, engine_named
from kvoffload.metrics import MODEL_METRICS, compute_metrics
from kvoffload.results import build_result
from kvoffload.workloads import Workload


@dataclass(frozen=True)
class RunOutcome:
    result: dict
    record: RunRecord

    @property
    def failed(self) -> bool:
        """The run did not complete: a connector crash, a livelock, the max_steps cap, or
        requests left stuck (nothing scheduled for them while nothing else progressed)."""
        record = self.record
        return (record.crash is not None or record.livelock is not None or record.max_steps_reached
                or bool(record.stuck_requests))


def replay_workload(workload: Workload, choice: ConnectorChoice,
                    on_step: Callable[[int, int], None] | None = None, trace: bool = False,
                    max_steps: int | None = None, engine: str = SIMULATOR, engine_options: dict | None = None,
                    step_bound_s: float | None = DEFAULT_STEP_BOUND_S) -> RunOutcome:
    """``step_bound_s``: an engine step (a connector call in it) running longer stops the run with
    a verdict naming the call (engine/bounded.py); None: unbounded."""
    replayer = engine_named(engine, **(engine_options or {}))
    replayer.step_bound_s = step_bound_s
    record = replayer.replay(workload, choice, on_step, trace, max_steps)
    unmeasured = set(replayer.unmeasured) | (set() if record.model_run else MODEL_METRICS)
    metrics = {name: value for name, value in compute_metrics(record).items() if name not in unmeasured}
    error = None
    if record.crash is not None:
        error = {"message": record.crash, "step": record.crash_step, "type": record.crash_type,
                 "could_not_start": record.start_failed, "connector_frames": list(record.crash_frames),
                 "traceback": record.crash_traceback}
    elif record.livelock is not None:
        error = {"message": record.livelock_message, "step": record.livelock["step"]}
    elif record.max_steps_reached:
        error = {"message": f"stopped at the max_steps cap ({max_steps}) with "
                            f"{len(record.stuck_requests)} requests unfinished", "step": record.steps}
    elif record.stuck_requests:
        error = {"message": record.stuck_message or f"{len(record.stuck_requests)} requests stuck: nothing was "
                 f"scheduled for them while nothing else progressed", "step": record.steps}
    result = build_result(
        workload={"name": workload.name, "source": str(workload.source), "seed": workload.seed,
                  "requests": len(workload.requests)},
        connector=choice.describe(),
        config={**dataclasses.asdict(workload.engine), "engine": engine, "connector": choice.source,
                **getattr(replayer, "recorded", {})},
        metrics=metrics, seed=workload.engine.seed,
        error=error)
    # What the livelock and invariant_violations metrics count, in detail.
    result["diagnostics"] = {"livelock": record.livelock,
                             "invariant_violations": list(record.invariant_violations)}
    # The whole store-delay distributions ({steps: chunks}), not only the percentiles: the report draws them.
    if record.engine_settings is not None:  # a real model's run: what ran, and what the connector counted
        result["engine_settings"] = record.engine_settings
        result["connector_stats"] = record.connector_stats
    if record.oracle is not None:
        result["oracle"] = record.oracle
    if record.poisoned:  # each as request, step, chunk and bad slots: the first ones, and how many
        result["poisoned_loads"] = {"count": len(record.poisoned),
                                    "first": [dataclasses.asdict(p) for p in record.poisoned[:POISONED_LISTED]]}
    result["distributions"] = {name: {str(k): v for k, v in sorted(Counter(delays).items())} for name, delays in
                               (("store_submit_delay_steps", record.store_submit_delays),
                                ("store_visible_delay_steps", record.store_visible_delays))}
    served = served_nothing(workload, choice, engine, record)
    if served is not None:
        result["served_nothing"] = served
    return RunOutcome(result, record)


def served_nothing(workload: Workload, choice: ConnectorChoice, engine: str, record: RunRecord) -> dict | None:
    """A connector that supplied no token where the reference (all fixes, on the simulator)
    supplies some: a connector that failed quietly (its worker never started, its tier never
    filled). None when it served some, crashed, ran no connector, or is the simulator's reference."""
    if (record.connector_hit_tokens_admitted or record.crash is not None or choice.source == "off"
            or (engine == SIMULATOR and choice.source == "reference")):
        return None
    from kvoffload.engine.engine import Engine

    reference = Engine(workload.requests, workload.engine, ConnectorChoice.build().fixes).run()
    if not reference.connector_hit_tokens_admitted:
        return None
    return {"reference_hit_tokens": reference.connector_hit_tokens_admitted,
            "message": f"the connector served no token; the reference serves {reference.connector_hit_tokens_admitted:,} "
                       "tokens of this workload (simulator, all fixes)"}


def chrome_trace(record: RunRecord) -> dict:
    """The run's transfer jobs as a Chrome trace (chrome://tracing, Perfetto): one row per
    request, one instant event per job at the step that built it (1 step = 1 µs on the axis)."""
    return {"traceEvents": record.trace_events, "displayTimeUnit": "ms",
            "otherData": {"time_unit": "engine step"}}
