"""Block hashes over compact (int32) token buffers: the same chained values whatever holds the tokens,
computed incrementally, and the same in every process."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from array import array

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.core.request import Request
from kvoffload.core.types import chain_block_hash, extend_block_hashes

BLOCK = 16


def model_hashes(tokens: list[int], block_size: int) -> list[bytes]:
    """An independent model: keyed BLAKE2b over (parent, int32 ids in machine order), block by block."""
    out, parent = [], b"\x00" * 16
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hashlib.blake2b(digest_size=16, key=b"kvoffload-bench/block-hash/v1")
        h.update(parent)
        h.update(b"".join(t.to_bytes(4, sys.byteorder, signed=True) for t in tokens[start : start + block_size]))
        parent = h.digest()
        out.append(parent)
    return out


@settings(max_examples=60, deadline=None)
@given(length=st.integers(0, 5 * BLOCK + 7), seed=st.integers(0, 2**32 - 1),
       cuts=st.lists(st.integers(0, 5 * BLOCK + 7), max_size=4))
def test_incremental_hashing_in_any_container_equals_the_model(length, seed, cuts):
    tokens = np.random.default_rng(seed).integers(0, 32_000, size=length).tolist()
    expected = model_hashes(tokens, BLOCK)
    for container in (tuple, list, lambda t: array("i", t), lambda t: array("q", t),
                      lambda t: np.array(t, dtype=np.int64), lambda t: np.array(t, dtype=np.int32)):
        hashes: list[bytes] = []
        for end in sorted(cuts) + [len(tokens)]:  # the sequence grows; each call hashes new blocks only
            extend_block_hashes(hashes, container(tokens[:end]), BLOCK)
        assert hashes == expected


def test_equal_prefixes_give_equal_hashes_and_a_change_changes_every_later_block():
    rng = np.random.default_rng(1)
    shared = rng.integers(16, 32_000, size=3 * BLOCK).tolist()
    a = shared + rng.integers(16, 32_000, size=2 * BLOCK).tolist()
    b = shared + rng.integers(16, 32_000, size=2 * BLOCK).tolist()
    ha, hb = [], []
    extend_block_hashes(ha, a, BLOCK)
    extend_block_hashes(hb, b, BLOCK)
    assert ha[:3] == hb[:3]
    assert all(x != y for x, y in zip(ha[3:], hb[3:]))
    # Chained: the same block content after a different parent hashes differently.
    c = a[:BLOCK] + [t + 1 if t < 31_999 else 16 for t in a[BLOCK : 2 * BLOCK]] + a[2 * BLOCK :]
    hc = []
    extend_block_hashes(hc, c, BLOCK)
    assert hc[0] == ha[0] and all(x != y for x, y in zip(ha[1:], hc[1:]))
    assert chain_block_hash(ha[0], a[BLOCK : 2 * BLOCK]) == ha[1]


def test_a_live_request_hashes_only_newly_full_blocks_as_tokens_arrive():
    tokens = list(range(100, 100 + 3 * BLOCK + 5))
    req = Request("r", tokens[: BLOCK + 3], BLOCK)
    assert req.block_hashes == model_hashes(tokens[: BLOCK + 3], BLOCK)
    for token in tokens[BLOCK + 3 :]:
        before = list(req.block_hashes)
        req.append_tokens((token,))
        assert req.block_hashes[: len(before)] == before  # earlier hashes untouched
        assert req.block_hashes == model_hashes(tokens[: req.num_tokens], BLOCK)
    assert list(req.all_token_ids) == tokens


def test_a_request_shares_an_int32_prompt_until_its_first_token_and_never_writes_it():
    prompt = array("i", range(100, 100 + 2 * BLOCK + 1))
    req = Request("r", prompt, BLOCK)
    assert req.all_token_ids is prompt  # a waiting request holds no second copy
    req.append_tokens((7, 8))
    assert req.all_token_ids is not prompt and list(prompt) == list(range(100, 100 + 2 * BLOCK + 1))
    assert list(req.all_token_ids) == list(prompt) + [7, 8]
    assert req.block_hashes == model_hashes(list(prompt) + [7, 8], BLOCK)


def test_hash_values_do_not_depend_on_the_process_or_its_hash_seed():
    code = ("from kvoffload.core.request import Request; "
            "print(Request('r', tuple(range(7, 7 + 50)), 16).block_hashes[-1].hex())")
    values = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        values.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                  check=True).stdout.strip())
    assert values == {model_hashes(list(range(7, 57)), 16)[-1].hex()}
