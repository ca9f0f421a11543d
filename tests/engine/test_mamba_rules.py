"""A Mamba group (align mode) in the engine: vLLM 0.32's ``MambaManager`` and the scheduler's
block-aligned split, one story each (docs/engine.md, "Hybrid models"; engine/mamba.py).

The model is ``qwen3-next`` (full attention, group 0; Mamba, group 1) at block size 4. A Mamba
row is position-indexed: the state after ``(i + 1) * 4`` tokens lives at index ``i``, every other
entry is the null block 0. The connector is a script that never hits unless told to.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvoffload.core.keys import group_key
from kvoffload.core.model import model_named
from kvoffload.core.types import NULL_BLOCK
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.engine import Engine
from kvoffload.engine.kv_groups import HybridKV
from kvoffload.engine.mamba import MambaRows, aligned_split
from kvoffload.engine.scheduler import StepOutput
from kvoffload.metrics import compute_metrics
from kvoffload.workloads import load_workload
from scripted import arrive, model, step


def qwen(connector=None, **settings):
    return model(connector, model="qwen3-next", **settings)


def steps(scheduler, first: int, last: int):
    """Sync steps ``first..last``; the SchedulerOutput of each."""
    outs = []
    for number in range(first, last + 1):
        out, scheduled = step(scheduler, number)
        scheduler.update_from_output(StepOutput(number, tuple(scheduled), ()))
        outs.append(out)
    return outs


def cached_states(scheduler, live) -> set[int]:
    """Indexes of the request's Mamba states findable in the GPU prefix cache (freed or not)."""
    return {i for i in range(len(live.req.block_hashes))
            if scheduler.pool.cached_block(group_key(live.req.block_hashes[i], 1)) is not None}


class TestStateBlocks:
    def test_a_prefill_holds_one_state_block_at_its_rows_last_index(self):
        """allocate_new_blocks: an 18-token prompt's first chunk (16 tokens, the split) gives full
        attention 4 blocks and Mamba a row of nulls with one block at index 3."""
        scheduler = qwen(max_num_batched_tokens=64)
        live = arrive(scheduler, "A", prompt=18)
        steps(scheduler, 0, 0)
        assert NULL_BLOCK not in live.tables[0] and len(live.tables[0]) == 4
        assert live.tables[1][:3] == [NULL_BLOCK] * 3 and live.tables[1][3] != NULL_BLOCK

    def test_the_previous_state_block_is_freed_once_behind_the_last_processed_token(self):
        """remove_skipped_blocks: the state at 16 (index 3) is kept while the chunk 16..18 reads
        it, and freed in the next allocation (processed 18: index 3 lies below block 4); the
        request then holds one Mamba block."""
        scheduler = qwen(max_num_batched_tokens=64)
        live = arrive(scheduler, "A", prompt=18)
        steps(scheduler, 0, 1)
        state_at_16 = live.tables[1][3]
        assert live.tables[1][3:] == [state_at_16, live.tables[1][4]] and NULL_BLOCK not in live.tables[1][3:]
        steps(scheduler, 2, 2)
        assert live.tables[1] == [NULL_BLOCK] * 4 + [live.tables[1][4]]
        assert scheduler.pool.num_free == scheduler.pool.num_blocks - 1 - len(live.tables[0]) - 1

    def test_admission_counts_at_most_one_new_state_block(self):
        """get_num_blocks_to_allocate (physical_block_cap): a 41-token prompt (its whole sequence
        must fit) needs 11 full-attention blocks and one Mamba block, not 11: it fits in 12
        usable blocks, and its first chunk is the 40 tokens before the last cacheable state."""
        scheduler = qwen(gpu_blocks=13, max_num_batched_tokens=64)
        arrive(scheduler, "A", prompt=41)
        out, _ = step(scheduler)
        assert out.num_scheduled_tokens == {"A": 40}

    def test_a_decode_step_spec_reservation_leaves_the_mamba_group_out(self):
        """_spec_decode_step_blocks counts only non-Mamba groups (HybridKV built from a bare config)."""
        config = SimpleNamespace(kv_model=model_named("qwen3-next"), block_size=4, scheduling="sync",
                                 prefix_cache_retention_interval=0, max_num_batched_tokens=64, spec_tokens=3)
        assert HybridKV(config, BlockPool(8, 4)).spec_step_blocks == 1


