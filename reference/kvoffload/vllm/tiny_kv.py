"""The KV shape of the tiny model every vLLM replay runs (``tiny_llama/config.json``; a test checks
the two agree): its layers, heads, head size and dtype, and the bytes of one GPU block.

Its own module so that what sizes a connector's host memory (``foreign.py``) and what builds the
replay (``build.py``) read one owner without importing each other.
"""

from __future__ import annotations

import torch

NUM_LAYERS, NUM_KV_HEADS, HEAD_SIZE = 2, 2, 64
KV_DTYPE = torch.bfloat16
LAYER_NAMES = tuple(f"model.layers.{i}.self_attn.attn" for i in range(NUM_LAYERS))


def block_bytes(block_size: int, num_layers: int = NUM_LAYERS) -> int:
    """KV bytes of one GPU block, ``num_layers`` layers (all of them by default), K and V."""
    return num_layers * 2 * NUM_KV_HEADS * HEAD_SIZE * KV_DTYPE.itemsize * block_size
