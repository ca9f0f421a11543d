"""CPU offload manager stories: prepare/complete pairs, LRU eviction, pinning, failures, lifecycle."""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import Recency
from kvoffload.core.manager import CPUOffloadManager, LifecycleViolation, LookupResult
from kvoffload.core.types import ConfigError


def keys(*ids: int) -> list[bytes]:
    return [i.to_bytes(4, "big") for i in ids]


@pytest.fixture
def manager():
    m = CPUOffloadManager(capacity_chunks=4)
    m.on_new_request("r")
    yield m
    m.check_invariants()


def test_store_is_pending_until_completed(manager):
    out = manager.prepare_store("r", keys(1, 2))
    assert out.keys_to_store == tuple(keys(1, 2)) and out.evicted_keys == ()
    assert manager.lookup(keys(1)[0]) is LookupResult.HIT_PENDING
    manager.complete_store(keys(1, 2))
    assert manager.lookup(keys(1)[0]) is LookupResult.HIT
    assert manager.lookup(keys(3)[0]) is LookupResult.MISS


def test_present_keys_are_not_stored_twice(manager):
    manager.prepare_store("r", keys(1, 2))
    out = manager.prepare_store("r", keys(2, 3))
    assert out.keys_to_store == tuple(keys(3))


def test_lru_eviction_takes_the_least_recently_used_ready_chunk(manager):
    # store [1, 2, 3, 4] -> full
    manager.prepare_store("r", keys(1, 2, 3, 4))
    manager.complete_store(keys(1, 2, 3, 4))
    # touch [1] -> 2 is now least recently used
    manager.touch(keys(1))
    # store [5] -> evicts 2
    out = manager.prepare_store("r", keys(5))
    assert out.evicted_keys == tuple(keys(2))
    assert manager.lookup(keys(2)[0]) is LookupResult.MISS


def test_touch_leaves_the_first_chunk_of_a_prefix_most_recent(manager):
    manager.prepare_store("r", keys(1, 2, 3, 4))
    manager.complete_store(keys(1, 2, 3, 4))
    manager.touch(keys(3, 4))
    # order now 1, 2, 4, 3 (3 newest): storing two evicts 1 and 2
    out = manager.prepare_store("r", keys(5, 6))
    assert out.evicted_keys == tuple(keys(1, 2))
    # 3 was touched after 4, so 4 goes first
    out = manager.prepare_store("r", keys(7))
    assert out.evicted_keys == tuple(keys(4))


def test_pending_and_loading_chunks_are_never_evicted(manager):
    manager.prepare_store("r", keys(1, 2, 3, 4))
    manager.complete_store(keys(1, 2))  # 3, 4 pending
    manager.prepare_load("r", keys(1))  # 1 pinned by a load
    out = manager.prepare_store("r", keys(5))
    assert out.evicted_keys == tuple(keys(2))
    assert manager.prepare_store("r", keys(6)) is None  # nothing evictable left
    assert manager.allocation_failures == 1
    manager.complete_load(keys(1))
    assert manager.prepare_store("r", keys(6)).evicted_keys == tuple(keys(1))


@pytest.mark.parametrize("recency", list(Recency), ids=lambda recency: recency.value)
def test_the_full_check_agrees_with_a_chunk_pinned_by_two_loads(recency):
    # Touch-on-access (vLLM <= 0.30) takes a loading chunk out of the LRU until its last load
    # completes; ranked at insert (0.31+) it keeps its rank. Either way the full check holds at
    # every point, and the pinned chunk is the one a full tier does not evict.
    m = CPUOffloadManager(capacity_chunks=2, recency=recency)
    m.on_new_request("r")
    m.prepare_store("r", keys(1, 2))
    m.complete_store(keys(1, 2))
    m.prepare_load("r", keys(1))
    m.prepare_load("r", keys(1))
    for loads_left in (2, 1):
        assert m.state_of(keys(1)[0]) == "loading"
        m.check_invariants()
        assert m.prepare_store("r", keys(3, 4)) is None  # two slots wanted, only chunk 2 evictable
        m.complete_load(keys(1))
    assert m.state_of(keys(1)[0]) == "ready"
    m.check_invariants()


def test_a_store_never_evicts_its_own_inputs(manager):
    manager.prepare_store("r", keys(1, 2, 3, 4))
    manager.complete_store(keys(1, 2, 3, 4))
    out = manager.prepare_store("r", keys(1, 5))  # 1 is LRU but asked for again
    assert out.keys_to_store == tuple(keys(5))
    assert out.evicted_keys == tuple(keys(2))


def test_failed_store_frees_its_slot_and_stays_invisible(manager):
    manager.prepare_store("r", keys(1))
    manager.complete_store(keys(1), success=False)
    assert manager.lookup(keys(1)[0]) is LookupResult.MISS
    assert manager.num_chunks == 0


def test_prepare_load_of_a_pending_chunk_is_refused(manager):
    manager.prepare_store("r", keys(1))
    with pytest.raises(KeyError, match="prepare_load of a chunk that is not ready") as refused:
        manager.prepare_load("r", keys(1))
    assert not isinstance(refused.value, LifecycleViolation)  # the chunk's state, not the request's


def test_reset_forgets_everything(manager):
    manager.prepare_store("r", keys(1, 2))
    manager.complete_store(keys(1))
    manager.reset_cache()
    assert manager.num_chunks == 0
    manager.complete_store(keys(2))  # late completion of a dropped store: ignored
    assert manager.lookup(keys(2)[0]) is LookupResult.MISS


def test_strict_lifecycle_counts_or_raises():
    counting = CPUOffloadManager(4, strict_lifecycle=True)
    counting.on_new_request("r")
    counting.on_request_finished("r")
    counting.prepare_store("r", keys(1))
    counting.on_request_finished("r")
    assert [(v.call, v.reason) for v in counting.violations] == [
        ("prepare_store", "after on_request_finished"), ("on_request_finished", "signalled twice")]
    raising = CPUOffloadManager(4, strict_lifecycle=True, raise_on_violation=True)
    with pytest.raises(LifecycleViolation, match="before on_new_request"):
        raising.prepare_load("ghost", [])


def test_capacity_must_be_positive():
    with pytest.raises(ConfigError, match="got 0"):
        CPUOffloadManager(0)
