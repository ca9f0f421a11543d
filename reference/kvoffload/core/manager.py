"""The CPU offload manager: which chunks the offload tier holds, in what state, and who may ask.

Chunk states (one ``_Chunk`` per key, owned here and nowhere else):

    pending-store  ref_count == -1   slot allocated, copy in flight, NOT readable (lookup: HIT_PENDING)
    ready          ref_count ==  0   readable and evictable
    being-loaded   ref_count  >  0   readable, pinned until every load completed

Calls come in prepare/complete pairs: ``prepare_store`` -> ``complete_store(success)``,
``prepare_load`` -> ``complete_load``. Eviction only ever takes ready chunks, least recently used
first, and never a chunk the same ``prepare_store`` call asked for.

Recency follows the release (``Recency``, docs/design.md, "Recency of the CPU tier"). ``_lru``
is one ordered dict, oldest first, whose membership is what differs:

    TOUCH_ON_ACCESS (vLLM <= 0.30)  ready chunks only; a chunk enters at the newest end when its
                                    store or its last load completes; ``touch`` moves keys
    RANK_AT_INSERT  (vLLM >= 0.31)  every chunk, from the prepare_store that inserted it; a
                                    pinned or pending chunk keeps its rank; the keys a request
                                    loaded or offered for store are re-ranked once, at
                                    on_request_finished (vLLM's cpu/policies/lru.py)

Strict lifecycle mode (like vLLM's tiering manager): every submit-side call for a request
(``prepare_store``, ``prepare_load``) must come between ``on_new_request`` and
``on_request_finished``; anything else is a violation, counted or raised.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

from kvoffload.core.fixes import Recency
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


class LifecycleViolation(KeyError):
    """A submit-side call for a request outside on_new_request .. on_request_finished.

    A KeyError on purpose: it is what vLLM's tiering manager raised (issue #49635).
    """


_NOTHING_TO_STORE = PrepareStoreOutput((), (), ())


@dataclass(slots=True)
class _Chunk:
    slot: ChunkSlot
    ref_count: int  # -1 pending store, 0 ready, n > 0 being loaded n times


class CPUOffloadManager:
    def __init__(self, capacity_chunks: int, strict_lifecycle: bool = True, raise_on_violation: bool = False,
                 recency: Recency = Recency.RANK_AT_INSERT):
        if not isinstance(capacity_chunks, int) or isinstance(capacity_chunks, bool) or capacity_chunks < 1:
            raise ConfigError(f"cpu capacity must be a positive number of chunks, got {capacity_chunks!r}")
        self.capacity_chunks = capacity_chunks
        self.strict_lifecycle = strict_lifecycle
        self.raise_on_violation = raise_on_violation
        self._chunks: dict[OffloadKey, _Chunk] = {}
        self.recency = recency
        self._ranked_at_insert = recency is Recency.RANK_AT_INSERT
        self._lru: OrderedDict[OffloadKey, None] = OrderedDict()  # oldest first; members: see above
        # RANK_AT_INSERT only: per live request, the keys it loaded or offered for store, with the
        # chunk position they were seen at (re-ranked head-to-tail at on_request_finished).
        self._accessed: dict[ReqId, dict[OffloadKey, int]] = {}
        # Free slots handed out lowest first, so slot assignment is deterministic.
        self._free_slots: list[ChunkSlot] = list(range(capacity_chunks - 1, -1, -1))
        self._live_requests: set[ReqId] = set()
        self._finished_requests: set[ReqId] = set()
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
        accessed = self._accessed.pop(req_id, None)
        if accessed:
            # Head-to-tail by position; touch() iterates backwards, so the head ends up newest.
            self.touch(sorted(accessed, key=accessed.__getitem__))

    def _record_access(self, req_id: ReqId, keys: Sequence[OffloadKey], positions: Sequence[int] | None) -> None:
        if req_id not in self._live_requests:
            return  # already finished (or never announced): vLLM asserts; the violation is counted
        seen = self._accessed.get(req_id)
        if seen is None:
            seen = self._accessed[req_id] = {}
        if positions is None:
            positions = range(len(seen), len(seen) + len(keys))
        for key, position in zip(keys, positions):
            if key not in seen:
                seen[key] = position

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

    def prepare_load(self, req_id: ReqId, keys: Sequence[OffloadKey],
                     positions: Sequence[int] | None = None) -> tuple[ChunkSlot, ...]:
        """Pin ``keys`` (all must be ready) until ``complete_load``; returns their tier slots.

        ``positions[i]`` is key i's chunk index in the request (orders the finish-time re-rank)."""
        self._check_submit(req_id, "prepare_load")
        slots = []
        for key in keys:
            chunk = self._chunks.get(key)
            if chunk is None or chunk.ref_count < 0:
                raise KeyError(f"prepare_load of a chunk that is not ready: {key.hex()[:12]}")
            if chunk.ref_count == 0 and not self._ranked_at_insert:
                del self._lru[key]
            chunk.ref_count += 1
            slots.append(chunk.slot)
        if self._ranked_at_insert:
            self._record_access(req_id, keys, positions)
        return tuple(slots)

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        for key in keys:
            chunk = self._chunks.get(key)
            if chunk is None or chunk.ref_count <= 0:
                raise KeyError(f"complete_load of a chunk that is not being loaded: {key.hex()[:12]}")
            chunk.ref_count -= 1
            if chunk.ref_count == 0 and not self._ranked_at_insert:
                self._lru[key] = None

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        """Mark ``keys`` most recently used; iterate backwards so the first chunk ends up newest
        (a prefix's head outlives its tail). Keys outside ``_lru`` are left alone (absent, and
        with TOUCH_ON_ACCESS also pending or pinned ones, as vLLM <= 0.30 did)."""
        lru = self._lru
        for key in reversed(keys):
            if key in lru:
                lru.move_to_end(key)

    # ---- stores ---------------------------------------------------------------------------

    def prepare_store(self, req_id: ReqId, keys: Sequence[OffloadKey],
                      positions: Sequence[int] | None = None) -> PrepareStoreOutput | None:
        """Allocate slots for the keys not already present (in any state).

        Returns None, allocating nothing, when not enough ready chunks can be evicted. With
        RANK_AT_INSERT the offer is recorded first (keys absent or ready; not ones another
        request is still storing), allocation failure or not, as vLLM's CPU manager does.
        """
        self._check_submit(req_id, "prepare_store")
        chunks = self._chunks
        if len(keys) == 1 and keys[0] not in chunks and len(self._free_slots):
            return self._store_one_new_chunk(req_id, keys[0], positions)
        wanted = [key for key in keys if key not in chunks]
        if len(wanted) > 1 and len(set(wanted)) != len(wanted):
            wanted = list(dict.fromkeys(wanted))
        if self._ranked_at_insert:
            if len(wanted) == len(keys):  # the decode step: every offered key is new
                self._record_access(req_id, keys, positions)
            else:
                offered = [i for i, key in enumerate(keys) if key not in chunks or chunks[key].ref_count == 0]
                self._record_access(req_id, [keys[i] for i in offered],
                                    [positions[i] for i in offered] if positions is not None else None)
        if not wanted:
            return _NOTHING_TO_STORE
        free = self._free_slots
        shortfall = len(wanted) - len(free)
        evicted: tuple[OffloadKey, ...] = ()
        if shortfall > 0:
            evicted = self._evict(shortfall, set(keys))
            if not evicted:
                self.allocation_failures += 1
                return None
        # What pop() would give, in one slice: fresh slots lowest first, freed ones last-freed first.
        slots = tuple(free[:-len(wanted) - 1:-1])
        del free[-len(wanted):]
        for key, slot in zip(wanted, slots):
            chunks[key] = _Chunk(slot, -1)
        if self._ranked_at_insert:
            self._lru.update(dict.fromkeys(wanted))  # ranked now, newest last
        return PrepareStoreOutput(tuple(wanted), slots, evicted)

    def _store_one_new_chunk(self, req_id: ReqId, key: OffloadKey,
                             positions: Sequence[int] | None) -> PrepareStoreOutput:
        """prepare_store of the decode step: one absent key and a free slot. Same effect as the
        general path, in fewer steps (it runs for every completed chunk of every request)."""
        if self._ranked_at_insert:
            seen = self._accessed.get(req_id)
            if seen is None and req_id in self._live_requests:
                seen = self._accessed[req_id] = {}
            if seen is not None and key not in seen:
                seen[key] = positions[0] if positions is not None else len(seen)
            self._lru[key] = None
        slot = self._free_slots.pop()
        self._chunks[key] = _Chunk(slot, -1)
        return PrepareStoreOutput((key,), (slot,), ())

    def _evict(self, count: int, protected: set[OffloadKey]) -> tuple[OffloadKey, ...]:
        """Drop ``count`` ready chunks, oldest first, none of ``protected``; () if impossible.

        With RANK_AT_INSERT pending and pinned chunks sit in ``_lru`` too and are skipped; they
        are few (a pending chunk completes within a few steps, a pinned one when its load lands).
        """
        chunks = self._chunks
        evicted: list[OffloadKey] = []
        for key in self._lru:
            if key not in protected and chunks[key].ref_count == 0:
                evicted.append(key)
                if len(evicted) == count:
                    break
        else:
            return ()
        for key in evicted:
            del self._lru[key]
            self._free_slots.append(chunks.pop(key).slot)
        return tuple(evicted)

    def complete_store(self, keys: Iterable[OffloadKey], success: bool = True) -> None:
        """Pending chunks become ready; a failed store frees its slots and leaves no visible key."""
        for key in keys:
            chunk = self._chunks.get(key)
            if chunk is None or chunk.ref_count != -1:
                continue  # dropped by reset_cache meanwhile, or already completed
            if success:
                chunk.ref_count = 0
                if not self._ranked_at_insert:
                    self._lru[key] = None
            else:
                del self._chunks[key]
                self._lru.pop(key, None)
                self._free_slots.append(chunk.slot)

    # ---- whole-cache operations -----------------------------------------------------------

    def reset_cache(self) -> None:
        """Forget every chunk; no key is served afterwards (in-flight copies are flushed by the
        connector and their completions ignored)."""
        self._chunks.clear()
        self._lru.clear()
        self._accessed.clear()  # like vLLM's cache generation: accesses before the reset are void
        self._free_slots = list(range(self.capacity_chunks - 1, -1, -1))

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
        assert len(self._lru) <= len(self._chunks), "LRU entry for a chunk that is not held"
        if not full:
            return
        used = {chunk.slot for chunk in self._chunks.values()}
        assert len(used) == len(self._chunks), "two chunks share a slot"
        assert used.isdisjoint(self._free_slots), "a slot is both used and free"
        assert len(used) + len(self._free_slots) == self.capacity_chunks, "slots leaked"
        if self._ranked_at_insert:
            assert self._lru.keys() == self._chunks.keys(), "a held chunk has no rank"
        else:
            ready = {key for key, chunk in self._chunks.items() if chunk.ref_count == 0}
            assert ready == self._lru.keys(), "LRU set differs from ready chunks"
