"""The KV content oracle: what every GPU slot *should* hold, and the check of loaded chunks.

A slot's first 8 bytes hold a fingerprint of the token prefix up to and including its position:
``fp[i] = fp[i-1] * B + (token[i] + 1)  (mod 2**64)``, a polynomial hash. Equal prefixes give equal
fingerprints (so KV legitimately shared between requests matches), and prefixes that differ in
any one token differ at every later position. It is computed for a whole sequence at once as
``B**i * cumsum((token[j] + 1) * B**-j)``, all in wrapping uint64 arithmetic.
"""

from __future__ import annotations

import numpy as np

_BASE = 0x9E3779B97F4A7C15  # odd, so invertible modulo 2**64
_BASE_INV = pow(_BASE, -1, 1 << 64)
_MASK = (1 << 64) - 1


def prefix_fingerprints(token_ids: np.ndarray) -> np.ndarray:
    """uint64 fingerprint of every prefix of ``token_ids``."""
    n = len(token_ids)
    base_pows = np.cumprod(np.full(n, _BASE, dtype=np.uint64)) * np.uint64(_BASE_INV)  # B**i
    inv_pows = np.cumprod(np.full(n, _BASE_INV, dtype=np.uint64)) * np.uint64(_BASE)  # B**-i
    terms = (token_ids.astype(np.uint64) + np.uint64(1)) * inv_pows
    return base_pows * np.cumsum(terms, dtype=np.uint64)


def extend_fingerprint(previous: int, token_id: int) -> int:
    """Fingerprint of a prefix extended by one token (drafts: one at a time)."""
    return (previous * _BASE + token_id + 1) & _MASK


def as_signed(values: np.ndarray) -> np.ndarray:
    """uint64 fingerprints as the int64 bit pattern stored in the slot."""
    return values.view(np.int64)


def to_signed_int(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value
