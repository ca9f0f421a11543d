"""Catalogue K01-K05: what happens to a request's last chunk when it finishes.

A (prompt 6, 3 length-capped outputs) writes positions 0-7 (the 9th token is sampled, never
computed): chunk 1 (positions 4-7) is complete only in A's final step. Under async scheduling
that step's schedule ran before the token that completes the chunk was known, so only a store
built after the finish can carry it.
"""

from __future__ import annotations

import pytest
from story import (SCHEDULINGS, TINY, engine, follow_up, assert_healthy, poisoned, run, stored_chunks, tokens,
                   without)

from kvoffload.engine.requests import RequestSpec

ASYNC = TINY.replace(scheduling="async")


def turn_a(prompt=6, outputs=3, **kwargs) -> RequestSpec:
    return RequestSpec("A", tokens(1, prompt), tokens(2, outputs), **kwargs)


class TestK01FinalStoreAfterFinishSignal:
    """vLLM #49635 / #49671. Async, slow copies (chunk 0's store still in flight when A finishes, so
    A stays tracked). The final store of chunk 1 is built one schedule after request_finished; the
    old order told the manager "finished" first, and the strict manager rejects the late
    prepare_store for A (EngineCore died of this KeyError)."""

    SLOW = ASYNC.replace(store_completion_steps=4)

    def test_fixed_order_builds_the_final_store_before_the_signal(self):
        a = turn_a()
        record = run([a, follow_up(a)], self.SLOW, strict=True)
        assert_healthy(record)
        assert stored_chunks(record, "A") == {0, 1}

    def test_old_order_is_a_key_error_for_a_late_prepare_store_of_a(self):
        a = turn_a()
        record = run([a, follow_up(a)], self.SLOW, without("deferred_finish_signal"), strict=True)
        assert record.crash == "LifecycleViolation: \"prepare_store for request 'A' after on_request_finished\""

    def test_sync_scheduling_stores_chunk_1_while_running_so_the_old_order_is_harmless(self):
        a = turn_a()
        record = run([a, follow_up(a)], TINY.replace(store_completion_steps=4),
                     without("deferred_finish_signal"), strict=True)
        assert_healthy(record)
        assert stored_chunks(record, "A") == {0, 1}


class TestK02FinishHookAndReset:
    """vLLM #45823 / #46284. A (prompt 8, 1 output) finishes with its store of chunks 0-1 still in
    flight (4-step copies); reset_cache runs in between. The finish hook must fire exactly once and
    the reset must release the finished-but-tracked request (the old reset leaked it)."""

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    @pytest.mark.parametrize("reset_at", [1, 2])
    def test_reset_between_finish_and_completion_signals_once_and_forgets_a(self, scheduling, reset_at):
        a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
        eng = engine([a], TINY.replace(scheduling=scheduling, store_completion_steps=4),
                     reset_cache_at=[reset_at], strict=True)
        record = eng.run()
        assert_healthy(record)
        assert eng.connector.manager.violations == []  # "signalled twice" would be one
        assert eng.connector.tracked_request_ids() == ()
        assert "A" in eng.connector.manager._finished_requests


class TestK03LastBlockAtFinish:
    """vLLM #48596. Async: without the finish-time store, A's chunk 1 is never offloaded and the
    next turn C (A's 9 tokens + 4, after the GPU cache forgot A) misses it. With the store but no
    fence, the freed block is handed to B in the very schedule that builds the store and C loads
    B's KV."""

    @pytest.mark.parametrize("fixed", [True, False])
    def test_the_next_turn_finds_chunk_1(self, fixed):
        a = turn_a()
        record = run([a, follow_up(a)], ASYNC, None if fixed else without("last_block_at_finish"),
                     forget_gpu_cache_before=(4,))
        assert stored_chunks(record, "A") == ({0, 1} if fixed else {0})
        (continuation,) = record.continuations
        assert continuation.eligible and continuation.served is fixed

    def test_sync_scheduling_reaches_chunk_1_while_running(self):
        a = turn_a()
        record = run([a, follow_up(a)], TINY, without("last_block_at_finish"))
        assert stored_chunks(record, "A") == {0, 1}

    WIDE = ASYNC.replace(max_num_batched_tokens=128)  # B's prompt in one step

    def requests_with_b(self):
        """B arrives as A finishes; A's blocks are cached at the tail of the free queue and B's
        30-block prompt reaches them, evicting A from the GPU cache as well."""
        a = turn_a()
        b = RequestSpec("B", tokens(9, 120), tokens(10, 2), parent="A", think_steps=0)
        return [a, follow_up(a), b]

    def test_final_store_copies_before_its_block_is_rewritten(self):
        record = run(self.requests_with_b(), self.WIDE, strict=True)
        assert_healthy(record)
        assert record.continuations[0].served

    def test_without_the_worker_fence_c_loads_b_kv_in_chunk_1(self):
        record = run(self.requests_with_b(), self.WIDE, without("flush_submits_before_wait"))
        assert [(r, c) for r, c, _ in poisoned(record)] == [("C", 1)]
        assert [v.writer for v in record.fence_violations] == ["forward"]
        assert record.unknown_wait_ids == 1  # the fence waited on a store never submitted

    @pytest.mark.parametrize("fenced", [True, False])
    def test_scheduler_fence_flushes_an_older_store_of_a_finished_request(self, monkeypatch, fenced):
        """The scheduler half. Sync, 4 usable GPU blocks: A (prompt 8, 1 output) builds its store of
        chunks 0-1 in step 0 and finishes; B (12 tokens) is admitted in step 1 onto A's freed
        blocks. That store is submitted in step 1 and copies after step 1's forward: unless the
        registry names it among the stores reading B's new blocks (jobs_to_flush), it copies B's
        KV, and C (A's prompt + 4) loads 4 bad slots in chunk 1."""
        a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
        b = RequestSpec("B", tokens(9, 12), tokens(10, 2), parent="A", think_steps=0)
        c = RequestSpec("C", a.prompt_token_ids + tokens(3, 4), tokens(4, 1), parent="B", think_steps=0)
        eng = engine([a, b, c], TINY.replace(gpu_blocks=5))
        if not fenced:
            monkeypatch.setattr(eng.connector.jobs, "stores_reading", lambda blocks: set())
        record = eng.run()
        assert record.connector_hit_tokens_admitted == 8
        assert poisoned(record) == ([] if fenced else [("C", 1, 4)])
        assert [(v.step, v.block) for v in record.fence_violations] == ([] if fenced else [(1, 2)])


