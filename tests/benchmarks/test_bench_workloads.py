"""bench_workloads: each replay-track class runs once on the -small workload of its kind.

The suite's classes replay the full workloads under asv; here the same code replays the -small
definitions, and every tracked number is checked to be the lower-is-better form of a metric.
"""

from __future__ import annotations

import math
import pickle

import pytest

from kvoffload.runner import ConnectorChoice, replay_workload
from kvoffload.workloads import load_workload

TRACK_CLASSES = ("TrackSharedPrefix", "TrackMultiTurn", "TrackSpecDecode")
# track method suffix -> tracked metric name, where they differ
METRIC_OF = {f"store_{kind}_delay_{p}": f"store_{kind}_delay_steps_{p}"
             for kind in ("submit", "visible") for p in ("p50", "p99")}
TRACK_OF = {metric: method for method, metric in METRIC_OF.items()}
# No eligible continuation (prompt-only offload) or no store at all: a run may have no value.
MAY_LACK_A_VALUE = {"track_last_block_miss_rate"} | {f"track_{m}" for m in METRIC_OF}


@pytest.fixture(scope="module")
def module(suite):
    return suite("bench_workloads")


@pytest.fixture(scope="module")
def caches(module):
    """{class name: setup_cache() of that class, replaying the -small workload}."""
    found = {}
    for name in TRACK_CLASSES:
        bench = getattr(module, name)()
        bench.workload += "-small"
        found[name] = bench.setup_cache()
    return found


def track_values(module, class_name, cache, methods_of):
    cls = getattr(module, class_name)
    bench = cls()
    return {(connector, method): getattr(bench, method)(cache, connector)
            for connector in module.CONNECTORS for method in methods_of(cls)}


@pytest.mark.parametrize("class_name", TRACK_CLASSES)
def test_every_track_runs_and_is_a_number_with_a_unit(module, caches, class_name, methods_of):
    cls = getattr(module, class_name)
    methods = methods_of(cls)
    assert methods and all(m.startswith("track_") for m in methods)
    for method in methods:
        assert getattr(cls, method).unit, f"{class_name}.{method} has no unit"
    cache = caches[class_name]
    values = track_values(module, class_name, cache, methods_of)
    assert all(isinstance(v, float) for v in values.values())
    # NaN (asv's n/a) exactly where the run has no value, and only for metrics that may lack one
    nan = {(connector, method) for (connector, method), v in values.items() if math.isnan(v)}
    missing = {(connector, "track_" + TRACK_OF.get(name, name)) for connector, tracked in cache.items()
               for name, v in tracked.items() if v is None}
    assert nan == missing
    assert {method for _, method in nan} <= MAY_LACK_A_VALUE, nan
    for (connector, method), v in values.items():
        if not math.isnan(v):
            name = METRIC_OF.get(method[len("track_"):], method[len("track_"):])
            assert v == pytest.approx(cache[connector][name]) and v >= 0, (connector, method)
    assert pickle.loads(pickle.dumps(cache)) == cache  # asv pickles the cache between processes


@pytest.mark.parametrize("class_name", TRACK_CLASSES)
def test_the_reference_tracks_zero_harm(module, caches, class_name, methods_of):
    values = track_values(module, class_name, caches[class_name], methods_of)
    for method in ("track_poisoned_loads", "track_lifecycle_violations", "track_leaked_requests",
                   "track_crashes", "track_fence_violations", "track_stuck_requests"):
        assert values[("reference", method)] == 0.0, method


def test_tracked_numbers_are_the_lower_is_better_forms(module):
    metrics = replay_workload(load_workload("multi-turn-small"), ConnectorChoice.build("vllm-0.25")).result["metrics"]
    tracked = module.tracked_metrics(metrics)
    assert tracked["last_block_miss_rate"] == pytest.approx(1 - metrics["last_block_hit_rate"])
    assert tracked["offload_miss_rate"] == pytest.approx(1 - metrics["offload_hit_rate"])
    assert tracked["seconds_per_output_token_modeled"] == pytest.approx(1 / metrics["tokens_per_s_modeled"])
    assert tracked["sim_seconds_per_request"] == pytest.approx(1 / metrics["sim_requests_per_s"])
    assert tracked["store_submit_delay_steps_p99"] == metrics["store_submit_delay_steps_p99"]


def test_the_last_block_fix_shows_as_a_lower_miss_rate(module, caches):
    """multi-turn-small: vLLM 0.25 lacks last_block_at_finish and misses last chunks the reference serves."""
    cache = caches["TrackMultiTurn"]
    bench = module.TrackMultiTurn()
    reference = bench.track_last_block_miss_rate(cache, "reference")
    old = bench.track_last_block_miss_rate(cache, "vllm-0.25")
    # Not 0 for the reference either: with blocks_per_chunk 2, a continuation whose GPU hit ends
    # inside its parent's last chunk has less than a whole chunk to load, which vLLM's
    # complete-chunk rule reports as no hit (docs/design.md, "Connector rules").
    assert old > reference


def test_a_metric_without_a_value_is_nan_for_asv(module, caches):
    """shared-prefix offloads prompts only: no continuation is eligible, asv shows n/a."""
    bench = module.TrackSharedPrefix()
    assert math.isnan(bench.track_last_block_miss_rate(caches["TrackSharedPrefix"], "reference"))


def test_workload_generation_generates_the_workload(module, methods_of):
    bench = module.GenerateWorkload()
    bench.setup("spec-decode-small")
    expected = load_workload("spec-decode-small").requests
    assert methods_of(module.GenerateWorkload) == ["peakmem_generate", "time_generate"]
    for method in methods_of(module.GenerateWorkload):
        bench.generated = None
        assert getattr(bench, method)("spec-decode-small") is None
        assert bench.generated.requests == expected and len(expected) > 0


def test_workloads_resolve_to_this_checkouts_definitions(module):
    path = module.workload_spec("multi-turn")
    assert path.endswith("workloads/multi-turn.toml")
    assert load_workload(path).requests == load_workload("multi-turn").requests
