"""Metrics on tiny workloads whose answers are known by hand."""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.engine import replay
from kvoffload.engine.record import RunRecord
from kvoffload.engine.requests import RequestSpec
from kvoffload.metrics import MEASURED_METRICS, compute_metrics, percentile

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
    # Turn 1 is admitted asking for its whole 6-token prompt (a miss). Turn 2 finds chunks 0 and 1
    # in the GPU cache (vLLM caches turn 1's blocks at its last output) and asks for the other 5
    # of its 13 tokens: positions 8-11 were never written, a miss.
    assert metrics["gpu_hit_rate"] == pytest.approx(8 / (6 + 13))
    assert metrics["offload_hit_rate"] == pytest.approx(0 / (6 + 5))
    assert metrics["repeated_lookups"] == 0


def test_offload_hit_rate_of_a_conversation_whose_history_left_the_gpu():
    """The filler evicts turn 1's chunk-1 block: turn 2 finds chunk 0 in the GPU cache and asks
    for the other 9 of its 13 tokens; the offload tier serves chunk 1 (4 tokens). Per admission:
    t1 asks 6 (0 supplied), the filler 120 (0), t2 9 (4)."""
    record = replay(conversation(filler=True), TINY.replace(scheduling="async"), Fixes())
    metrics = compute_metrics(record)
    assert (record.admissions, record.admission_asked_tokens, record.admission_hit_tokens) == (3, 6 + 120 + 9, 4)
    assert metrics["offload_hit_rate"] == pytest.approx(4 / (6 + 120 + 9))
    assert metrics["poisoned_loads"] == metrics["crashes"] == metrics["leaked_requests"] == 0


def test_offload_hit_rate_counts_each_admission_once_however_often_it_was_looked_up():
    """Five usable GPU blocks of 4 tokens. W (8 tokens) finishes at step 0 and is stored; X (12
    + 8 tokens) runs steps 1-8 and takes all five blocks, evicting W's from the GPU. Y (W's prompt
    + 4 tokens) arrives at step 3: the connector holds W's two chunks (8 tokens) but Y cannot get
    blocks until X finishes, so it is looked up at steps 3-9 (7 answered lookups, 6 repeats) and
    admitted once at step 9. Per admission: W asks 8 (supplied 0), X 12 (0), Y 12 (8)."""
    config = EngineConfig(gpu_blocks=6, cpu_chunks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64)
    w = RequestSpec("W", tuple(range(10, 18)), (1,), arrival_step=0)
    x = RequestSpec("X", tuple(range(100, 112)), tuple(range(200, 208)), arrival_step=1)
    y = RequestSpec("Y", w.prompt_token_ids + (50, 51, 52, 53), (60,), arrival_step=3)
    record = replay([w, x, y], config, Fixes())
    metrics = compute_metrics(record)
    assert (record.admissions, record.connector_lookups) == (3, 9)
    assert metrics["repeated_lookups"] == 6
    assert metrics["offload_hit_rate"] == pytest.approx(8 / (8 + 12 + 12))
    assert metrics["gpu_hit_rate"] == 0


def test_offload_hit_rate_numerator_and_denominator_come_from_admissions():
    """A record whose lookup totals differ from its admission totals: only the latter count."""
    record = RunRecord(admissions=4, admission_asked_tokens=100, admission_hit_tokens=30,
                       connector_lookups=10, connector_lookup_tokens=400, connector_hit_tokens_admitted=7,
                       connector_stats={"hit_tokens": 90, "queried_tokens": 120})
    metrics = compute_metrics(record)
    assert metrics["offload_hit_rate"] == pytest.approx(30 / 100)
    assert metrics["repeated_lookups"] == 10 - 4
    assert compute_metrics(RunRecord())["offload_hit_rate"] is None  # nothing asked: no rate


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
    measured = MEASURED_METRICS
    first = {k: v for k, v in compute_metrics(replay(conversation(), config)).items() if k not in measured}
    second = {k: v for k, v in compute_metrics(replay(conversation(), config)).items() if k not in measured}
    assert first == second