class TestK04FinalTokenWatermark:
    """vLLM #54193 / #54288. The final sampled token's slot is never written by a forward pass (or
    holds a rejected draft): a chunk that ends on it must not be stored."""

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    @pytest.mark.parametrize("fixed", [True, False])
    def test_output_ending_on_a_chunk_boundary(self, scheduling, fixed):
        """Prompt 6 + 2 outputs = 8 tokens; position 7 (the last token) was never computed."""
        a = turn_a(outputs=2)
        record = run([a, follow_up(a)], TINY.replace(scheduling=scheduling),
                     None if fixed else without("final_token_watermark"))
        assert poisoned(record) == ([] if fixed else [("C", 1, 1)])
        assert stored_chunks(record, "A") == ({0} if fixed else {0, 1})

    @pytest.mark.parametrize("scheduling, accepts", [("sync", (1,)), ("async", (0,))])
    @pytest.mark.parametrize("fixed", [True, False])
    def test_rejected_draft_slot(self, scheduling, accepts, fixed):
        """k=2 drafts, prompt 5, outputs end at position 7; the last step rejects a draft. Sync:
        step 1 accepts 1 of 2 and its bonus token is the last output. Async: step 1 accepts none,
        step 2 (scheduled before step 1 is verified) has one output left to make and rejects both
        of its drafts; with one token to go, vLLM schedules no step after it."""
        a = RequestSpec("A", tokens(1, 5), tokens(2, 3), accept_counts=accepts)
        record = run([a, follow_up(a)], TINY.replace(spec_tokens=2, scheduling=scheduling),
                     None if fixed else without("final_token_watermark"))
        assert poisoned(record) == ([] if fixed else [("C", 1, 1)])

    def test_the_chunk_stored_with_the_rejected_draft_counts_from_the_plan_that_stored_it(self):
        """The sync story without the watermark: chunk 1's last slot (7) holds the draft step 1
        rejected when the finish stores it. No forward completed chunk 1, so its store delay
        counts from the plan that stored it: 1 step, like chunk 0's (2 counting from step 1)."""
        a = RequestSpec("A", tokens(1, 5), tokens(2, 3), accept_counts=(1,))
        record = run([a], TINY.replace(spec_tokens=2), without("final_token_watermark"))
        assert stored_chunks(record, "A") == {0, 1}
        assert record.store_submit_delays == [1, 1]

    def test_async_a_step_that_may_fall_short_is_followed_by_one_that_rewrites_the_slot(self):
        """Async, the sync story: step 1 could end short of the last output (all drafts
        rejected), so AsyncScheduler schedules step 2 before verifying it; step 2's forward writes
        the true last token into slot 7 before the request finishes. Its output is dropped, and
        even the connector without the watermark stores a clean chunk 1."""
        a = RequestSpec("A", tokens(1, 5), tokens(2, 3), accept_counts=(1,))
        record = run([a, follow_up(a)], ASYNC.replace(spec_tokens=2), without("final_token_watermark"))
        assert poisoned(record) == [] and stored_chunks(record, "A") == {0, 1}
        alone = run([a], ASYNC.replace(spec_tokens=2))
        assert alone.scheduled_tokens == 5 + 3 + 3 and alone.output_tokens == 3  # step 2: 1 + 2 drafts, dropped


class TestK05EveryStoredChunkIsServed:
    """vLLM #41704 / #53498 (SimpleCPU eager): the final chunk dropped at finish, and stores that
    never became hits (store bytes grow, hits stay 0). Block 4, chunk 16 (4 blocks): A's prompt is
    32 tokens, 1 output; a filler evicts all but A's first block from the GPU cache; B = A's
    prompt + 4 must get its other 28 tokens from the connector, not 12 and not 0. (The load starts
    at sub-block 1 of chunk 0: the geometry of K26(a), vLLM #28950.)"""

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_the_whole_prompt_comes_back(self, scheduling):
        config = TINY.replace(gpu_blocks=14, blocks_per_chunk=4, scheduling=scheduling)
        a = RequestSpec("A", tokens(1, 32), tokens(2, 1))
        filler = RequestSpec("F", tokens(5, 48), tokens(6, 1), parent="A")
        b = RequestSpec("B", a.prompt_token_ids + tokens(7, 4), tokens(8, 1), parent="F")
        record = run([a, filler, b], config, strict=True)
        assert_healthy(record)
        assert stored_chunks(record, "A") == {0, 1}
        assert record.gpu_hit_tokens == 4
        assert record.connector_hit_tokens_admitted == 28
        assert [e["args"]["chunks"] for e in record.trace_events if e["name"].startswith("load")] == [[0, 1]]
