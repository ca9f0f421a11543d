"""A failed invariant check is a result: counted in the metrics, listed in the result file."""

from __future__ import annotations

from kvoffload.core.fixes import Fixes
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.engine import Engine, EngineInvariantError
from kvoffload.engine.requests import RequestSpec
from kvoffload.metrics import compute_metrics
from kvoffload.runner import ConnectorChoice, replay_workload
from kvoffload.workloads import load_workload


def tokens(seed: int, n: int) -> tuple[int, ...]:
    return tuple((seed * 7919 + i * 104729) % 30000 + 3 for i in range(n))


def leaky_engine(strict: bool) -> Engine:
    """An engine whose pool loses a block at step 3: the pool's accounting check fails after."""
    requests = [RequestSpec("A", tokens(1, 40), tokens(2, 12))]
    engine = Engine(requests, EngineConfig(gpu_blocks=32, block_size=16), Fixes(), strict=strict)
    engine.on_step = lambda step, finished: engine.pool.allocate(1) if step == 3 else None
    return engine


def test_a_lenient_run_counts_every_failure_and_keeps_the_first_with_step_and_rule():
    record = leaky_engine(strict=False).run()
    assert record.invariant_violation_count >= 5
    assert compute_metrics(record)["invariant_violations"] == record.invariant_violation_count
    first = record.invariant_violations[0]
    assert first["rule"] == "block-pool" and first["step"] == 3
    assert "referenced by no request" in first["message"]
    assert len(record.invariant_violations) == 5  # the first few; the count has them all


def test_a_strict_run_stops_at_the_first_as_a_crash():
    record = leaky_engine(strict=True).run()
    assert record.crash.startswith(f"{EngineInvariantError.__name__}: block-pool: ")
    assert record.crash_step == 3 and record.invariant_violation_count == 0


def test_the_reference_shows_none_and_the_result_file_says_so():
    outcome = replay_workload(load_workload("multi-turn-small"), ConnectorChoice.build())
    assert outcome.result["metrics"]["invariant_violations"] == 0
    assert outcome.result["diagnostics"] == {"livelock": None, "invariant_violations": []}
    assert not outcome.failed
