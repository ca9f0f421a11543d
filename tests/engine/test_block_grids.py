"""Groups of their own block sizes in the engine (engine/block_grids.py; docs/engine.md, "Groups
with block sizes of their own"): vLLM 0.32's rules, one story each, on ``mixed-blocks-tiny``
(full attention of 6-token blocks, a 4-token window of 4-token blocks: lcm 12, hashes every 2
tokens) and ``nested-blocks-tiny`` (12-token blocks, an 8-token window of 4-token blocks).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scripted import ScriptedConnector, step

from kvoffload.core.keys import group_key
from kvoffload.core.model import model_named
from kvoffload.core.types import NULL_BLOCK, RequestStatus
from kvoffload.engine.block_grids import BlockGrids
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.cost import profile
from kvoffload.engine.live import LiveRequest
from kvoffload.engine.observer import RunObserver
from kvoffload.engine.requests import RequestSpec
from kvoffload.engine.scheduler import SchedulerModel, StepOutput

BS = 4  # the engine's block size: the window's


def scheduler_of(model: str, **settings) -> SchedulerModel:
    config = EngineConfig(gpu_blocks=settings.pop("gpu_blocks", 48), block_size=BS, model=model, **settings)
    observer = RunObserver(profile(config.profile), BS, config.tokens_per_chunk, trace=False)
    return SchedulerModel(config, BlockPool(config.gpu_blocks, BS), ScriptedConnector(), observer,
                          on_finished=lambda live, number: None)


def arrive(scheduler: SchedulerModel, req_id: str, prompt, output: int = 1) -> LiveRequest:
    """A request hashed as EngineCore hashes it: at the groups' gcd."""
    spec = RequestSpec(req_id, tuple(prompt), tuple(range(900, 900 + output)))
    live = LiveRequest.create(spec, scheduler.hybrid.grids.hashed, 0)
    scheduler.add(live)
    return live


def run_to_end(scheduler: SchedulerModel, live: LiveRequest) -> None:
    number = 0
    while live.status is not RequestStatus.FINISHED_LENGTH:
        _, scheduled = step(scheduler, number)
        scheduler.update_from_output(StepOutput(number, tuple(scheduled), ()))
        number += 1


def cached_blocks(scheduler: SchedulerModel, live: LiveRequest, g: int) -> list[int]:
    """Indices of group ``g``'s blocks of ``live`` the prefix cache holds under their own key."""
    grids, hashes = scheduler.hybrid.grids, live.req.block_hashes
    return [i for i in range(grids.blocks_hashed(len(hashes), g))
            if scheduler.pool.cached_block(group_key(grids.block_hash(hashes, g, i), g)) is not None]


def test_the_grids_of_each_model():
    """resolve_kv_cache_block_sizes: the scheduler's block is the lcm, the hash block the gcd;
    the pool's page is the largest block. One block size: all three are it."""
    for name, expected in (("mixed-blocks-tiny", ((6, 4), 12, 2, 6)), ("nested-blocks-tiny", ((12, 4), 12, 4, 12)),
                           ("gpt-oss-tiny", ((4, 4), 4, 4, 4))):
        grids = BlockGrids(model_named(name).groups, BS)
        assert (grids.sizes, grids.scheduler, grids.hashed, grids.page) == expected, name
        assert grids.uniform is (name == "gpt-oss-tiny")
    grids = BlockGrids(model_named("mixed-blocks-tiny").groups, BS)
    hashes = [bytes([i]) for i in range(12)]  # one per 2 tokens
    assert [grids.block_hash(hashes, 0, i) for i in range(4)] == [hashes[2], hashes[5], hashes[8], hashes[11]]
    assert [grids.block_hash(hashes, 1, i) for i in range(6)] == hashes[1::2]
    assert (grids.blocks_hashed(12, 0), grids.blocks_hashed(12, 1), grids.blocks_hashed(11, 0)) == (4, 6, 3)


