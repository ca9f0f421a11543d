"""The simulator's GPU prefix cache on groups of their own block sizes (engine/block_grids.py,
docs/engine.md "Groups with block sizes of their own") held against vLLM's own scheduler and KV
cache manager, which build the same groups (``vllm/group_blocks.py``): A's prompt is prefilled to
its end in each, then B, sharing a prefix of A's, is looked up. Each group must have cached the
same blocks of A (the lcm-aligned cacheable tokens, each group on its grid, a window's reachable
mask at the lcm) and B's hit the same length and junction (full attention rounded down to the
lcm, the window's run ending on it). vLLM's scheduler runs alone there, stepped by hand as in K15's
story.

Then whole replays: the simulator and vLLM's scheduler with the replay's worker (its copies move
whole padded pages, its fake model and KV oracle index each group on its own grid) agree per
request and per step on both models, sync and async, and the oracle finds every loaded slot
right, for the reference and for vLLM's stock connector.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from kvoffload.core.keys import group_key  # noqa: E402
from kvoffload.engine.engine import Engine  # noqa: E402
from kvoffload.engine.live import LiveRequest  # noqa: E402
from kvoffload.engine.requests import RequestSpec  # noqa: E402
from kvoffload.gates.plugin import GateConnector  # noqa: E402
from kvoffload.gates.story import tokens  # noqa: E402
from kvoffload.gates.test_k15_k16_block_sizes import MIXED, NESTED, run_to_finish, scheduler_alone  # noqa: E402
from kvoffload.vllm.build import STOCK, ConnectorLoad  # noqa: E402
from kvoffload.vllm.pinned import call_pinned  # noqa: E402

pytestmark = pytest.mark.vllm

# (engine, A's prompt, B's prompt). Mixed grids: B shares A's first 18 tokens (three 6-token
# blocks, rounded down to 12) under dense retention, or 25 under vLLM's default retention (0,
# the window's block before A's replay boundary 25, rounded down to 24). Nested: 30 tokens (two
# and a half 12-token blocks, rounded down to 24). A of 20 tokens caches full attention's blocks
# below 12 only (the cacheable tokens rounded down to the lcm).
DENSE = {"prefix_cache_retention_interval": None}
CASES = {
    "mixed-dense": (MIXED.replace(**DENSE), tokens(1, 26), tokens(1, 18) + tokens(5, 10)),
    "mixed-retention-0": (MIXED.replace(prefix_cache_retention_interval=0), tokens(1, 26), tokens(1, 25) + tokens(5, 5)),
    # A prefilled to 20 tokens: full attention's block 2 (tokens 12-17) is full but past the lcm
    "mixed-short": (MIXED.replace(**DENSE), tokens(1, 20), tokens(1, 20) + tokens(5, 4)),
    "nested-dense": (NESTED.replace(**DENSE), tokens(1, 40), tokens(1, 30) + tokens(5, 10)),
    "nested-retention-0": (NESTED.replace(prefix_cache_retention_interval=0), tokens(1, 40), tokens(1, 30) + tokens(5, 10)),
}


def vllm_request(scheduler, req_id: str, prompt, max_tokens: int = 1):
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from kvoffload.vllm.group_blocks import scheduler_block_sizes

    init_none_hash(sha256)
    sizes = scheduler_block_sizes(scheduler.vllm_config, scheduler.kv_cache_config)
    return Request(request_id=req_id, prompt_token_ids=list(prompt), pooling_params=None,
                   sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   block_hasher=get_request_block_hasher(sizes["hash_block_size"], sha256))


def in_vllm(engine, first, second) -> tuple[list[list[int]], int, int]:
    """A run to its end in vLLM's scheduler: the indices of A's blocks each group caches, and
    the tokens B's lookup finds and its shared-prefix junction (``get_computed_blocks``)."""
    from vllm.v1.core.kv_cache_utils import BlockHashListWithBlockSize

    with scheduler_alone(GateConnector(STOCK, None), engine) as (scheduler, _):
        a = vllm_request(scheduler, "A", first)
        scheduler.add_request(a)
        run_to_finish(scheduler, "A")
        manager = scheduler.kv_cache_manager
        pool, hashed = manager.block_pool, manager.coordinator.hash_block_size
        cached = []
        for g, group in enumerate(scheduler.kv_cache_config.kv_cache_groups):
            size = group.kv_cache_spec.block_size
            view = a.block_hashes if size == hashed else BlockHashListWithBlockSize(a.block_hashes, hashed, size)
            cached.append([i for i in range(len(view)) if pool.get_cached_block(view[i], [g]) is not None])
        _, hit, junction = manager.get_computed_blocks(vllm_request(scheduler, "B", second))
        return cached, hit, junction


