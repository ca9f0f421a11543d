"""A waiting request's GPU prefix-cache lookup continues its last walk (issue 14, item 2): the
kept walk must always answer what a full walk over the whole prompt answers, however the pool
changed in between (commits, prefix hits taken, frees, evictions by reuse, cache resets)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.engine.block_pool import BlockPool, PrefixWalk

NUM_BLOCKS = 10


def chained(tokens: list[int]) -> list[bytes]:
    """One hash per block of one token: the prefix itself (chained like the real hashes)."""
    return [bytes(tokens[:i + 1]) for i in range(len(tokens))]


requests = st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=7), min_size=2, max_size=4)
operations = st.lists(st.tuples(st.sampled_from(["run", "admit", "free", "look", "grow", "reset", "uncache", "forget"]),
                                st.integers(0, 3), st.integers(0, 7)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(requests, operations)
def test_a_kept_walk_always_equals_the_full_walk(prompts, ops):
    pool = BlockPool(NUM_BLOCKS, 1)
    hashes = [chained(tokens) for tokens in prompts]
    tables: list[list[int]] = []  # block tables of "running" requests
    for op, which, amount in ops:
        r = which % len(hashes)
        if op in ("run", "admit"):  # a request runs: its prefix hit is taken, the rest allocated
            # and committed; "admit" takes the kept walk itself, which ends it
            hit = pool.cached_prefix(hashes[r], len(hashes[r]), key=r if op == "admit" else None)
            expected = list(hit)
            fresh = min(len(hashes[r]) - len(hit), pool.num_free_after_taking(hit))
            pool.take(hit)
            assert list(hit) == expected and r not in pool._walks or op == "run"
            table = hit + pool.allocate(fresh)
            pool.commit(table, hashes[r], len(hit), len(table))
            tables.append(table)
        elif op == "free" and tables:
            pool.free(tables.pop(amount % len(tables)))
        elif op == "grow":  # the request's sequence grew (a preempted request's outputs)
            tokens = list(hashes[r][-1]) + [amount % 2]
            hashes[r].append(bytes(tokens))
        elif op == "uncache":
            pool.uncache_free_blocks()
        elif op == "reset":  # refused while blocks are in use
            assert pool.reset_prefix_cache() == (not tables)
        elif op == "forget":
            pool.forget_prefix(r)
        limit = min(amount, len(hashes[r]))
        kept = pool.cached_prefix(hashes[r], limit, key=r)
        full = pool.cached_prefix(hashes[r], limit)
        assert type(kept) is PrefixWalk and list(kept) == full
        assert pool.num_free_after_taking(kept) == pool.num_free_after_taking(full)
        pool.check_invariants(sum(len(table) for table in tables))  # every kept walk checked too
    for key in range(len(hashes)):
        pool.forget_prefix(key)
    assert not pool._watchers


def test_an_evicted_block_ends_the_walk_before_it():
    pool = BlockPool(4, 1)
    prompt = chained([1, 0, 1])
    blocks = pool.allocate(3)
    pool.commit(blocks, prompt, 0, 3)
    pool.free(blocks)
    assert list(pool.cached_prefix(prompt, 3, key="W")) == blocks
    pool.allocate(2)  # the free queue's head: the request's tail block first, then its middle one
    assert list(pool.cached_prefix(prompt, 3, key="W")) == blocks[:1] == pool.cached_prefix(prompt, 3)


def test_a_block_committed_later_extends_the_walk():
    pool = BlockPool(6, 1)
    prompt = chained([0, 1, 1])
    first = pool.allocate(1)
    pool.commit(first, prompt, 0, 1)
    assert list(pool.cached_prefix(prompt, 3, key="W")) == first
    rest = pool.allocate(2)
    pool.commit(first + rest, prompt, 1, 3)
    assert list(pool.cached_prefix(prompt, 3, key="W")) == first + rest


def test_a_prefix_cache_reset_ends_every_walk():
    pool = BlockPool(6, 1)
    prompt = chained([1, 0])
    blocks = pool.allocate(2)
    pool.commit(blocks, prompt, 0, 2)
    pool.free(blocks)
    assert list(pool.cached_prefix(prompt, 2, key="W")) == blocks
    assert pool.reset_prefix_cache()
    assert list(pool.cached_prefix(prompt, 2, key="W")) == [] == pool.cached_prefix(prompt, 2)
    pool.check_invariants(0)
