"""What the replay sees of the connector from the scheduler's side of the API.

The vLLM engine cannot read a connector's internals (vLLM's stock one or anyone's), so what it
reports comes from the calls vLLM makes: each admission's lookup (the GPU prefix-cache hit it was
asked about, the tokens offered) and ``update_state_after_alloc`` (what vLLM accepted and will
load), counted as the simulator's observer counts them (``kvoffload.engine.observer``).
"""

from __future__ import annotations

import time
from typing import Iterable, MutableMapping

from kvoffload.engine.record import RunRecord, continuation, last_written_chunk_end


def timed_methods(target, names: Iterable[str], totals: MutableMapping[str, float]) -> None:
    """Replace each named method of ``target`` by one that adds its wall time to ``totals``."""
    for name in names:
        method = getattr(target, name, None)
        if method is None:
            continue

        def timed(*args, _method=method, _name=name, **kwargs):
            started = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                totals[_name] += time.perf_counter() - started

        setattr(target, name, timed)


class AdmissionLedger:
    def __init__(self, block_size: int, blocks_per_chunk: int, record: RunRecord, specs: dict):
        self.block_size = block_size
        self.blocks_per_chunk = blocks_per_chunk
        self.tokens_per_chunk = block_size * blocks_per_chunk
        self.record = record
        self.specs = specs
        self.loaded_tokens = 0  # connector hits vLLM accepted, i.e. positions loads will write
        self.sync_loads: set[str] = set()  # admitted with a load the connector makes before the forward
        self._async_at_lookup: dict[str, bool] = {}
        self.pending_loads: dict[str, tuple[int, int]] = {}  # request -> positions its load writes
        self._load_from: dict[str, int] = {}  # request -> where its latest connector load starts
        self.first_admission: dict[str, tuple[int, int]] = {}  # request -> (GPU hit, connector hit)
        self._local_at_lookup: dict[str, int] = {}
        self._parent_end: dict[str, tuple[int, tuple[int, ...]]] = {}  # last fully-written chunk end, truth

    def attach(self, connector, kv_cache_manager=None) -> None:
        """Observe the connector's lookup and after-alloc calls (outside any timing wrapper), and
        with ``kv_cache_manager`` the hit the scheduler settles on after the lookup
        (:meth:`_watch_agreed_hits`)."""
        if kv_cache_manager is not None:
            self._watch_agreed_hits(kv_cache_manager)
        lookup, after_alloc = connector.get_num_new_matched_tokens, connector.update_state_after_alloc

        def observed_lookup(request, num_computed_tokens, *args, **kwargs):
            hits, is_async = lookup(request, num_computed_tokens, *args, **kwargs)
            self._local_at_lookup[request.request_id] = num_computed_tokens
            self._async_at_lookup[request.request_id] = bool(is_async)
            if hits is not None:
                self.record.connector_lookups += 1
                self.record.connector_lookup_tokens += request.num_tokens - num_computed_tokens
            return hits, is_async

        def observed_alloc(request, blocks, num_external_tokens, *args, **kwargs):
            result = after_alloc(request, blocks, num_external_tokens, *args, **kwargs)
            self._admitted(request, num_external_tokens)
            return result

        connector.get_num_new_matched_tokens = observed_lookup
        connector.update_state_after_alloc = observed_alloc

    def _watch_agreed_hits(self, manager) -> None:
        """A hybrid's groups can hit to different depths. vLLM 0.27 tells every connector the
        deeper hit (``get_computed_blocks_for_connector``), 0.28+ one that sets
        ``supports_divergent_local_hybrid_hits``; when the connector then adds nothing, the
        scheduler asks ``get_computed_blocks`` again after the lookup and admits the hit every
        group agrees on (``Scheduler.schedule``, "Reconcile to the boundary every group agrees
        on"). That second answer is the GPU hit admitted, not what the lookup was told."""
        computed = manager.get_computed_blocks

        def observed(request, *args, **kwargs):
            result = computed(request, *args, **kwargs)
            if request.request_id in self._local_at_lookup:  # after this admission's lookup
                self._local_at_lookup[request.request_id] = result[1]
            return result
        manager.get_computed_blocks = observed

    def _admitted(self, request, num_external: int) -> None:
        req_id = request.request_id
        # vLLM calls after-alloc at every admission; only those right after a lookup are
        # admissions through the connector (not the resumption after a landed load).
        num_local = self._local_at_lookup.pop(req_id, None)
        if num_local is None:
            return
        record = self.record
        record.admissions += 1
        record.admission_asked_tokens += request.num_tokens - num_local
        record.admission_hit_tokens += num_external
        if num_external:
            self.pending_loads[req_id] = (num_local, num_local + num_external)
            if not self._async_at_lookup.get(req_id, True):
                self.sync_loads.add(req_id)
            self._load_from[req_id] = num_local
            self.loaded_tokens += num_external
        if req_id in self.first_admission:
            return
        self.first_admission[req_id] = (num_local, num_external)
        record.gpu_hit_tokens += num_local
        record.admitted_prompt_tokens += request.num_tokens
        record.connector_hit_tokens_admitted += num_external
        spec = self.specs[req_id]
        parent = self._parent_end.get(spec.parent) if spec.parent else None
        if parent is None:
            return
        last_chunk_end, truth = parent
        follow_up = continuation(req_id, spec.parent, spec.prompt_token_ids, truth, last_chunk_end,
                                 num_local, num_external)
        if follow_up is not None:
            record.continuations.append(follow_up)

    def parent_finished(self, req_id: str, truth: tuple[int, ...], request, loading: bool = False) -> None:
        """Remember a finished parent's last fully-written chunk, by the simulator's definition.
        ``loading``: aborted while vLLM's scheduler still waited for its connector load."""
        aborted = request.status.name == "FINISHED_ABORTED"
        computed = request.num_computed_tokens
        if aborted and loading:
            # vLLM counts a load as computed at admission, "even though KVs are not yet loaded"
            # (Scheduler.schedule); aborted before the scheduler saw it land, the request got only
            # as far as its GPU hit, as the simulator counts it (docs/fidelity.md, "An aborted
            # parent's load in flight").
            computed = min(computed, self._load_from.get(req_id, computed))
        self._parent_end[req_id] = (last_written_chunk_end(request.num_tokens, computed, aborted,
                                                           self.tokens_per_chunk), truth)


