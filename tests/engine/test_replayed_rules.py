"""Rules seen on whole replays: what the connector stores, and what the observer counts.

The metrics' hand-filled records (tests/metrics) pin each formula; these stories pin the
bookkeeping that fills a record on a real replay, where preemptions, rejected drafts and
re-admissions happen. Block size 4, one block per chunk (story.TINY): chunk n is positions
4n .. 4n+3.
"""

from __future__ import annotations

import pytest

from kvoffload.engine.requests import RequestSpec
from kvoffload.metrics import compute_metrics
from readmitted import READMITTED, readmitted_requests
from story import SCHEDULINGS, TINY, healthy, run, stored_chunks, tokens


@pytest.mark.parametrize("scheduling", SCHEDULINGS)
def test_with_offload_prompt_only_a_running_request_stores_only_its_prompt(scheduling):
    """A 12-token prompt (chunks 0-2) and 12 outputs: without the option its outputs' chunks 3
    and 4 are stored as they fill (chunk 5 would need the last token's slot, never written)."""
    a = RequestSpec("A", tokens(1, 12), tokens(2, 12))
    prompt_only = run([a], TINY.replace(offload_prompt_only=True, scheduling=scheduling))
    everything = run([a], TINY.replace(offload_prompt_only=False, scheduling=scheduling))
    assert healthy(prompt_only) and healthy(everything)
    assert stored_chunks(prompt_only, "A") == {0, 1, 2}
    assert stored_chunks(everything, "A") == {0, 1, 2, 3, 4}


@pytest.mark.parametrize("scheduling", SCHEDULINGS)
def test_gpu_hit_rate_counts_first_admissions_only_when_a_request_is_preempted(scheduling):
    """A and B (8-token prompts, nothing shared) decode in 5 usable blocks: B is preempted and,
    re-admitted, finds its own committed blocks in the GPU prefix cache. That is no prefix hit
    of the workload: the rate stays 0 of the 16 prompt tokens. The re-admission is still an
    admission through a lookup (three in all), asking only about B's tokens past its own blocks."""
    a = RequestSpec("A", tokens(1, 8), tokens(2, 8))
    b = RequestSpec("B", tokens(3, 8), tokens(4, 8))
    record = run([a, b], TINY.replace(gpu_blocks=6, reserve_full_isl=False, scheduling=scheduling))
    assert healthy(record) and record.preemptions == 1
    assert (record.requests, record.prompt_tokens, record.finished_requests) == (2, 16, 2)  # once each
    assert (record.gpu_hit_tokens, record.admitted_prompt_tokens) == (0, 16)
    assert compute_metrics(record)["gpu_hit_rate"] == 0.0
    assert record.admissions == 3 and record.admission_asked_tokens < 8 + 8 + 9


def test_a_chunk_whose_last_slot_was_a_rejected_draft_is_written_when_the_token_is():
    """Sync, k=2 drafts, every draft rejected; prompt 6. Step 0 writes chunk 0 (positions 0-3);
    step 1 computes position 6 and drafts at 7 and 8, both rejected: chunk 1's last slot (7)
    holds no valid KV until step 2 computes it. Each chunk's store is submitted one step after
    its last slot became valid: 1 step each (counting from step 1 for chunk 1 would give 2)."""
    a = RequestSpec("A", tokens(1, 6), tokens(2, 8), accept_counts=(0,))
    record = run([a], TINY.replace(spec_tokens=2))
    assert healthy(record)
    assert record.store_submit_delays == [1, 1, 1]
    assert record.store_visible_delays == [2, 2, 2]  # store_completion_steps = 1 on top


def test_under_async_a_decode_chunk_is_stored_a_step_after_it_was_written():
    """The async run of the story above. Chunk 0 is written by the prefill, whose tokens the
    connector knows when it plans that step: submitted one step later, as in sync. A decode step
    that completes a chunk is planned before the previous step's output is processed, so the
    connector offers the chunk one step after its forward wrote it: 2 steps to submission, and
    visible 2 steps after that (the completion report, processed a step late under async)."""
    a = RequestSpec("A", tokens(1, 6), tokens(2, 8), accept_counts=(0,))
    record = run([a], TINY.replace(spec_tokens=2, scheduling="async"))
    assert healthy(record)
    assert record.store_submit_delays == [1, 2, 2]
    assert record.store_visible_delays == [3, 4, 4]


def test_a_request_aborted_while_it_waits_after_preemption_stores_nothing_it_lost():
    """Async; A and B (8-token prompts, 8 outputs each) in 6 usable blocks. B is preempted, then
    aborted at step 7 while it waits; its follow-up C quotes B's first 12 tokens (chunks 0-2).
    Preemption forgot B's computed tokens (vLLM's _preempt_request: num_computed_tokens = 0), so
    the abort's store stops at what was stored before: chunks 0 and 1. With the old count the
    abort would store chunk 2 from a block A is already writing, and C would load A's KV."""
    a = RequestSpec("A", tokens(1, 8), tokens(2, 8))
    b = RequestSpec("B", tokens(3, 8), tokens(4, 8), abort_after_steps=7)
    c = RequestSpec("C", b.prompt_token_ids + b.output_token_ids[:4] + tokens(5, 3), tokens(6, 2), parent="B",
                    think_steps=2)
    record = run([a, b, c], TINY.replace(gpu_blocks=7, scheduling="async", reserve_full_isl=False))
    assert record.preemptions == 1 and healthy(record)
    assert stored_chunks(record, "B") == {0, 1}


@pytest.mark.parametrize("story", READMITTED)
def test_a_readmitted_request_counts_its_chunks_from_the_step_it_gets_them_back(story):
    """The stories of readmitted.py: B's chunk 2 counts from its re-admission (1 step), not from
    its write before the preemption (3 and 4 steps); tests/vllm/test_differential.py replays the
    same through vLLM's scheduler."""
    record = run(readmitted_requests(READMITTED[story]), READMITTED[story])
    assert healthy(record) and record.preemptions == 1
    # Chunks 0-1 of A and B (stored from the prefill), A's chunk 2, then B's chunk 2.
    assert record.store_submit_delays == [1, 1, 1, 1, 2, 1]
