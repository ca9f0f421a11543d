"""vLLM 0.32's scheduling rules, one story each, told to the scheduler model and the block pool.

The connector is a script here: it answers each lookup with the hits the story needs, so every
test isolates one rule of ``vllm/v1/core/sched/scheduler.py`` or ``vllm/v1/core/block_pool.py``
(docs/engine.md lists them with their vLLM function names). Block size 4 throughout.
"""

from __future__ import annotations

from kvoffload.core.types import RequestStatus
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.live import LiveRequest, Phase
from kvoffload.engine.requests import RequestSpec
from kvoffload.engine.scheduler import StepOutput
from scripted import BS, ScriptedConnector, arrive, land, model, step, tokens


def processed(scheduler, number: int = 0):
    """One step, its output processed at once (sync scheduling)."""
    out, scheduled = step(scheduler, number)
    scheduler.update_from_output(StepOutput(number, tuple(scheduled), ()))
    return out


class TestLoadAllocation:
    def test_a_load_holds_blocks_for_its_hit_only_and_gets_the_rest_when_it_resumes(self):
        """schedule(): ``if load_kv_async: num_new_tokens = 0`` -- blocks for GPU + connector hit."""
        scheduler = model(ScriptedConnector({"L": [8]}))
        loading = arrive(scheduler, "L", prompt=20)
        step(scheduler)
        assert loading.phase is Phase.LOADING
        assert len(loading.blocks) == 2  # 8 hit tokens
        land(scheduler, loading)
        out, _ = step(scheduler, 1)
        assert len(loading.blocks) == 5 and out.num_scheduled_tokens == {"L": 12}

    def test_loaded_blocks_are_cached_when_admission_reaches_the_request(self):
        """_update_waiting_for_remote_kv caches them, from _handle_blocked_waiting_request."""
        scheduler = model(ScriptedConnector({"L": [8]}), max_num_seqs=2)
        arrive(scheduler, "B", prompt=4)
        loading = arrive(scheduler, "L", prompt=20)
        step(scheduler)  # B runs, L loads
        other = arrive(scheduler, "C", prompt=4)
        step(scheduler, 1)  # C takes the second seat
        land(scheduler, loading)
        step(scheduler, 2)  # both seats taken: admission never reaches L
        assert loading.phase is Phase.LOADED and loading.num_committed_blocks == 0
        scheduler.finish(other, RequestStatus.FINISHED_ABORTED, 2)
        step(scheduler, 3)
        assert loading.phase is Phase.RUNNING and loading.num_committed_blocks == 5  # its whole prompt


    def test_a_hit_covering_the_whole_prompt_still_recomputes_its_last_token(self):
        """_update_waiting_for_remote_kv: ``num_computed_tokens = min(..., num_tokens - 1)`` --
        the forward of the last prompt token is what samples the first output token."""
        scheduler = model(ScriptedConnector({"L": [8]}))
        loading = arrive(scheduler, "L", prompt=8)  # every token of it is in the offload tier
        step(scheduler)
        land(scheduler, loading)
        assert loading.req.num_computed_tokens == 7
        out, scheduled = step(scheduler, 1)
        assert out.num_scheduled_tokens == {"L": 1}
        assert (scheduled[0].start, scheduled[0].samples) == (7, True)

    def test_blocks_loaded_for_a_request_serve_a_later_one_from_the_gpu_after_it_was_aborted(self):
        """_update_waiting_for_remote_kv caches the loaded blocks as soon as admission reaches
        the request, whether or not it then runs: once freed they stay in the prefix cache."""
        scheduler = model(ScriptedConnector({"L": [8]}), gpu_blocks=9, reserve_full_isl=False)
        arrive(scheduler, "R", prompt=16, output=8)
        processed(scheduler)  # R holds 4 of the 8 usable blocks
        loader = arrive(scheduler, "L", prompt=20)
        processed(scheduler, 1)  # L loads its first 8 tokens into 2 blocks
        land(scheduler, loader)
        processed(scheduler, 2)  # admission reaches L: 3 more blocks needed, 1 free -- it waits
        assert loader.phase is Phase.LOADED and loader.num_committed_blocks == 2
        scheduler.abort("L", 3)
        later = LiveRequest.create(RequestSpec("M", loader.spec.prompt_token_ids[:8] + tokens(50, 4),
                                               tokens(51, 2)), BS, 3)
        scheduler.add(later)
        out = processed(scheduler, 3)
        assert out.num_scheduled_tokens["M"] == 4  # its first 8 tokens hit the GPU prefix cache
        assert scheduler.observer.record.gpu_hit_tokens == 8


