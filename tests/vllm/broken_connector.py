"""A deliberately broken connector for the oracle test: the reference connector with the
finished-request watermark fix (vLLM PR #54288) switched off in code, loaded by module path."""

import dataclasses
import sys
from pathlib import Path

from kvoffload.core.manager import PrepareStoreOutput
from kvoffload.vllm.connector import KVOffloadConnector

sys.path.insert(0, str(Path(__file__).parents[1] / "gates"))  # planted.py: the simulator gates' plants
from planted import StaleWindowBlocksScheduler, UndroppedDrafterLookupScheduler, UnfencedWindowScheduler  # noqa: E402


class StaleWindowBlocksConnector(KVOffloadConnector):
    """K14 planted (vLLM before PR #42959): a window's reused blocks are stored (tests/gates/planted.py)."""

    def scheduler_side(self, config, fixes):
        return StaleWindowBlocksScheduler(config, fixes)


class UnfencedWindowConnector(KVOffloadConnector):
    """K14's fence half planted: a window's source blocks fenced only at finish (tests/gates/planted.py)."""

    def scheduler_side(self, config, fixes):
        return UnfencedWindowScheduler(config, fixes)


class UndroppedDrafterLookupConnector(KVOffloadConnector):
    """A drafter group of its own looked up like a target group: no chunk dropped (tests/gates/planted.py)."""

    def scheduler_side(self, config, fixes):
        return UndroppedDrafterLookupScheduler(config, fixes)


class WatermarkOffConnector(KVOffloadConnector):
    def choose_fixes(self, configured):
        return configured.without("final_token_watermark")


class CrashOnFirstCompletionConnector(KVOffloadConnector):
    """Dies like a connector with a broken assert: the run must stop there and say so."""

    def update_connector_output(self, connector_output) -> None:
        if connector_output.kv_connector_worker_meta is not None:
            raise AssertionError("planted: completion bookkeeping broke")
        super().update_connector_output(connector_output)


class FenceRemovedConnector(KVOffloadConnector):
    """The reference with the worker fence removed: a store whose source blocks are handed to
    another request in this step is not waited for before the forward."""

    def register_kv_caches(self, kv_caches) -> None:
        super().register_kv_caches(kv_caches)
        self.worker.handler.wait = lambda job_ids: None


class ResetKeepsTierConnector(KVOffloadConnector):
    """vLLM #57727 planted: reset_cache says success and the tier keeps every chunk."""

    def reset_cache(self) -> bool:
        return True


class NeverDefersConnector(KVOffloadConnector):
    """A lookup that meets chunks still being stored answers "no hit" at once instead of "not
    yet": the request recomputes what the tier was about to hold (vLLM #49829), and a hit rate
    that counts the answer is not the one a deferring connector reports (vLLM #28585)."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        hits, is_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        return (0, False) if hits is None else (hits, is_async)


class NeverServesConnector(KVOffloadConnector):
    """Stores that never become hits (vLLM #41704 / #53498): every lookup answers no hit."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return 0, False


class FailedStoreVisibleConnector(KVOffloadConnector):
    """A failed store reported as a success (LMCache #4991): its keys become loadable."""

    def update_connector_output(self, connector_output) -> None:
        meta = connector_output.kv_connector_worker_meta
        if meta is not None:
            meta.results = [dataclasses.replace(result, success=True) for result in meta.results]
        super().update_connector_output(connector_output)


class LoadErrorsUnreportedConnector(KVOffloadConnector):
    """A failed load's blocks never reach vLLM (vLLM #39732): the base class's "no errors"."""

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set()


class ResetKeepsFinishedConnector(KVOffloadConnector):
    """vLLM #46284 planted: reset_cache forgets the jobs but keeps a finished request that was
    waiting for them; their completions come back stale and are ignored, so it stays tracked."""

    def reset_cache(self) -> bool:
        waiting = {req_id: state for req_id, state in self.core._requests.items() if state.req.status.is_finished}
        done = super().reset_cache()
        self.core._requests.update(waiting)
        return done


class LoadsWhileStoringConnector(KVOffloadConnector):
    """vLLM #46014 planted: the lookup of a re-admitted request does not wait for the stores it
    still has in flight, so a load is built beside them (``assert not transfer_jobs``)."""

    def choose_fixes(self, configured):
        return configured.without("defer_lookup_while_transferring")


class FailedAllocationSkippedConnector(KVOffloadConnector):
    """vLLM #25856 / #50069 planted: a store the full tier cannot take now is given up, not
    retried: ``prepare_store``'s None reads as "nothing to store", so the cursor moves past the
    chunks as if they were stored. (vLLM 0.32's ``_build_store_jobs`` counts the failure and
    keeps the cursor: the same chunks are offered again next step.)"""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        if self.core is not None:
            manager = self.core.manager
            prepare_store = manager.prepare_store

            def given_up_when_full(req_id, keys, positions=None):
                prepared = prepare_store(req_id, keys, positions)
                return prepared if prepared is not None else PrepareStoreOutput((), (), ())

            manager.prepare_store = given_up_when_full


class PreemptedBlocksKeptConnector(KVOffloadConnector):
    """vLLM #52170 / #52211 planted: re-admission after a preemption keeps the block table the
    request had before and appends the new one (vLLM 0.32 clears it where the request resumes,
    ``_update_req_states`` in ``kv_connector/v1/offloading/scheduler.py``), so chunk i's store
    reads the old table's block i, freed at the preemption and handed out again since: keys and
    block ids out of step. The stale table is longer than the keys, so vLLM's length
    assert cannot fire; the wrong block's KV is stored under the key and a later load of it is
    poisoned."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        state = self.core._requests[request.request_id]
        kept = list(state.block_ids)  # empty at the first admission
        answer = super().get_num_new_matched_tokens(request, num_computed_tokens)
        state.block_ids[:0] = kept
        return answer


class AsksForKvDeliveryConnector(KVOffloadConnector):
    """The reference connector without its opt-out of KV delivery: the base class's default for a
    kv_both connector (vLLM 0.27+), so a preemption drops the request's in-flight output."""

    @property
    def requires_kv_delivery(self):
        return True


class OpaqueConnector(KVOffloadConnector):
    """A connector the gates cannot look inside (no scheduler ``core``, as any connector not built
    on the reference), which notes every shutdown of either side."""

    shutdowns: list[str] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.core = None

    def shutdown(self) -> None:
        OpaqueConnector.shutdowns.append("worker" if self.worker is not None else "scheduler")
        super().shutdown()


class UnfencedAllocationsConnector(KVOffloadConnector):
    """vLLM #46951 (catalogue K13) planted: an allocation with no external tokens is not recorded
    for the fence (the early return of vLLM 0.32's update_state_after_alloc), so a block another
    connector of a MultiConnector loads into can be rewritten while a store still reads it."""

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens:
            super().update_state_after_alloc(request, blocks, num_external_tokens)