class TestAlignedSplit:
    @pytest.mark.parametrize("start, new, prompt, num_tokens, junction, expected", [
        (0, 64, 18, 18, 0, 16),  # never past the last cacheable position, (18 - 1) // 4 * 4
        (0, 64, 16, 16, 0, 12),  # a prompt of exactly 4 blocks: 12 + 4
        (16, 2, 18, 18, 0, 2),  # the prompt's last chunk is exempt from the block boundary
        (0, 10, 40, 40, 0, 8),  # a chunk short of the prefill's end ends on a block boundary
        (6, 10, 40, 40, 0, 2),  # a chunk starting mid-block stops at the next boundary
        (0, 3, 40, 40, 0, 0),  # no block fits: nothing this step
        (0, 30, 40, 40, 10, 8),  # a junction inside the chunk is a stop, floored to a block
        (20, 1, 18, 21, 0, 1),  # decoding: no split
        (8, 64, 18, 25, 0, 16),  # resumed after preemption: it replays its outputs, up to 24
    ])
    def test_a_prefill_chunk_ends_where_a_state_is_materialised(self, start, new, prompt, num_tokens, junction,
                                                                 expected):
        assert aligned_split(start, new, prompt, num_tokens, junction, 4, 64) == expected

    def test_a_prompt_of_exactly_k_blocks_is_prefilled_in_two_chunks(self):
        """The running loop: 16 = 12 + 4 (the state at 12 is the last one a resend can use)."""
        scheduler = qwen(max_num_batched_tokens=64)
        arrive(scheduler, "A", prompt=16)
        assert [out.num_scheduled_tokens for out in steps(scheduler, 0, 1)] == [{"A": 12}, {"A": 4}]

    def test_a_waiting_request_without_a_block_in_the_budget_stops_admission(self):
        """The waiting loop: A's 3 tokens leave 3 of the budget of 6, no block for B, a split of
        0, which is a ``break``: C, whose 2 tokens would fit, waits behind B."""
        scheduler = qwen(max_num_batched_tokens=6)
        arrive(scheduler, "A", prompt=3)
        arrive(scheduler, "B", prompt=20)
        arrive(scheduler, "C", prompt=2)
        out, _ = step(scheduler)
        assert out.num_scheduled_tokens == {"A": 3}


