"""vLLM 0.30: the CPU spec counts its capacity in ``num_chunks`` (``vllm/v1/kv_offload/cpu/spec.py``);
before 0.30 the same number was ``num_blocks`` (an offloaded "block" being one chunk)."""

from __future__ import annotations


def num_chunks_since(spec) -> int:
    return spec.num_chunks


def num_chunks_before(spec) -> int:
    return spec.num_blocks
