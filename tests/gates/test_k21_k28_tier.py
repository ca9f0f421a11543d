"""Catalogue K21-K28: the offload tier itself: reset, failed copies, pending hits, eviction,
allocation failures and the hit-rate counters."""

from __future__ import annotations

import pytest
from story import SCHEDULINGS, TINY, engine, follow_up, assert_healthy, poisoned, run, stored_chunks, tokens

from kvoffload.core.manager import CPUOffloadManager, LookupResult
from kvoffload.core.types import TransferKind
from kvoffload.engine.requests import RequestSpec
from kvoffload.metrics import compute_metrics


def a_and_its_next_turn():
    """A (prompt 8, 1 output) stores chunks 0-1; C resends A's 9 tokens + 4 after the GPU cache
    forgot A (before step 2), so C's first 8 tokens can only come from the offload tier."""
    a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
    return [a, follow_up(a)]


class TestK21ResetReallyClears:
    """vLLM #57727: reset_prefix_cache said success while the offload tier kept serving. B repeats
    A's prompt after reset_cache at step 5: no GPU hit and no connector hit (8 without the reset)."""

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    @pytest.mark.parametrize("reset", [True, False])
    def test_nothing_is_served_after_a_reset(self, scheduling, reset):
        a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
        b = RequestSpec("B", tokens(1, 8) + tokens(3, 4), tokens(2, 1), arrival_step=6)
        kwargs = {"reset_cache_at": [5]} if reset else {"forget_gpu_cache_before": tuple(range(1, 7))}
        record = run([a, b], TINY.replace(scheduling=scheduling), strict=True, **kwargs)
        assert_healthy(record)
        assert (record.gpu_hit_tokens, record.connector_hit_tokens_admitted) == (0, 0 if reset else 8)


    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_a_request_running_across_the_reset_stores_its_chunks_again(self, scheduling):
        """R (prompt 16, 12 outputs) stored chunks 0-3 in step 0; reset_cache at step 3 drops them.
        R must offer them again (its store cursor rewinds): they are stored at step 3, and F (R's
        prompt + 4, after the GPU cache forgot R) gets all 16 tokens from the connector."""
        r = RequestSpec("R", tokens(1, 16), tokens(2, 12))
        f = RequestSpec("F", r.prompt_token_ids + tokens(3, 4), tokens(4, 1), parent="R", think_steps=2)
        record = run([r, f], TINY.replace(scheduling=scheduling), strict=True, reset_cache_at=[3],
                     forget_gpu_cache_before=tuple(range(4, 40)))
        assert_healthy(record)
        assert [e["args"]["chunks"] for e in record.trace_events if e["ts"] == 3] == [[0, 1, 2, 3]]
        assert record.connector_hit_tokens_admitted == 16


class TestK22FailedLoadIsRecomputed:
    """vLLM #39732 / #52838 / #54733. C's load of chunks 0-1 fails (the handler scribbles the
    destination blocks and reports success=False). The worker must pass that on, the connector
    report the load's blocks, and the engine recompute those 8 tokens: no crash, no garbage
    served, C finishes, and it computes 8 positions more than with a good load."""

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_the_failed_tokens_are_computed_again(self, scheduling):
        config = TINY.replace(scheduling=scheduling)
        good = run(a_and_its_next_turn(), config, forget_gpu_cache_before=(2,))
        eng = engine(a_and_its_next_turn(), config, strict=True, forget_gpu_cache_before=(2,))
        eng.handler.fail_jobs(lambda job: job.kind is TransferKind.LOAD)
        record = eng.run()
        assert len(eng.handler.failed_job_ids) == 1
        assert_healthy(record)
        assert record.finished_requests == 2
        assert record.connector_hit_tokens_admitted == good.connector_hit_tokens_admitted == 8
        assert record.scheduled_tokens == good.scheduled_tokens + 8
        assert eng.worker.take_block_ids_with_load_errors() == set()  # the engine took them


    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_the_gpu_prefix_before_a_failed_load_is_kept(self, scheduling):
        """vLLM keeps the computed prefix before the first failed block (_handle_invalid_blocks).
        L, running throughout, holds the block of the 4 tokens A and C share; C gets them from
        the GPU, and A's next 8 from the tier (the GPU cache forgot A before step 3). The load
        fails: C computes those 8 again, and only those (4 more would mean the GPU block too)."""
        def requests():
            a = RequestSpec("A", tokens(1, 4) + tokens(3, 8), tokens(2, 1), arrival_step=1)
            return [RequestSpec("L", tokens(1, 4), tokens(5, 30)), a, follow_up(a)]

        config, forgetting = TINY.replace(scheduling=scheduling), tuple(range(3, 8))
        good = run(requests(), config, forget_gpu_cache_before=forgetting)
        eng = engine(requests(), config, strict=True, forget_gpu_cache_before=forgetting)
        eng.handler.fail_jobs(lambda job: job.kind is TransferKind.LOAD)
        record = eng.run()
        assert len(eng.handler.failed_job_ids) == 1
        assert_healthy(record)
        assert record.gpu_hit_tokens == good.gpu_hit_tokens == 4 + 4  # A's and C's shared block
        assert record.connector_hit_tokens_admitted == good.connector_hit_tokens_admitted == 8
        assert record.scheduled_tokens == good.scheduled_tokens + 8


