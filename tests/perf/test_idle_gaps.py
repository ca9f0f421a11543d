"""Idle gaps between arrivals are skipped in one jump, with the metrics of a step-by-step walk.

A step where nothing is live, in flight or unreported can only charge the modelled step
overhead; the engine jumps to the next arrival and charges the gap at once. The story: the same
replays with the jump and with the walk agree on every metric that is not a wall-clock
measurement, and a trace with a gap of ten million steps finishes having run a handful of steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.engine.engine import Engine
from kvoffload.metrics import compute_metrics
from kvoffload.metrics import MEASURED_METRICS
from kvoffload.workloads import load_workload


def _replay(workload, skip_idle: bool):
    steps_run = []
    record = Engine(workload.requests, workload.engine, Fixes(), skip_idle=skip_idle,
                    on_step=lambda step, finished: steps_run.append(step)).run()
    metrics = {name: value for name, value in compute_metrics(record).items() if name not in MEASURED_METRICS}
    return metrics, len(steps_run)


def _gap_trace(path: Path, gap_ms: int, output_length: int = 12) -> Path:
    """Two bursts of three requests sharing a prefix, ``gap_ms`` apart (20 ms per step)."""
    lines = []
    for burst in range(2):
        for i in range(3):
            lines.append({"timestamp": burst * gap_ms + 40 * i, "input_length": 700 + 100 * i,
                          "output_length": output_length, "hash_ids": [1, 2 + 10 * burst + i]})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("scheduling", ["sync", "async"])
@pytest.mark.parametrize("name", ["multi-turn-small", "shared-prefix-small", "gap-trace"])
def test_jumping_over_idle_steps_gives_the_metrics_of_walking_them(tmp_path, name, scheduling):
    settings = {"scheduling": scheduling}
    spec = name
    if name == "gap-trace":  # one-token answers, slow store completions: stores in flight at the gap
        spec = f"mooncake:{_gap_trace(tmp_path / 'gap.jsonl', gap_ms=400_000, output_length=1)}"
        settings["store_completion_steps"] = "8"
    workload = load_workload(spec, settings)
    jumped, jumped_steps = _replay(workload, skip_idle=True)
    walked, walked_steps = _replay(workload, skip_idle=False)
    assert jumped == walked
    assert walked_steps == walked["steps"]
    if name == "gap-trace":  # the 20,000-step gap is one jump
        assert walked["steps"] > 20_000 and jumped_steps < 1_000


def test_a_gap_of_ten_million_steps_costs_a_handful_of_steps(tmp_path):
    workload = load_workload(f"mooncake:{_gap_trace(tmp_path / 'gap.jsonl', gap_ms=200_000_000)}")
    metrics, steps_run = _replay(workload, skip_idle=True)
    assert metrics["steps"] > 10_000_000
    assert steps_run < 1_000
    assert metrics["requests"] == 6 and metrics["stuck_requests"] == 0 and metrics["leaked_requests"] == 0
