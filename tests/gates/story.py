"""What every gate story needs: tokens, a tiny engine config, a bounded run, and readers of it.

Block size 4 and one block per chunk unless a story says otherwise, so positions 0-3 are chunk
0, 4-7 chunk 1, and so on. Every run is bounded (``MAX_STEPS``): a stuck job fails its story
with ``stuck_requests`` set instead of hanging the suite.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from kvoffload.core.fixes import Fixes
from kvoffload.core.manager import LookupResult
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.engine import Engine
from kvoffload.engine.oracle import as_signed, prefix_fingerprints
from kvoffload.engine.record import RunRecord
from kvoffload.engine.requests import RequestSpec

TINY = EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64)
# Far above any story's length (the longest needs ~40 steps), far below a hang.
MAX_STEPS = 400
SCHEDULINGS = ("sync", "async")
# The fix-flag check (test_fix_flags.py) replays the gates with these flags made ineffective in
# every connector a story builds, the "fixed" side included: some gate must then fail.
MADE_INEFFECTIVE = tuple(name for name in os.environ.get("KVOFFLOAD_GATES_DISABLE", "").split(",") if name)


def tokens(seed: int, n: int) -> tuple[int, ...]:
    return tuple((seed * 7919 + i * 104729) % 30000 + 3 for i in range(n))


def engine(requests, config: EngineConfig = TINY, fixes: Fixes | None = None, *,
           forget_gpu_cache_before: tuple[int, ...] = (), **kwargs) -> Engine:
    """A bounded, traced engine. ``forget_gpu_cache_before=(n,)``: the GPU prefix cache loses
    every free block before step n (memory pressure from elsewhere), so the offload tier serves."""
    kwargs.setdefault("max_steps", MAX_STEPS)
    kwargs.setdefault("trace", True)
    engines: list[Engine] = []
    if forget_gpu_cache_before:
        def forget(next_step: int, finished: int) -> None:
            if next_step in forget_gpu_cache_before:
                engines[0].pool.uncache_free_blocks()
        kwargs["on_step"] = forget
        kwargs.setdefault("skip_idle", False)  # the hook must see every step: an idle-gap jump would skip it
    fixes = fixes if fixes is not None else Fixes()
    if MADE_INEFFECTIVE:
        fixes = fixes.without(*(name for name in MADE_INEFFECTIVE if getattr(fixes, name)))
    engines.append(Engine(requests, config, fixes, **kwargs))
    return engines[0]


def run(requests, config: EngineConfig = TINY, fixes: Fixes | None = None, **kwargs) -> RunRecord:
    return engine(requests, config, fixes, **kwargs).run()


def without(*names: str) -> Fixes:
    return Fixes().without(*names)


def stored_chunks(record: RunRecord, req_id: str) -> set[int]:
    """Chunks of ``req_id`` that a store job carried (from the run's trace)."""
    return {chunk for event in record.trace_events if event["name"].startswith("store")
            and event["tid"] == req_id for chunk in event["args"]["chunks"]}


def loaded_chunks(record: RunRecord, req_id: str) -> set[int]:
    return {chunk for event in record.trace_events if event["name"].startswith("load")
            and event["tid"] == req_id for chunk in event["args"]["chunks"]}


def poisoned(record: RunRecord) -> list[tuple[str, int, int]]:
    """(request, chunk, bad slots) of every load that failed the content oracle."""
    return [(p.req_id, p.chunk, p.bad_slots) for p in record.poisoned]


def healthy(record: RunRecord) -> bool:
    return not record.problems(fences=True, lifecycle=True, invariants=True)


def assert_healthy(record: RunRecord) -> None:
    """No crash, poisoned load, fence violation, stuck or leaked request, lifecycle violation or
    failed invariant; else an AssertionError naming each (request, step, chunk, bad slots of a
    poisoned load; the stuck and leaked ids; the crash with the connector's frame)."""
    found = record.problems(fences=True, lifecycle=True, invariants=True)
    if found:
        raise AssertionError("; ".join(found))


def follow_up(parent: RequestSpec, req_id: str = "C", new: int = 4, think_steps: int = 3, **kwargs) -> RequestSpec:
    """A next turn: the parent's whole history plus ``new`` tokens."""
    return RequestSpec(req_id, parent.prompt_token_ids + parent.output_token_ids + tokens(77, new),
                       tokens(78, 2), parent=parent.req_id, think_steps=think_steps, **kwargs)


def pending_reads_as_miss(eng: Engine) -> None:
    """A tier of the vLLM 0.2x era: a chunk whose store is in flight is simply not there."""
    manager = eng.connector.manager
    plain = manager.lookup

    def lookup(key):
        result = plain(key)
        return LookupResult.MISS if result is LookupResult.HIT_PENDING else result

    manager.lookup = lookup


def wrong_computed_slots(eng: Engine) -> list[tuple[str, int]]:
    """(request, position) of every computed position whose GPU slot does not hold the KV of the
    request's prefix: what a wrong GPU prefix hit or a recompute that skipped a failed load
    leaves behind. (The load oracle only checks the slots a load wrote.) Under async scheduling
    with drafts, the drafts a step in flight will reject count as computed until its output is
    processed (vLLM rolls them back then): their slots are not the request's KV."""
    kv, bs = eng.kv, eng.config.block_size
    slots = kv.gpu.view(kv.num_gpu_blocks * bs, kv.slot_bytes).view(torch.int64)[:, 0].numpy()
    wrong = []
    for live in eng.scheduler.live.values():
        verified = live.req.num_computed_tokens - live.rejected_in_flight
        computed = min(verified, len(live.truth), len(live.blocks) * bs)
        if computed == 0:
            continue
        expected = as_signed(prefix_fingerprints(np.asarray(live.truth[:computed], dtype=np.int64)))
        blocks = np.asarray(live.blocks, dtype=np.int64)
        positions = np.arange(computed)
        held = slots[blocks[positions // bs] * bs + positions % bs]
        wrong += [(live.req_id, int(p)) for p in np.nonzero(held != expected)[0]]
    return wrong
