"""How a replay cuts vLLM's KV buffer into block regions (kvoffload/vllm/regions.py) on hand-made
layer views of one buffer (no vLLM needed): layers merge into one region only where, block after
block, one layer's page ends where the next one's begins."""

from __future__ import annotations

import torch

from kvoffload.vllm.regions import block_regions

BLOCKS = 4


def layer(buffer: torch.Tensor, start: int, page: int, stride: int) -> torch.Tensor:
    """A layer's view: BLOCKS pages of ``page`` floats, block b at ``start + b * stride``."""
    return buffer.as_strided((BLOCKS, page), (stride, 1), start)


def test_small_interleaved_layers_merge_into_one_region_per_block():
    # Block-outermost: block b holds layer a's 4 floats then layer b's (16 bytes each, a 32-byte
    # stride, small enough that Python shares the int object of equal strides).
    buffer = torch.zeros(BLOCKS * 8)
    (region,) = block_regions({"a": layer(buffer, 0, 4, 8), "b": layer(buffer, 4, 4, 8)}, BLOCKS)
    assert (region.layers, region.page_bytes) == (("a", "b"), 32)


def test_layers_that_touch_in_block_0_but_step_differently_stay_apart():
    # Layer b's page 0 starts where layer a's ends, but a steps 2 pages a block and b 3: merged,
    # b's block 1 would be read at a's stride, from the wrong bytes.
    page = 100  # 400 bytes: strides past the small ints Python shares
    buffer = torch.zeros(3 * page * BLOCKS + page)
    regions = block_regions({"a": layer(buffer, 0, page, 2 * page), "b": layer(buffer, page, page, 3 * page)}, BLOCKS)
    assert [(r.layers, r.page_bytes) for r in regions] == [(("a",), 400), (("b",), 400)]
