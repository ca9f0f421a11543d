"""Catalogue K06-K11, K14, K20 in vLLM's scheduler: cursors, aborts, preemption and reset while
jobs are in flight, against the connector named by ``--kv-connector``."""

from __future__ import annotations

import pytest

from kvoffload.core.manager import LookupResult
from kvoffload.engine.requests import RequestSpec
from kvoffload.gates.story import TINY, assert_clean, assert_served, follow_up, replay, tokens


class TestK06CursorWaitsForHashes:
    """vLLM #36052 / #33881. Sync, k=5 drafts, all accepted: a decode step schedules 1 + 5 tokens,
    so computed + scheduled runs up to 5 positions past the last block that has a hash. The cursor
    must stop at the known keys and pick the rest up later (storing past them is vLLM's
    `assert len(offload_keys) == len(block_ids)`): the next turn, after the GPU cache forgot A,
    gets every chunk below A's final token (21 tokens: chunks 0-4) from the connector."""

    def test_every_decode_chunk_is_stored(self, kv_connector):
        a = RequestSpec("A", tokens(1, 8), tokens(2, 13), accept_counts=(5,))
        record, _ = replay(kv_connector, [a, follow_up(a)], TINY.replace(spec_tokens=5),
                           forget_gpu_cache_before=tuple(range(1, 12)))
        assert_clean(record)
        assert_served(record, connector=20)


class TestK07AbortOfAQueuedRequest:
    """vLLM #49118 / #49146 / #49285. One sequence at a time: Q (16 tokens, hashes known at
    arrival, no blocks) waits behind R and is aborted after one step. Its finished-path store
    walk must build nothing (vLLM 0.26 died of `assert len(offload_keys) == len(block_ids)`)."""

    def test_abort_of_a_queued_request(self, kv_connector):
        requests = [RequestSpec("R", tokens(1, 16), tokens(2, 4)),
                    RequestSpec("Q", tokens(3, 16), tokens(4, 4), abort_after_steps=1)]
        record, _ = replay(kv_connector, requests, TINY.replace(max_num_seqs=1))
        assert record.crash is None
        assert_clean(record, finished=2)

    @pytest.mark.parametrize("budget", [6, 7])
    def test_abort_mid_prefill_stores_only_computed_tokens(self, kv_connector, budget):
        """vLLM #49285: A (40-token prompt) is aborted after its first step with 6 or 7 tokens
        computed; chunk 1 is not fully written and must not be stored, else C (A's prompt + 4)
        loads its unwritten slots (vLLM 0.26)."""
        a = RequestSpec("A", tokens(1, 40), tokens(2, 2), abort_after_steps=1)
        c = RequestSpec("C", a.prompt_token_ids + tokens(3, 4), tokens(4, 2), arrival_step=5)
        record, _ = replay(kv_connector, [a, c], TINY.replace(max_num_batched_tokens=budget, max_num_seqs=2))
        assert_clean(record)


class TestK08CompletionForAnAbortedRequest:
    """vLLM #43226 / LMCache #3499. C (A's history + 4) loads chunks 0-1 with 3-step copies and is
    aborted while its load is in flight (the GPU cache forgot A's blocks before step 3); D is
    aborted with its prefill's store in flight. Each completion must map to a request the
    connector still tracks; then all are released (K30: aborts while loading and storing)."""

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_aborts_with_a_load_and_a_store_in_flight(self, kv_connector, scheduling):
        a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
        c = follow_up(a, abort_after_steps=4)
        d = RequestSpec("D", tokens(5, 12), tokens(6, 8), arrival_step=6, abort_after_steps=2)
        record, _ = replay(kv_connector, [a, c, d], TINY.replace(scheduling=scheduling, store_completion_steps=3),
                           forget_gpu_cache_before=(3,))
        assert_served(record, connector=8)  # C's load was built
        assert_clean(record, finished=3)


class TestK09PreemptedStoresAreFlushed:
    """vLLM #29870. 8 usable blocks: A and B (16 tokens each) prefill in step 0 and fill them;
    their stores are submitted at the start of step 1. In step 1 A's decode needs a 5th block and
    preempts B, whose last block A takes and writes. B's store of chunk 3 must be waited on before
    that forward; else it copies A's KV, and B's own resume loads it back (K29: no freed block is
    rewritten while a store still copies it)."""

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_preemption_waits_for_the_victims_stores(self, kv_connector, scheduling):
        a = RequestSpec("A", tokens(1, 16), tokens(2, 4))
        b = RequestSpec("B", tokens(3, 16), tokens(4, 4))
        record, _ = replay(kv_connector, [a, b], TINY.replace(gpu_blocks=9, scheduling=scheduling,
                                                              store_completion_steps=2))
        assert record.preemptions >= 1  # vLLM 0.25-0.29 preempt B twice here
        assert_clean(record)


