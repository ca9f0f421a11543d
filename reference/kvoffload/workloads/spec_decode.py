"""``spec-decode``: speculative decoding with scripted acceptance, outputs shaped around chunks.

Needs ``spec_tokens`` (k) >= 1 in the engine settings. Each request carries ``accept_counts``,
one entry per decode step, drawn from the acceptance model: every draft is accepted with
probability ``spec_acceptance``, and a step accepts the drafts before the first rejection
(0..k). The token count this assumes::

    num_output = 1 (sampled by the prefill step) + sum(a + 1 for a in accept_counts)

so the engine never has to cut a step short. Output lengths fall in three classes, spread evenly
through the stream by a seeded golden-ratio sequence (so the shares hold in small workloads too):

- ``end_on_boundary``: prompt + output is a multiple of the chunk (block_size x
  blocks_per_chunk) and the final step rejects a draft (its accept count < k). The final token's
  slot then holds a rejected draft's KV: storing that chunk would be a poisoned block (#54193).
- ``end_one_past_boundary``: prompt + output is a multiple of the chunk plus one, so the final
  step completes the last chunk's KV: that chunk must be stored and served (when a store is
  declined or scheduling is async, only the finish path can store it, #48596).
- the rest: ``output_len`` as drawn.

Conversations have ``turns`` requests; each follow-up's prompt is the parent's prompt and output
plus a new message of ``user_len`` tokens, arriving ``think_steps`` after the parent finished, so
follow-ups replay exactly the histories whose final chunks are in question.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from kvoffload.engine.config import EngineConfig
from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads.distributions import Distribution, parse_distribution
from kvoffload.workloads.limits import MAX_REQUESTS, MAX_STEP, MAX_TOKENS
from kvoffload.workloads.registry import GenerateContext, register
from kvoffload.workloads.schema import TableReader, WorkloadError
from kvoffload.workloads.tokens import answer_tokens, random_tokens

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_ON, _ONE_PAST, _FREE = "on", "one-past", "free"


@register("spec-decode")
@dataclass(frozen=True)
class SpecDecode:
    conversations: int
    turns: Distribution
    prompt_len: Distribution
    user_len: Distribution
    output_len: Distribution
    end_on_boundary: float
    end_one_past_boundary: float
    think_steps: Distribution
    conversation_gap: Distribution
    eos_share: float

    @classmethod
    def from_table(cls, table: TableReader) -> "SpecDecode":
        params = cls(
            conversations=table.integer("conversations", minimum=1, maximum=MAX_REQUESTS),
            turns=parse_distribution(table, "turns", floor=1, ceiling=MAX_REQUESTS),
            prompt_len=parse_distribution(table, "prompt_len", floor=1, ceiling=MAX_TOKENS),
            user_len=parse_distribution(table, "user_len", floor=1, ceiling=MAX_TOKENS),
            output_len=parse_distribution(table, "output_len", floor=2, ceiling=MAX_TOKENS),
            end_on_boundary=table.number("end_on_boundary", minimum=0.0, maximum=1.0),
            end_one_past_boundary=table.number("end_one_past_boundary", minimum=0.0, maximum=1.0, default=0.0),
            think_steps=parse_distribution(table, "think_steps", floor=0, ceiling=MAX_STEP),
            conversation_gap=parse_distribution(table, "conversation_gap", floor=0, ceiling=MAX_STEP),
            eos_share=table.number("eos_share", minimum=0.0, maximum=1.0, default=0.0),
        )
        if params.end_on_boundary + params.end_one_past_boundary > 1.0:
            table.fail("end_one_past_boundary", f"at most 1 - end_on_boundary ({1.0 - params.end_on_boundary:g})",
                       params.end_one_past_boundary)
        return params

    def generate(self, ctx: GenerateContext) -> list[RequestSpec]:
        k = ctx.engine.spec_tokens
        if k < 1:
            raise WorkloadError(f"{ctx.source}: key engine.spec_tokens: expected an integer >= 1 for the "
                                f"spec-decode generator, got {k}")
        rng = random.Random(ctx.seed)
        phase = rng.random()
        width = len(str(self.conversations - 1))
        requests: list[RequestSpec] = []
        arrival = 0
        for index in range(self.conversations):
            if index:
                arrival += self.conversation_gap.sample(rng)
            conversation = f"s{index:0{width}d}"
            prompt_len = self.prompt_len.sample(rng)
            ctx.budget.check_length(f"request {conversation}-t00", prompt_len)
            history = random_tokens(rng, prompt_len)
            parent: str | None = None
            for turn in range(self.turns.sample(rng)):
                req_id = f"{conversation}-t{turn:02d}"
                if parent is None:
                    prompt = history
                else:
                    user_len = self.user_len.sample(rng)
                    ctx.budget.check_length(f"request {req_id}", len(history) + user_len)
                    prompt = history + random_tokens(rng, user_len)
                shape = self._shape(phase + len(requests) * _GOLDEN)
                num_output = _output_length(len(prompt), self.output_len.sample(rng), shape,
                                            ctx.engine.tokens_per_chunk)
                ctx.budget.add(f"request {req_id}", len(prompt), num_output)
                accepts = acceptance_script(rng, num_output, k, ctx.engine.spec_acceptance, reject_last=shape == _ON)
                eos = rng.random() < self.eos_share
                spec = RequestSpec(
                    req_id=req_id,
                    prompt_token_ids=prompt,
                    output_token_ids=answer_tokens(rng, num_output, eos=eos),
                    stop="eos" if eos else "length",
                    arrival_step=arrival if parent is None else 0,
                    parent=parent,
                    think_steps=0 if parent is None else self.think_steps.sample(rng),
                    accept_counts=accepts,
                    conversation=conversation,
                    turn=turn,
                )
                requests.append(spec)
                parent = spec.req_id
                history = prompt + spec.output_token_ids
        return requests

    def _shape(self, position: float) -> str:
        fraction = position % 1.0
        if fraction < self.end_on_boundary:
            return _ON
        if fraction < self.end_on_boundary + self.end_one_past_boundary:
            return _ONE_PAST
        return _FREE


def _output_length(num_prompt: int, drawn: int, shape: str, chunk: int) -> int:
    """The smallest output length >= ``drawn`` (and >= 2: one decode step at least) whose total
    with the prompt sits where ``shape`` asks. Chunk 32, prompt 40, drawn 20: ``on`` gives 24
    (total 64), ``one-past`` gives 25 (total 65), ``free`` keeps 20."""
    if shape == _FREE:
        return drawn
    offset = 0 if shape == _ON else 1
    total = -(-(num_prompt + drawn - offset) // chunk) * chunk + offset
    while total - num_prompt < 2:
        total += chunk
    return total - num_prompt


def acceptance_script(rng: random.Random, num_output: int, k: int, p: float, *, reject_last: bool) -> tuple[int, ...]:
    """Accept counts whose steps produce exactly ``num_output - 1`` tokens after the prefill.

    Each step draws its count from the model (leading successes of k Bernoulli(p) drafts), cut
    to what is left. With ``reject_last`` a full acceptance that would end the request is turned
    into k - 1, so the final step always rejects a draft.
    """
    counts = []
    remaining = num_output - 1
    while remaining > 0:
        accepted = 0
        while accepted < k and rng.random() < p:
            accepted += 1
        accepted = min(accepted, remaining - 1)
        if reject_last and accepted == k and remaining == k + 1:
            accepted = k - 1
        counts.append(accepted)
        remaining -= accepted + 1
    return tuple(counts)


def ends_on_chunk_after_rejection(spec: RequestSpec, engine: EngineConfig) -> bool:
    """Whether prompt + output fills whole chunks and the final decode step rejected a draft."""
    if not spec.accept_counts or engine.spec_tokens < 1:
        return False
    total = spec.num_prompt_tokens + spec.max_tokens
    return total % engine.tokens_per_chunk == 0 and spec.accept_counts[-1] < engine.spec_tokens
