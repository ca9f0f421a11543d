"""The main job shows every seed fix: ``kvoffload bench`` replays the reference with each of the
fixes of the founding bug reports switched off, and on the bundled workloads each one moves a
figure of the bench table. The reference keeps every finished request's last chunk (1.0)."""

from __future__ import annotations

import pytest

from kvoffload.choice import ConnectorChoice
from kvoffload.cli.bench import BENCH_CONNECTORS, SEED_FIXES, TABLE_METRICS
from kvoffload.runner import replay_workload
from kvoffload.workloads import load_workload


@pytest.fixture(scope="module")
def reference_metrics():
    return {name: replay_workload(load_workload(name), ConnectorChoice.build()).result["metrics"]
            for name in ("multi-turn-small", "spec-decode-small", "shared-prefix-small")}


def test_the_bench_runs_the_reference_without_each_seed_fix():
    assert [disabled for preset, disabled in BENCH_CONNECTORS if preset is None] == [
        (), *((fix,) for fix in SEED_FIXES)]
    assert "last_chunk_offloaded_rate" in TABLE_METRICS


def test_the_reference_offloads_every_finished_requests_last_chunk(reference_metrics):
    assert {name: m["last_chunk_offloaded_rate"] for name, m in reference_metrics.items()} == dict.fromkeys(
        reference_metrics, 1.0)


# Where each fix shows at test size, and what it moves (the full-size workloads: docs/fixes.md,
# "Each fix moves a figure").
SHOWS = [
    ("last_block_at_finish", "multi-turn-small", "last_chunk_offloaded_rate"),
    ("flush_submits_before_wait", "spec-decode-small", "poisoned_loads"),
    ("final_token_watermark", "spec-decode-small", "poisoned_loads"),
    ("deferred_finish_signal", "multi-turn-small", "lifecycle_violations"),
]


@pytest.mark.parametrize("fix, workload, metric", SHOWS, ids=[fix for fix, _, _ in SHOWS])
def test_each_seed_fix_switched_off_moves_a_figure_of_the_bench(reference_metrics, fix, workload, metric):
    off = replay_workload(load_workload(workload), ConnectorChoice.build(disabled=(fix,))).result["metrics"]
    on = reference_metrics[workload]
    assert metric in TABLE_METRICS and off[metric] != on[metric]
    assert (off[metric] < on[metric]) if metric.endswith("_rate") else (off[metric] > on[metric] == 0)
