"""Metrics on tiny workloads whose answers are known by hand."""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.engine import replay
from kvoffload.engine.requests import RequestSpec
from kvoffload.metrics import compute_metrics, percentile

TINY = EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64)


def conversation(filler: bool = False):
    """Turn 1: prompt 6 + 3 length-capped outputs = 9 tokens; its last written position, 7,
    closes chunk 1. Turn 2 resends all 9 tokens plus 4 new ones. With ``filler``, a 30-block
    prompt between them evicts turn 1's chunk-1 block from the GPU prefix cache (vLLM caches it
    at turn 1's last output), so only the offload tier can serve it."""
    first = RequestSpec("t1", tuple(range(10, 16)), (20, 21, 22), stop="length")
    evictor = RequestSpec("f", tuple(range(1000, 1120)), (50,), stop="length", parent="t1", think_steps=0)
    second = RequestSpec("t2", first.prompt_token_ids + first.output_token_ids + (30, 31, 32, 33), (40, 41),
                         parent="t1", think_steps=2)
    return [first, evictor, second] if filler else [first, second]


@pytest.mark.parametrize("fixes, expected", [(Fixes(), 1.0), (Fixes().without("last_block_at_finish"), 0.0)])
def test_last_block_hit_rate_of_a_two_turn_conversation(fixes, expected):
    metrics = compute_metrics(replay(conversation(filler=True), TINY.replace(scheduling="async"), fixes))
    assert metrics["last_block_eligible"] == 1
    assert metrics["last_block_hit_rate"] == expected


def test_store_delays_known_by_construction():
    """Sync: the 8-token prefill writes chunks 0 and 1 in step 0; their store job is built in
    that step's schedule, queued after the forward and submitted at the start of step 1 (delay 1).
    The copy runs after step 1's forward and is reported one step later: loadable in step 2."""
    request = RequestSpec("r", tuple(range(100, 108)), (1,), stop="length")
    record = replay([request], TINY.replace(store_completion_steps=1), Fixes())
    metrics = compute_metrics(record)
    assert record.store_submit_delays == [1, 1]
    assert (metrics["store_submit_delay_steps_p50"], metrics["store_submit_delay_steps_p99"]) == (1, 1)
    assert (metrics["store_visible_delay_steps_p50"], metrics["store_visible_delay_steps_p99"]) == (2, 2)
    immediate = compute_metrics(replay([request], TINY.replace(store_completion_steps=0), Fixes()))
    assert immediate["store_visible_delay_steps_p50"] == 1


def test_hit_rates_and_counts():
    metrics = compute_metrics(replay(conversation(), TINY.replace(scheduling="async"), Fixes()))
    assert (metrics["requests"], metrics["prompt_tokens"], metrics["output_tokens"]) == (2, 6 + 13, 5)
    # Turn 1 asks the connector for its one full chunk (4 tokens, a miss). Turn 2 finds chunks 0
    # and 1 in the GPU cache (vLLM caches turn 1's blocks at its last output) and asks for
    # chunk 2 (4 tokens): positions 8-11 were never written, a miss.
    assert metrics["gpu_hit_rate"] == pytest.approx(8 / (6 + 13))
    assert metrics["offload_hit_rate"] == pytest.approx(0 / (4 + 4))
    assert metrics["poisoned_loads"] == metrics["crashes"] == metrics["leaked_requests"] == 0


def test_a_rejected_draft_does_not_count_as_written_kv():
    """k=2, prompt 5. Step 1 writes positions 5-7 but rejects both drafts: slot 7 holds a draft.
    Step 2 writes 6-8 and accepts both: chunk 1 (positions 4-7) is really written at step 2. Its
    store is built at step 3 (the watermark needs num_tokens past 8) and submitted at step 4."""
    request = RequestSpec("A", (10, 11, 12, 13, 14), (15, 16, 17, 18, 19, 20, 21), accept_counts=(0, 2, 2))
    record = replay([request], TINY.replace(spec_tokens=2), Fixes(), trace=True)
    built = [(event["ts"], event["args"]["chunks"]) for event in record.trace_events]
    assert built == [(0, [0]), (3, [1])]
    assert record.store_submit_delays == [1, 4 - 2]


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([5], 99) == 5
    assert percentile([1, 2, 3, 4], 50) == 2
    assert percentile(list(range(1, 101)), 99) == 99


def test_same_inputs_give_the_same_metrics():
    config = TINY.replace(scheduling="async", spec_tokens=0)
    measured = {"connector_us_per_step", "copy_gb_per_s", "sim_requests_per_s"}
    first = {k: v for k, v in compute_metrics(replay(conversation(), config)).items() if k not in measured}
    second = {k: v for k, v in compute_metrics(replay(conversation(), config)).items() if k not in measured}
    assert first == second