class TestPrefixCache:
    def test_retention_0_caches_only_the_state_at_the_replay_boundary(self):
        """reachable_block_mask: chunks of 4 write states at 4, 8, 12 and 16; retention 0 keeps
        only the one at the replay boundary (17, rounded down: index 3), an interval of 8 one per
        two blocks (indexes 1 and 3), dense every one."""
        for retention, expected in ((0, {3}), (8, {1, 3}), (None, {0, 1, 2, 3})):
            scheduler = qwen(max_num_batched_tokens=4, prefix_cache_retention_interval=retention)
            live = arrive(scheduler, "A", prompt=18)
            outs = steps(scheduler, 0, 3)
            assert [out.num_scheduled_tokens for out in outs] == [{"A": 4}] * 4
            assert cached_states(scheduler, live) == expected, retention

    def test_every_cached_state_is_offered_to_the_connector_in_its_step(self):
        """take_boundary_state_offloads: (group, block, boundary tokens) per request."""
        scheduler = qwen(max_num_batched_tokens=64)
        live = arrive(scheduler, "A", prompt=18)
        out, _ = step(scheduler)
        assert out.boundary_states == {"A": ((1, live.tables[1][3], 16),)}
        scheduler.hybrid.boundary_offers.append(("A", 1, live.tables[1][3], 16))
        scheduler.hybrid.release(live, None, 0)  # pop_blocks_for_free drops offers not yet taken
        assert scheduler.hybrid.boundary_offers == []

    def test_the_hit_is_the_rightmost_cached_state_and_full_attention_is_cut_to_it(self):
        """find_longest_cache_hit: A (10-token prompt, 8 outputs) leaves full attention 4 cached
        blocks and one Mamba state, at 8 (its replay boundary). B shares those 16 tokens: full
        attention finds 16, Mamba 8 (nulls, then the state): the hit is 8, the junction 16."""
        scheduler = qwen(max_num_batched_tokens=64, max_num_seqs=1)
        first = arrive(scheduler, "A", prompt=10, output=8)
        steps(scheduler, 0, 9)
        follow = arrive(scheduler, "B", prompt=24)
        follow.req.all_token_ids[:16] = first.req.all_token_ids[:16]
        follow.req.block_hashes[:4] = first.req.block_hashes[:4]
        hits, length, junction = scheduler.hybrid.prefix_hit(follow)
        assert (length, junction) == (8, 16)
        assert len(hits[0]) == 2 and hits[1][0] == NULL_BLOCK and hits[1][1] != NULL_BLOCK

    def test_a_connector_that_opts_in_is_told_full_attentions_hit_unless_a_group_hit_deeper(self):
        """get_computed_blocks_for_connector (vLLM 0.28+): the same A and B, each group's hit on
        its own: full attention's 16 is the local hit, flagged diverged (Mamba's is 8), with no
        junction. Dense retention (states at 8, 12 and 16: the groups agree on 16); with full
        attention's block 3 and the state at 12 gone: Mamba, looked up to B's 23 tokens, hits 16, deeper than full attention's
        12, so B takes the hit every group agrees on (the state at 8; junction 12), not diverged."""
        for retention in (0, None):
            scheduler = qwen(max_num_batched_tokens=64, max_num_seqs=1, prefix_cache_retention_interval=retention)
            first = arrive(scheduler, "A", prompt=10, output=8)
            steps(scheduler, 0, 9)
            follow = arrive(scheduler, "B", prompt=24)
            follow.req.all_token_ids[:16] = first.req.all_token_ids[:16]
            follow.req.block_hashes[:4] = first.req.block_hashes[:4]
            hits, length, junction, diverged = scheduler.hybrid.prefix_hit_for_connector(follow)
            assert (len(hits[0]), length, junction, diverged) == (4, 16, 0, retention == 0)  # dense: a state at 16
            if retention == 0:
                assert hits[1][0] == NULL_BLOCK and hits[1][1] != NULL_BLOCK and len(hits[1]) == 2
                continue
            states = [scheduler.pool.cached_block(group_key(first.req.block_hashes[i], 1)) for i in (1, 3)]
            scheduler.pool.uncache_free_blocks(keep={*hits[0][:3], *states})
            assert scheduler.hybrid.prefix_hit_for_connector(follow) == (*scheduler.hybrid.prefix_hit(follow), False)
            assert scheduler.hybrid.prefix_hit(follow)[1:] == (8, 12)

    def test_a_state_cached_in_this_step_is_not_a_hit_before_the_next(self):
        """cached_blocks_this_step: A's first chunk caches its state at 16 in step 0, and its
        second (16..18, cached up to its prompt's boundary again) marks it once more in step 1;
        B, the same prompt arriving with A, finds that state and waits until step 2, when A's
        state at 16 was freed (A no longer reads it) and stays findable."""
        scheduler = qwen(max_num_batched_tokens=64)
        arrive(scheduler, "A", prompt=18)
        twin = arrive(scheduler, "B", prompt=18)
        twin.req.all_token_ids[:] = scheduler.live["A"].req.all_token_ids
        twin.req.block_hashes[:] = scheduler.live["A"].req.block_hashes
        outs = steps(scheduler, 0, 2)
        assert [out.num_scheduled_tokens for out in outs] == [{"A": 16}, {"A": 2}, {"A": 1, "B": 2}]

    def test_a_hit_on_the_prompts_boundary_state_marks_it_for_this_step_again(self):
        """_cache_partial_tail_block: a request caching up to its prompt's replay boundary
        registers that state again, even its own hit's: A2 enters on A's state at 16, and B, the
        same prompt behind it, must wait a step."""
        scheduler = qwen(max_num_batched_tokens=64, max_num_seqs=4)
        first = arrive(scheduler, "A", prompt=18, output=1)
        steps(scheduler, 0, 2)
        assert first.req.req_id not in scheduler.live
        for req_id in ("A2", "B"):
            twin = arrive(scheduler, req_id, prompt=18)
            twin.req.all_token_ids[:] = first.req.all_token_ids[:18]
            twin.req.block_hashes[:] = first.req.block_hashes[:4]
        out, _ = step(scheduler, 3)
        assert out.num_scheduled_tokens == {"A2": 2}


