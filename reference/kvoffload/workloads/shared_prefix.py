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
from kvoffload.workloads.limits import MAX_REQUESTS, MAX_STEP, MAX_TOKENS
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
        params = cls(
            groups=table.integer("groups", minimum=1, maximum=MAX_REQUESTS),
            prompts_per_group=table.integer("prompts_per_group", minimum=1, maximum=MAX_REQUESTS),
            system_prompt_len=parse_distribution(table, "system_prompt_len", floor=1, ceiling=MAX_TOKENS),
            question_len=parse_distribution(table, "question_len", floor=1, ceiling=MAX_TOKENS),
            output_len=parse_distribution(table, "output_len", floor=1, ceiling=MAX_TOKENS),
            arrival_gap=parse_distribution(table, "arrival_gap", floor=0, ceiling=MAX_STEP),
            order=table.string("order", choices=ORDERS, default="shuffled"),
            eos_share=table.number("eos_share", minimum=0.0, maximum=1.0, default=0.0),
        )
        if params.groups * params.prompts_per_group > MAX_REQUESTS:
            table.fail("prompts_per_group", f"groups x prompts_per_group at most {MAX_REQUESTS:,} requests",
                       params.prompts_per_group)
        return params

    def generate(self, ctx: GenerateContext) -> list[RequestSpec]:
        rng = random.Random(ctx.seed)
        system_prompts = []
        for group in range(self.groups):
            length = self.system_prompt_len.sample(rng)
            ctx.budget.check_length(f"group {group}", length)
            system_prompts.append(random_tokens(rng, length))
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
            req_id = f"g{group:0{group_width}d}-q{index:0{index_width}d}"
            question_len = self.question_len.sample(rng)
            ctx.budget.check_length(f"request {req_id}", len(system_prompts[group]) + question_len)
            prompt = system_prompts[group] + random_tokens(rng, question_len)
            output_len = self.output_len.sample(rng)
            ctx.budget.add(f"request {req_id}", len(prompt), output_len)
            requests.append(RequestSpec(
                req_id=req_id,
                prompt_token_ids=prompt,
                output_token_ids=answer_tokens(rng, output_len, eos=eos),
                stop="eos" if eos else "length",
                arrival_step=arrival,
            ))
        return requests