@pytest.mark.parametrize("name", ["shared-prefix-small"])
def test_every_request_is_admitted_once_per_arrival_and_once_per_preemption(name):
    """The per-admission hit rate's population: none of these requests is aborted while waiting,
    so admissions = requests + preemptions (shared-prefix-small preempts a few times)."""
    from kvoffload.runner import ConnectorChoice, replay_workload
    from kvoffload.workloads import load_workload

    workload = load_workload(name)
    assert not any(spec.abort_after_steps == 0 for spec in workload.requests)
    record = replay_workload(workload, ConnectorChoice.build()).record
    assert record.preemptions > 0
    assert record.admissions == record.requests + record.preemptions


def one_request_and_a_short_one():
    """r: prompt 6 + 3 length-capped outputs = 9 tokens; a forward wrote positions 0-7, so its
    last fully-written chunk is chunk 1 (positions 4-7), complete only in the step that samples
    r's final token. s: 2 + 1 tokens, no full chunk: never counted."""
    return [RequestSpec("r", tuple(range(10, 16)), (20, 21, 22), stop="length"),
            RequestSpec("s", (1, 2), (3,), stop="length")]


@pytest.mark.parametrize("scheduling, prompt_only, fixes, expected", [
    ("async", False, Fixes(), 1.0),  # chunk 1 stored by the final store built after the finish
    # The first seed bug: under async scheduling the finish is processed after the step that
    # completed chunk 1, and without the fix nothing stores it.
    ("async", False, Fixes().without("last_block_at_finish"), 0.0),
    # Sync: that step's own plan stores chunk 1 before the finish; nothing to lose.
    ("sync", False, Fixes().without("last_block_at_finish"), 1.0),
    # Prompts only: the last chunk to store is the prompt's (chunk 0), stored at the prefill.
    ("async", True, Fixes().without("last_block_at_finish"), 1.0),
])
def test_last_chunk_offloaded_rate_of_one_request(scheduling, prompt_only, fixes, expected):
    config = TINY.replace(scheduling=scheduling, offload_prompt_only=prompt_only)
    record = replay(one_request_and_a_short_one(), config, fixes)
    assert (record.final_chunks, record.final_chunks_offloaded) == (1, int(expected))
    assert compute_metrics(record)["last_chunk_offloaded_rate"] == expected


def test_a_chunk_the_tier_already_holds_counts_as_offloaded():
    """r2 repeats r1 after r1 finished: every chunk of r2 is in the tier already (r1 stored the same
    KV), so the connector stores nothing for r2, rightly: 2 of 2."""
    r1 = RequestSpec("r1", tuple(range(10, 16)), (20, 21, 22), stop="length")
    r2 = RequestSpec("r2", r1.prompt_token_ids, r1.output_token_ids, stop="length", arrival_step=30)
    record = replay([r1, r2], TINY.replace(scheduling="async"), Fixes(), trace=True)
    assert {event["tid"] for event in record.trace_events if event["name"].startswith("store")} == {"r1"}
    assert compute_metrics(record)["last_chunk_offloaded_rate"] == 1.0


def test_a_last_chunk_stored_with_another_requests_kv_did_not_reach_the_tier(fence_story):
    """The fence story of test_glossary: without submit-before-wait, A's final store copies B's KV
    into the tier. A, C and B each finish with a full chunk; A's holds B's KV: 2 of 3, while
    the tier's slot for A's chunk is filled (a count of stores would say 3 of 3)."""
    (a, c, b), config = fence_story
    broken = replay([a, c, b], config, Fixes().without("flush_submits_before_wait"), max_steps=200)
    assert len(broken.fence_violations) == 1
    assert (broken.final_chunks, broken.final_chunks_offloaded) == (3, 2)
    assert compute_metrics(replay([a, c, b], config, Fixes(), max_steps=200))["last_chunk_offloaded_rate"] == 1.0


def test_connector_time_per_step_is_in_microseconds():
    """connector_us_per_step: wall seconds inside connector calls, in µs, over the run's steps."""
    record = RunRecord(steps=4, connector_seconds=0.5)
    assert compute_metrics(record)["connector_us_per_step"] == 125_000.0  # exact in binary floats