class TestPreemption:
    """A and B decode in a pool of 5 usable blocks; C (one block) arrives while they do. At step 1
    A needs a fifth block: B, the newest running request, is preempted and frees 2."""

    def crowd(self):
        scheduler = model(gpu_blocks=6, max_num_seqs=3, reserve_full_isl=False)
        arrive(scheduler, "A", prompt=8, output=8)
        victim = arrive(scheduler, "B", prompt=8, output=8)
        processed(scheduler)
        arrive(scheduler, "C", prompt=4)
        return scheduler, victim

    def test_a_step_that_preempted_admits_no_one(self):
        """schedule(): ``if not preempted_reqs ...`` guards the whole waiting side, the
        KV-holding queue included: L's load landed and L fits in the block B freed, yet it waits."""
        scheduler = model(ScriptedConnector({"L": [4]}), gpu_blocks=6, max_num_seqs=3, reserve_full_isl=False)
        arrive(scheduler, "A", prompt=8, output=8)
        arrive(scheduler, "B", prompt=8, output=8)
        loader = arrive(scheduler, "L", prompt=5, output=2)
        processed(scheduler)  # A and B prefill on 4 blocks, L loads 4 tokens into the fifth
        land(scheduler, loader)
        out = processed(scheduler, 1)
        assert out.preempted_req_ids == ("B",) and scheduler.pool.num_free == 1  # L needs just 1 ...
        assert out.num_scheduled_tokens == {"A": 1} and loader.phase is Phase.LOADED  # ... and waits
        assert processed(scheduler, 2).num_scheduled_tokens == {"A": 1, "L": 1}

    def test_the_victim_goes_back_to_the_front_of_the_waiting_queue(self):
        """_preempt_request: ``self.waiting.prepend_request(request)`` -- ahead of C, which
        arrived first; C cannot pass it while B cannot get its blocks."""
        scheduler, victim = self.crowd()
        processed(scheduler, 1)
        assert [live.req_id for live in scheduler.waiting] == ["B", "C"]
        out = processed(scheduler, 2)  # B needs 3 blocks, 2 are free: admission stops at B
        assert out.num_scheduled_tokens == {"A": 1} and victim.phase is Phase.WAITING
        assert victim.req.num_computed_tokens == 0  # recompute preemption: its progress is gone


class TestAdmissionOrder:
    def test_requests_holding_blocks_are_admitted_before_older_waiting_ones(self):
        """kv_holding_waiting is drained first: a landed load takes the seat."""
        scheduler = model(ScriptedConnector({"W": [None], "L": [8]}), max_num_seqs=1)
        waiting = arrive(scheduler, "W", prompt=8)  # its first lookup is deferred
        loading = arrive(scheduler, "L", prompt=12)
        step(scheduler)
        assert waiting.phase is Phase.WAITING and loading.phase is Phase.LOADING
        land(scheduler, loading)
        out, _ = step(scheduler, 1)
        assert list(out.num_scheduled_tokens) == ["L"]

    def test_admission_stops_at_the_first_request_that_cannot_get_blocks(self):
        """``if new_blocks is None: break`` -- a landed load that fits does not slip past one
        that does not."""
        scheduler = model(ScriptedConnector({"L1": [8], "L2": [4]}), gpu_blocks=9, reserve_full_isl=False)
        first = arrive(scheduler, "L1", prompt=16)  # holds 2 blocks, needs 2 more
        second = arrive(scheduler, "L2", prompt=8)  # holds 1 block, needs 1 more
        arrive(scheduler, "R", prompt=16)  # runs on 4 of the 5 blocks left
        step(scheduler)
        assert scheduler.pool.num_free == 1
        land(scheduler, first)
        land(scheduler, second)
        out, _ = step(scheduler, 1)
        assert "L2" not in out.num_scheduled_tokens and second.phase is Phase.LOADED

    def test_the_whole_prompt_must_fit_with_reserve_full_isl(self):
        """allocate_slots(full_sequence_must_fit=scheduler_reserve_full_isl): not just the chunk."""
        for reserve, admitted in ((True, {}), (False, {"long": 8})):
            scheduler = model(gpu_blocks=5, max_num_batched_tokens=8, reserve_full_isl=reserve)
            arrive(scheduler, "long", prompt=24)  # 6 blocks, 4 free; the first chunk needs 2
            out, _ = step(scheduler)
            assert out.num_scheduled_tokens == admitted

    def test_a_load_leaves_the_blocks_admitted_prefills_still_need(self):
        """reserved_blocks = _inflight_prefill_reserved_blocks() for async loads."""
        scheduler = model(ScriptedConnector({"L": [8]}), gpu_blocks=9, max_num_batched_tokens=8)
        prefill = arrive(scheduler, "P", prompt=24)  # 6 blocks; chunk 1 takes 2, 4 stay reserved
        step(scheduler)
        assert len(prefill.blocks) == 2 and scheduler.pool.num_free == 6
        loading = arrive(scheduler, "L", prompt=16)  # its hit needs 2 blocks: 6 free, 4 reserved
        scheduler._schedule_waiting(8, [], {}, {})
        assert loading.phase is Phase.LOADING
        late = arrive(scheduler, "M", prompt=16)
        scheduler.connector.hits["M"] = [8]  # 2 blocks; 4 free, P and L still need 4 + 2
        scheduler._schedule_waiting(8, [], {}, {})
        assert late.phase is Phase.WAITING and late.blocks == []


