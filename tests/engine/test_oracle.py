"""The KV content oracle's fingerprints (engine/oracle.py): the fingerprint of a prefix is the
polynomial hash the module states, ``fp[i] = fp[i-1] * B + (token[i] + 1) mod 2**64``, whether it
is computed for a whole sequence at once (a forward's writes) or one token at a time (drafts)."""

from __future__ import annotations

import numpy as np

from kvoffload.engine.oracle import extend_fingerprint, prefix_fingerprints


def test_a_whole_sequence_at_once_equals_the_recurrence_token_by_token():
    tokens = [5, 0, 7, 29_999, 5, 5, 123, 0]
    expected, fingerprint = [], 0
    for token in tokens:
        fingerprint = extend_fingerprint(fingerprint, token)
        expected.append(fingerprint)
    assert prefix_fingerprints(np.array(tokens, dtype=np.int64)).tolist() == expected
    assert expected[0] == 5 + 1  # B**0 * (token + 1): the first prefix is its token, plus one


def test_equal_prefixes_agree_and_one_differing_token_differs_at_every_later_position():
    a = prefix_fingerprints(np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.int64))
    b = prefix_fingerprints(np.array([3, 1, 4, 7, 5, 9, 2, 6], dtype=np.int64))
    assert (a[:3] == b[:3]).all()
    assert (a[3:] != b[3:]).all()
