"""The smallest replays of what the suite found in vLLM's SimpleCPUOffloadConnector
(docs/connectors.md, "Blind findings"). Each asserts the symptom as the installed release shows
it: when vLLM fixes one, its test fails and the finding's row needs its release range closed.

Block size 4, one block per chunk (``kvoffload.gates.story``): positions 0-3 are block 0, 4-7
block 1, and so on. On demand (``scripts/vllm-on-demand``), not in CI.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.vllm_on_demand]

from kvoffload.engine.requests import RequestSpec  # noqa: E402
from kvoffload.gates.plugin import GateConnector  # noqa: E402
from kvoffload.gates.story import TINY, follow_up, replay, tokens  # noqa: E402
from kvoffload.vllm.compat import RELEASE  # noqa: E402

EAGER = GateConnector("simple-cpu", None)


def names_in_tier(built, requests) -> dict[str, str]:
    """The tier's cached blocks as 'A0', 'B1', ... (request and block index)."""
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    manager = built.scheduler.connector.scheduler_manager
    names = {make_block_hash_with_group_id(h, 0): f"{r}{i}" for r in requests
             for i, h in enumerate(built._requests[r].block_hashes)}
    return sorted(names[b.block_hash] for b in manager.cpu_block_pool.blocks if b.block_hash in names)


def test_f1_a_full_tier_evicts_the_head_of_a_prefix_first():
    """F1. Tier of 6 blocks (5 usable, F5), 3-step copies. A (16 tokens) and B's block 0 are
    stored in one event; B's blocks 1-3 evict three blocks on their way in. The completion freed
    the event's blocks head first (B0 before A0-A3), so the LRU evicts B0, A0, A1: the tier ends
    with A2, A3, B1, B2, B3, and C (B's 16 tokens) finds no prefix: 0 hits with 3 of its 4
    blocks in the tier."""
    a = RequestSpec("A", tokens(1, 16), tokens(2, 1))
    b = RequestSpec("B", tokens(3, 12), tokens(4, 8))
    c = RequestSpec("C", b.prompt_token_ids + b.output_token_ids[:4], tokens(6, 1), arrival_step=30)
    tier_before_c = []

    def watch(built) -> None:  # the tier as C finds it (C stores its own blocks afterwards)
        on_step = built.on_step

        def step(next_step, finished):
            if next_step == 30:
                tier_before_c.extend(names_in_tier(built, "AB"))
            on_step(next_step, finished)
        built.on_step = step

    record, _ = replay(EAGER, [a, b, c], TINY.replace(cpu_chunks=6, store_completion_steps=3),
                       forget_gpu_cache_before=tuple(range(20, 31)), prepare=watch)
    assert record.connector_hit_tokens_admitted == 0
    assert tier_before_c == ["A2", "A3", "B1", "B2", "B3"]


def test_f2_with_drafts_the_blocks_of_the_final_step_are_never_offloaded():
    """F2 (0.30+; before, F7 loses them too). Sync, k=5 drafts all accepted: A's final step
    computes positions 14-19, completing blocks 3 and 4. Their GPU blocks get a hash only at the
    next schedule, which never comes: the finish-time store skips them as unhashed. C (A's
    history + 4) gets 12 tokens, not the 20 below A's final token."""
    a = RequestSpec("A", tokens(1, 8), tokens(2, 13), accept_counts=(5,))
    record, _ = replay(EAGER, [a, follow_up(a)], TINY.replace(spec_tokens=5), forget_gpu_cache_before=tuple(range(1, 12)))
    assert record.connector_hit_tokens_admitted == 12


def test_f3_a_reset_stops_every_running_request_offloading():
    """F3. R (16 + 12) stored blocks 0-3 in step 0; a reset before step 3 drops them and R's
    store state with them: R never offers a block again, not even at its finish. F (R's prompt
    + 4, after the GPU cache forgot R) gets nothing from the tier."""
    r = RequestSpec("R", tokens(1, 16), tokens(2, 12))
    f = RequestSpec("F", r.prompt_token_ids + tokens(3, 4), tokens(4, 1), parent="R", think_steps=2)
    record, built = replay(EAGER, [r, f], reset_cache_before=(3,), forget_gpu_cache_before=tuple(range(4, 40)))
    assert record.connector_hit_tokens_admitted == 0
    # R's decode blocks (positions 16-23) were never offered; its prompt blocks are back only
    # because F recomputed and stored them (same tokens, same hashes).
    assert names_in_tier(built, "R") == ["R0", "R1", "R2", "R3"]


