"""What a workload looks like before it runs: counts, lengths, and its reuse ceiling.

``reusable_prompt_share`` is the share of prompt tokens an infinite prefix cache could serve:

    A prompt token is reusable when the full block holding it (``engine.block_size`` tokens,
    counted from position 0) has a chained block hash that some earlier request's full token
    sequence (prompt + output) also produced. Earlier = earlier in the workload's request order,
    which is estimated arrival order (a follow-up after its parent). Tokens of a final partial
    block are never reusable.

Chained hashes make a hit on block i imply hits on blocks 0..i-1, so this is exactly "the longest
cached prefix, in whole blocks". It is an upper bound for any real cache: finite capacity,
eviction and a request's need to compute at least its last token only lower it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from kvoffload.core.types import extend_block_hashes
from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads.definition import Workload
from kvoffload.workloads.registry import estimated_arrival_steps
from kvoffload.workloads.spec_decode import ends_on_chunk_after_rejection


def reusable_prompt_share(workload: Workload) -> float:
    """Reusable prompt tokens / prompt tokens (see the module docstring); 0.0 for no tokens.

    One pass over the requests: a parent's tokens and hashes are kept only until its last
    follow-up was read (a follow-up's prompt usually extends them, which saves rehashing the
    history of every turn); the set of block hashes seen is what the definition needs.
    """
    requests = workload.requests
    block_size = workload.engine.block_size
    seen: set[bytes] = set()
    children_left = _follow_ups_per_parent(requests)
    history: dict[str, tuple[Sequence[int], list[bytes]]] = {}  # parent -> (prompt + output, hashes)
    reusable = total = 0
    for spec in requests:
        hashes = _inherited_hashes(spec, history, children_left)
        extend_block_hashes(hashes, spec.prompt_token_ids, block_size)
        num_prompt_blocks = len(hashes)
        reused = 0
        while reused < num_prompt_blocks and hashes[reused] in seen:
            reused += 1
        reusable += reused * block_size
        total += spec.num_prompt_tokens
        full = spec.prompt_token_ids + spec.output_token_ids
        extend_block_hashes(hashes, full, block_size)
        seen.update(hashes)
        if children_left.get(spec.req_id):
            history[spec.req_id] = (full, hashes)
    return reusable / total if total else 0.0


def _follow_ups_per_parent(requests: Sequence[RequestSpec]) -> dict[str, int]:
    """How many follow-ups name each parent (a stream of first turns has none: not read for it)."""
    counts: dict[str, int] = {}
    if not getattr(requests, "roots_only", False):
        for spec in requests:
            if spec.parent is not None:
                counts[spec.parent] = counts.get(spec.parent, 0) + 1
    return counts


def _inherited_hashes(spec: RequestSpec, history: dict[str, tuple[Sequence[int], list[bytes]]],
                      children_left: dict[str, int]) -> list[bytes]:
    """A copy of the parent's full-sequence hashes when the prompt extends its tokens, else a
    fresh list; the parent's entry goes once its last follow-up was read."""
    if spec.parent is None or spec.parent not in history:
        return []
    tokens, parent_hashes = history[spec.parent]
    children_left[spec.parent] -= 1
    if not children_left[spec.parent]:
        del history[spec.parent]
    if spec.prompt_token_ids[: len(tokens)] != tokens:
        return []
    return list(parent_hashes)


@dataclass(frozen=True)
class _Shape:
    """What the description reads of one request (its tokens are not kept)."""

    num_prompt_tokens: int
    max_tokens: int
    parent: str | None
    think_steps: int
    arrival_step: int
    stop: str
    conversation: str | None
    ends_on_chunk: bool
    req_id: str
    accept_counts: bool
    abort_after_steps: int | None


def describe_workload(workload: Workload) -> str:
    """A readable multi-line summary for ``kvoffload workloads show NAME`` (two passes over the
    requests: their shapes, then the reuse share)."""
    engine = workload.engine
    requests = [_Shape(spec.num_prompt_tokens, spec.max_tokens, spec.parent, spec.think_steps, spec.arrival_step,
                       spec.stop, spec.conversation, ends_on_chunk_after_rejection(spec, engine), spec.req_id,
                       bool(spec.accept_counts), spec.abort_after_steps) for spec in workload.requests]
    prompts = [spec.num_prompt_tokens for spec in requests]
    outputs = [spec.max_tokens for spec in requests]
    follow_ups = [spec for spec in requests if spec.parent is not None]
    roots = [step for step, spec in zip(estimated_arrival_steps(requests), requests) if spec.parent is None]
    num_eos = sum(spec.stop == "eos" for spec in requests)
    lines = [
        f"{workload.name}: {workload.description}",
        f"  source          {workload.source}",
        f"  seed            {workload.seed}",
        f"  requests        {len(requests):,} ({len(requests) - len(follow_ups):,} first turns, "
        f"{len(follow_ups):,} follow-ups)",
    ]
    conversations = _turns_per_conversation(requests)
    if conversations:
        counts = sorted(conversations.values())
        lines.append(f"  conversations   {len(counts):,}, {counts[0]}-{counts[-1]} turns "
                     f"(mean {statistics.fmean(counts):.1f})")
    lines += [
        f"  arrivals        first turns over steps {min(roots, default=0):,}-{max(roots, default=0):,}"
        + (f"; think time mean {statistics.fmean(s.think_steps for s in follow_ups):.0f} steps" if follow_ups else ""),
        f"  prompt tokens   {sum(prompts):,} ({_spread(prompts)})",
        f"  output tokens   {sum(outputs):,} ({_spread(outputs)}); stop: "
        f"{len(requests) - num_eos:,} length, {num_eos:,} eos",
    ]
    if engine.spec_tokens and any(spec.accept_counts for spec in requests):
        on_chunk = sum(spec.ends_on_chunk for spec in requests)
        lines.append(f"  spec decode     k={engine.spec_tokens}; {on_chunk:,} requests "
                     f"({on_chunk / len(requests):.1%}) end on a chunk boundary right after a rejection")
    aborted = [spec.abort_after_steps for spec in requests if spec.abort_after_steps is not None]
    if aborted:
        lines.append(f"  aborts          {len(aborted):,} requests ({len(aborted) / len(requests):.1%}), "
                     f"{min(aborted):,}-{max(aborted):,} steps after arriving; {aborted.count(0):,} at the step they arrive")
    if workload.reset_cache_at:
        lines.append(f"  cache resets    at steps {', '.join(f'{step:,}' for step in workload.reset_cache_at)}")
    lines.append(f"  reusable        {reusable_prompt_share(workload):.1%} of prompt tokens "
                 f"(infinite cache, {engine.block_size}-token blocks)")
    settings = [f"{key}={getattr(engine, key)}" for key in engine.keys()]
    for start in range(0, len(settings), 5):
        lines.append(("  engine          " if start == 0 else " " * 18) + " ".join(settings[start : start + 5]))
    return "\n".join(lines)


def _turns_per_conversation(requests: list[_Shape]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for spec in requests:
        if spec.conversation is not None:
            counts[spec.conversation] = counts.get(spec.conversation, 0) + 1
    return counts


def _spread(values: list[int]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    return (f"mean {statistics.fmean(ordered):,.0f}, p50 {ordered[len(ordered) // 2]:,}, "
            f"max {ordered[-1]:,}")
