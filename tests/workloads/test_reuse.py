"""The infinite-cache reuse share, on workloads small enough to count by hand (16-token blocks)."""

from __future__ import annotations

import pytest

from kvoffload.core.types import extend_block_hashes
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads import Workload, load_workload, reusable_prompt_share


def workload(*requests: RequestSpec, block_size: int = 16) -> Workload:
    return Workload(name="w", description="d", seed=0, engine=EngineConfig(block_size=block_size),
                    requests=tuple(requests), source="test")


def tokens(start: int, count: int) -> tuple[int, ...]:
    return tuple(range(start, start + count))


def test_a_shared_prefix_counts_in_whole_blocks_only():
    # A and B share 40 tokens: blocks 0 and 1 (32 tokens) are reusable for B, the 8 shared
    # tokens of block 2 are not (that block differs), and nothing is reusable for A.
    a = RequestSpec("a", tokens(0, 40) + tokens(1000, 24), (1,), arrival_step=0)
    b = RequestSpec("b", tokens(0, 40) + tokens(2000, 24), (1,), arrival_step=5)
    assert reusable_prompt_share(workload(a, b)) == pytest.approx(32 / 128)


def test_identical_prompts_reuse_all_full_blocks_but_not_the_partial_one():
    a = RequestSpec("a", tokens(0, 20), (1,))
    b = RequestSpec("b", tokens(0, 20), (1,), arrival_step=1)
    assert reusable_prompt_share(workload(a, b)) == pytest.approx(16 / 40)


def test_a_follow_up_reuses_its_parents_answer_too():
    # The parent's prompt (24) + answer (24) = 48 tokens = 3 full blocks, all in the child's
    # prompt; the first block of the parent's own prompt was new.
    parent = RequestSpec("p", tokens(0, 24), tokens(500, 24), conversation="c")
    child = RequestSpec("c1", tokens(0, 24) + tokens(500, 24) + tokens(900, 10), (1,), parent="p",
                        think_steps=3, conversation="c", turn=1)
    assert reusable_prompt_share(workload(parent, child)) == pytest.approx(48 / (24 + 58))


def test_a_follow_up_that_rewrote_its_history_reuses_only_what_it_really_shares():
    # A trace's next turn need not repeat its parent's history verbatim (an edited message): the
    # child's first block is the parent's, its second differs, so it reuses 16 tokens, not the
    # parent's 48 (the parent's chained hashes do not carry over to a prompt that leaves them).
    parent = RequestSpec("p", tokens(0, 24), tokens(500, 24), conversation="c")
    child = RequestSpec("c1", tokens(0, 16) + tokens(700, 32) + tokens(900, 10), (1,), parent="p",
                        think_steps=3, conversation="c", turn=1)
    w = workload(parent, child)
    assert reusable_prompt_share(w) == pytest.approx(16 / (24 + 58)) == pytest.approx(naive_share(w))


def test_only_earlier_requests_count():
    late = RequestSpec("late", tokens(0, 32), (1,), arrival_step=9)
    early = RequestSpec("early", tokens(0, 32), (1,), arrival_step=0)
    # Requests are taken in list order, which load_workload makes the estimated arrival order.
    assert reusable_prompt_share(workload(early, late)) == pytest.approx(32 / 64)
    assert reusable_prompt_share(workload(RequestSpec("solo", tokens(0, 32), (1,)))) == 0.0


def test_block_size_comes_from_the_engine_settings():
    a = RequestSpec("a", tokens(0, 40), (1,))
    b = RequestSpec("b", tokens(0, 40), (1,), arrival_step=1)
    assert reusable_prompt_share(workload(a, b, block_size=8)) == pytest.approx(40 / 80)
    assert reusable_prompt_share(workload(a, b, block_size=32)) == pytest.approx(32 / 80)


def naive_share(w: Workload) -> float:
    """The definition, word for word: hash every request from scratch."""
    seen, reusable, total = set(), 0, 0
    for spec in w.requests:
        prompt_hashes: list[bytes] = []
        extend_block_hashes(prompt_hashes, spec.prompt_token_ids, w.engine.block_size)
        reusable += w.engine.block_size * sum(h in seen for h in prompt_hashes)
        total += spec.num_prompt_tokens
        full: list[bytes] = []
        extend_block_hashes(full, spec.prompt_token_ids + spec.output_token_ids, w.engine.block_size)
        seen.update(full)
    return reusable / total


@pytest.mark.parametrize("name", ["shared-prefix-small", "multi-turn-small", "spec-decode-small"])
def test_the_fast_path_agrees_with_the_definition(name):
    w = load_workload(name)
    assert reusable_prompt_share(w) == pytest.approx(naive_share(w), abs=1e-12)
