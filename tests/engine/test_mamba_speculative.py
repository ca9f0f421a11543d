"""Speculative decoding with a Mamba group (align mode) in the engine: vLLM 0.32's speculative
state blocks (``MambaManager``, ``vllm/v1/core/single_type_kv_cache_manager.py``) and the worker's
copy of the state at a boundary that accepted drafts reached (``postprocess_mamba_align_gpu``,
``vllm/v1/worker/mamba_utils.py``); docs/engine.md, "Hybrid models"; engine/mamba.py.

Block size 4 and k = 2 drafts: a row holds its running state and then two speculative blocks.
"""

from __future__ import annotations

from kvoffload.core.types import NULL_BLOCK
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.engine import Engine
from kvoffload.engine.mamba import MambaRows, accepted_state_end
from kvoffload.workloads import load_workload
from scripted import arrive, model

K = 2


def rows() -> MambaRows:
    return MambaRows(1, BlockPool(16, 4), 4, K)


class TestSpeculativeStateBlocks:
    def test_a_first_allocation_takes_a_state_block_per_draft_token(self):
        """get_num_blocks_to_allocate: ``cdiv(tokens, 4) + k`` blocks, the one-block cap raised by
        k until the row had its first allocation (``_allocated_block_reqs``)."""
        r, table = rows(), []
        assert r.blocks_needed("A", 0, (), 8) == 1 + K  # 2 + 2 needed, 3 at most
        r.allocate("A", table, 3)
        assert len(table) == 1 + K and NULL_BLOCK not in table
        assert r.blocks_needed("A", len(table), (), 16) == 1  # 4 + 2 needed, one at most now

    def test_a_growing_row_moves_its_speculative_blocks_below_the_running_state_to_its_end(self):
        """allocate_new_blocks (``_relocate_speculative_block``): a row [s, x1, x2] grown to 16
        tokens keeps its running state at index 3: x1 and x2 move to indexes 3 and 4, their old
        places become null, and only one new block is taken."""
        r, table = rows(), []
        r.allocate("A", table, 3)
        state, x1, x2 = table
        free = r.pool.num_free
        new = r.allocate("A", table, 16)
        assert table[:5] == [state, NULL_BLOCK, NULL_BLOCK, x1, x2] and len(table) == 6
        assert r.pool.num_free == free - 1 and new == [x1, x2, table[5]]

    def test_the_previous_state_is_the_one_before_the_speculative_blocks(self):
        """allocate_new_blocks records ``len - 1 - k`` of the row before it grows."""
        r, table = rows(), []
        r.allocate("A", table, 3)
        r.allocate("A", table, 6)
        assert r.last_state_index == {"A": 0}

    def test_a_row_holding_more_than_it_needs_counts_fewer_than_none(self):
        """get_num_blocks_to_allocate adds no floor: a row sized for drafts that were rejected
        (4 blocks for 6 tokens) asked about 4 tokens counts -1, which the coordinator's sum over
        the groups keeps."""
        r, table = rows(), []
        r.allocate("A", table, 3)
        r.allocate("A", table, 6)
        assert r.blocks_needed("A", len(table), (), 4) == -1

    def test_a_prefills_remaining_blocks_leave_the_decode_step_out_of_the_mamba_group(self):
        """_request_remaining_blocks: the decode step's ``1 + k`` slots count in full attention
        (``num_tokens``), not in Mamba (``num_tokens_main_model``): an 8-token prompt holding its
        blocks still needs one full-attention block for 11 tokens and no Mamba block."""
        scheduler = model(model="qwen3-next", spec_tokens=K)
        live = arrive(scheduler, "A", prompt=8)
        scheduler.hybrid.allocate(live, 8)
        assert [len(table) for table in live.tables] == [2, 2 + K]
        assert scheduler.hybrid.remaining_blocks(live, 1 + K) == 1


class TestAcceptedDraftsLeaveTheBoundaryState:
    def test_the_state_left_is_at_the_boundary_the_accepted_drafts_reached(self):
        assert accepted_state_end(14, 2, 4) == 16  # the drafts at 14 and 15 accepted: the state at 16
        assert accepted_state_end(13, 2, 4) == 13  # 15 reaches no boundary
        assert accepted_state_end(16, 2, 4) == 16  # the real token ended on it
        assert accepted_state_end(14, 0, 4) == 14
        assert accepted_state_end(14, 2, 4, known=15) == 14  # 16 lies past the sequence

    def test_every_state_loaded_is_the_one_its_boundary_needs(self):
        """spec-decode-small on qwen3-next with every state cached (dense retention): the states
        stored at boundaries crossed by accepted drafts load back right. Writing only the state
        after a step's last real token loads 8 poisoned states here."""
        workload = load_workload("spec-decode-small", {"model": "qwen3-next",
                                                       "prefix_cache_retention_interval": "dense"})
        record = Engine(workload.requests, workload.engine).run()
        assert record.crash is None and record.connector_hit_tokens_admitted == 2304
        assert record.poisoned == []