def in_the_simulator(engine, first, second) -> tuple[list[list[int]], int, int]:
    """The same in the engine (its scheduler model): A replayed alone, B's prefix hit."""
    eng = Engine([RequestSpec("A", first, tokens(2, 1))], engine)
    assert not eng.run().problems()
    hybrid = eng.scheduler.hybrid
    grids, pool = hybrid.grids, eng.pool
    live = LiveRequest.create(RequestSpec("A", first, (1,)), grids.hashed, 0)
    hashes = live.req.block_hashes
    cached = [[i for i in range(grids.blocks_hashed(len(hashes), g))
               if pool.cached_block(group_key(grids.block_hash(hashes, g, i), g)) is not None]
              for g in range(len(grids.sizes))]
    _, hit, junction = hybrid.prefix_hit(LiveRequest.create(RequestSpec("B", second, (1,)), grids.hashed, 0))
    return cached, hit, junction


@pytest.mark.parametrize("case", CASES)
def test_the_simulator_caches_and_hits_as_vllms_kv_cache_manager(case):
    engine, first, second = CASES[case]
    simulated = in_the_simulator(engine, first, second)
    assert simulated == in_vllm(engine, first, second)
    assert simulated[1] % 12 == 0  # a hit on the lcm


# The replays: shared-prefix-small at the story's block size, one block a chunk, a pool that
# keeps every request's blocks (the workload's own pool is sized for 16-token blocks).
REPLAY = {"block_size": "4", "blocks_per_chunk": "1", "gpu_blocks": "120"}
MODELS = ("mixed-blocks-tiny", "nested-blocks-tiny")


@pytest.mark.parametrize("scheduling", ("sync", "async"))
@pytest.mark.parametrize("model", MODELS)
def test_the_simulator_and_vllms_scheduler_agree_per_request_and_step(model, scheduling):
    """tests/vllm/differential.py's comparison (the reference in both engines): every request's
    first admission, chunks stored and loaded, and every step's tokens and free blocks agree."""
    from differential import compare

    ids, sim, real, _ = call_pinned(compare, "shared-prefix-small", scheduling, {"model": model, **REPLAY})
    assert sim.crash is None and real.crash is None
    assert sim.totals[2] > 0, "no connector hit: the replay never loaded"
    assert [r for r in ids if sim.per_request[r] != real.per_request[r]] == []
    assert sim.totals == real.totals and sim.steps == real.steps


def oracle_counts(model: str, connector: str, *, on_step=None) -> tuple:
    """(crash, poisoned loads, tokens the oracle checked) of vLLM's scheduler replay."""
    from kvoffload.vllm.replay import VllmSchedulerReplay
    from kvoffload.workloads import load_workload

    workload = load_workload("shared-prefix-small", {"model": model, "scheduling": "sync", **REPLAY})
    replay = VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad(connector), on_step=on_step)
    record = replay.run()
    return record.crash, len(record.poisoned), replay.checked_load_tokens


@pytest.mark.parametrize("connector", ("reference", STOCK))
@pytest.mark.parametrize("model", MODELS)
def test_every_loaded_slot_of_both_groups_is_right_in_vllms_scheduler(model, connector):
    """The replay's worker copies and checks both groups: 0 poisoned of the tokens loaded
    (planted: the window's writes at the full-attention group's offsets, 11 poisoned loads for
    the reference and 12 for the stock connector on mixed-blocks-tiny)."""
    crash, poisoned, checked = call_pinned(oracle_counts, model, connector)
    assert crash is None and poisoned == 0 and checked > 0
