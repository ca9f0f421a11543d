"""Every failing example the fuzzer ever found, replayed as an explicit story.

Each entry names what went wrong when it was found. An example that exposed a too-strict oracle
(not a connector bug) stays too: it pins the oracle's rule down.
"""

from __future__ import annotations

import pytest

from test_engine_fuzz import Program, check_program

from kvoffload.engine.config import EngineConfig
from kvoffload.engine.requests import RequestSpec as R


def test_follow_up_admitted_before_the_parents_final_store_exists():
    """Found on the first run (async, 3-step copies): r3 arrives with no think time as r1
    finishes and is admitted by the schedule that builds r1's final store of chunk 5, so it
    misses that chunk and stores it itself. Not a connector bug: the served-oracle now asks only
    follow-ups with two steps of think time; everything else about the run must still hold."""
    config = EngineConfig(gpu_blocks=18, cpu_chunks=47, block_size=4, max_num_seqs=3,
                          max_num_batched_tokens=17, store_completion_steps=3, seed=500, scheduling="async")
    r0 = R("r0", (3, 4, 6, 3, 5, 3, 3, 7), (7, 4, 7), arrival_step=1, think_steps=3)
    r1 = R("r1", r0.prompt_token_ids + r0.output_token_ids + (9, 9, 3, 5, 5, 3, 9, 6, 9), (7, 8, 5, 3, 4),
           parent="r0", think_steps=2, abort_after_steps=11)
    r3 = R("r3", r1.prompt_token_ids + r1.output_token_ids + (3,), (3, 4, 3, 5, 7, 5, 6, 3), arrival_step=2,
           parent="r1", think_steps=0, abort_after_steps=13)
    check_program(Program(config, (r0, r1, r3), infinite=True))


@pytest.mark.parametrize("scheduling", ["sync", "async"])
@pytest.mark.parametrize("spec_tokens", [0, 1])
def test_a_load_that_fails_across_a_reset_is_recomputed(scheduling, spec_tokens):
    """Issue 22 (the nightly profile, two minutes in): r2's load of chunk 0 (job 3) is in flight
    when reset_cache comes at step 8, and its copy fails. The connector's scheduler side dropped
    the failure as a stale completion, so nothing reported r2's block as garbage and r2 counted
    position 0 as computed: "computed positions hold wrong KV: r2 position 0". The worker now
    reports a failed load's blocks itself (docs/engine.md, "Failed loads")."""
    config = EngineConfig(gpu_blocks=6, cpu_chunks=5, block_size=2, blocks_per_chunk=1, offload_prompt_only=False,
                          max_num_seqs=1, max_num_batched_tokens=2, spec_tokens=spec_tokens,
                          store_completion_steps=3, strict_lifecycle=True, scheduling=scheduling)
    requests = (R("r0", (3, 3), (3,)), R("r1", (3,) * 5, (3, 3, 3)), R("r2", (3, 3), (3,)))
    check_program(Program(config, requests, resets=(8,), failed_job_ids=frozenset({3})))


def test_a_follow_up_whose_gpu_hit_ends_inside_its_parents_last_chunk_is_not_served_it():
    """Found by the nightly profile (sync, 2 drafts, 8-token chunks). r1's final step accepted
    two drafts into its last written chunk (positions 56-63); sync scheduling caches blocks only
    at allocation (vLLM's Scheduler has no cache_blocks after an output), so block 31 (positions
    62-63) is never cached and r2's GPU hit stops at 62. The connector holds the chunk, but
    loading it would add 2 tokens, less than a chunk: vLLM's complete-chunk rule
    (``_lookup_complete_chunks``) answers 0. Not a connector bug: the served-oracle now asks
    only follow-ups whose GPU hit leaves a whole chunk of their parent's written prefix."""
    config = EngineConfig(gpu_blocks=47, cpu_chunks=26, block_size=2, blocks_per_chunk=4, max_num_seqs=1,
                          max_num_batched_tokens=3, spec_tokens=2, store_completion_steps=0)
    r0 = R("r0", (3,) * 16, (3,) * 14, stop="eos", accept_counts=(0,))
    r1 = R("r1", r0.prompt_token_ids + r0.output_token_ids + (3,) * 23, (3,) * 12, stop="eos",
           parent="r0", accept_counts=(0, 2))
    r2 = R("r2", r1.prompt_token_ids + r1.output_token_ids + (3,) * 22 + (9,), (3,), stop="eos",
           parent="r1", think_steps=2, accept_counts=(0,))
    check_program(Program(config, (r0, r1, r2), infinite=True))


def test_an_aborted_request_owes_only_the_chunks_whose_tokens_are_known():
    """Found by the nightly profile once it drew drafts under async scheduling. r0 is aborted
    while its decode step (position 2 and a draft at 3) is in flight: 4 positions computed, 3
    tokens known. Chunk 1 (positions 2-3) has no key, since token 3 was never sampled, so it cannot be
    stored. Not a connector bug: the infinite-capacity oracle now owes an aborted request the
    chunks below min(computed, known) tokens."""
    config = EngineConfig(gpu_blocks=5, cpu_chunks=6, block_size=2, max_num_seqs=1, max_num_batched_tokens=2,
                          spec_tokens=1, store_completion_steps=0, scheduling="async")
    r0 = R("r0", (3, 3), (3, 3), stop="eos", accept_counts=(0,), abort_after_steps=2)
    r1 = R("r1", (3, 3, 3, 3, 3), (3,), stop="eos", parent="r0", accept_counts=(0,), abort_after_steps=0)
    check_program(Program(config, (r0, r1), infinite=True))
