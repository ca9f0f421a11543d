"""The catalogue's gates in vLLM's scheduler, against the connector named by ``--kv-connector``.

Each class replays one catalogued bug (``Knn``, tests/gates/README.md) and asserts what a correct
connector shows from outside: the content oracle finds no poisoned load, the connector does not
crash, the chunk it should serve is served. The reference and vLLM 0.32's stock connector pass
every gate; a release (or a reference preset) fails exactly the gates of the bugs it shipped.
"""

from __future__ import annotations

import pytest

from kvoffload.engine.requests import RequestSpec
from kvoffload.gates.story import TINY, clean, follow_up, poisoned, replay, tokens


def turn_a(prompt=6, outputs=3, **kwargs) -> RequestSpec:
    return RequestSpec("A", tokens(1, prompt), tokens(2, outputs), **kwargs)


class TestK03LastBlockAtFinish:
    """vLLM #48596. Async: A (prompt 6, 3 outputs) completes chunk 1 (positions 4-7) only in its
    final step, whose schedule ran before that token was known; only a store built after the
    finish carries it. The next turn C (A's 9 tokens + 4), after the GPU cache forgot A, must get
    chunks 0-1 from the connector (vLLM 0.25 stored chunk 0 only)."""

    def test_the_next_turn_finds_chunk_1(self, kv_connector):
        a = turn_a()
        record, _ = replay(kv_connector, [a, follow_up(a)], TINY.replace(scheduling="async"),
                           forget_gpu_cache_before=(4,))
        assert clean(record)
        (continuation,) = record.continuations
        assert continuation.eligible and continuation.served

    def test_final_store_copies_before_its_block_is_rewritten(self, kv_connector):
        """The worker half: B (120 tokens) arrives as A finishes and is handed A's freed blocks in
        the schedule that builds A's final store; the store must copy before B's forward
        rewrites them, else C loads B's KV in chunk 1 (vLLM 0.25)."""
        a = turn_a()
        b = RequestSpec("B", tokens(9, 120), tokens(10, 2), parent="A", think_steps=0)
        record, _ = replay(kv_connector, [a, follow_up(a), b],
                           TINY.replace(scheduling="async", max_num_batched_tokens=128))
        assert poisoned(record) == []
        assert clean(record)


class TestK04FinalTokenWatermark:
    """vLLM #54193 / #54288. A: prompt 6 + 2 outputs = 8 tokens; position 7 holds the last sampled
    token, never written by a forward. Chunk 1 (positions 4-7) must not be stored, else the next
    turn loads an unwritten slot (vLLM 0.25-0.29)."""

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_output_ending_on_a_chunk_boundary(self, kv_connector, scheduling):
        a = turn_a(outputs=2)
        record, _ = replay(kv_connector, [a, follow_up(a)], TINY.replace(scheduling=scheduling),
                           forget_gpu_cache_before=(4,))
        assert poisoned(record) == []
        assert clean(record)


class TestK07AbortOfAQueuedRequest:
    """vLLM #49118 / #49146 / #49285. One sequence at a time: Q (16 tokens, hashes known at
    arrival, no blocks) waits behind R and is aborted after one step. Its finished-path store
    walk must build nothing (vLLM 0.25-0.26 died of `assert len(offload_keys) == len(block_ids)`)."""

    def test_abort_of_a_queued_request(self, kv_connector):
        requests = [RequestSpec("R", tokens(1, 16), tokens(2, 4)),
                    RequestSpec("Q", tokens(3, 16), tokens(4, 4), abort_after_steps=1)]
        record, _ = replay(kv_connector, requests, TINY.replace(max_num_seqs=1))
        assert record.crash is None
        assert clean(record) and record.finished_requests == 2

    @pytest.mark.parametrize("budget", [6, 7])
    def test_abort_mid_prefill_stores_only_computed_tokens(self, kv_connector, budget):
        """vLLM #49285: A (40-token prompt) is aborted after its first step with 6 or 7 tokens
        computed; chunk 1 is not fully written and must not be stored, else C (A's prompt + 4)
        loads its unwritten slots (vLLM 0.25-0.26)."""
        a = RequestSpec("A", tokens(1, 40), tokens(2, 2), abort_after_steps=1)
        c = RequestSpec("C", a.prompt_token_ids + tokens(3, 4), tokens(4, 2), arrival_step=5)
        record, _ = replay(kv_connector, [a, c], TINY.replace(max_num_batched_tokens=budget, max_num_seqs=2))
        assert poisoned(record) == []
        assert clean(record)


class TestK01FinalStoreAfterFinishSignal:
    """vLLM #49635 / #49671. Async, 4-step copies: A's final store of chunk 1 is built one
    schedule after request_finished. The manager must hear "finished" only after it (vLLM 0.25-0.26
    told it first: a strict manager sees prepare_store after on_request_finished)."""

    def test_no_store_is_prepared_after_the_finish_signal(self, kv_connector):
        a = turn_a()
        record, built = replay(kv_connector, [a, follow_up(a)], TINY.replace(scheduling="async",
                                                                            store_completion_steps=4))
        core = getattr(built.scheduler.connector, "core", None)
        if core is None:
            pytest.skip("needs the reference manager's lifecycle record (strict mode); this connector has none")
        assert record.lifecycle_violations == 0
        assert clean(record)
