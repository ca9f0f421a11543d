"""Gates on the engine's own model, where a wrong engine would hide a connector bug: the GPU
prefix cache evicts a freed request's tail first, its hits hold written KV only, and the fence
check sees loads as writers too."""

from __future__ import annotations

import pytest
from story import SCHEDULINGS, TINY, engine, run, tokens, wrong_computed_slots

from kvoffload.engine.requests import RequestSpec


def test_freed_blocks_are_evicted_tail_first():
    """10 usable blocks. A (12 prompt tokens, 1 output) commits blocks 0-2 and frees them last
    first; F (8 blocks) then evicts exactly one of them: A's block 2. B (A's prompt + 4) still
    finds blocks 0-1 in the GPU cache (8 tokens) and gets chunk 2 from the connector (4). Freed in
    forward order the head would go first: no GPU hit at all."""
    a = RequestSpec("A", tokens(1, 12), tokens(2, 1))
    f = RequestSpec("F", tokens(5, 29), tokens(6, 1), parent="A")
    b = RequestSpec("B", a.prompt_token_ids + tokens(7, 4), tokens(8, 1), parent="F")
    record = run([a, f, b], TINY.replace(gpu_blocks=11))
    assert (record.gpu_hit_tokens, record.connector_hit_tokens_admitted) == (8, 4)


@pytest.mark.parametrize("scheduling", SCHEDULINGS)
def test_gpu_prefix_hits_hold_only_written_kv(scheduling):
    """A: prompt 6 + 2 outputs; position 7 (the final token) is never computed, so A's block 1
    must never be committed. C (A's 8 tokens + 4) gets a GPU hit of block 0 only; after every step
    each computed position of every live request holds its prefix's KV."""
    a = RequestSpec("A", tokens(1, 6), tokens(2, 2))
    c = RequestSpec("C", a.prompt_token_ids + a.output_token_ids + tokens(3, 4), tokens(4, 2),
                    parent="A", think_steps=1)
    wrong: list = []
    holder = []
    eng = engine([a, c], TINY.replace(scheduling=scheduling, cpu_chunks=1),
                 on_step=lambda step, finished: wrong.extend(wrong_computed_slots(holder[0])))
    holder.append(eng)
    record = eng.run()
    assert record.gpu_hit_tokens == 4
    assert wrong == []


@pytest.mark.parametrize("fenced", [True, False])
def test_the_fence_check_counts_a_load_into_a_block_a_store_still_reads(monkeypatch, fenced):
    """3 usable blocks, sync. P's chunks 0-1 are in the tier and the GPU cache forgot P. A
    (prompt 8, 1 output) builds its store of blocks 3 and 2 in step 4 and finishes. In step 5, C
    (P's prompt) is admitted onto blocks 1 and 2 with a load. Without the scheduler's fence the
    store is still unread when the load writes block 2: one violation, written by a load."""
    p = RequestSpec("P", tokens(1, 8), tokens(2, 1))
    a = RequestSpec("A", tokens(3, 8), tokens(4, 1), arrival_step=4)
    c = RequestSpec("C", p.prompt_token_ids, tokens(6, 1), parent="A", think_steps=0)
    eng = engine([p, a, c], TINY.replace(gpu_blocks=4), forget_gpu_cache_before=(3,))
    if not fenced:
        monkeypatch.setattr(eng.connector.jobs, "stores_reading", lambda blocks: set())
    record = eng.run()
    assert record.connector_hit_tokens_admitted == 8
    assert [(v.step, v.block, v.writer) for v in record.fence_violations] == ([] if fenced else [(5, 2, "load")])
