"""A hybrid model's KV cache groups in the engine: vLLM 0.32's hybrid rules, one story each
(docs/engine.md, "Hybrid models"; engine/kv_groups.py).

The model here is full attention plus an 8-token sliding window (group 1), block size 4: a
window hit needs cdiv(8 - 1, 4) = 2 blocks in a row, and after n computed tokens the window has
skipped n - 7 of them. The connector is a script that never hits unless told to.
"""

from __future__ import annotations

import pytest

from kvoffload.core.model import FULL, GroupKind, KVCacheGroup, ModelDescription, model_named
from kvoffload.core.types import NULL_BLOCK, RequestStatus
from kvoffload.engine.engine import Engine
from kvoffload.engine.kv_groups import HybridKV
from kvoffload.engine.scheduler import StepOutput
from kvoffload.core.hybrid import HybridConnectorScheduler
from kvoffload.metrics import GLOSSARY, MEASURED_MARK, compute_metrics
from kvoffload.workloads import load_workload
from scripted import ScriptedConnector, arrive, land, model, step

def hybrid(connector=None, **settings):
    return model(connector, model="gpt-oss-tiny", **settings)


def run_to_end(scheduler, live, first_step=0):
    """Sync steps until ``live`` finished; returns the next step number."""
    number = first_step
    while live.status is not RequestStatus.FINISHED_LENGTH:
        _, scheduled = step(scheduler, number)
        scheduler.update_from_output(StepOutput(number, tuple(scheduled), ()))
        number += 1
    return number


class TestPrefixHit:
    def test_a_window_hit_is_the_run_of_blocks_its_window_reads_and_full_attention_is_cut_to_it(self):
        """find_longest_cache_hit: full attention from the left (5 blocks), the window from the
        right (blocks 2 and 3, the only ones it cached: below); the hit is the shorter one, 16
        tokens, with nulls before the window's run, and the junction is full attention's 20."""
        scheduler = hybrid(max_num_seqs=1)
        first = arrive(scheduler, "A", prompt=20, output=1)
        run_to_end(scheduler, first)
        follow = arrive(scheduler, "B", prompt=24)
        follow.req.all_token_ids[:20] = first.req.all_token_ids[:20]
        follow.req.block_hashes[:5] = first.req.block_hashes[:5]
        hits, length, junction = scheduler.hybrid.prefix_hit(follow)
        assert (length, junction) == (16, 20)
        assert len(hits[0]) == 4 and hits[1][:2] == [NULL_BLOCK, NULL_BLOCK] and NULL_BLOCK not in hits[1][2:]

    def test_the_window_caches_only_the_blocks_a_replay_of_the_prompt_reads(self):
        """reachable_block_mask under vLLM's default retention (0): of a 20-token prompt the
        window keeps blocks 2 and 3, the two before position 19's block boundary (16); dense
        retention (None) keeps all five, like full attention."""
        for retention, expected in ((0, {2, 3}), (None, {0, 1, 2, 3, 4})):
            scheduler = hybrid(max_num_seqs=1, prefix_cache_retention_interval=retention)
            live = arrive(scheduler, "A", prompt=20, output=1)
            step(scheduler)
            cached = {i for i, block in enumerate(live.tables[1]) if scheduler.pool.cached_block(
                live.req.block_hashes[i] + (1).to_bytes(4, "big")) == block}
            assert cached == expected, retention


class TestWindowBlocks:
    def test_blocks_behind_the_window_are_freed_on_the_processed_tokens(self):
        """remove_skipped_blocks, from allocate_slots: a request at 13 processed tokens attends
        to tokens 6..13 only, so its window's blocks 0 (tokens 0-3) is null and back in the pool;
        full attention keeps every block."""
        scheduler = hybrid(max_num_seqs=1, max_num_batched_tokens=64)
        live = arrive(scheduler, "A", prompt=12, output=8)
        free_before = scheduler.pool.num_free
        number = 0
        while live.req.num_computed_tokens < 13:
            _, scheduled = step(scheduler, number)
            scheduler.update_from_output(StepOutput(number, tuple(scheduled), ()))
            number += 1
        step(scheduler, number)  # the allocation at 13 processed tokens frees block 0
        assert live.tables[1][0] == NULL_BLOCK and NULL_BLOCK not in live.tables[1][1:]
        assert NULL_BLOCK not in live.tables[0]
        held = len(live.tables[0]) + len(live.tables[1]) - 1
        assert scheduler.pool.num_free == free_before - held

    def test_an_external_hit_allocates_window_blocks_only_inside_the_window(self):
        """add_local_computed_blocks pads the skipped blocks with nulls and
        allocate_external_computed_blocks gives the window only the blocks of its last 7 tokens:
        a 24-token hit leaves blocks 0-3 null (tokens 0..16 are skipped), full attention gets 6."""
        scheduler = hybrid(ScriptedConnector({"L": [24]}))
        loading = arrive(scheduler, "L", prompt=28)
        step(scheduler)
        assert len(loading.tables[0]) == 6 and NULL_BLOCK not in loading.tables[0]
        assert loading.tables[1][:4] == [NULL_BLOCK] * 4 and NULL_BLOCK not in loading.tables[1][4:]
        land(scheduler, loading)
        out, _ = step(scheduler, 1)
        assert out.num_scheduled_tokens == {"L": 4}  # tokens 24..27

    def test_admission_reserves_at_most_the_windows_cap(self):
        """full_sequence_must_fit with SlidingWindowSpec.max_admission_blocks_per_request: a
        40-token prompt needs 10 full-attention blocks and, capped, cdiv(7 + 8, 4) + 1 = 5 window
        blocks (budget 8): 15 fit in 16 usable blocks, the uncapped 20 would not."""
        scheduler = hybrid(gpu_blocks=17, max_num_batched_tokens=8)
        assert scheduler.hybrid.caps == [None, 5]
        arrive(scheduler, "A", prompt=40)
        out, _ = step(scheduler)
        assert out.num_scheduled_tokens == {"A": 8}


