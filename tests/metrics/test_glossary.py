"""Every metric of the glossary on a run record filled by hand: each expected value is worked out
in the comment beside it, and each case is chosen so that a wrong numerator, a wrong denominator
or a wrong percentile rank gives a different number."""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.engine import Engine, replay
from kvoffload.engine.record import Continuation, FenceViolation, PoisonedLoad, RunRecord
from kvoffload.engine.requests import RequestSpec
from kvoffload.metrics import METRIC_NAMES, compute_metrics, percentile


def hand_record() -> RunRecord:
    record = RunRecord(
        steps=250, requests=10, finished_requests=9, prompt_tokens=40, output_tokens=30,
        gpu_hit_tokens=5, admitted_prompt_tokens=20, preemptions=3, lifecycle_violations=3,
        connector_seconds=0.5, modeled_seconds=1.5, wall_seconds=4.0,
        store_bytes=3_000_000_000, store_seconds=1.0, load_bytes=1_000_000_000, load_seconds=1.0,
        crash="KeyError: 'A'", stuck_requests=("S",), leaked_requests=("L1", "L2"),
        connector_stats={"hit_tokens": 7, "queried_tokens": 30, "lookups": 4},
        # 6 answered lookups ended in 4 admissions, which asked for 12 tokens and got 3.
        connector_lookups=6, connector_lookup_tokens=30, admissions=4, admission_asked_tokens=12,
        admission_hit_tokens=3, invariant_violation_count=5, livelock={"cycle": "r0 <-> r1"},
        # 9 requests finished, 4 of them with a fully-written chunk; 3 of those 4 reached the tier.
        final_chunks=4, final_chunks_offloaded=3,
    )
    record.continuations += [Continuation("c1", "p", eligible=True, served=True),
                             Continuation("c2", "p", eligible=True, served=False),
                             Continuation("c3", "p", eligible=False, served=True)]
    record.poisoned += [PoisonedLoad(4, "c1", 0, 2), PoisonedLoad(4, "c1", 1, 4)]
    record.fence_violations += [FenceViolation(2, 7, "forward"), FenceViolation(3, 7, "load")]
    # 7 values: nearest rank of p50 is ceil(3.5) = 4 -> 4 (a floor rank gives 3); p99 is the 7th -> 7.
    record.store_submit_delays += [5, 1, 4, 2, 7, 3, 6]
    # 98 twos and two tens: p50 = 2, p99 = the 99th value = 10 (p99 computed as p50 gives 2).
    record.store_visible_delays += [10] + [2] * 98 + [10]
    # A real model's timings (the vllm engine). TTFT, 5 values: p50 is the 3rd smallest, 3 ms (a
    # floor rank gives 2 ms); p99 the 5th, 5 ms. TPOT: 98 of 10 ms, then 50 and 30: p99 is the
    # 99th value, 30 ms (the largest, 50, would be p100).
    record.model_run = True
    record.ttft_seconds += [0.005, 0.001, 0.004, 0.002, 0.003]
    record.tpot_seconds += [0.010] * 98 + [0.050, 0.030]
    record.prefill_tokens_computed, record.prefill_tokens_saved = 25, 11
    record.engine_start_seconds = 12.5
    record.oracle = {"mismatches": ["request a: ...", "request b: ..."]}
    return record


EXPECTED = {
    "last_block_hit_rate": 1 / 2,  # eligible: c1 (served), c2 (not); c3 is not eligible
    "last_block_eligible": 2,
    "last_chunk_offloaded_rate": 3 / 4,  # of finished requests with a full chunk (not 3 / 9 finished)
    "offload_hit_rate": 3 / 12,  # per admission: tokens supplied / tokens asked (not 7 / 30 per lookup)
    "repeated_lookups": 6 - 4,  # answered lookups that ended in no admission
    "livelock": 1,
    "invariant_violations": 5,
    "gpu_hit_rate": 5 / 20,  # GPU hit tokens / prompt tokens of first admissions (not all 40)
    "poisoned_loads": 2,
    "lifecycle_violations": 3,
    "leaked_requests": 2,
    "stuck_requests": 1,
    "crashes": 1,
    "fence_violations": 2,
    "store_submit_delay_steps_p50": 4,
    "store_submit_delay_steps_p99": 7,
    "store_visible_delay_steps_p50": 2,
    "store_visible_delay_steps_p99": 10,
    "connector_us_per_step": 0.5e6 / 250,  # 2000 us
    "tokens_per_s_modeled": 30 / 1.5,
    "copy_gb_per_s": (3 + 1) / (1.0 + 1.0),  # both directions over both directions' time
    "sim_requests_per_s": 10 / 4.0,
    "output_tokens_per_s": 30 / 4.0,  # over the replay's wall time (not the modelled 1.5 s)
    "total_tokens_per_s": (40 + 30) / 4.0,  # prompt and output tokens
    "ttft_ms_p50": 3.0,
    "ttft_ms_p99": 5.0,
    "tpot_ms_p50": 10.0,
    "tpot_ms_p99": 30.0,
    "prefill_tokens_computed": 25,
    "prefill_tokens_saved": 11,
    "output_mismatches": 2,
    "wall_seconds": 4.0,
    "engine_start_seconds": 12.5,
    "requests": 10,
    "steps": 250,
    "prompt_tokens": 40,
    "output_tokens": 30,
    "preemptions": 3,
}


