"""The reference connector and a Mamba group in align mode (core/hybrid.py, core/hybrid_stores.py):
vLLM 0.32's rules for ``qwen3-next``, one story each (docs/hybrid.md, "The reference connector
and Mamba"), then vLLM 0.25-0.28's block-table stores (the presets of 0.25, 0.26 and 0.28).

Full attention (group 0) and Mamba (group 1), block size 4. A Mamba state block holds the
state after every token before its boundary; the engine offers the states it cached in a step
(``SchedulerOutput.boundary_states``: group, block, boundary) and the connector stores only those,
never a Mamba block from the table (the running state is rewritten in place). The test plays the
engine: it hands each request its per-group block tables and offers.
"""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import PRESETS, Fixes, MambaStores, ReleaseRules
from kvoffload.core.hybrid import HybridConnectorScheduler, connector_scheduler
from kvoffload.core.request import Request
from kvoffload.core.types import (
    ConnectorConfig,
    ConnectorCrash,
    RequestStatus,
    SchedulerOutput,
    TransferJob,
    TransferKind,
    TransferResult,
    packed_chunks,
)
from kvoffload.worker.copy import plan_copy
from kvoffload.worker.kv import KVCache

EOS = 50256


def prompt(n: int, seed: int = 1) -> list[int]:
    return [(seed * 7919 + i * 104729) % 30000 + 3 for i in range(n)]


class Mamba:
    """A scripted engine for qwen3-next: block size 4, ``bpc`` blocks per chunk."""

    def __init__(self, bpc: int = 1, fixes: Fixes | None = None):
        self.config = ConnectorConfig(block_size=4, blocks_per_chunk=bpc, cpu_chunks=32, model="qwen3-next")
        self.connector = connector_scheduler(self.config, fixes or Fixes())
        self.requests: dict[str, Request] = {}
        self.step_index = 0

    def add(self, req_id: str, tokens) -> Request:
        req = self.requests[req_id] = Request(req_id, tokens, 4)
        self.connector.on_new_request(req)
        return req

    def step(self, scheduled=None, new_blocks=None, offers=None, finish_jobs=True):
        out = SchedulerOutput(self.step_index, dict(scheduled or {}),
                              {r: tuple(tuple(g) for g in groups) for r, groups in (new_blocks or {}).items()},
                              boundary_states={r: tuple(o) for r, o in (offers or {}).items()})
        plan = self.connector.build_connector_meta(out)
        for req_id, n in (scheduled or {}).items():
            self.requests[req_id].num_computed_tokens += n
            self.requests[req_id].status = RequestStatus.RUNNING
        if finish_jobs:
            self.connector.update_connector_output([TransferResult(job.job_id) for job in plan.store_jobs])
        self.connector.check_invariants()
        self.step_index += 1
        return plan

    def prefill(self, req_id: str, tokens, fa_blocks, mamba_row, offers=(), finish_jobs=True):
        """``req_id`` prefills ``tokens`` in one step; the engine offers ``offers``."""
        req = self.add(req_id, tokens)
        self.connector.get_num_new_matched_tokens(req, 0)
        return self.step({req_id: len(tokens)}, {req_id: [fa_blocks, mamba_row]},
                         {req_id: offers} if offers else None, finish_jobs)


def stored(plan) -> list[tuple[int, int, tuple[int, ...]]]:
    """(group, chunk, source blocks) of every chunk the plan stores, job by job."""
    return [(group, chunk, job.gpu_block_ids) for job in plan.store_jobs
            for group, chunk in zip(job.chunk_groups, job.chunk_indices)]


class TestStores:
    def test_a_mamba_state_is_stored_only_from_the_engines_offer_in_a_job_of_its_own(self):
        """A 12-token prompt in one step, Mamba row [0, 0, 9]: full attention stores chunks 0-2
        from its table, Mamba nothing from its table (block 9 is the running state); the state
        at 8 the engine offers (block 7) is stored under Mamba chunk 1's key, one job for it,
        built before the table's stores (``_build_aligned_boundary_store_jobs``)."""
        engine = Mamba()
        plan = engine.prefill("A", prompt(12), [1, 2, 3], [0, 0, 9], offers=[(1, 7, 8)])
        assert stored(plan) == [(1, 1, (7,)), (0, 0, (1, 2, 3)), (0, 1, (1, 2, 3)), (0, 2, (1, 2, 3))]
        key = engine.connector._requests["A"].groups[1].offload_keys[1]
        assert plan.store_jobs[0].chunk_skips == (0,) and key in engine.connector.manager._chunks

    def test_a_state_blocks_store_is_fenced_from_its_creation(self):
        """The request frees its previous state block a step later while the copy may still
        wait: a schedule that hands block 7 out again must flush the state's store first."""
        engine = Mamba()
        plan = engine.prefill("A", prompt(12), [1, 2, 3], [0, 0, 9], offers=[(1, 7, 8)], finish_jobs=False)
        state_job = plan.store_jobs[0].job_id
        assert engine.connector.jobs.stores_reading({7}) == {state_job}
        assert engine.connector.jobs.stores_reading({9}) == set()  # the running state is never read

    @pytest.mark.parametrize("offer, why", [
        ((1, 0, 8), "a null block"),
        ((1, 7, 16), "past the prompt (offload_prompt_only)"),
        ((0, 7, 8), "not a Mamba group"),
    ])
    def test_an_offer_is_skipped(self, offer, why):
        engine = Mamba()
        plan = engine.prefill("A", prompt(12), [1, 2, 3], [0, 0, 9], offers=[offer])
        assert [group for group, _, _ in stored(plan)] == [0, 0, 0], why

    def test_a_state_not_at_a_chunks_end_is_not_stored(self):
        """Two blocks per chunk (8 tokens): the state at 4 ends no chunk, so no lookup can end
        there; the state at 8 is stored, its block at the chunk's tail (the load reads it so)."""
        engine = Mamba(bpc=2)
        plan = engine.prefill("A", prompt(16), [1, 2, 3, 4], [0, 0, 0, 9], offers=[(1, 6, 4), (1, 7, 8)])
        mamba = [job for job in plan.store_jobs if job.chunk_groups == (1,)]
        assert [(job.chunk_indices, job.gpu_block_ids, job.chunk_skips) for job in mamba] == [((0,), (7,), (1,))]


