"""What differs between vLLM releases, in one place.

Every other module of ``kvoffload.vllm`` is written against vLLM 0.32's API. Where an older
release (0.25.0 and later) differs, the difference is one adapter module here, named by the
release that made the change (``v0_29``: what vLLM 0.29 changed), holding the code for both
sides. The installed vLLM's version is read once, below, and picks each side; nothing else in
the package looks at versions.

Adapters
    v0_26  the offloading spec's chunk geometry: ``tokens_per_block``, ``blocks_per_chunk``
           (before: ``gpu_block_size``, ``block_size_factor``)
    v0_27  a Mamba layer handed to a connector as one int8 page array ``[B, 1, 1, page]``;
           before it (0.25, 0.26), as a list of state tensors (the offloading worker asserts
           each form)
    v0_29  one KV cache buffer with a named layout (``allocate_kv_cache``,
           ``CacheConfig.kv_cache_layout``); before it, one page array per layer
    v0_30  the CPU spec's capacity: ``num_chunks`` (before: ``num_blocks``)

API (for any module of this package, the real-model engine included)
    RELEASE                                  the installed vLLM as (major, minor, patch)
    allocate_kv_caches(config, kv_cache_config) -> {layer name: [B, H, N, C] tensor view}
                                             vLLM's KV cache tensors on the CPU, as its model
                                             runner would allocate them
    use_kv_cache_layout(config, layout)      make the layout a connector asks for the config's
                                             (a no-op where the release has no such setting)
    for_connector(kv_caches, kv_cache_config)
                                             the KV caches as the release's model runner hands
                                             them to ``register_kv_caches`` (Mamba layers: a list
                                             of state tensors before 0.27, the page view since)
    own_storage_per_layer(kv_caches)         the same KV caches as a release's model runner hands a
                                             foreign connector: before 0.29 one allocation per layer
    offload_geometry(spec) -> (tokens per GPU block, GPU blocks per chunk, chunks on the host)
                                             of a built ``CPUOffloadingSpec``
"""

from __future__ import annotations

import re

import vllm

from kvoffload.vllm.compat import v0_26, v0_27, v0_29, v0_30


def _release(version: str) -> tuple[int, int, int]:
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if found is None:  # a source build without a tag: take it as the newest known API
        return (0, 32, 0)
    major, minor, patch = (int(part) for part in found.groups())
    return (major, minor, patch)


RELEASE = _release(vllm.__version__)

_chunk_shape = v0_26.chunk_shape_since if RELEASE >= (0, 26, 0) else v0_26.chunk_shape_before
_num_chunks = v0_30.num_chunks_since if RELEASE >= (0, 30, 0) else v0_30.num_chunks_before
for_connector = v0_27.for_connector_since if RELEASE >= (0, 27, 0) else v0_27.for_connector_before
if RELEASE >= (0, 29, 0):
    allocate_kv_caches, use_kv_cache_layout = v0_29.allocate_since, v0_29.use_layout_since
    own_storage_per_layer = v0_29.own_storage_per_layer_since
else:
    allocate_kv_caches, use_kv_cache_layout = v0_29.allocate_before, v0_29.use_layout_before
    own_storage_per_layer = v0_29.own_storage_per_layer_before



def offload_geometry(spec) -> tuple[int, int, int]:
    tokens_per_block, blocks_per_chunk = _chunk_shape(spec)
    return tokens_per_block, blocks_per_chunk, _num_chunks(spec)


__all__ = ["RELEASE", "allocate_kv_caches", "for_connector", "offload_geometry", "own_storage_per_layer",
           "use_kv_cache_layout"]
