"""What a workload hands the engine: one frozen ``RequestSpec`` per request.

The fake model is scripted: ``output_token_ids`` are the tokens it will sample, in order, so a
multi-turn follow-up can quote its parent's answer before the run starts and every replay is
bit-for-bit repeatable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload.

    - ``output_token_ids``: the tokens sampled, in order; the request finishes after the last one.
      ``stop="eos"``: that last token is an EOS (finished-stopped; under async scheduling the
      request is scheduled once more and that output discarded). ``stop="length"``: max_tokens
      reached (finished-length; no extra step).
    - Arrival: ``arrival_step`` for a root request; a follow-up names ``parent`` and arrives
      ``think_steps`` steps after its parent finished. Its prompt must extend the parent's full
      token sequence (prompt + output) for it to count as a continuation in the metrics.
    - ``accept_counts``: with speculative decoding, how many of the k drafts each decode step
      accepts (cycled if shorter than needed); None lets the engine's seeded acceptance model
      decide.
    - ``abort_after_steps``: the engine aborts the request that many steps after it arrived, if it
      is still alive then (0: before its first schedule, a queued abort).
    """

    req_id: str
    prompt_token_ids: tuple[int, ...]  # or a compact array("i") (generators, trace loaders): sliced, added, compared alike
    output_token_ids: tuple[int, ...]
    stop: Literal["eos", "length"] = "length"
    arrival_step: int = 0
    parent: str | None = None
    think_steps: int = 0
    accept_counts: tuple[int, ...] | None = None
    abort_after_steps: int | None = None
    conversation: str | None = None
    turn: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.req_id}: empty prompt")
        if not self.output_token_ids:
            raise ValueError(f"request {self.req_id}: no output tokens")
        if self.stop not in ("eos", "length"):
            raise ValueError(f"request {self.req_id}: stop must be 'eos' or 'length', got {self.stop!r}")
        if self.arrival_step < 0 or self.think_steps < 0 or (self.abort_after_steps or 0) < 0:
            raise ValueError(f"request {self.req_id}: negative arrival or think time")

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def max_tokens(self) -> int:
        return len(self.output_token_ids)