def served(engine: Mamba, req_id: str, tokens) -> int:
    req = engine.add(req_id, tokens)
    return engine.connector.get_num_new_matched_tokens(req, 0)[0]


class TestLookup:
    def test_a_hit_ends_on_a_stored_state_and_loads_that_one_state_block(self):
        """A stored the state at 8; B (A's 8 tokens + 4) is served 8 tokens: full attention's
        chunks 0-1 and the one Mamba block the engine allocated at index 1 for the state at 8."""
        engine = Mamba()
        engine.prefill("A", prompt(8), [1, 2], [0, 5], offers=[(1, 5, 8)])
        follow = engine.add("B", prompt(8) + prompt(4, seed=2))
        assert engine.connector.get_num_new_matched_tokens(follow, 0) == (8, True)
        engine.connector.update_state_after_alloc(follow, ((21, 22, 23), (0, 24, 0)), 8)
        job = engine.step().load_jobs[0]
        assert list(zip(job.chunk_groups, job.chunk_indices)) == [(0, 0), (0, 1), (1, 1)]
        assert job.gpu_block_ids == (21, 22, 24)

    def test_k18_an_exact_resend_is_not_served_one_token_short_with_the_later_state(self):
        """vLLM #44599: A (8 tokens + 4) stored the state at 8; B = those 8 tokens exactly. One
        token must be computed, so at most 7 may be served, and 7 is no state boundary: the
        bound rounds down to 4, where no state was stored: no hit. Serving 7 with the state at 8
        would apply B's last token twice."""
        engine = Mamba()
        engine.prefill("A", prompt(12), [1, 2, 3], [0, 6, 9], offers=[(1, 6, 8)])
        assert served(engine, "B", prompt(8)) == 0

    def test_k18_planted_without_the_round_down_the_resend_is_served_7_tokens(self, monkeypatch):
        """The rule's plant (no fix flag: every release modelled has the fix): the bound only one
        token short of the request, as for a window alone."""
        monkeypatch.setattr(HybridConnectorScheduler, "_lookup_bound", lambda self, req: req.num_tokens - 1)
        engine = Mamba()
        engine.prefill("A", prompt(12), [1, 2, 3], [0, 6, 9], offers=[(1, 6, 8)])
        assert served(engine, "B", prompt(8)) == 7

    def test_the_bound_rounds_to_the_chunk_with_two_blocks_per_chunk(self):
        """Chunks of 8 tokens: A stored the state at 8; B (A's 8 tokens + 6 = 14) may be served
        at most 13, rounded down to 8: the hit is chunk 0, the state at 8."""
        engine = Mamba(bpc=2)
        engine.prefill("A", prompt(16), [1, 2, 3, 4], [0, 0, 0, 9], offers=[(1, 6, 8)])
        assert served(engine, "B", prompt(8) + prompt(6, seed=3)) == 8


# ---- the presets of vLLM 0.25, 0.26 and 0.28: MambaStores.BLOCK_TABLE (core/fixes.py) --------
# vLLM 0.25-0.28 stored a Mamba group from its block table, as a window of one chunk: every chunk
# under the watermark whose last block is not null, with every non-null block of it; the worker
# laid a job's blocks of the group one after another from the first one's sub-block
# (GPULoadStoreSpec's group_sizes and block_indices, cpu/gpu_worker.py's transfer_async). The
# engine's boundary-state offers (vLLM 0.29+) are not read.

OLD = ("vllm-0.25", "vllm-0.26", "vllm-0.28")


def test_the_presets_up_to_0_28_store_mamba_from_the_block_table_the_others_from_the_hand_off():
    rules = {name: preset.rules.mamba_stores for name, preset in PRESETS.items()}
    assert rules == {name: MambaStores.BLOCK_TABLE if name in OLD else MambaStores.BOUNDARY_HAND_OFF
                     for name in PRESETS}
    assert ReleaseRules().mamba_stores is MambaStores.BOUNDARY_HAND_OFF


