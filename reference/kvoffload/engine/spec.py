"""Speculative decoding in the scheduler model, sync and async, as vLLM 0.32 runs it.

The scheduler (``scheduler.py``) and admission (``admission.py``) call these at five points of a
request's step; the counters live on ``LiveRequest`` under vLLM's names (docs/engine.md,
"Speculative decoding"):

- admission: an async load leaves one decode step's blocks free (``step_blocks``); a request
  admitted with one token to compute runs a padded decode step (``DecodePadding``).

- schedule: a running request asks for its known tokens plus its draft slots
  (``Scheduler.schedule``: ``num_tokens_with_spec + num_output_placeholders -
  num_computed_tokens``), cut at the token budget: a tight budget verifies fewer drafts, not none.
- after the schedule (``AsyncScheduler._update_after_schedule``): under async a sampling step
  adds ``1 + drafts`` output placeholders and leaves ``k`` placeholder draft slots for the next
  step, which is scheduled before this one's drafts are verified.
- update_from_output: rejected drafts roll back ``num_computed_tokens`` (and, async, the
  placeholders); under sync the drafter then proposes ``k`` new drafts
  (``Scheduler.update_draft_token_ids``).
- preemption forgets all of it (``_preempt_request``).

The acceptance is decided at schedule time (scripted or seeded, ``LiveRequest.accepted_drafts``),
so the forward of a step scheduled while an earlier step is in flight already knows where the
true sequence is: it writes from ``num_computed_tokens - rejected_in_flight``, as vLLM's GPU
model runner corrects its optimistic positions by the previous step's rejections
(``GPUModelRunner._update_states``, ``prev_num_draft_len``).
"""

from __future__ import annotations

from kvoffload.core.types import cdiv
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.live import LiveRequest


def step_blocks(config: EngineConfig) -> int:
    """Blocks one decode step with drafts may need, which an async load must leave free on top of
    the admitted prefills' reservation (``Scheduler._spec_decode_step_blocks``; the modelled
    drafter, n-gram, reserves no lookahead slots)."""
    k = config.spec_tokens
    return cdiv(1 + k, config.block_size) if k else 0


def padding_never_fits(config: EngineConfig) -> bool:
    """A padded decode step (``1 + k`` tokens) exceeds the whole token budget: a request admitted
    with one token to compute is then never scheduled (``DecodePadding``). vLLM 0.32 accepts
    such a setting: ``VllmConfig._set_max_num_scheduled_tokens`` rejects only a budget within the
    drafter's extra slots, none for n-gram (``SpeculativeConfig.max_num_new_slots_for_drafting``)."""
    return bool(config.spec_tokens) and 1 + config.spec_tokens > config.max_num_batched_tokens


def running_share(live: LiveRequest, remaining: int, budget: int) -> tuple[int, int]:
    """(tokens, drafts) a running request is scheduled for: its ``remaining`` known tokens plus
    its draft slots, cut at the budget; the drafts are what lies past the known tokens."""
    count = min(remaining + live.draft_slots, budget)
    live.prefill_chunk = not live.draft_slots  # with k > 0 only a sampled step leaves drafts
    return count, max(0, count - remaining)


class DecodePadding:
    """Admission pads a request with one token left to a whole decode step of ``1 + k`` tokens,
    its k drafts placeholders that are never accepted (vLLM 0.32 ``Scheduler.schedule``,
    ``pad_spec_decode``: it keeps the batch uniform for full CUDA graphs). Only in a step where no
    running request continued a prefill, and only for a request with computed tokens (a landed
    load, a prefix hit) or next to running requests; one whose padded step does not fit the
    budget ends admission for the step."""

    def __init__(self, config: EngineConfig, running: list):
        self.k = config.spec_tokens
        self.running_scheduled = bool(running)
        self.on = bool(self.k) and not any(item.live.prefill_chunk for item in running)

    def count(self, remaining: int, computed: int, count: int, budget: int) -> int | None:
        """The tokens to schedule for a request with ``remaining`` tokens to compute (``count``
        unpadded); None: admission stops here."""
        if not self.on or remaining != 1 or not (self.running_scheduled or computed):
            return count
        return 1 + self.k if 1 + self.k <= budget else None


def scheduled(live: LiveRequest, drafts: int, accepted: int) -> int:
    """The request is in the step: its draft slots are used up (``spec_token_ids = []``; a request
    that did not get its blocks keeps them), its rejections are in flight from now on. Returns the
    first position the step really writes."""
    live.draft_slots = 0
    start = live.req.num_computed_tokens - live.rejected_in_flight
    live.rejected_in_flight += drafts - accepted
    return start


def after_schedule(live: LiveRequest, drafts: int, k: int) -> None:
    """Async, a sampling step: placeholders for its outputs, placeholder drafts for the next."""
    live.placeholders += 1 + drafts
    live.draft_slots = k


def verified(live: LiveRequest, drafts: int, accepted: int, appended: int, asynchronous: bool, k: int) -> None:
    """A step's output: ``appended`` tokens were appended after ``accepted`` of ``drafts`` passed."""
    rejected = drafts - accepted
    live.req.num_computed_tokens -= rejected
    live.rejected_in_flight -= rejected
    if asynchronous:
        live.placeholders -= rejected + appended
    else:
        live.draft_slots = k  # the drafter proposes after every sampled step


def forget(live: LiveRequest) -> None:
    """Preempted: no placeholders, no drafts, nothing in flight counts any more."""
    live.placeholders = live.draft_slots = live.rejected_in_flight = 0
