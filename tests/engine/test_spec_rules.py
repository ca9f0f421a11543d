"""Speculative decoding as vLLM 0.32's scheduler runs it, sync and async, one story per rule.

Told to the scheduler model directly (``engine/scheduler.py`` with ``engine/spec.py``); the
vllm-marked differential (tests/vllm/test_differential.py) checks the same rules against vLLM's
own ``Scheduler`` and ``AsyncScheduler`` on whole workloads. Block size 4, k drafts per step.
"""

from __future__ import annotations

import pytest

from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.cost import profile
from kvoffload.engine.engine import Engine
from kvoffload.engine.live import LiveRequest, Phase
from kvoffload.engine.observer import RunObserver
from kvoffload.engine.requests import RequestSpec
from kvoffload.engine.scheduler import SchedulerModel, StepOutput

BS = 4


class OneHitConnector:
    """Answers the lookups of ``loads`` (every request if None) with ``hits`` connector tokens."""

    def __init__(self, hits: int = 0, loads: tuple[str, ...] | None = None):
        self.hits = hits
        self.loads = loads

    def on_new_request(self, req) -> None:
        pass

    def get_num_new_matched_tokens(self, req, num_local):
        hits = self.hits if self.loads is None or req.req_id in self.loads else 0
        return hits, bool(hits)

    def update_state_after_alloc(self, req, block_ids, num_external_tokens) -> None:
        pass

    def request_finished(self, req, block_ids=()) -> bool:
        return False


def model(connector=None, **settings) -> SchedulerModel:
    config = EngineConfig(gpu_blocks=settings.pop("gpu_blocks", 32), block_size=BS, **settings)
    observer = RunObserver(profile(config.profile), BS, config.tokens_per_chunk, trace=False)
    return SchedulerModel(config, BlockPool(config.gpu_blocks, BS), connector or OneHitConnector(),
                          observer, on_finished=lambda live, step: None)


def arrive(scheduler: SchedulerModel, prompt: int, output: int = 8, accepts=None, req_id: str = "R") -> LiveRequest:
    spec = RequestSpec(req_id, tuple(range(3, 3 + prompt)), tuple(range(500, 500 + output)), accept_counts=accepts)
    live = LiveRequest.create(spec, BS, 0)
    scheduler.add(live)
    return live


def schedule(scheduler: SchedulerModel, number: int):
    out, scheduled, _ = scheduler.schedule(number)
    scheduler.after_schedule(scheduled)
    return out, scheduled


def update(scheduler: SchedulerModel, number: int, scheduled) -> None:
    scheduler.update_from_output(StepOutput(number, tuple(scheduled), ()))


class TestSyncDrafts:
    def test_a_tight_budget_verifies_fewer_drafts_not_none(self):
        """schedule(): num_new_tokens = min(num_tokens_with_spec - computed, token_budget); the
        drafts scheduled are what lies past num_tokens (spec_token_ids[:num_scheduled_spec_tokens])."""
        scheduler = model(spec_tokens=3, max_num_batched_tokens=2)
        arrive(scheduler, prompt=2)
        _, prefill = schedule(scheduler, 0)
        update(scheduler, 0, prefill)
        out, (decode,) = schedule(scheduler, 1)
        assert out.num_scheduled_tokens == {"R": 2} and decode.drafts == 1

    def test_only_a_sampled_step_is_followed_by_drafts(self):
        """update_draft_token_ids ignores prefill chunks: a chunk that leaves one prompt token
        is followed by that token alone, not by 1 + k."""
        scheduler = model(spec_tokens=3, max_num_batched_tokens=4)
        arrive(scheduler, prompt=5)
        _, chunk = schedule(scheduler, 0)
        update(scheduler, 0, chunk)
        out, (last,) = schedule(scheduler, 1)
        assert out.num_scheduled_tokens == {"R": 1} and last.drafts == 0 and last.samples
        update(scheduler, 1, [last])
        out, _ = schedule(scheduler, 2)
        assert out.num_scheduled_tokens == {"R": 4}  # now sampled: 1 + 3 drafts

    def test_rejected_drafts_roll_back_the_computed_tokens(self):
        """update_from_output: num_computed_tokens -= num_draft_tokens - num_accepted."""
        scheduler = model(spec_tokens=3)
        live = arrive(scheduler, prompt=4, accepts=(1,))
        _, prefill = schedule(scheduler, 0)
        update(scheduler, 0, prefill)
        _, decode = schedule(scheduler, 1)
        assert live.req.num_computed_tokens == 8  # 4 + the last token + 3 drafts
        update(scheduler, 1, decode)
        assert live.req.num_tokens == 7 and live.req.num_computed_tokens == 6  # 2 drafts rejected

    def test_a_load_also_leaves_one_decode_steps_blocks(self):
        """allocate_slots(reserved_blocks=_inflight_prefill_reserved_blocks() +
        _spec_decode_step_blocks): with k=3, one step of 1 + 3 tokens needs a block of 4."""
        for k, admitted in ((0, True), (3, False)):
            scheduler = model(OneHitConnector(8), gpu_blocks=3, reserve_full_isl=False, spec_tokens=k)
            loading = arrive(scheduler, prompt=12)  # the hit needs 2 blocks: exactly the 2 free
            schedule(scheduler, 0)
            assert (loading.phase is Phase.LOADING) is admitted, k


    def test_a_request_that_did_not_get_its_blocks_keeps_its_drafts(self):
        """spec_token_ids are cleared only for a request that is scheduled. Async, 3 usable
        blocks: A takes the last free one for its drafts; B (the newest) cannot get one and cannot
        be preempted either (its blocks are still written by the step in flight), so it waits,
        drafts kept."""
        scheduler = model(spec_tokens=3, scheduling="async", gpu_blocks=4)
        arrive(scheduler, prompt=4, req_id="A")
        waiting = arrive(scheduler, prompt=4, req_id="B")
        schedule(scheduler, 0)
        out, _ = schedule(scheduler, 1)
        assert out.num_scheduled_tokens == {"A": 4} and waiting.phase is Phase.RUNNING
        assert waiting.draft_slots == 3


