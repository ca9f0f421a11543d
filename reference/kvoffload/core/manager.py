"""The CPU offload manager: which chunks the offload tier holds, in what state, and who may ask.

Chunk states (one ``_Chunk`` per key, owned here and nowhere else):

    pending-store  ref_count == -1   slot allocated, copy in flight, NOT readable (lookup: HIT_PENDING)
    ready          ref_count ==  0   readable and evictable (LRU order in ``_evictable``)
    being-loaded   ref_count  >  0   readable, pinned until every load completed

Calls come in prepare/complete pairs: ``prepare_store`` -> ``complete_store(success)``,
``prepare_load`` -> ``complete_load``. Eviction only ever takes ready chunks, least recently used
first, and never a chunk the same ``prepare_store`` call asked for.

Strict lifecycle mode (like vLLM's tiering manager): every submit-side call for a request
(``prepare_store``, ``prepare_load``) must come between ``on_new_request`` and
``on_request_finished``; anything else is a violation, counted or raised.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

from kvoffload.core.types import ChunkSlot, ConfigError, LifecycleEvent, OffloadKey, ReqId


class LookupResult(enum.Enum):
    MISS = "miss"
    HIT = "hit"  # stored and readable
    HIT_PENDING = "hit_pending"  # present, its store still in flight


class PrepareStoreOutput(NamedTuple):
    """``keys_to_store[i]`` goes to tier slot ``slots[i]``; ``evicted_keys`` were dropped for room.

    A NamedTuple (immutable) rather than a frozen dataclass: one per store, on the hot path."""

    keys_to_store: tuple[OffloadKey, ...]
    slots: tuple[ChunkSlot, ...]
    evicted_keys: tuple[OffloadKey, ...]


@dataclass(frozen=True)
class ManagerEvent:
    keys: tuple[OffloadKey, ...]
    removed: bool  # False: stored (now loadable); True: evicted or dropped


class LifecycleViolation(KeyError):
    """A submit-side call for a request outside on_new_request .. on_request_finished.

    A KeyError on purpose: it is what vLLM's tiering manager raised (issue #49635).
    """


@dataclass(slots=True)
class _Chunk:
    slot: ChunkSlot
    ref_count: int  # -1 pending store, 0 ready, n > 0 being loaded n times


class CPUOffloadManager:
    def __init__(self, capacity_chunks: int, strict_lifecycle: bool = True, raise_on_violation: bool = False):
        if not isinstance(capacity_chunks, int) or isinstance(capacity_chunks, bool) or capacity_chunks < 1:
            raise ConfigError(f"cpu capacity must be a positive number of chunks, got {capacity_chunks!r}")
        self.capacity_chunks = capacity_chunks
        self.strict_lifecycle = strict_lifecycle
        self.raise_on_violation = raise_on_violation
        self._chunks: dict[OffloadKey, _Chunk] = {}
        self._evictable: OrderedDict[OffloadKey, None] = OrderedDict()  # ready chunks, LRU first
        # Free slots handed out lowest first, so slot assignment is deterministic.
        self._free_slots: list[ChunkSlot] = list(range(capacity_chunks - 1, -1, -1))
        self._live_requests: set[ReqId] = set()
        self._finished_requests: set[ReqId] = set()
        self._events: list[ManagerEvent] = []
        self.violations: list[LifecycleEvent] = []
        self.allocation_failures = 0

    # ---- lifecycle -------------------------------------------------------------------------

    def on_new_request(self, req_id: ReqId) -> None:
        self._live_requests.add(req_id)
        self._finished_requests.discard(req_id)

    def on_request_finished(self, req_id: ReqId) -> None:
        if req_id not in self._live_requests:
            reason = "signalled twice" if req_id in self._finished_requests else "never announced"
            self._violation(req_id, "on_request_finished", reason)
            return
        self._live_requests.discard(req_id)
        self._finished_requests.add(req_id)

    def _check_submit(self, req_id: ReqId, call: str) -> None:
        if self.strict_lifecycle and req_id not in self._live_requests:
            reason = "after on_request_finished" if req_id in self._finished_requests else "before on_new_request"
            self._violation(req_id, call, reason)

    def _violation(self, req_id: ReqId, call: str, reason: str) -> None:
        event = LifecycleEvent(req_id=req_id, call=call, reason=reason)
        self.violations.append(event)
        if self.raise_on_violation:
            raise LifecycleViolation(f"{call} for request {req_id!r} {reason}")

    # ---- lookups and loads ----------------------------------------------------------------

    def lookup(self, key: OffloadKey) -> LookupResult:
        chunk = self._chunks.get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT_PENDING if chunk.ref_count < 0 else LookupResult.HIT

    def prepare_load(self, req_id: ReqId, keys: Sequence[OffloadKey]) -> tuple[ChunkSlot, ...]:
        """Pin ``keys`` (all must be ready) until ``complete_load``; returns their tier slots."""
        self._check_submit(req_id, "prepare_load")
        slots = []
        for key in keys:
            chunk = self._chunks.get(key)
            if chunk is None or chunk.ref_count < 0:
                raise KeyError(f"prepare_load of a chunk that is not ready: {key.hex()[:12]}")
            if chunk.ref_count == 0:
                del self._evictable[key]
            chunk.ref_count += 1
            slots.append(chunk.slot)
        return tuple(slots)

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        for key in keys:
            chunk = self._chunks.get(key)
            if chunk is None or chunk.ref_count <= 0:
                raise KeyError(f"complete_load of a chunk that is not being loaded: {key.hex()[:12]}")
            chunk.ref_count -= 1
            if chunk.ref_count == 0:
                self._evictable[key] = None

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        """Mark ``keys`` most recently used; iterate backwards so the first chunk ends up newest
        (a prefix's head outlives its tail)."""
        for key in reversed(keys):
            if key in self._evictable:
                self._evictable.move_to_end(key)

    # ---- stores ---------------------------------------------------------------------------

    def prepare_store(self, req_id: ReqId, keys: Sequence[OffloadKey]) -> PrepareStoreOutput | None:
        """Allocate slots for the keys not already present (in any state).

        Returns None, changing nothing, when not enough ready chunks can be evicted.
        """
        self._check_submit(req_id, "prepare_store")
        chunks = self._chunks
        wanted = [key for key in keys if key not in chunks]
        if len(wanted) > 1 and len(set(wanted)) != len(wanted):
            wanted = list(dict.fromkeys(wanted))
        shortfall = len(wanted) - len(self._free_slots)
        evicted: list[OffloadKey] = []
        if shortfall > 0:
            protected = set(keys)
            for key in self._evictable:  # least recently used first
                if key not in protected:
                    evicted.append(key)
                    if len(evicted) == shortfall:
                        break
            if len(evicted) < shortfall:
                self.allocation_failures += 1
                return None
            for key in evicted:
                del self._evictable[key]
                self._free_slots.append(self._chunks.pop(key).slot)
            self._events.append(ManagerEvent(tuple(evicted), removed=True))
        slots = []
        for key in wanted:
            slot = self._free_slots.pop()
            self._chunks[key] = _Chunk(slot=slot, ref_count=-1)
            slots.append(slot)
        return PrepareStoreOutput(tuple(wanted), tuple(slots), tuple(evicted))

    def complete_store(self, keys: Iterable[OffloadKey], success: bool = True) -> None:
        """Pending chunks become ready; a failed store frees its slots and leaves no visible key."""
        done = []
        for key in keys:
            chunk = self._chunks.get(key)
            if chunk is None or chunk.ref_count != -1:
                continue  # dropped by reset_cache meanwhile, or already completed
            done.append(key)
            if success:
                chunk.ref_count = 0
                self._evictable[key] = None
            else:
                del self._chunks[key]
                self._free_slots.append(chunk.slot)
        if done:
            self._events.append(ManagerEvent(tuple(done), removed=not success))

    # ---- whole-cache operations -----------------------------------------------------------

    def reset_cache(self) -> None:
        """Forget every chunk; no key is served afterwards (in-flight copies are flushed by the
        connector and their completions ignored)."""
        if self._chunks:
            self._events.append(ManagerEvent(tuple(self._chunks), removed=True))
        self._chunks.clear()
        self._evictable.clear()
        self._free_slots = list(range(self.capacity_chunks - 1, -1, -1))

    def has_pending_work(self) -> bool:
        return False  # one tier, no background work: completions drive everything

    def take_events(self) -> list[ManagerEvent]:
        events, self._events = self._events, []
        return events

    @property
    def num_chunks(self) -> int:
        return len(self._chunks)

    def state_of(self, key: OffloadKey) -> str:
        chunk = self._chunks.get(key)
        if chunk is None:
            return "absent"
        return "pending" if chunk.ref_count < 0 else ("ready" if chunk.ref_count == 0 else "loading")

    def check_invariants(self, full: bool = True) -> None:
        """Slot accounting always; with ``full``, every slot and state (O(capacity))."""
        assert len(self._chunks) + len(self._free_slots) == self.capacity_chunks, "slots leaked"
        assert len(self._evictable) <= len(self._chunks), "evictable chunk that is not held"
        if not full:
            return
        used = {chunk.slot for chunk in self._chunks.values()}
        assert len(used) == len(self._chunks), "two chunks share a slot"
        assert not used & set(self._free_slots), "a slot is both used and free"
        assert len(used) + len(self._free_slots) == self.capacity_chunks, "slots leaked"
        ready = {key for key, chunk in self._chunks.items() if chunk.ref_count == 0}
        assert ready == set(self._evictable), "evictable set differs from ready chunks"
