"""A drafter (MTP/EAGLE) group of its own in the engine (``qwen3-next-mtp``; engine/drafter_kv.py,
docs/engine.md, "Hybrid models"): the model is refused without a drafter, its full-attention
groups share one prefix lookup, and the KV oracle writes a drafter slot one token ahead."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvoffload.core.keys import group_key
from kvoffload.core.model import model_named
from kvoffload.core.types import ConfigError
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.drafter_kv import drafter_writes, joint_full_hit
from kvoffload.engine.engine import Engine
from kvoffload.engine.oracle import group_salt, prefix_fingerprints
from kvoffload.engine.requests import RequestSpec

MTP = EngineConfig(model="qwen3-next-mtp", block_size=16, gpu_blocks=64, cpu_chunks=64, max_num_seqs=8,
                   max_num_batched_tokens=16, eagle_drafts=1)
HASHES = [bytes([i]) * 8 for i in range(4)]


def test_the_model_has_a_flagged_full_attention_group_and_needs_a_drafter():
    groups = model_named("qwen3-next-mtp").groups
    assert [(g.kind.value, g.drafter) for g in groups] == [("full_attention", False), ("mamba", False),
                                                         ("full_attention", True)]
    assert model_named("qwen3-next-mtp").unsupported() is None
    with pytest.raises(ConfigError, match="needs eagle_drafts >= 1"):
        MTP.replace(eagle_drafts=0)


def pool_with(target_blocks: int, drafter_blocks: int) -> BlockPool:
    """A pool whose group 0 caches the first ``target_blocks`` hashes and group 2 the first
    ``drafter_blocks``."""
    pool = BlockPool(32, 16)
    for group, count in ((0, target_blocks), (2, drafter_blocks)):
        for block, block_hash in zip(pool.allocate(count), HASHES):
            pool.commit_one(block, group_key(block_hash, group))
    return pool


@pytest.mark.parametrize("eagle, expected", [(False, 2), (True, 1)])
def test_a_block_counts_where_both_full_attention_groups_cached_it(eagle, expected):
    """``FullAttentionManager.find_longest_cache_hit`` over the spec group's ids: group 0 caches
    three blocks, the drafter's two; the hit (at most 3 blocks) is two, one under the EAGLE drop,
    the same length in both groups."""
    hits = [[], [], []]
    joint_full_hit(hits, pool_with(3, 2), HASHES, 48, 16, eagle, [0, 2])
    assert len(hits[0]) == len(hits[2]) == expected
    assert set(hits[0]).isdisjoint(hits[2])  # each group's own blocks
    planted = [[], [], []]  # the lookup of group 0 alone (the drafter's group ignored)
    joint_full_hit(planted, pool_with(3, 2), HASHES, 48, 16, eagle, [0])
    assert len(planted[0]) == expected + 1


class Item:
    def __init__(self, start, num_tokens):
        self.start, self.num_tokens = start, num_tokens


def test_a_drafter_slot_holds_the_prefix_through_the_next_token():
    """``set_inputs_first_pass``: the input at position i is token i + 1; the script's last token
    is never an input."""
    fingerprints = prefix_fingerprints(np.arange(10)).view(np.int64)
    positions, held = drafter_writes(fingerprints, Item(4, 3))
    assert positions.tolist() == [4, 5, 6] and held.tolist() == fingerprints[5:8].tolist()
    positions, held = drafter_writes(fingerprints, Item(8, 2))
    assert positions.tolist() == [8] and held.tolist() == [fingerprints[9]]


def test_after_a_run_the_drafter_slots_lead_the_target_slots_by_a_token():
    """One request of 40 prompt tokens and 3 outputs, no offloading read: every computed
    position's slot in group 2 holds the salted fingerprint of the prefix a token longer than
    group 0's slot there (the last position, 42, never computed)."""
    spec = RequestSpec("A", tuple(range(100, 140)), (7, 8, 9))
    engine = Engine([spec], MTP, max_steps=50)
    tables = {}
    plain = engine.oracle.forward_group

    def keep_tables(scheduled, group, state=False):
        for item in scheduled:
            tables.update(target=list(item.live.tables[0]), drafter=list(item.live.tables[2]))
        plain(scheduled, group, state)

    engine.oracle.forward_group = keep_tables
    record = engine.run()
    assert record.finished_requests == 1 and not record.poisoned
    fingerprints = prefix_fingerprints(np.asarray(spec.prompt_token_ids + spec.output_token_ids)).view(np.int64)
    words = engine.kv.gpu.view(engine.kv.num_gpu_blocks * 16, engine.kv.slot_bytes).view(torch.int64)
    slot = lambda table, i: int(words[table[i // 16] * 16 + i % 16, 0])  # noqa: E731
    assert [slot(tables["target"], i) for i in range(42)] == fingerprints[:42].tolist()
    salt = group_salt(2)
    assert [slot(tables["drafter"], i) ^ salt for i in range(42)] == fingerprints[1:43].tolist()

