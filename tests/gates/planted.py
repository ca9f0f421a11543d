"""Connectors' scheduler sides that ship a catalogued bug no fix flag plants (the bug was fixed
before the oldest preset's release): the simulator's gates replay them, and
tests/vllm/broken_connector.py wraps them for vLLM's scheduler."""

from __future__ import annotations

import dataclasses

from kvoffload.core.hybrid import HybridConnectorScheduler
from kvoffload.core.model import GroupKind
from kvoffload.core.types import NULL_BLOCK


class StaleWindowBlocksScheduler(HybridConnectorScheduler):
    """vLLM before PR #42959 (0.23.0), K14: a sliding window's table keeps the ids of blocks the
    engine freed behind the window and handed out again, so a late store copies another
    request's KV under this request's key."""

    def _take_new_blocks(self, out, allocated) -> None:
        for req_id, new_groups in out.new_block_ids.items():
            state = self._requests.get(req_id)
            for g, blocks in enumerate(new_groups):
                if state is not None:
                    state.groups[g].block_ids.extend(blocks)
                allocated.update(blocks)
        allocated.discard(NULL_BLOCK)


class UnfencedWindowScheduler(HybridConnectorScheduler):
    """K14's fence half: a sliding window's source blocks enter the fence only when the request
    finishes, like full attention's (vLLM 0.32's ``_build_store_jobs`` fences them at the
    store's creation, ``fenced_block_ids``), so a schedule that hands out a block the window
    freed does not flush the store still queued to read it."""

    def __init__(self, config, fixes=None, manager=None):
        super().__init__(config, fixes, manager)
        plain = self.jobs.add_store

        def fenced_at_finish_only(req_id, keys, source_blocks, fence_now, fence_early=()):
            return plain(req_id, keys, source_blocks, fence_now)

        self.jobs.add_store = fenced_at_finish_only


class UnroundedMambaHitScheduler(HybridConnectorScheduler):
    """vLLM before 0.25.0 (#44599), K18: a Mamba group's hit is bounded only one token short of
    the request, as a window's, not rounded down to a chunk's end where a state was stored, so an
    exact resend of a stored prefix is served one token short with the state of its whole."""

    def _lookup_bound(self, req) -> int:
        return req.num_tokens - (1 if self._sliding else 0)


class StatelessDivergentLoadScheduler(HybridConnectorScheduler):
    """K19: a connector told the deeper full-attention hit of a hybrid whose Mamba state the GPU
    lost (``supports_divergent_local_hybrid_hits``, vLLM 0.28+) that loads the attention past
    it and leaves the state out: the request resumes from a state block no load or forward of
    its own wrote (the plant of tests/vllm/broken_connector.py, the stock connector whose load
    sees only nulls in the Mamba group)."""

    supports_divergent_local_hybrid_hits = True

    def build_connector_meta(self, out):
        plan = super().build_connector_meta(out)
        jobs = []
        for job in plan.load_jobs:
            kept = [i for i, group in enumerate(job.chunk_groups) if self.groups[group].kind is not GroupKind.MAMBA]
            jobs.append(job._replace(**{field: tuple(getattr(job, field)[i] for i in kept) for field in (
                "gpu_block_ids", "chunk_slots", "chunk_indices", "chunk_groups", "chunk_skips")}))
        return dataclasses.replace(plan, load_jobs=tuple(jobs))


class UndroppedDrafterLookupScheduler(HybridConnectorScheduler):
    """A drafter group of its own (K17's ``qwen3-next-mtp``) looked up like a target group: no
    chunk past the bound, none dropped (``_lookup_complete_chunks`` without its ``is_eagle_group``
    branch). Its stores keep the reference's trailing-chunk exclusion."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._drafters = frozenset()


class StoredDrafterTailScheduler(HybridConnectorScheduler):
    """The reference with core/drafter.py's store exclusion removed: a drafter group's trailing
    chunk stored while decoding, like a target group's. Its lookups keep the drop."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stores.drafters = frozenset()