class TestSeededAcceptance:
    """Without scripted accept counts the engine draws acceptance from its seeded model
    (``spec_acceptance``, leading drafts only); at the two ends of the range the draw is certain."""

    @pytest.mark.parametrize("acceptance, decode_steps", [(0.0, 11), (1.0, 4)])
    def test_no_draft_or_every_draft_is_accepted(self, acceptance, decode_steps):
        # r: 4 prompt tokens, 12 outputs, 2 drafts a step. The prefill samples the first output;
        # each decode step schedules 1 + 2 tokens and yields 1 + the accepted drafts: 11 steps
        # of one output at 0; 3 + 3 + 3 + 2 (the last capped by the scripted output) at 1.
        config = EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, spec_tokens=2, spec_acceptance=acceptance)
        record = Engine([RequestSpec("r", tuple(range(3, 7)), tuple(range(20, 32)))], config, strict=True,
                        max_steps=100).run()
        assert (record.finished_requests, record.output_tokens) == (1, 12)
        assert record.scheduled_tokens == 4 + 3 * decode_steps


def test_a_decode_step_with_k_drafts_may_need_the_blocks_of_1_plus_k_positions():
    """spec.step_blocks: what an async load leaves free for one decode step with drafts (vLLM's
    _spec_decode_step_blocks): the real token and k drafts. With 4-token blocks, k = 3 fits one
    block and k = 4 may need two; no drafts, nothing reserved."""
    from kvoffload.engine.spec import step_blocks

    blocks = {k: step_blocks(EngineConfig(block_size=4, spec_tokens=k)) for k in (0, 3, 4, 7, 8)}
    assert blocks == {0: 0, 3: 1, 4: 2, 7: 2, 8: 3}


