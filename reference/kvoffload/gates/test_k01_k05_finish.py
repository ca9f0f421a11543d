"""Catalogue K01-K05 in vLLM's scheduler: what happens to a request's last chunk when it finishes.

Each class replays one catalogued bug (``Knn``, tests/gates/README.md) with the connector named by
``--kv-connector`` and asserts what a correct connector shows from outside: the content oracle
finds no poisoned load, the connector does not crash, the chunk it should serve is served.
"""

from __future__ import annotations

import pytest

from kvoffload.engine.requests import RequestSpec
from kvoffload.gates.story import LIFECYCLE, TINY, assert_clean, assert_whole_prompt_served, follow_up, replay, tokens

ASYNC = TINY.replace(scheduling="async")


def turn_a(prompt=6, outputs=3, **kwargs) -> RequestSpec:
    return RequestSpec("A", tokens(1, prompt), tokens(2, outputs), **kwargs)


class TestK01FinalStoreAfterFinishSignal:
    """vLLM #49635 / #49671. Async, 4-step copies: A's final store of chunk 1 is built one
    schedule after request_finished. The manager must hear "finished" only after it (vLLM 0.25-0.26
    told it first: a strict manager sees prepare_store after on_request_finished)."""

    def test_no_store_is_prepared_after_the_finish_signal(self, kv_connector):
        a = turn_a()
        record, _ = replay(kv_connector, [a, follow_up(a)], ASYNC.replace(store_completion_steps=4),
                           reference_only=LIFECYCLE)
        assert record.lifecycle_violations == 0
        assert_clean(record)


class TestK02FinishHookAndReset:
    """vLLM #45823 / #46284. A (prompt 8, 1 output) finishes with its store of chunks 0-1 still in
    flight (4-step copies); reset_prefix_cache runs in between. The finish hook fires once and the
    reset releases the finished-but-tracked request: nothing is left tracked, nothing crashes."""

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_reset_between_finish_and_completion_forgets_a(self, kv_connector, scheduling):
        a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
        record, _ = replay(kv_connector, [a], TINY.replace(scheduling=scheduling, store_completion_steps=4),
                           reset_cache_before=(2,))
        assert_clean(record, finished=1)


class TestK03LastBlockAtFinish:
    """vLLM #48596. Async: A (prompt 6, 3 outputs) completes chunk 1 (positions 4-7) only in its
    final step, whose schedule ran before that token was known; only a store built after the
    finish carries it. The next turn C (A's 9 tokens + 4), after the GPU cache forgot A, must get
    chunks 0-1 from the connector (vLLM 0.25 stored chunk 0 only)."""

    def test_the_next_turn_finds_chunk_1(self, kv_connector):
        a = turn_a()
        record, _ = replay(kv_connector, [a, follow_up(a)], ASYNC, forget_gpu_cache_before=(4,))
        assert_clean(record)
        (continuation,) = record.continuations
        assert continuation.eligible, "C's parent chunk was still in the GPU cache: the story did not force a load"
        assert continuation.served, (f"C was not served A's last chunk: {record.connector_hit_tokens_admitted} "
                                     f"connector hit tokens of the 8 it needed")

    def test_final_store_copies_before_its_block_is_rewritten(self, kv_connector):
        """The worker half: B (120 tokens) arrives as A finishes and is handed A's freed blocks in
        the schedule that builds A's final store; the store must copy before B's forward
        rewrites them, else C loads B's KV in chunk 1."""
        a = turn_a()
        b = RequestSpec("B", tokens(9, 120), tokens(10, 2), parent="A", think_steps=0)
        record, _ = replay(kv_connector, [a, follow_up(a), b], ASYNC.replace(max_num_batched_tokens=128))
        assert_clean(record)


class TestK04FinalTokenWatermark:
    """vLLM #54193 / #54288. The final sampled token's slot is never written by a forward pass (or
    holds a rejected draft): a chunk that ends on it must not be stored, else the next turn loads
    an unwritten slot (vLLM 0.26-0.29)."""

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_output_ending_on_a_chunk_boundary(self, kv_connector, scheduling):
        """A: prompt 6 + 2 outputs = 8 tokens; position 7 holds the last sampled token."""
        a = turn_a(outputs=2)
        record, _ = replay(kv_connector, [a, follow_up(a)], TINY.replace(scheduling=scheduling),
                           forget_gpu_cache_before=(4,))
        assert_clean(record)

    def test_rejected_draft_slot(self, kv_connector):
        """Sync, k=2 drafts, prompt 5, outputs end at position 7: step 1 accepts 1 of 2 drafts and
        its bonus token is the last output; slot 7 holds the rejected draft."""
        a = RequestSpec("A", tokens(1, 5), tokens(2, 3), accept_counts=(1,))
        record, _ = replay(kv_connector, [a, follow_up(a)], TINY.replace(spec_tokens=2),
                           forget_gpu_cache_before=(4,))
        assert_clean(record)


class TestK05EveryStoredChunkIsServed:
    """vLLM #41704 / #53498. Block 4, chunk 16 (4 blocks): A's prompt is 32 tokens, 1 output; a
    filler evicts all but A's first block from the GPU cache; B = A's prompt + 4 must get its
    other 28 tokens from the connector, not 12 and not 0. The load starts at sub-block 1 of
    chunk 0 (K26's geometry, vLLM #28950). A connector whose copies pin GPU blocks changes what
    the filler evicts: the whole prompt back, at least 28 tokens from the connector."""

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_the_whole_prompt_comes_back(self, kv_connector, scheduling):
        config = TINY.replace(gpu_blocks=14, blocks_per_chunk=4, scheduling=scheduling)
        a = RequestSpec("A", tokens(1, 32), tokens(2, 1))
        filler = RequestSpec("F", tokens(5, 48), tokens(6, 1), parent="A")
        b = RequestSpec("B", a.prompt_token_ids + tokens(7, 4), tokens(8, 1), parent="F")
        record, _ = replay(kv_connector, [a, filler, b], config)
        assert_clean(record)
        assert_whole_prompt_served(record, tokens=32, connector_at_least=28)