def test_f4_a_block_whose_store_is_in_flight_is_a_miss():
    """F4 (by design: a best-effort cache). C asks for A's blocks while their store is in
    flight (6-step copies): no deferral, C recomputes what the tier was about to hold."""
    a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
    record, _ = replay(EAGER, [a, follow_up(a, think_steps=0)], TINY.replace(store_completion_steps=6),
                       forget_gpu_cache_before=(1, 2, 3))
    assert record.connector_hit_tokens_admitted == 0 and record.finished_requests == 2


def test_f5_one_block_of_the_tier_is_the_null_block():
    _, built = replay(EAGER, [RequestSpec("A", tokens(1, 8), tokens(2, 1))], TINY.replace(cpu_chunks=6))
    manager = built.scheduler.connector.scheduler_manager
    assert (manager.num_cpu_blocks, manager.cpu_block_pool.get_num_free_blocks()) == (6, 5)


def test_f7_before_0_30_the_last_block_is_never_offloaded():
    """F7 (0.25-0.29, eager). Sync: A (6 + 3) completes block 1 (positions 4-7) in its final
    step; only a store built at the finish carries it. 0.30 added one (request_finished_all_groups)."""
    a = RequestSpec("A", tokens(1, 6), tokens(2, 3))
    record, _ = replay(EAGER, [a, follow_up(a, think_steps=6)], forget_gpu_cache_before=tuple(range(3, 9)))
    (continuation,) = record.continuations
    served = record.connector_hit_tokens_admitted
    assert (served, continuation.served) == ((4, False) if RELEASE < (0, 30, 0) else (8, True))


def test_f6_the_lazy_cursor_resumes_at_the_tail_and_skips_the_queue(small_workload):
    """F6. The lazy walk resumes after its cursor, a block it stored itself: the store's
    completion freed that block again, to the tail of the free queue, and a cursor whose block is
    free passes the staleness check (``ref_cnt > 0`` only). Every block freed before it is never
    visited and is evicted unoffloaded: the last-block hit rate falls to 20 of 39 where eager
    mode serves 39 of 39 (multi-turn-small, sync, 40 GPU blocks), and most walks start within
    three blocks of the queue's tail."""
    import vllm.v1.simple_kv_offload.manager as simple_manager

    from kvoffload.vllm.build import ConnectorLoad
    from kvoffload.vllm.replay import VllmSchedulerReplay

    walks, at_tail = [], []
    walk = simple_manager.SimpleCPUOffloadScheduler._prepare_lazy_store_specs

    def observed(self):
        cursor = self._cursor
        if cursor is not None and cursor.ref_cnt == 0:
            queue = [block.block_id for block in self._gpu_block_pool.free_block_queue.iter_blocks_after(None)]
            at_tail.append(queue.index(cursor.block_id) >= len(queue) - 3)
        walks.append(1)
        return walk(self)

    served = {}
    for source in ("simple-cpu", "simple-cpu-lazy"):
        workload = small_workload("multi-turn-small", scheduling="sync", gpu_blocks=40)
        replay_ = VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad(source))
        if source.endswith("lazy"):
            replay_.scheduler.connector.scheduler_manager._prepare_lazy_store_specs = observed.__get__(
                replay_.scheduler.connector.scheduler_manager)
        record = replay_.run()
        eligible = [c for c in record.continuations if c.eligible]
        served[source] = (sum(c.served for c in eligible), len(eligible))
    assert served == {"simple-cpu": (39, 39), "simple-cpu-lazy": (20, 39)}
    assert sum(at_tail) > len(walks) / 2  # 255 of 377 walks with 0.32


@pytest.mark.skipif(RELEASE < (0, 30, 0), reason="no finish-time store before 0.30 (F7)")
def test_f8_beside_a_connector_without_hma_the_finish_time_store_is_lost():
    """F8 (0.30+). K21's no-reset story: A (8 + 1) finishes in its prefill step, so only the
    finish-time store carries its blocks. Alone, SimpleCPU serves B's 8 tokens; inside a
    MultiConnector with ExampleConnector (no HMA support) vLLM calls request_finished, not
    request_finished_all_groups, and SimpleCPU queues that store only in the latter."""
    a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
    b = RequestSpec("B", tokens(1, 8) + tokens(3, 4), tokens(2, 1), arrival_step=6)
    served = {}
    for source in ("simple-cpu", "simple-cpu+example"):
        record, _ = replay(GateConnector(source, None), [a, b], forget_gpu_cache_before=tuple(range(1, 7)))
        served[source] = record.connector_hit_tokens_admitted
    assert served == {"simple-cpu": 8, "simple-cpu+example": 0}
