"""What one engine step schedules and produces: the records the scheduler model
(``scheduler.py``) hands to the forward, the oracle and ``update_from_output``."""

from __future__ import annotations

from typing import NamedTuple

from kvoffload.core.types import BlockId, TransferJob, TransferResult
from kvoffload.engine.live import LiveRequest


class Scheduled(NamedTuple):
    """One request's share of a step, fixed at schedule time (immutable; a NamedTuple rather than
    a frozen dataclass: one per scheduled request per step, built at C speed)."""

    live: LiveRequest
    start: int  # first position written
    num_tokens: int  # positions written (1 + drafts while decoding)
    samples: bool  # the step ends with a sampled token for it
    accepted: int  # drafts that survive verification
    generation: int
    prefill: bool
    drafts: int = 0  # draft positions among num_tokens


class StepOutput(NamedTuple):
    """What one step's forward and worker poll produced, applied by ``update_from_output``."""

    step: int
    scheduled: tuple[Scheduled, ...]
    results: tuple[TransferResult, ...]
    # GPU blocks of this poll's failed loads (vLLM's KVConnectorOutput.invalid_block_ids, from
    # the worker's get_block_ids_with_load_errors): they travel with the output that reports the
    # loads, so async scheduling applies them with those loads, not with the next step's.
    load_error_blocks: frozenset[BlockId] = frozenset()


class LoadInFlight(NamedTuple):
    live: LiveRequest
    job: TransferJob
