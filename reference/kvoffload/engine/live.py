"""The engine's own record of one request while it lives (the connector sees only ``req``)."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

from kvoffload.core.request import Request
from kvoffload.core.types import BlockId, RequestStatus
from kvoffload.engine.requests import RequestSpec


class Phase(enum.Enum):
    """Where a request is in the engine's scheduler model (docs/engine.md, "Request phases").

    WAITING requests sit in the waiting queue, RUNNING ones in the running list. LOADING and
    LOADED requests hold blocks and sit in the KV-holding queue, which admission drains first
    (vLLM 0.32 ``Scheduler.kv_holding_waiting``); a LOADING one is skipped until its load lands.
    """

    WAITING = "waiting"  # new or preempted: the next admission asks the prefix cache and connector
    LOADING = "loading"  # admitted with a connector hit; its load job is in flight
    LOADED = "loaded"  # the load landed: the next admission continues after the loaded tokens
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # identity: the engine finds requests in its queues with `in`
class LiveRequest:
    spec: RequestSpec
    req: Request
    arrival_step: int
    phase: Phase = Phase.WAITING
    blocks: list[BlockId] = field(default_factory=list)
    num_committed_blocks: int = 0  # blocks already findable in the GPU prefix cache
    num_outputs: int = 0  # sampled tokens appended so far
    pending_outputs: int = 0  # async: scheduled steps whose sample is not processed yet
    # Speculative decoding (docs/engine.md, "Speculative decoding"), vLLM's Request fields:
    placeholders: int = 0  # async: num_output_placeholders (1 + drafts per step in flight)
    draft_slots: int = 0  # len(spec_token_ids): drafts the next decode step may verify
    rejected_in_flight: int = 0  # drafts rejected by steps not processed yet (positions shift)
    prefill_chunk: bool = False  # is_prefill_chunk when this step's schedule reached it
    generation: int = 0  # bumped by preemption: outputs scheduled before it are dropped
    spec_steps: int = 0  # decode steps with drafts so far (indexes accept_counts)
    loaded_tokens: int = 0  # LOADING/LOADED: tokens its load (GPU hit + connector hit) brings
    last_scheduled_seq: int = 0  # the scheduler's non-empty-step counter when it last ran
    admitted: bool = False  # the first admission (for hit-rate metrics) happened
    # Hybrid models only (engine/kv_groups.py, vLLM's names): every group's block table
    # (tables[0] is `blocks`; 0 is the null block), the blocks cached per group
    # (num_cached_block) and the tokens of steps not processed yet (num_in_flight_tokens).
    tables: list[list[BlockId]] | None = None
    cached_blocks: list[int] | None = None
    in_flight_tokens: int = 0
    req_id: str = field(init=False)  # spec.req_id, a plain attribute: read for every request every step

    def __post_init__(self) -> None:
        self.req_id = self.spec.req_id

    @classmethod
    def create(cls, spec: RequestSpec, block_size: int, arrival_step: int) -> "LiveRequest":
        return cls(spec=spec, req=Request(spec.req_id, spec.prompt_token_ids, block_size), arrival_step=arrival_step)

    @cached_property
    def truth(self) -> Sequence[int]:
        """The whole scripted sequence (prompt + every output token), made when first read: a
        request waiting in the queue (a trace's backlog can be thousands) needs only its block
        hashes; the forward, the oracle's fingerprints and the sampled tokens read this."""
        return self.spec.prompt_token_ids + self.spec.output_token_ids

    @property
    def status(self) -> RequestStatus:
        return self.req.status

    def scheduling_cap_reached(self) -> bool:
        """Async: no more steps once every output is sampled or in flight. A length cap is known
        to the scheduler; an EOS is not, so an EOS request is scheduled once more."""
        limit = self.spec.max_tokens if self.spec.stop == "length" else self.spec.max_tokens + 1
        return self.num_outputs + self.pending_outputs >= limit

    def accepted_drafts(self, k: int, acceptance: float, rng: random.Random) -> int:
        counts = self.spec.accept_counts
        if counts:
            accepted = counts[self.spec_steps % len(counts)]
        else:
            accepted = 0
            while accepted < k and rng.random() < acceptance:
                accepted += 1
        self.spec_steps += 1
        # Never accept past the scripted output: the bonus token must exist. Async: the tokens of
        # the step still in flight count (its acceptance is known; its update is not processed).
        in_flight = self.placeholders - self.rejected_in_flight
        return max(0, min(accepted, k, self.spec.max_tokens - self.num_outputs - in_flight - 1))
