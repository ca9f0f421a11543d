"""What the connector's scheduler side remembers per request, and the counters it keeps."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvoffload.core.types import BlockId, ConnectorCrash, JobId, OffloadKey, RequestView


@dataclass(slots=True)
class RequestState:
    """One request, from on_new_request until the connector releases it."""

    req: RequestView
    offload_keys: list[OffloadKey] = field(default_factory=list)  # key of chunk i
    block_ids: list[BlockId] = field(default_factory=list)  # the request's GPU block table
    next_stored_chunk: int = 0  # chunks below were stored, skipped or hit; set via move_cursor
    store_boundary: int = 0  # (next_stored_chunk + 1) * tokens_per_chunk: the decode step's test
    num_local_tokens: int = 0  # GPU prefix-cache hit tokens at the last admission
    finish_signalled: bool = False  # manager.on_request_finished was called
    # Only with reset_clears_request_jobs off: job ids reset_cache forgot to clear (vLLM #48102).
    stale_job_ids: tuple[JobId, ...] = ()
    # A hybrid model (core/hybrid.py): keys, blocks and cursor per KV cache group instead of the
    # three fields above (vLLM's RequestGroupState), and where its last admission's hit ended, in
    # tokens (vLLM's update_num_hit_chunks divides it by each group's chunk).
    groups: list["GroupState"] | None = None
    num_hit_tokens: int = 0

    def move_cursor(self, chunk: int, tokens_per_chunk: int) -> None:
        self.next_stored_chunk = chunk
        self.store_boundary = (chunk + 1) * tokens_per_chunk

    def refresh_keys(self, blocks_per_chunk: int) -> None:
        """Key of chunk i = hash of the chunk's last GPU block (hashes are chained)."""
        hashes = self.req.block_hashes
        keys = self.offload_keys
        for last_block in range((len(keys) + 1) * blocks_per_chunk - 1, len(hashes), blocks_per_chunk):
            keys.append(hashes[last_block])

    def crash_on_stale_jobs(self, where: str) -> None:
        """vLLM <= 0.25 indexed its job table with every id a request listed; after a
        reset_cache that left the ids behind (PR #48102) that was a KeyError, EngineCore dead."""
        raise ConnectorCrash(f"KeyError in {where}: job {self.stale_job_ids[0]} of {self.req.req_id!r} "
                             f"was dropped by reset_cache")


@dataclass(slots=True)
class GroupState:
    """One KV cache group of one request (vLLM's ``RequestGroupState``)."""

    offload_keys: list[OffloadKey] = field(default_factory=list)  # key of chunk i in this group
    block_ids: list[BlockId] = field(default_factory=list)  # the group's block table (0: null)
    next_stored_chunk: int = 0  # chunks below were stored, skipped or hit


@dataclass
class SchedulerStats:
    lookups: int = 0  # lookups that returned a result (deferrals excluded)
    deferred_lookups: int = 0
    queried_tokens: int = 0  # tokens the connector was asked to serve
    hit_tokens: int = 0
    load_jobs: int = 0
    store_jobs: int = 0
    chunks_stored: int = 0  # chunks handed to a store job
    store_allocation_failures: int = 0
    flushed_jobs: int = 0