class TestK23PendingHitResolves:
    """vLLM #49829 / #53062. C asks for A's chunks while their store is in flight (6-step copies):
    the lookup defers, then resolves: a load once the store landed, or a plain miss (recompute)
    if the store failed. Never a request waiting forever."""

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    @pytest.mark.parametrize("store_fails", [False, True])
    def test_a_deferred_lookup_ends(self, scheduling, store_fails):
        a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
        c = follow_up(a, think_steps=0)
        eng = engine([a, c], TINY.replace(scheduling=scheduling, store_completion_steps=6), strict=True,
                     forget_gpu_cache_before=(1, 2, 3))
        if store_fails:
            eng.handler.fail_jobs(lambda job: job.kind is TransferKind.STORE and job.req_id == "A")
        record = eng.run()
        assert_healthy(record)
        assert record.finished_requests == 2
        assert eng.connector.stats.deferred_lookups >= 3
        assert record.connector_hit_tokens_admitted == (0 if store_fails else 8)


class TestK24EvictionKeepsPrefixChains:
    """vLLM #35846 / #55461 / #51787, at the manager: a store never evicts its own inputs, and a
    prefix is evicted tail first, so what remains is still a usable prefix."""

    def keys(self, *ids):
        return [bytes([i]) * 8 for i in ids]

    def test_a_store_never_evicts_a_key_it_was_given(self):
        """Capacity 4: [1, 2] stored; prepare_store([2, 3, 4, 5]) must evict 1, never 2."""
        manager = CPUOffloadManager(4, strict_lifecycle=False)
        manager.prepare_store("r", self.keys(1, 2))
        manager.complete_store(self.keys(1, 2))
        out = manager.prepare_store("r", self.keys(2, 3, 4, 5))
        assert out.evicted_keys == tuple(self.keys(1))
        assert manager.lookup(self.keys(2)[0]) is LookupResult.HIT_PENDING or manager.lookup(
            self.keys(2)[0]) is LookupResult.HIT
        manager.complete_store(out.keys_to_store)
        assert [manager.lookup(k) for k in self.keys(2, 3, 4, 5)] == [LookupResult.HIT] * 4

    def test_a_touched_prefix_loses_its_tail_first(self):
        """[1, 2, 3] stored and touched as one prefix; one more key evicts 3, keeping 1-2 usable."""
        manager = CPUOffloadManager(3, strict_lifecycle=False)
        manager.prepare_store("r", self.keys(1, 2, 3))
        manager.complete_store(self.keys(1, 2, 3))
        manager.touch(self.keys(1, 2, 3))
        assert manager.prepare_store("r", self.keys(9)).evicted_keys == tuple(self.keys(3))


class TestK25AllocationFailure:
    """vLLM #25856 / #50069. Tier of 6 chunks, 3-step copies: A's 4 chunks are pending when B (12
    prompt tokens) wants 3, so prepare_store fails and B's cursor must stay put. Once A's chunks are
    ready B stores chunks 0-3 in one job, and a later request gets all 16 tokens back."""

    @pytest.mark.parametrize("scheduling, failures, stored_at", [("sync", 5, 5), ("async", 6, 6)])
    def test_b_retries_until_it_stores(self, scheduling, failures, stored_at):
        a = RequestSpec("A", tokens(1, 16), tokens(2, 1))
        b = RequestSpec("B", tokens(3, 12), tokens(4, 8))
        c = RequestSpec("C", b.prompt_token_ids + b.output_token_ids[:4], tokens(6, 1), arrival_step=30)
        eng = engine([a, b, c], TINY.replace(scheduling=scheduling, cpu_chunks=6, store_completion_steps=3),
                     strict=True, forget_gpu_cache_before=tuple(range(20, 31)))
        record = eng.run()
        assert_healthy(record)
        assert eng.connector.stats.store_allocation_failures == failures
        assert [(e["ts"], e["args"]["chunks"]) for e in record.trace_events
                if e["tid"] == "B"] == [(stored_at, [0, 1, 2, 3])]
        assert record.connector_hit_tokens_admitted == 16


class TestK27HitRateCountsEachLookupOnce:
    """vLLM #28585 / #30522 / #57596. C asks while A's chunks are still being stored (4-step
    copies): it is deferred several times and answered once. One answer per request, for the
    tokens it queried: the connector's chunk counters A 8 (a miss) + C 12 (8 hit); the metric,
    per admission, A's 8 tokens + C's 13 asked -> 8 / 21."""

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_deferred_lookups_are_not_counted(self, scheduling):
        a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
        c = follow_up(a, think_steps=0)
        eng = engine([a, c], TINY.replace(scheduling=scheduling, store_completion_steps=4),
                     forget_gpu_cache_before=(1, 2, 3))
        record = eng.run()
        stats = eng.connector.stats
        assert stats.deferred_lookups >= 2
        assert (stats.lookups, stats.queried_tokens, stats.hit_tokens) == (2, 20, 8)
        assert (record.connector_lookups, record.admissions) == (2, 2)
        metrics = compute_metrics(record)
        assert metrics["offload_hit_rate"] == pytest.approx(8 / 21) and metrics["repeated_lookups"] == 0


class TestK28FailedStoreStaysInvisible:
    """LMCache #4991 / #4847. A's store of chunks 0-1 fails (the tier slots hold a scribble). The
    keys must never become loadable: C gets no hit and recomputes, nothing poisoned."""

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_no_hit_from_a_failed_store(self, scheduling):
        eng = engine(a_and_its_next_turn(), TINY.replace(scheduling=scheduling), strict=True,
                     forget_gpu_cache_before=(2,))
        eng.handler.fail_jobs(lambda job: job.kind is TransferKind.STORE and job.req_id == "A")
        record = eng.run()
        assert_healthy(record)
        assert stored_chunks(record, "A") == {0, 1} and eng.handler.failed_job_ids == [0]
        assert record.connector_hit_tokens_admitted == 0
        assert poisoned(record) == []
