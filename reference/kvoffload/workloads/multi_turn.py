"""``multi-turn``: conversations whose every turn resends the whole history plus a new message.

Modelled on vLLM's ``benchmarks/multi_turn`` generator. Every conversation opens with a prefix
common to all conversations (``common_prefix_len`` tokens) and one of its own
(``prefix_len``); turn k's prompt is then::

    turn 0:    common prefix | own prefix | user message 0
    turn k+1:  prompt of turn k | answer of turn k | user message k+1

so each follow-up extends its parent's full token sequence and the engine can recognise it as a
continuation. Conversations start ``conversation_gap`` steps apart; turn k+1 arrives
``think_steps`` after turn k finished.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads.distributions import Distribution, parse_distribution
from kvoffload.workloads.limits import MAX_REQUESTS, MAX_STEP, MAX_TOKENS
from kvoffload.workloads.registry import GenerateContext, register
from kvoffload.workloads.schema import TableReader
from kvoffload.workloads.tokens import answer_tokens, random_tokens


@register("multi-turn")
@dataclass(frozen=True)
class MultiTurn:
    conversations: int
    turns: Distribution
    common_prefix_len: int
    prefix_len: Distribution
    user_len: Distribution
    answer_len: Distribution
    think_steps: Distribution
    conversation_gap: Distribution
    eos_share: float  # share of answers that end with EOS; the rest are length-capped

    @classmethod
    def from_table(cls, table: TableReader) -> "MultiTurn":
        return cls(
            conversations=table.integer("conversations", minimum=1, maximum=MAX_REQUESTS),
            turns=parse_distribution(table, "turns", floor=1, ceiling=MAX_REQUESTS),
            common_prefix_len=table.integer("common_prefix_len", minimum=0, maximum=MAX_TOKENS, default=0),
            prefix_len=parse_distribution(table, "prefix_len", floor=0, ceiling=MAX_TOKENS),
            user_len=parse_distribution(table, "user_len", floor=1, ceiling=MAX_TOKENS),
            answer_len=parse_distribution(table, "answer_len", floor=1, ceiling=MAX_TOKENS),
            think_steps=parse_distribution(table, "think_steps", floor=0, ceiling=MAX_STEP),
            conversation_gap=parse_distribution(table, "conversation_gap", floor=0, ceiling=MAX_STEP),
            eos_share=table.number("eos_share", minimum=0.0, maximum=1.0, default=0.0),
        )

    def generate(self, ctx: GenerateContext) -> list[RequestSpec]:
        rng = random.Random(ctx.seed)
        budget = ctx.budget
        width = len(str(self.conversations - 1))
        budget.check_length(f"request c{0:0{width}d}-t00", self.common_prefix_len)
        common_prefix = random_tokens(rng, self.common_prefix_len)
        requests: list[RequestSpec] = []
        arrival = 0
        for index in range(self.conversations):
            if index:
                arrival += self.conversation_gap.sample(rng)
            conversation = f"c{index:0{width}d}"
            prefix_len = self.prefix_len.sample(rng)
            budget.check_length(f"request {conversation}-t00", len(common_prefix) + prefix_len)
            history = common_prefix + random_tokens(rng, prefix_len)
            parent: str | None = None
            for turn in range(self.turns.sample(rng)):
                req_id = f"{conversation}-t{turn:02d}"
                user_len = self.user_len.sample(rng)
                budget.check_length(f"request {req_id}", len(history) + user_len)
                prompt = history + random_tokens(rng, user_len)
                eos = rng.random() < self.eos_share
                answer_len = self.answer_len.sample(rng)
                budget.add(f"request {req_id}", len(prompt), answer_len)
                output = answer_tokens(rng, answer_len, eos=eos)
                spec = RequestSpec(
                    req_id=req_id,
                    prompt_token_ids=prompt,
                    output_token_ids=output,
                    stop="eos" if eos else "length",
                    arrival_step=arrival if parent is None else 0,
                    parent=parent,
                    think_steps=0 if parent is None else self.think_steps.sample(rng),
                    conversation=conversation,
                    turn=turn,
                )
                requests.append(spec)
                parent = spec.req_id
                history = prompt + output
        return requests