class TestK10NoLoadWhileStoresAreInFlight:
    """vLLM #46014 / #46231 (async, 8 usable blocks, the GPU cache forgetting every free block).
    A (8 + 12), B (8 + 3) and R (8 + 4) fill the blocks; in step 5 A's decode preempts R, whose
    stores of chunks 0-1 are flushed but reported only with that step's output. B's finish frees
    blocks, so step 6's schedule admits R again while its store of chunk 1 is still tracked: a tier
    that reads pending chunks as absent reports chunk 0 as a hit. The lookup must wait one step
    (vLLM's `assert not transfer_jobs` when a load is built now), then load chunks 0-1."""

    def test_the_lookup_waits_then_loads(self, kv_connector):
        def pending_reads_as_miss(built) -> None:  # a tier of the vLLM 0.2x era
            manager = built.scheduler.connector.core.manager
            plain = manager.lookup
            manager.lookup = lambda key: LookupResult.MISS if plain(key) is LookupResult.HIT_PENDING else plain(key)

        requests = [RequestSpec("A", tokens(1, 8), tokens(2, 12)), RequestSpec("B", tokens(5, 8), tokens(6, 3)),
                    RequestSpec("R", tokens(3, 8), tokens(4, 4), arrival_step=1)]
        config = TINY.replace(gpu_blocks=9, scheduling="async", store_completion_steps=1, max_num_batched_tokens=8)
        record, _ = replay(kv_connector, requests, config, forget_gpu_cache_before=tuple(range(1, 16)),
                           prepare=pending_reads_as_miss,
                           reference_only="needs a tier that reads pending chunks as absent (the reference manager's "
                                          "lookup); this connector's tier answers them itself")
        assert_clean(record, finished=3)
        assert record.preemptions >= 1
        assert record.connector_stats["load_jobs"] == 1  # R's chunks 0-1, once its stores were reported


class TestK11CursorAfterPreemption:
    """vLLM #52170 / #52211 / #55503. Preempt -> resume under spec decode (k=2): the connector's
    block table is rebuilt on re-admission while its cursor is kept. Whatever chunk the walk
    reaches must have a block and a key (else vLLM's assert kills the engine)."""

    def test_preempted_spec_decode_requests_store_everything(self, kv_connector):
        config = TINY.replace(gpu_blocks=11, spec_tokens=2, store_completion_steps=2)
        requests = [RequestSpec(f"R{i}", tokens(i, 10), tokens(i + 10, 14), accept_counts=(2, 0, 1))
                    for i in range(3)]
        record, _ = replay(kv_connector, requests, config)
        assert record.preemptions >= 1
        assert_clean(record, finished=3)


class TestK14DuplicateBlockIdsInTheFence:
    """vLLM #42761 (b) / LIL#197: one store listing a physical block twice (lockstep groups)."""

    def test_a_repeated_block_is_fenced_and_released_once(self, kv_connector):
        pytest.skip("needs a store job that lists one block twice: vLLM's scheduler with one KV group never "
                    "builds one (tests/gates runs it against the reference's job registry)")


class TestK20ResetForgetsRequestJobs:
    """vLLM #48102. 8 usable blocks: R1 is preempted by R0 with its store in flight (4-step
    copies); reset_prefix_cache before step 3 drops the store and its late completion is stale.
    Job ids the reset forgot must not be looked up later (vLLM 0.25: the surviving R0's next
    store, a KeyError)."""

    def test_r1_is_readmitted_after_the_reset(self, kv_connector):
        requests = [RequestSpec("R0", tokens(1, 16), tokens(2, 10)), RequestSpec("R1", tokens(3, 8), tokens(4, 10))]
        record, _ = replay(kv_connector, requests, TINY.replace(gpu_blocks=9, store_completion_steps=4),
                           reset_cache_before=(3,))
        assert record.preemptions >= 1
        assert_clean(record, finished=2)
