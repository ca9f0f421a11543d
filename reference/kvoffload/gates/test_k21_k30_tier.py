"""Catalogue K21-K28 in vLLM's scheduler: the offload tier itself (reset, failed copies, pending
hits, allocation failures, the hit counters); then the bugs no story can show here, each skipped
with the catalogue's reason."""

from __future__ import annotations

import pytest

from kvoffload.core.types import TransferKind
from kvoffload.engine.requests import RequestSpec
from kvoffload.gates.catalogue import NO_GATE
from kvoffload.gates.story import FAILING_COPIES, TINY, assert_clean, assert_served, fail_first, follow_up, replay, tokens
from kvoffload.metrics import compute_metrics


def a_and_its_next_turn():
    """A (prompt 8, 1 output) stores chunks 0-1; C resends A's 9 tokens + 4 after the GPU cache
    forgot A (before step 2), so C's first 8 tokens can only come from the offload tier."""
    a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
    return [a, follow_up(a)]


class TestK21ResetReallyClears:
    """vLLM #57727: reset_prefix_cache said success while the offload tier kept serving."""

    @pytest.mark.parametrize("reset", [True, False])
    def test_nothing_is_served_after_a_reset(self, kv_connector, reset):
        """B repeats A's prompt after a reset before step 5: no GPU hit and no connector hit (8
        without the reset, the GPU cache forgetting A instead)."""
        a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
        b = RequestSpec("B", tokens(1, 8) + tokens(3, 4), tokens(2, 1), arrival_step=6)
        hooks = {"reset_cache_before": (5,)} if reset else {"forget_gpu_cache_before": tuple(range(1, 7))}
        record, _ = replay(kv_connector, [a, b], **hooks)
        assert_clean(record)
        assert_served(record, connector=0 if reset else 8, gpu=0)

    def test_a_request_running_across_the_reset_stores_its_chunks_again(self, kv_connector):
        """R (prompt 16, 12 outputs) stored chunks 0-3 in step 0; a reset before step 3 drops
        them. R must offer them again (its store cursor rewinds), and F (R's prompt + 4, after
        the GPU cache forgot R) gets all 16 tokens from the connector."""
        r = RequestSpec("R", tokens(1, 16), tokens(2, 12))
        f = RequestSpec("F", r.prompt_token_ids + tokens(3, 4), tokens(4, 1), parent="R", think_steps=2)
        record, _ = replay(kv_connector, [r, f], reset_cache_before=(3,), forget_gpu_cache_before=tuple(range(4, 40)))
        assert_clean(record)
        assert_served(record, connector=16)


class TestK22FailedLoadIsRecomputed:
    """vLLM #39732 / #52838 / #54733. C's load of chunks 0-1 fails (the handler scribbles the
    destination blocks and reports success=False). The worker must pass that on
    (``get_block_ids_with_load_errors``), so vLLM's scheduler never reads the garbage as computed
    KV: under its default ``kv_load_failure_policy`` it fails C instead. No crash, nothing
    poisoned, nothing left tracked, C ends with an error."""

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_the_failed_tokens_are_never_served(self, kv_connector, scheduling):
        record, built = replay(kv_connector, a_and_its_next_turn(), TINY.replace(scheduling=scheduling),
                               forget_gpu_cache_before=(2,), prepare=fail_first(TransferKind.LOAD),
                               reference_only=FAILING_COPIES)
        assert_served(record, connector=8)  # the load was built, and failed
        assert_clean(record)
        assert built._requests["C"].status.name == "FINISHED_ERROR"  # vLLM failed it: nothing read