@pytest.mark.parametrize("preset", OLD)
def test_a_mamba_chunk_is_stored_from_the_table_in_the_requests_job_and_the_offer_is_not_read(preset):
    """16 tokens in one step, Mamba row [0, 0, 0, 9]: chunk 0 ends on a null block (skipped),
    chunk 1 is stored from its last block 9 in the request's one job, beside full attention's
    two chunks; the state at 8 the engine offers (block 7) is not stored."""
    engine = Mamba(bpc=2, fixes=Fixes.preset(preset))
    plan = engine.prefill("A", prompt(16), [1, 2, 3, 4], [0, 0, 0, 9], offers=[(1, 7, 8)], finish_jobs=False)
    assert stored(plan) == [(0, 0, (1, 2, 3, 4, 9)), (0, 1, (1, 2, 3, 4, 9)), (1, 1, (1, 2, 3, 4, 9))]
    (job,) = plan.store_jobs
    assert job.chunk_skips == (0, 0, 1) and job.chunk_counts == (2, 2, 1)
    # a Mamba block is fenced from the job's creation (0.25's sliding_window_block_ids), full attention's later
    assert engine.connector.jobs.stores_reading({9}) == {job.job_id}
    assert engine.connector.jobs.stores_reading({1}) == set()


def test_the_reference_stores_the_offer_and_no_mamba_block_from_the_table():
    """The same step with vLLM 0.29+'s rule: the offered state in a job of its own, block 9 never."""
    engine = Mamba(bpc=2)
    plan = engine.prefill("A", prompt(16), [1, 2, 3, 4], [0, 0, 0, 9], offers=[(1, 7, 8)])
    assert [(group, chunk) for group, chunk, _ in stored(plan)] == [(1, 0), (0, 0), (0, 1)]


def test_two_states_in_one_job_are_packed_as_vllms_worker_did_one_a_sub_block_early():
    """Mamba row [0, 6, 0, 9] (the state at 8 still in the table): both chunks are stored in one
    job; the worker lays blocks 6 and 9 from sub-block 1 of chunk 0 on, so 9 lands in sub-block 0
    of chunk 1, and sub-block 1, which a load of chunk 1 reads, is never written: vLLM 0.25's bug."""
    engine = Mamba(bpc=2, fixes=Fixes.preset("vllm-0.25"))
    plan = engine.prefill("A", prompt(16), [1, 2, 3, 4], [0, 6, 0, 9], finish_jobs=False)
    (job,) = plan.store_jobs
    assert job.chunk_groups == (0, 0, 1, 1) and job.gpu_block_ids == (1, 2, 3, 4, 6, 9)
    assert job.chunk_skips[2:] == (1, 0) and job.chunk_counts[2:] == (1, 1)
    kv = KVCache(num_gpu_blocks=16, block_size=4, num_cpu_chunks=8, blocks_per_chunk=2, slot_bytes=8)
    mamba_slots = job.chunk_slots[2:]
    assert plan_copy(kv, job, TransferKind.STORE).tier_rows[4:] == (mamba_slots[0] * 2 + 1, mamba_slots[1] * 2)


def test_states_that_fill_fewer_slots_than_their_chunks_crash_as_vllms_worker_asserted():
    """Row [0, 5, 0, 6, 0, 9]: three chunks, three blocks from sub-block 1 fill two slots; the
    worker's ``assert dst_offset == num_dst_blocks`` failed and took the engine down."""
    engine = Mamba(bpc=2, fixes=Fixes.preset("vllm-0.25"))
    with pytest.raises(ConnectorCrash, match="3 blocks packed from sub-block 1 fill 2 chunks, 3 given"):
        engine.prefill("A", prompt(24), [1, 2, 3, 4, 7, 8], [0, 5, 0, 6, 0, 9])


@pytest.mark.parametrize("blocks, skip, layout", [
    (1, 1, ([1], [1])),
    (2, 1, ([1, 0], [1, 1])),
    (5, 0, ([0, 0, 0], [2, 2, 1])),
    (4, 1, ([1, 0, 0], [1, 2, 1])),
])
def test_packed_chunks_fills_chunks_one_after_another(blocks, skip, layout):
    assert packed_chunks(blocks, skip, 2) == layout


def test_a_copy_with_counts_writes_only_the_counted_sub_blocks():
    """chunk_counts stops a chunk early: the rows copied, and a count past the chunk refused."""
    kv = KVCache(num_gpu_blocks=8, block_size=4, num_cpu_chunks=4, blocks_per_chunk=2, slot_bytes=8)
    job = TransferJob(1, "A", TransferKind.STORE, (5, 6), (2, 3), (0, 1), chunk_groups=(1, 1),
                      chunk_skips=(1, 0), chunk_counts=(1, 1))
    assert plan_copy(kv, job, TransferKind.STORE).tier_rows == (5, 6)
    with pytest.raises(Exception, match="chunk_counts=\\(2, 1\\)"):
        plan_copy(kv, job._replace(gpu_block_ids=(5, 6, 7), chunk_counts=(2, 1)), TransferKind.STORE)