class TestDecodePadding:
    """schedule(), waiting side: ``pad_spec_decode`` -- a request admitted with one token to
    compute is scheduled for a whole decode step, 1 + k, its drafts placeholders (-1)."""

    def loaded(self, scheduler, prompt=9):
        """Admitted with an 8-token load; it lands with one prompt token left to compute."""
        live = arrive(scheduler, prompt=prompt, accepts=(3,), req_id="L")
        schedule(scheduler, 0)
        scheduler.load_landed(live, 0)
        return live

    def test_a_landed_load_with_one_token_left_runs_a_whole_decode_step(self):
        scheduler = model(OneHitConnector(8), spec_tokens=3)
        live = self.loaded(scheduler)
        out, (step,) = schedule(scheduler, 1)
        assert out.num_scheduled_tokens == {"L": 4} and step.drafts == 3
        assert step.accepted == 0 and live.spec_steps == 0  # padding: never accepted, no script used
        update(scheduler, 1, [step])
        assert live.req.num_tokens == 10 and live.req.num_computed_tokens == 9

    def test_not_while_a_running_request_continues_its_prefill(self):
        """``and not prefill_scheduled``: R's second prompt chunk runs in the same step, so L
        runs its one token alone (the 4 tokens would fit the budget)."""
        scheduler = model(OneHitConnector(8, loads=("L",)), spec_tokens=3, max_num_batched_tokens=8)
        live = arrive(scheduler, prompt=9, accepts=(3,), req_id="L")
        arrive(scheduler, prompt=12, req_id="R")
        out, _ = schedule(scheduler, 0)
        assert out.num_scheduled_tokens == {"R": 8} and live.phase is Phase.LOADING
        scheduler.load_landed(live, 0)
        out, _ = schedule(scheduler, 1)
        assert out.num_scheduled_tokens == {"R": 4, "L": 1}

    def test_a_padded_step_that_does_not_fit_the_budget_ends_admission(self):
        """``if padded_num_tokens > request_token_budget: break``."""
        scheduler = model(OneHitConnector(8), spec_tokens=3, max_num_batched_tokens=3)
        live = self.loaded(scheduler)
        out, _ = schedule(scheduler, 1)
        assert out.num_scheduled_tokens == {} and live.phase is Phase.LOADED


class TestABudgetBelowAPaddedStep:
    """spec_tokens=2 with max_num_batched_tokens=2 (issue 22). vLLM 0.32 accepts the setting:
    ``VllmConfig._set_max_num_scheduled_tokens`` rejects only a budget within the drafter's extra
    draft slots, and the n-gram drafter has none (``max_num_new_slots_for_drafting``). Its
    scheduler then never schedules a request admitted with one token left: the padded step (3
    tokens) never fits, ``break`` every step (vLLM's own scheduler, driven by the vllm-scheduler
    engine with either connector, stops the same way). The engine does the same, and says why:
    the run ends with the request stuck, which fails the run (``kvoffload run`` exits 1)."""

    def two_equal_requests(self, budget: int, spec_tokens: int = 2):
        """r0 runs; r1, the same 2-token prompt, gets it from the connector: after the load one
        token is left, which admission pads to 1 + spec_tokens tokens."""
        config = EngineConfig(gpu_blocks=8, block_size=2, blocks_per_chunk=1, spec_tokens=spec_tokens,
                              max_num_batched_tokens=budget, max_num_seqs=1, scheduling="async")
        requests = [RequestSpec(f"r{i}", (7, 7), (9,)) for i in range(2)]
        return Engine(requests, config, strict=True, max_steps=1000).run()

    @pytest.mark.parametrize("spec_tokens, budget", [(2, 2), (3, 3)])
    def test_the_setting_is_accepted_and_the_loaded_request_is_never_scheduled(self, spec_tokens, budget):
        record = self.two_equal_requests(budget, spec_tokens)
        assert record.connector_hit_tokens_admitted == 2 and record.finished_requests == 1
        assert record.stuck_requests == ("r1",) and not record.max_steps_reached
        assert record.stuck_message.startswith("1 request stuck (r1): nothing was scheduled for 200 steps")
        assert (f"decode step of 1 + spec_tokens = {1 + spec_tokens} tokens, over max_num_batched_tokens={budget}"
                in record.stuck_message)

    def test_a_budget_that_holds_the_padded_step_finishes_both(self):
        record = self.two_equal_requests(budget=3)
        assert record.connector_hit_tokens_admitted == 2 and record.finished_requests == 2
        assert record.stuck_requests == () and record.stuck_message is None