def test_every_glossary_metric_has_a_hand_computed_value():
    assert set(EXPECTED) == set(METRIC_NAMES), "a metric was added or renamed: compute its case by hand"


@pytest.mark.parametrize("name", METRIC_NAMES)
def test_metric_of_the_hand_record(name):
    value = compute_metrics(hand_record())[name]
    assert value == pytest.approx(EXPECTED[name]), name
    assert type(value) is type(EXPECTED[name]) or isinstance(EXPECTED[name], float)


def test_empty_denominators_are_none_not_zero():
    metrics = compute_metrics(RunRecord())
    ratios = ("last_block_hit_rate", "last_chunk_offloaded_rate", "offload_hit_rate", "gpu_hit_rate", "connector_us_per_step",
              "tokens_per_s_modeled", "copy_gb_per_s", "sim_requests_per_s", "store_submit_delay_steps_p50",
              "store_submit_delay_steps_p99", "store_visible_delay_steps_p50", "store_visible_delay_steps_p99")
    assert {name: metrics[name] for name in ratios} == dict.fromkeys(ratios)
    assert metrics["crashes"] == metrics["fence_violations"] == metrics["last_block_eligible"] == 0
    assert metrics["livelock"] == metrics["invariant_violations"] == metrics["repeated_lookups"] == 0


@pytest.mark.parametrize("values, q, expected", [
    (list(range(1, 11)), 99, 10),  # rank ceil(9.9) = 10; a floor rank gives 9
    (list(range(1, 11)), 50, 5),  # rank 5 exactly
    (list(range(1, 8)), 50, 4),  # rank ceil(3.5) = 4; floor gives 3
    ([9, 1, 5], 0, 1),  # rank max(1, 0) = 1: the smallest
    ([9, 1, 5], 100, 9),
    (list(range(100, 0, -1)), 99, 99),  # order of the input does not matter
])
def test_percentile_is_the_nearest_rank(values, q, expected):
    assert percentile(values, q) == expected


def test_a_fence_violation_made_on_purpose_is_counted(fence_story):
    """A's freed final block goes to B (a 30-block prompt, admitted as A finishes) in the schedule
    that builds A's final store; without the worker's submit-before-wait the store copies B's KV:
    exactly one block, written by a forward, and C loads it."""
    (a, c, b), config = fence_story
    broken = replay([a, c, b], config, Fixes().without("flush_submits_before_wait"), max_steps=200)
    fixed = replay([a, c, b], config, Fixes(), max_steps=200)
    assert compute_metrics(broken)["fence_violations"] == len(broken.fence_violations) == 1
    assert compute_metrics(broken)["poisoned_loads"] == 1
    assert compute_metrics(fixed)["fence_violations"] == compute_metrics(fixed)["poisoned_loads"] == 0


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_last_block_of_a_parent_whose_length_is_a_multiple_of_the_chunk(scheduling):
    """A: prompt 6 + 2 outputs = 8 tokens, a multiple of the 4-token chunk. Its final token is
    never computed, so its last fully-written chunk is chunk 0 (positions 0-3), not chunk 1. The
    GPU cache forgets A before C (A's 8 tokens + 4) arrives: C gets chunk 0 from the connector,
    which is all the metric may ask for: 1 eligible continuation, served (1.0)."""
    config = EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, max_num_seqs=8,
                          max_num_batched_tokens=64, scheduling=scheduling)
    a = RequestSpec("A", tuple(range(10, 16)), (20, 21))
    c = RequestSpec("C", a.prompt_token_ids + a.output_token_ids + (30, 31, 32, 33), (40, 41),
                    parent="A", think_steps=3)
    engines = []

    def forget_gpu_cache(next_step, finished):
        if finished:
            engines[0].pool.uncache_free_blocks()

    engines.append(Engine([a, c], config, Fixes(), max_steps=200, on_step=forget_gpu_cache))
    metrics = compute_metrics(engines[0].run())
    assert (metrics["last_block_eligible"], metrics["last_block_hit_rate"]) == (1, 1.0)