class TestK23PendingHitResolves:
    """vLLM #49829 / #53062. C asks for A's chunks while their store is in flight (6-step copies):
    the lookup defers, then resolves: a load once the store landed, or a plain miss (recompute)
    if the store failed. Never a request waiting forever."""

    def test_a_deferred_lookup_ends_in_a_load(self, kv_connector):
        record, _ = replay(kv_connector, self.requests(), TINY.replace(store_completion_steps=6),
                           forget_gpu_cache_before=(1, 2, 3))
        assert_clean(record, finished=2)
        assert_served(record, connector=8)

    def test_a_deferred_lookup_on_a_failed_store_ends_in_a_miss(self, kv_connector):
        record, _ = replay(kv_connector, self.requests(), TINY.replace(store_completion_steps=6),
                           forget_gpu_cache_before=(1, 2, 3), prepare=fail_first(TransferKind.STORE),
                           reference_only=FAILING_COPIES)
        assert_clean(record, finished=2)
        assert_served(record, connector=0)

    def requests(self):
        a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
        return [a, follow_up(a, think_steps=0)]


class TestK24EvictionKeepsPrefixChains:
    """vLLM #35846 / #55461 / #51787: a store never evicts its own inputs; a prefix loses its tail first."""

    def test_a_store_never_evicts_a_key_it_was_given(self, kv_connector):
        pytest.skip("needs the tier's manager API (prepare_store, touch) driven directly: a unit story "
                    "of the reference's CPU manager (tests/gates), no connector-level hook")


class TestK25AllocationFailure:
    """vLLM #25856 / #50069. Tier of 6 chunks, 3-step copies: A's 4 chunks are pending when B (12
    prompt tokens) wants 3, so prepare_store fails and B's cursor must stay put. Once A's chunks
    are ready B stores chunks 0-3, and a later request gets all 16 tokens back."""

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_b_retries_until_it_stores(self, kv_connector, scheduling):
        a = RequestSpec("A", tokens(1, 16), tokens(2, 1))
        b = RequestSpec("B", tokens(3, 12), tokens(4, 8))
        c = RequestSpec("C", b.prompt_token_ids + b.output_token_ids[:4], tokens(6, 1), arrival_step=30)
        record, _ = replay(kv_connector, [a, b, c],
                           TINY.replace(scheduling=scheduling, cpu_chunks=6, store_completion_steps=3),
                           forget_gpu_cache_before=tuple(range(20, 31)))
        assert_clean(record)
        assert_served(record, connector=16)


class TestK27HitRateCountsEachLookupOnce:
    """vLLM #28585 / #30522 / #57596. C asks while A's chunks are still being stored (4-step
    copies): it is deferred several times and answered once. The metric, per admission: A's 8
    tokens + C's 13 asked -> 8 / 21."""

    def test_deferred_lookups_are_not_counted(self, kv_connector):
        a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
        record, _ = replay(kv_connector, [a, follow_up(a, think_steps=0)], TINY.replace(store_completion_steps=4),
                           forget_gpu_cache_before=(1, 2, 3))
        assert_clean(record)
        assert (record.connector_lookups, record.admissions) == (2, 2)
        metrics = compute_metrics(record)
        assert metrics["offload_hit_rate"] == pytest.approx(8 / 21) and metrics["repeated_lookups"] == 0


class TestK28FailedStoreStaysInvisible:
    """LMCache #4991 / #4847. A's store of chunks 0-1 fails (the tier slots hold a scribble). The
    keys must never become loadable: C gets no hit and recomputes, nothing poisoned."""

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_no_hit_from_a_failed_store(self, kv_connector, scheduling):
        record, _ = replay(kv_connector, a_and_its_next_turn(), TINY.replace(scheduling=scheduling),
                           forget_gpu_cache_before=(2,), prepare=fail_first(TransferKind.STORE),
                           reference_only=FAILING_COPIES)
        assert_clean(record)
        assert_served(record, connector=0)


def _not_modelled(bug: str):
    class Gate:
        def test_not_modelled(self, kv_connector):
            pytest.skip(NO_GATE[bug])
    Gate.__doc__ = f"{bug}: skipped everywhere; the catalogue's reason (kvoffload.gates.catalogue.NO_GATE)."
    return Gate


TestK12CrossStreamHazards = _not_modelled("K12")