class TestOneGroupIsTheDenseEngine:
    """The dense model's scheduler code is kv_groups.py's one-group case, inlined for speed: run
    through HybridKV (and the hybrid connector) it gives the same replay, number for number."""

    @pytest.mark.parametrize("name", ["multi-turn-small", "spec-decode-small", "shared-prefix-small"])
    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_the_hybrid_path_with_one_full_attention_group_replays_the_dense_engine(self, name, scheduling):
        workload = load_workload(name, {"scheduling": scheduling})
        dense = Engine(workload.requests, workload.engine).run()
        through_groups = Engine(workload.requests, workload.engine)
        connector = HybridConnectorScheduler(workload.engine.connector_config(), through_groups.fixes)
        through_groups.connector = through_groups.scheduler.connector = connector
        through_groups.scheduler.hybrid = HybridKV(workload.engine, through_groups.pool)
        grouped = through_groups.run()
        assert dense.crash is None and grouped.crash is None
        measured = {m.name for m in GLOSSARY if m.definition.startswith(MEASURED_MARK)}
        assert {k: v for k, v in compute_metrics(grouped).items() if k not in measured} == \
            {k: v for k, v in compute_metrics(dense).items() if k not in measured}
        assert grouped.store_submit_delays == dense.store_submit_delays


def test_a_group_the_engine_does_not_model_is_refused_with_one_line():
    drafter = ModelDescription("eagle", (FULL, KVCacheGroup(GroupKind.MAMBA, drafter=True)), "")
    assert drafter.unsupported() == "a drafter (EAGLE/MTP) group of full attention only is modelled by the engine"
    assert model_named("qwen3-next").unsupported() is None


def test_groups_of_their_own_block_sizes_are_served_and_their_limits_refused_in_one_line():
    """K15's and K16's models run in the engine (engine/block_grids.py); a chunk is one block of
    each group (blocks_per_chunk 1, as vLLM's stock connector chunks them), the retention a
    multiple of the groups' lcm (the scheduler's block), no Mamba group beside them (its hits
    inside a block are not modelled); a block size of its own is for attention groups."""
    from kvoffload.core.types import ConfigError
    from kvoffload.engine.config import EngineConfig

    assert not model_named("gpt-oss-tiny").has_own_block_sizes
    for name, sizes in (("mixed-blocks-tiny", [6, 4]), ("nested-blocks-tiny", [12, 4])):
        assert [group.tokens_per_block(4) for group in model_named(name).groups] == sizes
        assert model_named(name).unsupported() is None
        Engine([], EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, model=name))
        with pytest.raises(ConfigError, match=f"^model '{name}' has groups of their own block sizes: a chunk is one "
                                              "block of each, blocks_per_chunk must be 1, got 2$"):
            Engine([], EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, blocks_per_chunk=2, model=name))
        with pytest.raises(ConfigError, match="multiple of the scheduler's block size 12, got 8$"):
            EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, model=name, prefix_cache_retention_interval=8)
    mamba = ModelDescription("m", (KVCacheGroup(GroupKind.FULL_ATTENTION, block_size=8), KVCacheGroup(GroupKind.MAMBA)),
                             "own block sizes beside a Mamba group")
    assert mamba.unsupported() == ("groups with a block size of their own beside a Mamba group are not modelled by "
                                   "the engine")
    for group in ({"kind": GroupKind.MAMBA, "block_size": 4}, {"kind": GroupKind.FULL_ATTENTION, "block_size": -1}):
        with pytest.raises(ConfigError, match="block size of its own for attention groups only"):
            KVCacheGroup(**group)


def test_a_window_of_any_positive_length_belongs_to_a_sliding_window_group_and_only_there():
    """A window is a positive number of tokens, one token included; a sliding-window group
    without one, or another kind of group with one, is refused in one line."""
    from kvoffload.core.types import ConfigError

    for tokens in (1, 2, 4, 128):
        assert KVCacheGroup(GroupKind.SLIDING_WINDOW, sliding_window=tokens).label.endswith(f" {tokens}")
    for kind, tokens in ((GroupKind.SLIDING_WINDOW, 0), (GroupKind.SLIDING_WINDOW, -4),
                         (GroupKind.FULL_ATTENTION, 1), (GroupKind.MAMBA, 1), (GroupKind.FULL_ATTENTION, 8)):
        with pytest.raises(ConfigError, match=f"group has sliding_window={tokens}: a window \\(in tokens\\) exactly "
                                              "for sliding-window groups$"):
            KVCacheGroup(kind, sliding_window=tokens)