@pytest.mark.parametrize("values, p50, p99, unit", [
    ("store_submit_delays", "store_submit_delay_steps_p50", "store_submit_delay_steps_p99", 1),
    ("store_visible_delays", "store_visible_delay_steps_p50", "store_visible_delay_steps_p99", 1),
    ("ttft_seconds", "ttft_ms_p50", "ttft_ms_p99", 1e-3),
    ("tpot_seconds", "tpot_ms_p50", "tpot_ms_p99", 1e-3),
])
def test_each_percentile_is_the_nearest_rank_at_its_own_q(values, p50, p99, unit):
    """101 values, 1 to 101 (steps, or ms of a real model's timings), shuffled: the nearest rank
    of p50 is ceil(50.5) = 51 and of p99 ceil(99.99) = 100, so p51 (52) or p100 (the largest,
    101) would show. With 100 values or fewer p99 is the largest, and could not tell them apart."""
    import random

    record = RunRecord(model_run=True)
    getattr(record, values).extend(value * unit for value in random.Random(0).sample(range(1, 102), 101))
    metrics = compute_metrics(record)
    assert (metrics[p50], metrics[p99]) == pytest.approx((51, 100))


class TierBytes:
    """The content oracle as engine/final_chunks.py reads it: the fingerprint each tier slot holds,
    and each request's KV (A's and B's chunk 0 hold the same KV, X's other KV)."""

    def __init__(self):
        self.slots: dict[int, int] = {}
        from kvoffload.engine.final_chunks import FinalChunkWatch

        self.watch = FinalChunkWatch(self, tokens_per_chunk=4, prompt_only=False)

    def tier_fingerprint(self, slot):
        return self.slots[slot]

    def fingerprint(self, req_id, position):
        return {"A": 111, "B": 111, "X": 222}[req_id]

    def is_live(self, req_id):
        return True

    def store(self, req_id, slot):
        """``req_id``'s store of its chunk 0 into ``slot`` completed."""
        from kvoffload.core.types import TransferJob, TransferKind

        self.slots[slot] = self.fingerprint(req_id, 3)
        self.watch.stored(TransferJob(1, req_id, TransferKind.STORE, (0,), (slot,), (0,)))

    def b_finished(self):
        """B finishes with positions 0-4 written: chunk 0 is its last full one. (counted, offloaded)"""
        from types import SimpleNamespace

        request = SimpleNamespace(num_tokens=6, num_computed_tokens=5, num_prompt_tokens=4)
        self.watch.finished(SimpleNamespace(req=request, req_id="B"), aborted=False)
        return self.watch.counted, self.watch.offloaded


def test_a_chunk_whose_tier_slot_was_overwritten_no_longer_counts_as_held():
    """The tier's bytes, slot by slot (engine/final_chunks.py): A stores its chunk 0 in slot 5;
    X's store then overwrites slot 5. B finishes with the same KV in its chunk 0 and stores
    nothing (a connector that trusted a stale entry would skip it): the tier no longer holds
    that chunk, so B's last chunk was lost: 0 of 1. Had slot 5 still held it, 1 of 1."""
    tier = TierBytes()
    tier.store("A", 5)
    assert tier.b_finished() == (1, 1)  # slot 5 holds B's chunk 0 (A stored the same KV)
    tier = TierBytes()
    tier.store("A", 5)
    tier.store("X", 5)
    assert tier.b_finished() == (1, 0)


def test_a_last_chunk_its_own_store_left_in_the_tier_counts_though_overwritten_later():
    """B's own store put its chunk 0 in slot 5 while B ran; X's store overwrote slot 5 before B
    finished. B's last chunk did reach the tier (the store PR #48596 is about happened; what the
    tier evicts later is another matter): 1 of 1, though no slot holds it at the finish."""
    tier = TierBytes()
    tier.store("B", 5)
    tier.store("X", 5)
    assert tier.b_finished() == (1, 1)


def test_a_fresh_record_has_counted_nothing():
    """Both engines (the simulator's observer, the vLLM replays) add to a fresh RunRecord: every
    count and time starts at 0, every list empty, no verdict. A record that counted two finished
    requests' last chunks and none that reached the tier says 0.0, not more."""
    import dataclasses

    record = RunRecord()
    values = {field.name: getattr(record, field.name) for field in dataclasses.fields(record)}
    assert {name for name, value in values.items() if value not in (0, None, False) and value != type(value)()} == set()
    assert compute_metrics(RunRecord(final_chunks=2))["last_chunk_offloaded_rate"] == 0.0
