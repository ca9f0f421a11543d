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

from kvoffload.core.types import extend_block_hashes
from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads.definition import Workload
from kvoffload.workloads.registry import estimated_arrival_steps
from kvoffload.workloads.spec_decode import ends_on_chunk_after_rejection


def reusable_prompt_share(workload: Workload) -> float:
    """Reusable prompt tokens / prompt tokens (see the module docstring); 0.0 for no tokens."""
    block_size = workload.engine.block_size
    seen: set[bytes] = set()
    full_hashes: dict[str, list[bytes]] = {}  # req_id -> hashes of its prompt + output
    by_id = {spec.req_id: spec for spec in workload.requests}
    parents = {spec.parent for spec in workload.requests if spec.parent is not None}
    reusable = total = 0
    for spec in workload.requests:
        hashes = _inherited_hashes(spec, by_id, full_hashes)
        extend_block_hashes(hashes, spec.prompt_token_ids, block_size)
        num_prompt_blocks = len(hashes)
        reused = 0
        while reused < num_prompt_blocks and hashes[reused] in seen:
            reused += 1
        reusable += reused * block_size
        total += spec.num_prompt_tokens
        extend_block_hashes(hashes, spec.prompt_token_ids + spec.output_token_ids, block_size)
        seen.update(hashes)
        if spec.req_id in parents:
            full_hashes[spec.req_id] = hashes
    return reusable / total if total else 0.0


def _inherited_hashes(spec: RequestSpec, by_id: dict[str, RequestSpec],
                      full_hashes: dict[str, list[bytes]]) -> list[bytes]:
    """A copy of the parent's full-sequence hashes when the prompt extends it (saves rehashing the
    history of every turn), else a fresh list."""
    parent_hashes = full_hashes.get(spec.parent) if spec.parent is not None else None
    if parent_hashes is None:
        return []
    parent = by_id[spec.parent]
    history = parent.prompt_token_ids + parent.output_token_ids
    if spec.prompt_token_ids[: len(history)] != history:
        return []
    return list(parent_hashes)


def describe_workload(workload: Workload) -> str:
    """A readable multi-line summary for ``kvoffload workloads show NAME``."""
    requests = workload.requests
    engine = workload.engine
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
    conversations = _turns_per_conversation(workload)
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
        on_chunk = sum(ends_on_chunk_after_rejection(spec, engine) for spec in requests)
        lines.append(f"  spec decode     k={engine.spec_tokens}; {on_chunk:,} requests "
                     f"({on_chunk / len(requests):.1%}) end on a chunk boundary right after a rejection")
    lines.append(f"  reusable        {reusable_prompt_share(workload):.1%} of prompt tokens "
                 f"(infinite cache, {engine.block_size}-token blocks)")
    settings = [f"{key}={getattr(engine, key)}" for key in engine.keys()]
    for start in range(0, len(settings), 5):
        lines.append(("  engine          " if start == 0 else " " * 18) + " ".join(settings[start : start + 5]))
    return "\n".join(lines)


def _turns_per_conversation(workload: Workload) -> dict[str, int]:
    counts: dict[str, int] = {}
    for spec in workload.requests:
        if spec.conversation is not None:
            counts[spec.conversation] = counts.get(spec.conversation, 0) + 1
    return counts


def _spread(values: list[int]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    return (f"mean {statistics.fmean(ordered):,.0f}, p50 {ordered[len(ordered) // 2]:,}, "
            f"max {ordered[-1]:,}")