class TestCaching:
    def test_blocks_are_cached_below_the_computed_tokens_rounded_to_the_lcm(self):
        """_align_cacheable: A computed 21 tokens, but a hit ends on a multiple of 12, so full
        attention caches blocks 0-1 (tokens 0-11), not block 2 (12-17, full too); the window caches
        block 2 (tokens 8-11), the one before the replay boundary 20 rounded down to 12."""
        scheduler = scheduler_of("mixed-blocks-tiny")
        live = arrive(scheduler, "A", range(100, 120))
        run_to_end(scheduler, live)
        assert live.req.num_tokens == 21
        assert cached_blocks(scheduler, live, 0) == [0, 1]
        assert cached_blocks(scheduler, live, 1) == [2]

    def test_each_group_is_cached_on_its_own_grid(self):
        """Dense retention on nested grids: full attention's 12-token blocks 0-2 of a 40-token
        prompt, the window's last two blocks of each 12-token segment (1, 2, 4, 5, 7, 8)."""
        scheduler = scheduler_of("nested-blocks-tiny", prefix_cache_retention_interval=None)
        live = arrive(scheduler, "A", range(100, 140))
        run_to_end(scheduler, live)
        assert cached_blocks(scheduler, live, 0) == [0, 1, 2]
        assert cached_blocks(scheduler, live, 1) == [1, 2, 4, 5, 7, 8]


class TestPrefixHit:
    def test_full_attentions_hit_is_rounded_down_to_the_lcm_and_leaves_no_junction(self):
        """B shares A's first 18 tokens: full attention finds 3 cached blocks (18 tokens) and
        rounds them down to 12 (FullAttentionManager.find_longest_cache_hit); the window's run
        ends at 12 too. 12 is also the longest hit, so there is no shared-prefix junction."""
        scheduler = scheduler_of("mixed-blocks-tiny", prefix_cache_retention_interval=None)
        first = arrive(scheduler, "A", range(100, 126))
        run_to_end(scheduler, first)
        assert cached_blocks(scheduler, first, 0) == [0, 1, 2, 3]
        follow = arrive(scheduler, "B", list(range(100, 118)) + list(range(500, 510)))
        hits, length, junction = scheduler.hybrid.prefix_hit(follow)
        assert (length, junction) == (12, 0)
        assert len(hits[0]) == 2 and hits[1][:2] == [NULL_BLOCK, NULL_BLOCK] and hits[1][2] != NULL_BLOCK

    def test_a_windows_run_must_end_on_the_lcm(self):
        """SlidingWindowManager.find_longest_cache_hit: the window's cached blocks 3 and 4 (ending
        at 16 and 20) cannot end a hit, whose length must be a multiple of 12: no hit."""
        scheduler = scheduler_of("mixed-blocks-tiny")
        live = arrive(scheduler, "B", range(100, 130))
        grids, hashes, pool = scheduler.hybrid.grids, live.req.block_hashes, scheduler.pool
        for i in (3, 4):
            pool.commit_one(pool.allocate(1)[0], group_key(grids.block_hash(hashes, 1, i), 1))
        assert scheduler.hybrid._window_hit(1, hashes, 24) == []
        pool.commit_one(pool.allocate(1)[0], group_key(grids.block_hash(hashes, 1, 5), 1))  # ends at 24
        assert scheduler.hybrid._window_hit(1, hashes, 24)[:5] == [NULL_BLOCK] * 5


class TestOracle:
    @pytest.mark.parametrize("model", ("mixed-blocks-tiny", "nested-blocks-tiny"))
    def test_each_groups_tokens_sit_in_its_own_blocks_slots(self, model):
        """The forward writes group g's token t into slot t % size of its block t // size (the
        page's first ``size`` slots; engine/oracle.py): after a 26-token prefill every computed
        position of each group holds its fingerprint there."""
        from kvoffload.engine.engine import Engine
        from kvoffload.engine.oracle import group_salt, prefix_fingerprints

        config = EngineConfig(gpu_blocks=48, block_size=BS, model=model, prefix_cache_retention_interval=None)
        spec = RequestSpec("A", tuple(range(100, 126)), (7, 8, 9))
        eng = Engine([spec], config, max_steps=1)
        eng.run()
        live = eng.scheduler.live["A"]
        page = eng.kv.block_size
        slots = eng.kv.gpu.view(eng.kv.num_gpu_blocks * page, eng.kv.slot_bytes).view(torch.int64)[:, 0].numpy()
        truth = prefix_fingerprints(np.asarray(live.truth[:26], dtype=np.int64)).view(np.int64)
        for g, size in enumerate(eng.scheduler.hybrid.sizes):
            table = live.tables[g]
            for t in range(26):
                if table[t // size] != NULL_BLOCK:
                    assert slots[table[t // size] * page + t % size] == truth[t] ^ np.int64(group_salt(g)), (g, t)