class TestAsyncDrafts:
    """AsyncScheduler: the next step is scheduled before this one's drafts are verified."""

    def test_placeholders_stand_for_outputs_and_drafts_in_flight(self):
        """_update_after_schedule adds 1 + drafts placeholders and k placeholder drafts; the next
        schedule asks for num_tokens_with_spec + num_output_placeholders - num_computed_tokens."""
        scheduler = model(spec_tokens=2, scheduling="async")
        live = arrive(scheduler, prompt=4, accepts=(1, 0))
        _, prefill = schedule(scheduler, 0)
        assert live.placeholders == 1 and live.draft_slots == 2
        out, step1 = schedule(scheduler, 1)  # the prefill's token is not known yet
        assert out.num_scheduled_tokens == {"R": 3} and step1[0].drafts == 2
        assert live.req.num_computed_tokens == 7 and live.placeholders == 4
        update(scheduler, 0, prefill)
        assert live.req.num_tokens == 5 and live.placeholders == 3

    def test_rejections_are_discounted_when_the_step_is_processed(self):
        """update_from_output: num_computed_tokens and num_output_placeholders both drop by the
        rejected drafts, then the placeholders by the tokens appended; what stays computed beyond
        the known tokens is exactly what is in flight."""
        scheduler = model(spec_tokens=2, scheduling="async")
        live = arrive(scheduler, prompt=4, accepts=(1, 0))
        _, prefill = schedule(scheduler, 0)
        _, step1 = schedule(scheduler, 1)
        update(scheduler, 0, prefill)
        _, step2 = schedule(scheduler, 2)
        update(scheduler, 1, step1)  # 1 of 2 accepted: 2 tokens appended, 1 draft rejected
        assert live.req.num_tokens == 7
        assert live.req.num_computed_tokens == 4 + 3 + 3 - 1 and live.placeholders == 3  # step 2: 1 + 2
        assert live.req.num_computed_tokens - live.placeholders == live.req.num_tokens - 1

    def test_a_step_scheduled_after_a_rejection_writes_from_the_true_position(self):
        """The scheduler counts step 1's drafts as computed; the GPU model runner corrects the
        next step's positions by step 1's rejections (prev_num_draft_len), so step 2's first
        position is the last true token's, not past the rejected draft."""
        scheduler = model(spec_tokens=2, scheduling="async")
        arrive(scheduler, prompt=4, accepts=(1, 0))
        _, prefill = schedule(scheduler, 0)
        _, (step1,) = schedule(scheduler, 1)
        update(scheduler, 0, prefill)
        _, (step2,) = schedule(scheduler, 2)
        assert step1.start == 4 and step1.accepted == 1
        assert step2.start == 6  # prompt 4 + 2 tokens of step 1 known; 7 - 1 rejected

    def test_blocks_are_cached_up_to_the_tokens_that_are_known(self):
        """AsyncScheduler._update_request_with_output caches up to computed - placeholders: a
        block filled only by drafts still in flight (or rejected) is not cached."""
        scheduler = model(spec_tokens=3, scheduling="async")
        live = arrive(scheduler, prompt=6, accepts=(0,))
        _, prefill = schedule(scheduler, 0)
        _, step1 = schedule(scheduler, 1)  # positions 6..9: block 2 gets draft slots
        update(scheduler, 0, prefill)
        _, step2 = schedule(scheduler, 2)
        update(scheduler, 1, step1)  # nothing accepted: 8 tokens known, position 7 not computed
        assert live.req.num_tokens == 8 and live.num_committed_blocks == 1

    def test_preemption_forgets_placeholders_and_drafts(self):
        """_preempt_request: num_output_placeholders = 0, spec_token_ids = []; the rejections
        of a dropped step no longer shift anything."""
        scheduler = model(spec_tokens=2, scheduling="async")
        live = arrive(scheduler, prompt=4, accepts=(0,))
        _, prefill = schedule(scheduler, 0)
        _, step1 = schedule(scheduler, 1)
        scheduler.running.remove(live)
        scheduler._preempt(live)
        assert (live.placeholders, live.draft_slots, live.rejected_in_flight) == (0, 0, 0)
        update(scheduler, 0, prefill)  # an earlier generation's output: dropped
        out, (again,) = schedule(scheduler, 2)
        assert out.num_scheduled_tokens == {"R": 4} and again.start == 0 and again.drafts == 0

    def test_acceptance_counts_the_tokens_still_in_flight(self):
        """The scripted acceptance is cut so that the bonus token exists (the script's end). The
        step scheduled while the prefill's token is in flight may accept 2 of 3 drafts, not 3:
        prefill token + 2 accepted + bonus = the 4 outputs. Were the in-flight token forgotten,
        the step would overrun the script and the next one would start past its end."""
        scheduler = model(spec_tokens=3, scheduling="async")
        live = arrive(scheduler, prompt=4, output=4, accepts=(3,))
        _, prefill = schedule(scheduler, 0)
        _, (step1,) = schedule(scheduler, 1)
        assert step1.accepted == 2
        update(scheduler, 0, prefill)
        _, (step2,) = schedule(scheduler, 2)  # might the request still fall short? vLLM cannot tell
        assert step2.start == len(live.truth) - 1 and step2.accepted == 0
        update(scheduler, 1, [step1])
        assert live.num_outputs == 4 and live.req.num_tokens == len(live.truth)
