"""The reference connector and a Mamba group in align mode (core/hybrid.py, core/hybrid_stores.py):
vLLM 0.32's rules for ``qwen3-next``, one story each (docs/hybrid.md, "The reference connector
and Mamba").

Full attention (group 0) and Mamba (group 1), block size 4. A Mamba state block holds the
state after every token before its boundary; the engine offers the states it cached in a step
(``SchedulerOutput.boundary_states``: group, block, boundary) and the connector stores only those,
never a Mamba block from the table (the running state is rewritten in place). The test plays the
engine: it hands each request its per-group block tables and offers.
"""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.core.hybrid import HybridConnectorScheduler, connector_scheduler
from kvoffload.core.request import Request
from kvoffload.core.types import ConnectorConfig, RequestStatus, SchedulerOutput, TransferResult

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


def test_a_preset_of_a_release_without_the_boundary_hand_off_refuses_a_mamba_group():
    """vLLM 0.25-0.28 stored a Mamba state from the block table, not from the scheduler's
    hand-off the reference follows: their presets refuse qwen3-next in one line rather than
    replay a release that never was; 0.29's and 0.30's run it, and 0.25's runs a dense model."""
    from kvoffload.core.model import model_named
    from kvoffload.core.types import ConfigError

    mamba = ConnectorConfig(block_size=4, cpu_chunks=32, model="qwen3-next")
    for name in ("vllm-0.25", "vllm-0.26"):
        with pytest.raises(ConfigError, match="^model 'qwen3-next': this preset's release stored Mamba states "
                                              "from the block table"):
            connector_scheduler(mamba, Fixes.preset(name))
    for name in ("vllm-0.29", "vllm-0.30"):
        assert isinstance(connector_scheduler(mamba, Fixes.preset(name)), HybridConnectorScheduler)
    Fixes.preset("vllm-0.25").check_model(model_named("dense"))
