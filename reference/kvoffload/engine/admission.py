"""Admission: the waiting side of vLLM 0.32's ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``).

Each step, once the running requests have their slots and none was preempted, admission walks the
KV-holding queue (requests whose connector load is in flight or has landed), then the waiting
queue, and for each request in turn:

- a LOADING request is set aside (its load has not landed);
- a LOADED request caches its loaded blocks and asks for blocks for the rest of its prompt
  (``_handle_blocked_waiting_request`` -> ``_update_waiting_for_remote_kv``);
- a WAITING one asks the GPU prefix cache, then the connector (``get_num_new_matched_tokens``;
  ``None`` sets it aside), then tries to allocate: a connector hit allocates blocks for the hit only
  (``if load_kv_async: num_new_tokens = 0``) and must leave the blocks admitted prefills still need
  (``_inflight_prefill_reserved_blocks``); with ``reserve_full_isl`` the whole prompt must fit
  (``allocate_slots(full_sequence_must_fit=...)``).

The first request that cannot get its blocks ends admission for the step (``if new_blocks is
None: break``). The scheduler (``scheduler.py``) owns the queues and the step's batch; a request
admitted to run is handed back to it through ``join_step``. The rules and their tests are listed
in docs/engine.md.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Any, Callable, Protocol

from kvoffload.core.types import RequestStatus, cdiv
from kvoffload.engine import spec
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.drafter import decode_step_slots
from kvoffload.engine.live import LiveRequest, Phase
from kvoffload.engine.observer import RunObserver


class SchedulerQueues(Protocol):
    """What admission reads and changes of the scheduler that owns it all (``scheduler.py``'s
    ``SchedulerModel``). Named here so the dependency runs one way: the scheduler imports
    admission, never the reverse."""

    config: EngineConfig
    pool: BlockPool
    connector: Any  # the connector's scheduler side under test
    observer: RunObserver
    waiting: deque[LiveRequest]
    kv_holding: deque[LiveRequest]
    running: list[LiveRequest]
    finished: dict[str, LiveRequest]
    inflight_prefills: dict[str, LiveRequest]

    def commit_computed(self, live: LiveRequest, num_tokens: int) -> None: ...


class Outcome(enum.Enum):
    """What one admission attempt did with the request at the head of its queue."""

    STOP = "stop"  # it cannot get its blocks: admission ends for this step, it stays first
    DEFERRED = "deferred"  # the connector asks to be asked again: back to the waiting queue
    LOADING = "loading"  # admitted with a connector hit: into the KV-holding queue
    RUNNING = "running"  # admitted to run this step


class Admission:
    def __init__(self, scheduler: SchedulerQueues):
        self.scheduler = scheduler
        self.config = scheduler.config
        self.pool = scheduler.pool
        self.padding = spec.DecodePadding(self.config, [])  # set by the scheduler every step

    def admit(self, budget: int, join_step: Callable[[LiveRequest, int], None]) -> None:
        """Walk the KV-holding queue, then the waiting queue, until the budget, the seats or the
        blocks run out; ``join_step(live, num_tokens)`` puts each request admitted to run into
        the step. Requests set aside go back to the front of their queue, their order kept."""
        scheduler = self.scheduler
        max_num_seqs = self.config.max_num_seqs
        set_aside_holding: list[LiveRequest] = []
        set_aside_waiting: list[LiveRequest] = []
        while budget > 0:
            queue = scheduler.kv_holding or scheduler.waiting
            if not queue or len(scheduler.running) >= max_num_seqs:
                break
            live = queue[0]
            if live.phase is Phase.LOADING:  # its load has not landed
                set_aside_holding.append(queue.popleft())
                continue
            if live.phase is Phase.LOADED:
                outcome, count = self._resume_loaded(live, budget)
            else:
                outcome, count = self._admit_new(live, budget)
            if outcome is Outcome.STOP:
                break
            queue.popleft()
            if outcome is Outcome.DEFERRED:
                set_aside_waiting.append(live)
            elif outcome is Outcome.LOADING:  # its job id arrives with the plan
                set_aside_holding.append(live)
            else:
                join_step(live, count)
                budget -= count
        scheduler.kv_holding.extendleft(reversed(set_aside_holding))
        scheduler.waiting.extendleft(reversed(set_aside_waiting))

    def _resume_loaded(self, live: LiveRequest, budget: int) -> tuple[Outcome, int]:
        """A landed load: cache the loaded blocks (even if it cannot run now), then allocate the
        rest of the chunk; the loaded request keeps its blocks while it waits."""
        req, pool, bs = live.req, self.pool, self.config.block_size
        self.scheduler.commit_computed(live, live.loaded_tokens)  # _update_waiting_for_remote_kv
        count = self.padding.count(req.num_tokens - req.num_computed_tokens, req.num_computed_tokens,
                                   min(req.num_tokens - req.num_computed_tokens, budget), budget)
        if count is None:  # spec decode: its padded step does not fit the budget
            return Outcome.STOP, 0
        hybrid = self.scheduler.hybrid
        if hybrid is not None and hybrid.mamba:  # the Mamba split; 0 ends admission for the step
            count = hybrid.split(live, req.num_computed_tokens, count)
            if not count:
                return Outcome.STOP, 0
        if hybrid is not None:  # allocate_slots: the whole-sequence gate, the window's skipped blocks, the step
            if self.config.reserve_full_isl and hybrid.blocks_for_running(live, req.num_tokens, True) > pool.num_free:
                return Outcome.STOP, 0
            hybrid.remove_skipped(live, req.num_computed_tokens - live.in_flight_tokens)
            if hybrid.blocks_for_running(live, req.num_computed_tokens + count) > pool.num_free:
                return Outcome.STOP, 0
            hybrid.allocate(live, req.num_computed_tokens + count)
            return Outcome.RUNNING, count
        needed = cdiv(req.num_computed_tokens + count, bs) - len(live.blocks)
        if self.config.reserve_full_isl and cdiv(req.num_tokens, bs) - len(live.blocks) > pool.num_free:
            return Outcome.STOP, 0
        if needed > pool.num_free:
            return Outcome.STOP, 0
        live.blocks.extend(pool.allocate(needed))
        return Outcome.RUNNING, count

    def _admit_new(self, live: LiveRequest, budget: int) -> tuple[Outcome, int]:
        """A new or preempted request: GPU prefix hit, connector hit, then the allocation."""
        req, bs = live.req, self.config.block_size
        hybrid, connector, diverged = self.scheduler.hybrid, self.scheduler.connector, False
        if hybrid is not None and getattr(connector, "supports_divergent_local_hybrid_hits", False):
            # Scheduler._get_local_prefix_cache_hit: such a connector is told full attention's hit
            group_hits, num_local, req.shared_prefix_boundary, diverged = hybrid.prefix_hit_for_connector(live)
            local_blocks = group_hits[0]
        elif hybrid is not None:
            group_hits, num_local, req.shared_prefix_boundary = hybrid.prefix_hit(live)
            local_blocks = group_hits[0]
        else:
            local_blocks = self.pool.cached_prefix(req.block_hashes, (req.num_tokens - 1) // bs, live.req_id)
            num_local = len(local_blocks) * bs
        observer = self.scheduler.observer
        hits, _ = observer.timed(connector.get_num_new_matched_tokens, req, num_local)
        if hits is None:
            return Outcome.DEFERRED, 0
        observer.looked_up(req.num_tokens - num_local)  # what the connector was asked about
        if diverged and not hits:  # nothing backs the deeper hit's Mamba state: the hit every group agrees on
            group_hits, num_local, req.shared_prefix_boundary = hybrid.prefix_hit(live)
            local_blocks = group_hits[0]
        count = 0 if hits else self.padding.count(req.num_tokens - num_local, num_local,
                                                  min(req.num_tokens - num_local, budget), budget)
        if count is None:  # spec decode: its padded step does not fit the budget
            return Outcome.STOP, 0
        if count and hybrid is not None and hybrid.mamba:  # the Mamba split; 0 ends admission for the step
            count = hybrid.split(live, num_local, count)
            if not count:
                return Outcome.STOP, 0
        if hybrid is not None:
            if not self._fits_hybrid(live, hybrid, group_hits, num_local, hits, count):
                return Outcome.STOP, 0
            self._allocate(live, local_blocks, 0, hits, group_hits, num_local + hits + count)
            return (Outcome.LOADING, 0) if hits else (Outcome.RUNNING, count)
        needed = cdiv(num_local + hits + count, bs) - len(local_blocks)
        if not self._fits(live, local_blocks, needed, hits):
            return Outcome.STOP, 0
        self._allocate(live, local_blocks, needed, hits)
        return (Outcome.LOADING, 0) if hits else (Outcome.RUNNING, count)

    def _fits(self, live: LiveRequest, local_blocks: list[int], needed: int, hits: int) -> bool:
        """The allocation would succeed: the whole prompt fits with ``reserve_full_isl``, and a
        load leaves the blocks the admitted prefills still need."""
        free = self.pool.num_free_after_taking(local_blocks)
        full_prompt = cdiv(live.req.num_tokens, self.config.block_size)
        if self.config.reserve_full_isl and full_prompt - len(local_blocks) > free:
            return False
        # A load also leaves one decode step's blocks under spec decode (_spec_decode_step_blocks).
        return needed <= free - (self.inflight_reserved_blocks() + spec.step_blocks(self.config) if hits else 0)

    def _fits_hybrid(self, live: LiveRequest, hybrid, group_hits, num_local: int, hits: int, count: int) -> bool:
        """``allocate_slots`` for a hybrid model: the whole sequence within every group's cap
        (``full_sequence_must_fit``), then this step's blocks, a load leaving the reservation."""
        total, free = num_local + hits, self.pool.num_free
        if self.config.reserve_full_isl and hybrid.blocks_for_new(group_hits, total, live.req.num_tokens, True) > free:
            return False
        reserved = self.inflight_reserved_blocks() + hybrid.spec_step_blocks if hits else 0
        return hybrid.blocks_for_new(group_hits, total, total + count, False) <= free - reserved

    def _allocate(self, live: LiveRequest, local_blocks: list[int], needed: int, hits: int,
                  group_hits=None, num_slots: int = 0) -> None:
        """Take the prefix hit, allocate the rest, tell the connector (``update_state_after_alloc``,
        which builds the load job for a hit). A hybrid model: every group's hit and ``num_slots``."""
        scheduler, req, hybrid = self.scheduler, live.req, self.scheduler.hybrid
        parent_id = live.spec.parent
        num_local = len(local_blocks) * (self.config.block_size if hybrid is None else hybrid.sizes[0])
        scheduler.observer.admitted(live, num_local, hits, scheduler.finished.get(parent_id) if parent_id else None)
        req.num_computed_tokens = num_local
        if hybrid is not None:
            hybrid.adopt(live, group_hits, req.num_computed_tokens, hits)
            hybrid.allocate(live, num_slots)
            block_ids = hybrid.block_ids(live)
        else:
            self.pool.take(local_blocks)
            live.blocks = local_blocks + self.pool.allocate(needed)
            live.num_committed_blocks = len(local_blocks)
            block_ids = tuple(live.blocks)
        scheduler.observer.timed(scheduler.connector.update_state_after_alloc, req, block_ids, hits)
        if hits:  # its blocks are cached once the load landed and admission reaches it again
            live.loaded_tokens = req.num_computed_tokens + hits
            live.phase = Phase.LOADING
            req.status = RequestStatus.WAITING_FOR_LOAD
            scheduler.inflight_prefills[live.req_id] = live

    def inflight_reserved_blocks(self) -> int:
        """Blocks the admitted prefills still need for their whole prompt (and, with drafts,
        one decode step), as vLLM's ``_inflight_prefill_reserved_blocks``."""
        bs = self.config.block_size
        extra = decode_step_slots(self.config)
        hybrid = self.scheduler.hybrid
        if hybrid is not None:
            return sum(hybrid.remaining_blocks(live, extra) for live in self.scheduler.inflight_prefills.values())
        return sum(max(0, cdiv(live.req.num_tokens + extra, bs) - len(live.blocks))
                   for live in self.scheduler.inflight_prefills.values())