class TestDeferredBlockFree:
    def test_blocks_of_a_request_finished_while_its_step_is_in_flight_return_when_processed(self):
        """defer_block_free: _free_request_blocks parks them until update_from_output."""
        scheduler = model(scheduling="async")
        live = arrive(scheduler, "A", prompt=8, output=1)
        _, scheduled = step(scheduler)
        free_before = scheduler.pool.num_free
        scheduler.finish(live, RequestStatus.FINISHED_ABORTED, 0)  # an abort mid-step
        assert scheduler.pool.num_free == free_before
        scheduler.update_from_output(StepOutput(0, tuple(scheduled), ()))
        assert scheduler.pool.num_free == free_before + 2

    def test_a_request_scheduled_in_the_unprocessed_step_is_not_a_preemption_victim(self):
        """schedule(): ``if not self._request_blocks_can_be_freed(preempted_req): break``."""
        scheduler = model(scheduling="async", gpu_blocks=4)
        first = arrive(scheduler, "A", prompt=4, output=8)
        second = arrive(scheduler, "B", prompt=4, output=8)
        step(scheduler)  # both prefill: 2 blocks held, 1 free
        # Step 1: A needs a block for position 4 (1 free), B needs one too: none left, and B,
        # scheduled in step 0 whose output is not processed, cannot be preempted.
        out, _ = step(scheduler, 1)
        assert out.preempted_req_ids == () and list(out.num_scheduled_tokens) == ["A"]
        assert second.phase is Phase.RUNNING and first.phase is Phase.RUNNING


class TestAbortDuringLoad:
    def test_the_request_finishes_at_once_and_its_blocks_return_when_the_load_lands(self):
        """finish_requests: a WAITING_FOR_REMOTE_KVS request finishes now with
        delay_free_blocks; _update_from_kv_xfer_finished frees its blocks later."""
        scheduler = model(ScriptedConnector({"L": [8]}))
        loading = arrive(scheduler, "L", prompt=20)
        step(scheduler)
        free_while_loading = scheduler.pool.num_free
        scheduler.abort("L", 1)
        assert loading.phase is Phase.FINISHED and loading.status is RequestStatus.FINISHED_ABORTED
        assert scheduler.finished_since_schedule == ["L"]
        assert scheduler.pool.num_free == free_while_loading  # the copy still writes them
        scheduler.pool.check_invariants(scheduler.blocks_in_use())
        land(scheduler, loading)
        assert scheduler.pool.num_free == free_while_loading + 2


class TestBlockPool:
    def test_equal_hashes_are_all_committed_and_a_lookup_takes_the_earliest(self):
        """BlockHashToBlockMap: no de-duplication, block tables stay append-only."""
        pool = BlockPool(8, BS)
        first, second = pool.allocate(1), pool.allocate(1)
        pool.commit(first, [b"h"], 0, 1)
        pool.commit(second, [b"h"], 0, 1)
        assert pool.cached_prefix([b"h"], 1) == first
        pool.free(first)
        pool.allocate(pool.num_free)  # the free queue's tail, ``first``, is reused: evicted
        assert pool.cached_prefix([b"h"], 1) == second
        pool.check_invariants(blocks_in_use=7)

    def test_freed_uncommitted_blocks_go_to_the_head_tail_block_first(self):
        """free_blocks: prepend_n of the blocks in eviction order (the request's last first)."""
        pool = BlockPool(8, BS)
        blocks = pool.allocate(3)
        pool.free(blocks)
        assert pool.allocate(3) == blocks[::-1]


def test_engine_and_connector_share_one_geometry():
    """KVGeometry is defined once (core/types.py): the engine's fields take its names and
    defaults, and the connector's config is built from them field by field."""
    import dataclasses

    from kvoffload.core.types import KVGeometry

    engine_defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    for field in dataclasses.fields(KVGeometry):
        assert engine_defaults[field.name] == field.default, field.name
    config = EngineConfig(cpu_chunks=7, block_size=8, blocks_per_chunk=3, offload_prompt_only=True,
                          strict_lifecycle=False, workers=2)
    connector = config.connector_config()
    assert (connector.cpu_chunks, connector.tokens_per_chunk, connector.num_workers) == (7, 24, 2)
    assert connector.offload_prompt_only and not connector.strict_lifecycle
