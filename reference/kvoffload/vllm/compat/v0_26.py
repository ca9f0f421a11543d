"""vLLM 0.26: an ``OffloadingSpec`` is built from a normalized ``OffloadingConfig``
(``vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py``) and names its chunk
geometry ``tokens_per_block`` (per KV cache group) and ``blocks_per_chunk``.

Before 0.26 the spec read the vLLM config itself and called them ``gpu_block_size`` and
``block_size_factor`` (``vllm/v1/kv_offload/base.py``, 0.25). Both read the chunk size from
``kv_connector_extra_config["block_size"]`` in tokens (0.26 added ``blocks_per_chunk``), which is
why the stock connector is configured by ``block_size``.
"""

from __future__ import annotations


def chunk_shape_since(spec) -> tuple[int, int]:
    """(tokens per GPU block of group 0, GPU blocks per offloaded chunk)."""
    return spec.tokens_per_block[0], spec.blocks_per_chunk


def chunk_shape_before(spec) -> tuple[int, int]:
    return spec.gpu_block_size[0], spec.block_size_factor
