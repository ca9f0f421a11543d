"""The order in which CPython iterates a set of request ids, under a fixed string hash seed.

vLLM's scheduler collects the requests that finished between two schedules in a ``set[str]``
(``Scheduler.finished_req_ids``, filled by ``_free_request``) and the connector walks that set in
``build_connector_meta``: vLLM's OffloadingConnector offers the final stores and signals
``on_request_finished`` in the set's iteration order (``offloading/scheduler.py``,
``_build_store_jobs``). A full CPU tier evicts in that order, so which continuation later finds
its parent's chunks depends on the order, and the order on the process's string hash
(``PYTHONHASHSEED``): docs/fidelity.md, "finish order".

The vllm-scheduler engine runs vLLM under ``PYTHONHASHSEED=HASH_SEED``; the simulator orders its
finished requests with :func:`set_iteration_order` for the same seed, so both engines walk them
alike. The model is CPython 3.11+'s: SipHash-1-3 of the string's code units keyed from the seed
(``Python/pyhash.c``, ``Python/bootstrap_hash.c``), and the open-addressing table of
``Objects/setobject.c`` (8 slots, linear probes of 9, perturbation, growth by 4 at 3/5 full).
tests/engine/test_set_order.py checks it against real sets in child interpreters.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Iterable, Sequence

HASH_SEED = 0  # the PYTHONHASHSEED of every vllm-scheduler replay, and the simulator's finish order

_MASK64 = (1 << 64) - 1
_LINEAR_PROBES = 9  # setobject.c
_PERTURB_SHIFT = 5
_MIN_SIZE = 8


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (64 - bits))) & _MASK64


def _siphash13(k0: int, k1: int, data: bytes) -> int:
    v0, v1 = k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D
    v2, v3 = k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573

    def round_(v0, v1, v2, v3):
        v0 = (v0 + v1) & _MASK64
        v2 = (v2 + v3) & _MASK64
        v1 = _rotl(v1, 13) ^ v0
        v3 = _rotl(v3, 16) ^ v2
        v0 = _rotl(v0, 32)
        v2 = (v2 + v1) & _MASK64
        v0 = (v0 + v3) & _MASK64
        v1 = _rotl(v1, 17) ^ v2
        v3 = _rotl(v3, 21) ^ v0
        v2 = _rotl(v2, 32)
        return v0, v1, v2, v3

    whole = len(data) - len(data) % 8
    for (word,) in struct.iter_unpack("<Q", data[:whole]):
        v3 ^= word
        v0, v1, v2, v3 = round_(v0, v1, v2, v3)
        v0 ^= word
    last = ((len(data) & 0xFF) << 56) | int.from_bytes(data[whole:], "little")
    v3 ^= last
    v0, v1, v2, v3 = round_(v0, v1, v2, v3)
    v0 ^= last
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = round_(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


@lru_cache(maxsize=None)
def _key(seed: int) -> tuple[int, int]:
    """SipHash's key: zero for seed 0 (randomization off), else the first 16 bytes that CPython's
    ``lcg_urandom`` derives from the seed."""
    if seed == 0:
        return 0, 0
    x, secret = seed, bytearray()
    for _ in range(16):
        x = (x * 214013 + 2531011) & 0xFFFFFFFF
        secret.append((x >> 16) & 0xFF)
    return struct.unpack("<QQ", bytes(secret))


def str_hash(text: str, seed: int = HASH_SEED) -> int:
    """``hash(text)`` in a CPython 3.11+ process started with ``PYTHONHASHSEED=seed``."""
    if not text:
        return 0
    widest = max(map(ord, text))
    # CPython hashes the string's own storage: 1, 2 or 4 bytes per code point.
    data = (text.encode("latin-1") if widest < 0x100 else
            text.encode("utf-16-le") if widest < 0x10000 else text.encode("utf-32-le"))
    value = _siphash13(*_key(seed), data)
    signed = value - (1 << 64) if value >> 63 else value
    return -2 if signed == -1 else signed


def set_iteration_order(ids: Sequence[str], seed: int = HASH_SEED) -> tuple[str, ...]:
    """The order ``for x in s`` yields after ``s = set(); s.add(i) for i in ids`` (duplicates
    ignored), in a process started with ``PYTHONHASHSEED=seed``."""
    if len(ids) < 2:
        return tuple(ids)
    table: list[tuple[int, str] | None] = [None] * _MIN_SIZE
    fill = 0
    for text in ids:
        hashed = str_hash(text, seed)
        mask = len(table) - 1
        slot = _probe(table, mask, hashed, text)
        if slot is None:
            continue  # already present
        table[slot] = (hashed, text)
        fill += 1
        if fill * 5 >= mask * 3:
            table = _resized(table, fill * 4 if fill <= 50000 else fill * 2)
    return tuple(entry[1] for entry in table if entry is not None)


def _probe(table, mask: int, hashed: int, text: str) -> int | None:
    """The free slot ``set_add_entry`` fills, or None when ``text`` is in the table (no removals:
    a finished set is only ever added to)."""
    unsigned = hashed & _MASK64
    perturb, i = unsigned, unsigned & mask
    while True:
        probes = _LINEAR_PROBES if i + _LINEAR_PROBES <= mask else 0
        for j in range(i, i + probes + 1):
            entry = table[j]
            if entry is None:
                return j
            if entry[0] == hashed and entry[1] == text:
                return None
        perturb >>= _PERTURB_SHIFT
        i = (i * 5 + 1 + perturb) & mask


def _resized(table, min_used: int):
    size = _MIN_SIZE
    while size <= min_used:
        size <<= 1
    fresh: list[tuple[int, str] | None] = [None] * size
    for entry in table:  # set_table_resize re-inserts in the old table's order
        if entry is not None:
            fresh[_probe(fresh, size - 1, entry[0], entry[1])] = entry
    return fresh


def process_hash_seed_is(seed: int = HASH_SEED, probes: Iterable[str] = ("kvoffload", "req-0", "A")) -> bool:
    """Whether this interpreter hashes strings as one started with ``PYTHONHASHSEED=seed``."""
    return all(hash(text) == str_hash(text, seed) for text in probes)