class TestRowBookkeeping:
    def test_rows_forget_a_request_that_lets_its_blocks_go(self):
        rows = MambaRows(1, BlockPool(8, 4), 4)
        table: list[int] = []
        rows.allocate("A", table, 8)
        rows.allocate("A", table, 12)
        assert rows.last_state_index == {"A": 1}
        rows.forget("A")
        assert rows.last_state_index == {}

    def test_a_rows_new_entries_are_handed_out_with_their_nulls(self):
        """vLLM's ``allocate_new_blocks`` returns ``req_blocks[prev_block_len:]``, the null padding
        included (0.25.0 and 0.32.0 alike), so a connector's copy of the row keeps each block at its
        position: the presets of 0.25 and 0.26 store a Mamba chunk from it (docs/hybrid.md)."""
        rows = MambaRows(1, BlockPool(8, 4), 4)
        table: list[int] = []
        first = rows.allocate("A", table, 8)
        grown = rows.allocate("A", table, 20)
        assert first == [0, table[1]] and grown == [0, 0, table[4]] and table == first + grown

    def test_a_request_admitted_on_a_cached_state_lets_the_hits_block_go_once_past_it(self):
        """The engine's calls for a request whose prompt hit a cached state at 8 tokens (blocks of 4):
        the admission's allocation leaves the hit's row as it is, the first chunk (to 20) remembers
        the hit's block as the previous state, the next (to 23) its own; once 20 tokens are
        processed, remove_skipped_blocks walks the row below them and hands the hit's block back,
        though no longer the remembered one. The row then holds its two running states."""
        pool = BlockPool(16, 4)
        rows = MambaRows(1, pool, 4)
        (hit,) = pool.allocate(1)
        table = [NULL_BLOCK, hit]
        assert rows.allocate("B", table, 8) == []
        rows.remove_skipped("B", table, 0)
        rows.allocate("B", table, 20)
        rows.remove_skipped("B", table, 8)
        rows.allocate("B", table, 23)
        assert hit in table and rows.last_state_index == {"B": 4}
        rows.remove_skipped("B", table, 20)
        assert hit not in table and [block != NULL_BLOCK for block in table] == [False] * 4 + [True, True]
        assert pool.num_free == pool.num_blocks - 1 - 2  # the null block and the two running states


class TestTheConnectorGetsTheStates:
    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_the_reference_stores_and_loads_states_from_the_simulators_hand_off(self, scheduling):
        """The reference connector stores a Mamba state only from the hand-off
        (``SchedulerOutput.boundary_states``), and a CPU hit needs a stored state: without the
        hand-off no request would get one. Every loaded state checks out with the KV oracle."""
        workload = load_workload("multi-turn-small", {"model": "qwen3-next", "scheduling": scheduling})
        record = Engine(workload.requests, workload.engine).run()
        metrics = compute_metrics(record)
        assert record.crash is None and metrics["offload_hit_rate"] > 0.4
        assert (metrics["poisoned_loads"], metrics["fence_violations"], metrics["invariant_violations"]) == (0, 0, 0)
