"""The fake forward's KV content (kvoffload/vllm/model.py) on hand-made layouts of one buffer (no
vLLM needed): where each slot's fingerprint and each Mamba state lives in every layer, what a
forward writes past its script, and that a rejected draft never writes a prefix that happened."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvoffload.engine.oracle import extend_fingerprint, prefix_fingerprints, to_signed_int
from kvoffload.vllm.model import FingerprintCells, ScriptedSequence, StateCells, read_state, write_states

BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM = 3, 2, 1, 2  # one head of two float32s: 8 bytes a slot


def layer_outermost(buffer: torch.Tensor, layers: int) -> dict[str, torch.Tensor]:
    size = BLOCKS * 2 * BLOCK_SIZE * HEADS * HEAD_DIM
    return {f"l{i}": buffer[i * size:(i + 1) * size].view(BLOCKS, 2, BLOCK_SIZE, HEADS, HEAD_DIM)
            for i in range(layers)}


def block_outermost(buffer: torch.Tensor, layers: int) -> dict[str, torch.Tensor]:
    pages = buffer[:BLOCKS * layers * 2 * BLOCK_SIZE * HEADS * HEAD_DIM].view(
        BLOCKS, layers, 2, BLOCK_SIZE, HEADS, HEAD_DIM)
    return {f"l{i}": pages[:, i] for i in range(layers)}


@pytest.mark.parametrize("layout", [layer_outermost, block_outermost])
def test_each_slots_cell_is_the_first_8_bytes_of_head_0_of_its_key_in_every_layer(layout):
    views = layout(torch.zeros(2 * BLOCKS * 2 * BLOCK_SIZE * HEADS * HEAD_DIM), 2)
    cells = FingerprintCells(views)
    blocks, offsets = np.array([0, 2, 1, 2]), np.array([0, 0, 1, 1])
    values = torch.arange(1, 2 * len(blocks) + 1, dtype=torch.int64) << 33 | 1  # both 4-byte halves non-zero
    cells.words[cells.index(blocks, offsets)] = values
    for layer, view in enumerate(views.values()):
        for i, (block, offset) in enumerate(zip(blocks, offsets)):
            cell = view[block, 0, offset, 0, :2].contiguous().view(torch.int64)
            assert int(cell) == values[layer * len(blocks) + i]
    # nothing else was written: two float32s per cell, layer 0's four cells, then layer 1's
    assert int(torch.count_nonzero(torch.cat([v.flatten() for v in views.values()]))) == 2 * 2 * len(blocks)


def test_layers_in_two_buffers_are_refused_in_either_order():
    first, second = layer_outermost(torch.zeros(1000), 1)["l0"], layer_outermost(torch.zeros(1000), 1)["l0"]
    for views in ({"a": first, "b": second}, {"a": second, "b": first}):
        with pytest.raises(ValueError, match="do not share one buffer"):
            FingerprintCells(views)


def test_a_forward_past_the_script_writes_the_true_prefixes_then_ones_that_never_happened():
    # A step scheduled after the script's end (async after an EOS; drafts past it): of positions
    # 2-5 of a 4-token script, 2-3 hold their true prefixes, 4-5 prefixes the script never had.
    truth = (20, 21, 22, 23)
    sequence = ScriptedSequence(truth)
    written = sequence.written(2, 4)
    assert written.tolist() == [*sequence.fingerprints[2:4].tolist(), *sequence.draft_fingerprints(3, 2, 0)]
    assert not set(written[2:].tolist()) & set(sequence.fingerprints.tolist())
    assert sequence.written(3, 2).tolist() == [sequence.fingerprints[3], *sequence.draft_fingerprints(3, 1, 0)]


@pytest.mark.parametrize("token", [0, 1, 31_999])
def test_a_rejected_draft_writes_a_prefix_that_never_happened_whatever_its_token(token):
    # The draft at position 2 (token ``token``) is rejected: its slot must hold KV no prefix of
    # the script has, or a load of it would pass the oracle as correct (a real model's id 0 too).
    truth = (20, 21, token, 23)
    sequence = ScriptedSequence(truth)
    true_prefixes = set(prefix_fingerprints(np.asarray(truth, dtype=np.int64)).view(np.int64).tolist())
    (rejected,) = sequence.draft_fingerprints(1, 1, 0)
    assert rejected not in true_prefixes
    accepted = sequence.draft_fingerprints(1, 2, 1)
    assert accepted[0] == sequence.fingerprints[2] and accepted[1] not in true_prefixes
    # the token after the true one, as the simulator's oracle writes it (engine/oracle.py): the
    # two engines' slots agree
    assert rejected == to_signed_int(extend_fingerprint(int(sequence.fingerprints[1]) & (2**64 - 1), token + 1))


@pytest.mark.parametrize("layout", [layer_outermost, block_outermost])
def test_a_mamba_states_cells_are_the_first_two_words_of_its_block_in_every_layer(layout):
    """StateCells: a state's hash and token count go to the first two 8-byte words of its
    block's page in each layer of the group, wherever the layer starts in the shared buffer
    (the second layer past the first's pages, or interleaved with it block by block), and
    read_state reads them back from there."""
    buffer = torch.zeros(2 * BLOCKS * 2 * BLOCK_SIZE * HEADS * HEAD_DIM)
    views = layout(buffer, 2)
    cells = StateCells(views)
    table = [2, 0, 1]  # the state after 3 tokens (block size 2) sits in the row's entry 1: block 0
    write_states(cells, [(table, 3, 77)], BLOCK_SIZE, group=0)
    for view in views.values():
        page = view[0].flatten().contiguous().view(torch.int64)
        assert page[:2].tolist() == [77, 3]
    assert int(torch.count_nonzero(buffer.view(torch.int64))) == 2 * 2  # nothing else: two words a layer
    hashes, counts = read_state(cells, table, 3, BLOCK_SIZE)
    assert hashes.tolist() == [77, 77] and counts.tolist() == [3, 3]