class StoreSubmitDelays:
    """Steps from a chunk's KV being fully written to the submission of the store that copies
    it, seen at the worker's transfer handler (any connector's stores pass through it).

    A chunk is fully written when a forward writes its last slot (a rejected draft's write does
    not count); a GPU block is keyed by its id and restarts from the step the scheduler hands it
    to a request, so a store of a chunk this request never wrote (a prefix-cache hit) counts from
    the step that planned it, as the simulator counts it (``kvoffload.engine.observer``,
    ``plan_built``: a chunk it saw no write of counts from the plan's step).
    """

    def __init__(self, block_size: int, record: RunRecord):
        self.block_size = block_size
        self.record = record
        self.step = 0
        self._full_at: dict[int, int] = {}  # GPU block id -> step its last slot was written

    def allocated(self, scheduler_output) -> None:
        """Blocks handed out by this schedule (new, appended, or a resumed request's table)."""
        full_at = self._full_at
        groups = [new.block_ids for new in scheduler_output.scheduled_new_reqs]
        groups += [ids for ids in scheduler_output.scheduled_cached_reqs.new_block_ids if ids]
        for ids in groups:
            for group_ids in ids:  # every KV cache group's (a hybrid model has several)
                for block in group_ids:
                    full_at[block] = self.step

    def written(self, step: int, table, start: int, valid_end: int, block_size: int | None = None) -> None:
        """``block_size``: the table's group's, where groups have their own (the engine's else)."""
        bs = block_size or self.block_size
        for index in range(-(-(start + 1) // bs) - 1, valid_end // bs):
            self._full_at[table[index]] = step

    def attach(self, handler) -> None:
        submit = handler.submit_store

        def observed(job):
            skips = job.skips()
            per_chunk = (len(job.gpu_block_ids) + sum(skips)) // len(skips) if skips else 0
            full_at, last = self._full_at, -1
            # the last block of each chunk (a chunk may skip leading blocks, or stop early)
            for count in job.counts(per_chunk):
                last += count
                self.record.store_submit_delays.append(self.step - full_at.get(job.gpu_block_ids[last], self.step))
            return submit(job)

        handler.submit_store = observed

    def attach_block_copies(self, backend) -> None:
        """A connector that stores single blocks through a copy backend (SimpleCPU's
        ``DmaCopyBackend.launch_copy(src_blocks, dst_blocks, is_store, ...)``): each stored GPU
        block counts as one chunk."""
        launch = backend.launch_copy

        def observed(src_blocks, dst_blocks, is_store, *args, **kwargs):
            if is_store:
                full_at = self._full_at
                self.record.store_submit_delays.extend(self.step - full_at.get(int(b), self.step) for b in src_blocks)
            return launch(src_blocks, dst_blocks, is_store, *args, **kwargs)

        backend.launch_copy = observed
