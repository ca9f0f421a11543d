"""The bounds of workloads/limits.py: the JSON depth scan agrees with a parser, and the budget
stops an oversized workload before its tokens exist."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.engine.config import EngineConfig
from kvoffload.workloads.limits import MAX_REQUESTS, Budget, check_engine, json_depth_at_most, max_model_len
from kvoffload.workloads.schema import WorkloadError


def depth(value) -> int:
    if isinstance(value, list):
        return 1 + max((depth(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(item) for item in value.values()), default=0)
    return 0


# Strings full of what the scan must not mistake for structure: brackets, quotes, backslashes.
tricky = st.text(alphabet='ab[]{}"\\ \n')
values = st.recursive(st.one_of(tricky, st.integers()),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky, inner, max_size=3),
                      max_leaves=30)


@settings(max_examples=400, database=None, derandomize=True)
@given(value=values, limit=st.integers(0, 8))
def test_the_depth_scan_agrees_with_the_nesting_a_parser_sees(value, limit):
    assert json_depth_at_most(json.dumps(value).encode(), limit) == (depth(value) <= limit)


@pytest.mark.parametrize("text, deepest", [
    (r'["\\", [[]]]', 3),  # an escaped backslash closes the string before the brackets
    (r'["\"[[[[", []]', 2),  # an escaped quote keeps the brackets inside the string
    (r'["\\\"[[[[", []]', 2),
    ('[' * 100 + ']' * 100, 100),
])
def test_escapes_and_deep_nesting(text, deepest):
    assert json_depth_at_most(text.encode(), deepest)
    assert not json_depth_at_most(text.encode(), deepest - 1)


def test_the_budget_stops_a_request_longer_than_the_gpu_pool_before_its_tokens_exist():
    engine = EngineConfig(gpu_blocks=11, block_size=16, spec_tokens=2)
    assert max_model_len(engine) == 10 * 16 - 2
    budget = Budget(engine, "w.toml")
    budget.add("request a", 100, 58)  # exactly max_model_len
    with pytest.raises(WorkloadError, match=r"w.toml: request b: expected prompt \+ output within max_model_len 158"):
        budget.add("request b", 100, 59)
    assert (budget.requests, budget.tokens) == (1, 158)


def test_the_budget_takes_ten_million_requests_and_refuses_the_next():
    # MAX_REQUESTS is the most a workload may hold, not the first count refused. Adding 10**7
    # requests one by one takes seconds; the count before the last two is set directly.
    budget = Budget(EngineConfig(), "w.toml")
    budget.requests = MAX_REQUESTS - 1
    budget.add("request r9999999", 4, 1)
    assert budget.requests == MAX_REQUESTS == 10**7
    with pytest.raises(WorkloadError, match=r"^w\.toml: request r10000000: expected at most 10,000,000 requests"):
        budget.add("request r10000000", 4, 1)


def test_the_memory_check_counts_at_least_what_a_full_gpu_pool_holds_per_block():
    """Issue 22: a gpu_blocks=auto pool grew past what the memory check counted. Every block of a
    pool handed out and committed (its hash findable): the Python memory traced per block stays
    within POOL_BYTES_PER_BLOCK (hashes aside: the requests own them)."""
    import hashlib
    import tracemalloc

    from kvoffload.engine.block_pool import BlockPool
    from kvoffload.workloads.limits import POOL_BYTES_PER_BLOCK

    blocks = 2**14
    hashes = [hashlib.sha256(i.to_bytes(8, "little")).digest() for i in range(blocks - 1)]
    tracemalloc.start()
    try:
        pool = BlockPool(blocks, 16)
        pool.commit(pool.allocate(blocks - 1), hashes, 0, blocks - 1)
        traced = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert 150 * blocks < traced <= POOL_BYTES_PER_BLOCK * blocks  # 150: the check measures a pool at all


@pytest.mark.parametrize("spec_tokens, refused", [(158, False), (159, True)])
def test_the_draft_limit_names_the_largest_count_that_is_taken(spec_tokens, refused):
    """A request needs two token slots beside its drafts: 160 slots take 158 drafts, not 159."""
    engine = EngineConfig(gpu_blocks=11, block_size=16, spec_tokens=spec_tokens)
    if not refused:
        check_engine(engine, "w.toml")
        return
    with pytest.raises(WorkloadError, match=r"^w.toml: spec_tokens: expected at most 158 \(the GPU pool's 160 "
                                            r"token slots less a request's two\), got 159$"):
        check_engine(engine, "w.toml")
