"""The fake worker of the ``vllm-scheduler`` replay (``replay.py``): one ``execute_model`` step
as vLLM's GPU model runner takes it, with the forward replaced by the KV content oracle's
writes (``model.py``), and the oracle's check of every load that landed.

A mixin of :class:`~kvoffload.vllm.replay.VllmSchedulerReplay`: it reads the replay's scheduler,
worker connector, block tables, scripted sequences and record.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

from kvoffload.engine.mamba import accepted_state_end
from kvoffload.engine.record import PoisonedLoad
from kvoffload.vllm.connector_parts import copy_hook
from kvoffload.vllm.model import StateCells, poisoned_chunks, write_positions, write_states


class FakeWorker:
    def _execute(self, step: int, scheduler_output):
        worker, bs = self.worker, self.engine.block_size
        meta = scheduler_output.kv_connector_metadata
        self.store_delays.step = step
        worker.handle_preemptions(meta)  # may submit the previous step's deferred stores
        computed = self.tables.update(scheduler_output)
        self.store_delays.allocated(scheduler_output)
        worker.bind_connector_metadata(meta)
        writes, accepted = [], {}
        self._written_ends = []
        drafts_of = scheduler_output.scheduled_spec_decode_tokens
        fresh = {new.req_id for new in scheduler_output.scheduled_new_reqs}
        fresh.update(scheduler_output.scheduled_cached_reqs.resumed_req_ids)
        in_flight = self._in_flight(fresh)
        for req_id, count in scheduler_output.num_scheduled_tokens.items():
            produced, rejected = in_flight.get(req_id, (0, 0))
            sequence, start = self._sequences[req_id], computed[req_id] - rejected
            drafts = len(drafts_of.get(req_id, ()))
            real = count - drafts
            values = sequence.written(start, real)
            if drafts:  # a request admitted this step has padding, never accepted (pad_spec_decode)
                accepted[req_id] = 0 if req_id in fresh else self._accepted_drafts(req_id, drafts, produced)
                values = np.concatenate([values, np.asarray(sequence.draft_fingerprints(
                    start + real - 1, drafts, accepted[req_id]), dtype=np.int64)])
            writes.append((req_id, start, values))
            self._written_ends.append((req_id, start + real))
            for table, size in zip(self.tables.groups[req_id], self.group_sizes):
                self.store_delays.written(step, table, start, start + real + accepted.get(req_id, 0), size)
            self.record.scheduled_tokens += count
        context = self._forward_context()
        # Loads a step's forward reads (a synchronous connector's) start before it, as vLLM's
        # model runner starts them (has_sync_kv_loads, kv_connector_model_runner_mixin.py).
        sync_first = bool(getattr(scheduler_output, "has_sync_kv_loads", False))
        if sync_first:
            worker.start_load_kv(context)
            # A Mamba state loaded now is read by this forward, which then overwrites it in place:
            # check it before (the other groups' slots after, with the load's failures known).
            for req_id in sorted(self.ledger.sync_loads.intersection(scheduler_output.num_scheduled_tokens)):
                self._check_load(step, req_id, set(), states=True, keep_claim=True)
        for group, cells in enumerate(self.group_cells):  # each group's layers, with its salt (engine/oracle.py)
            if isinstance(cells, StateCells):  # the state after each request's last real token,
                # or at the boundary its accepted drafts reached (engine/mamba.py, accepted_state_end)
                states = []
                for (req_id, start, values), (_, end) in zip(writes, self._written_ends):
                    if end > start:
                        state = accepted_state_end(end, accepted.get(req_id, 0), bs, len(self._sequences[req_id].truth))
                        states.append((self.tables.groups[req_id][group], state, int(values[state - start - 1])))
                write_states(cells, states, bs, group)
                continue
            write_positions(cells, [(self.tables.groups[req_id][group], start, cells.values(self._sequences[req_id],
                                                                                               start, values))
                                    for req_id, start, values in writes], self.group_sizes[group], group)
        for name, view in self.kv_caches.items():  # each attention layer hands its KV on after writing it
            worker.save_kv_layer(name, view, context.attn_metadata[name])
        if not sync_first:
            worker.start_load_kv(context)
        worker.wait_for_save()
        copy_hook(worker)()
        _, recving = worker.get_finished(scheduler_output.finished_req_ids)
        # Failed loads' blocks travel with the pass that reports the load, as vLLM's runner
        # carries them (kv_connector_model_runner_mixin.py): its scheduler recomputes them or
        # fails the request (kv_load_failure_policy), so their garbage is never read.
        invalid = worker.get_block_ids_with_load_errors()
        for req_id in sorted(recving or ()):
            self._check_load(step, req_id, invalid)
        for req_id in sorted(self.ledger.sync_loads.intersection(scheduler_output.num_scheduled_tokens)):
            self.ledger.sync_loads.discard(req_id)  # loaded in this step, before its forward
            self._check_load(step, req_id, invalid, states=False)
        kv_output = KVConnectorOutput(finished_recving=recving or None, invalid_block_ids=invalid,
                                      kv_connector_worker_meta=worker.build_connector_worker_meta())
        worker.clear_connector_metadata()
        req_ids = list(scheduler_output.num_scheduled_tokens)
        output = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                   sampled_token_ids=[], logprobs=None, prompt_logprobs_dict={}, pooler_output=[],
                                   kv_connector_output=kv_output)
        # Which requests sample is fixed now (a partial prefill chunk does not).
        samples = {r for r in req_ids if not self._requests[r].is_prefill_chunk}
        return step, scheduler_output, output, samples, accepted

    def _forward_context(self):
        """What a layer-wise connector reads of vLLM's forward context (``ForwardContext``): each
        attention layer with its KV cache, and per-layer attention metadata (vLLM's own type
        matters only to MLA connectors)."""
        if getattr(self, "_context", None) is None:
            self._context = SimpleNamespace(
                attn_metadata={name: SimpleNamespace(layer=name) for name in self.kv_caches},
                no_compile_layers={name: SimpleNamespace(kv_cache=view) for name, view in self.kv_caches.items()},
                virtual_engine=0)
        return self._context

    def _in_flight(self, fresh: set[str]) -> dict[str, tuple[int, int]]:
        """Async: per request scheduled again, the tokens the step still in flight produces and
        the drafts it rejected. The scheduler counted those drafts as computed; vLLM's GPU model
        runner corrects its positions by the previous step's rejections
        (``GPUModelRunner._update_states``, ``prev_num_draft_len``)."""
        if self._pending is None:
            return {}
        _, previous, _, samples, accepted = self._pending
        drafts = previous.scheduled_spec_decode_tokens
        return {req_id: (accepted.get(req_id, 0) + 1, len(drafts.get(req_id, ())) - accepted.get(req_id, 0))
                for req_id in samples if req_id not in fresh}

    def _accepted_drafts(self, req_id: str, drafts: int, in_flight: int) -> int:
        """The workload's scripted acceptance (else the seeded model), capped so that the bonus
        token stays inside the script, counting the ``in_flight`` tokens of the step not yet
        processed (the simulator's rule, ``LiveRequest.accepted_drafts``)."""
        spec, request = self.specs[req_id], self._requests[req_id]
        counts = spec.accept_counts
        if counts:
            accepted = counts[self._spec_steps[req_id] % len(counts)]
        else:
            accepted = 0
            while accepted < drafts and self.rng.random() < self.engine.spec_acceptance:
                accepted += 1
        self._spec_steps[req_id] += 1
        return max(0, min(accepted, drafts, spec.max_tokens - request.num_output_tokens - in_flight - 1))

    def _check_load(self, step: int, req_id: str, invalid: set[int], states: bool | None = None,
                    keep_claim: bool = False) -> None:
        """The load landed: every slot it wrote must hold the fingerprint of its true prefix, and
        a Mamba group's state the state at the resume point (``poisoned_chunks``; ``states``
        picks the groups), unless the worker reported its blocks failed (vLLM does not count them
        computed)."""
        claim = (self.ledger.pending_loads.get if keep_claim else self.ledger.pending_loads.pop)(req_id, None)
        if claim is None:
            return
        start, end = claim
        sizes = self.group_sizes  # each group's grid; a chunk is blocks_per_chunk of its blocks
        tables = self.scheduler.kv_cache_manager.get_block_ids(req_id)
        if any(invalid.intersection(table[start // bs:-(-end // bs)]) for table, bs in zip(tables, sizes)):
            return
        if states is not True:
            self.checked_load_tokens += end - start
        for group, chunk, count in poisoned_chunks(self.group_cells, tables, self._sequences[req_id].fingerprints,
                                                   start, end, sizes, self.engine.blocks_per_chunk, states):
            self.record.poisoned.append(PoisonedLoad(step, req_id, chunk, count, group))
