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
        self.pending_loads: dict[str, tuple[int, int]] = {}  # request -> positions its load writes
        self.first_admission: dict[str, tuple[int, int]] = {}  # request -> (GPU hit, connector hit)
        self._local_at_lookup: dict[str, int] = {}
        self._parent_end: dict[str, tuple[int, tuple[int, ...]]] = {}  # last fully-written chunk end, truth

    def attach(self, connector) -> None:
        """Observe the connector's lookup and after-alloc calls (outside any timing wrapper)."""
        lookup, after_alloc = connector.get_num_new_matched_tokens, connector.update_state_after_alloc

        def observed_lookup(request, num_computed_tokens, *args, **kwargs):
            hits, is_async = lookup(request, num_computed_tokens, *args, **kwargs)
            self._local_at_lookup[request.request_id] = num_computed_tokens
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

    def parent_finished(self, req_id: str, truth: tuple[int, ...], request) -> None:
        """Remember a finished parent's last fully-written chunk, by the simulator's definition."""
        aborted = request.status.name == "FINISHED_ABORTED"
        self._parent_end[req_id] = (last_written_chunk_end(request.num_tokens, request.num_computed_tokens,
                                                           aborted, self.tokens_per_chunk), truth)
