"""``shared-prefix``: groups of requests that share a system prompt, each with its own question.

The shape of SGLang's ``generated-shared-prefix`` and vLLM's ``prefix_repetition`` datasets:
``groups`` system prompts, ``prompts_per_group`` questions each, one answer per question. Arrival
order across groups is ``shuffled`` (default: groups interleave at random), ``round-robin`` (one
question of every group in turn: the longest reuse distance) or ``grouped`` (a group's questions
back to back). Consecutive arrivals are ``arrival_gap`` steps apart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads.distributions import Distribution, parse_distribution
from kvoffload.workloads.registry import GenerateContext, register
from kvoffload.workloads.schema import TableReader
from kvoffload.workloads.tokens import answer_tokens, random_tokens

ORDERS = ("shuffled", "round-robin", "grouped")


@register("shared-prefix")
@dataclass(frozen=True)
class SharedPrefix:
    groups: int
    prompts_per_group: int
    system_prompt_len: Distribution  # one draw per group
    question_len: Distribution
    output_len: Distribution
    arrival_gap: Distribution
    order: str
    eos_share: float  # share of answers that end with EOS; the rest are length-capped

    @classmethod
    def from_table(cls, table: TableReader) -> "SharedPrefix":
        return cls(
            groups=table.integer("groups", minimum=1),
            prompts_per_group=table.integer("prompts_per_group", minimum=1),
            system_prompt_len=parse_distribution(table, "system_prompt_len", floor=1),
            question_len=parse_distribution(table, "question_len", floor=1),
            output_len=parse_distribution(table, "output_len", floor=1),
            arrival_gap=parse_distribution(table, "arrival_gap", floor=0),
            order=table.string("order", choices=ORDERS, default="shuffled"),
            eos_share=table.number("eos_share", minimum=0.0, maximum=1.0, default=0.0),
        )

    def generate(self, ctx: GenerateContext) -> list[RequestSpec]:
        rng = random.Random(ctx.seed)
        system_prompts = [random_tokens(rng, self.system_prompt_len.sample(rng)) for _ in range(self.groups)]
        slots = [(group, index) for group in range(self.groups) for index in range(self.prompts_per_group)]
        if self.order == "shuffled":
            rng.shuffle(slots)
        elif self.order == "round-robin":
            slots.sort(key=lambda slot: (slot[1], slot[0]))
        group_width = len(str(self.groups - 1))
        index_width = len(str(self.prompts_per_group - 1))
        requests = []
        arrival = 0
        for position, (group, index) in enumerate(slots):
            if position:
                arrival += self.arrival_gap.sample(rng)
            eos = rng.random() < self.eos_share
            requests.append(RequestSpec(
                req_id=f"g{group:0{group_width}d}-q{index:0{index_width}d}",
                prompt_token_ids=system_prompts[group] + random_tokens(rng, self.question_len.sample(rng)),
                output_token_ids=answer_tokens(rng, self.output_len.sample(rng), eos=eos),
                stop="eos" if eos else "length",
                arrival_step=arrival,
            ))
        return requests
