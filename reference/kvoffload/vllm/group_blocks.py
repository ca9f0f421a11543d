"""KV cache groups with block sizes of their own (``KVCacheGroup.block_size``) in vLLM's terms.

vLLM gives each group its own ``KVCacheSpec.block_size`` where a model sets one per layer kind
(DeepSeek-V4: full attention 256, its window 64). ``EngineCore`` then aligns the scheduler to the
groups' lcm and hashes at their gcd (``resolve_kv_cache_block_sizes``, vLLM 0.25+), and every
group's page is padded to one size (``AttentionSpec.page_size_padded``), since the groups share one
pool of blocks. The replay's worker copies whole pages (``vllm/regions.py``), and its fake model
and KV oracle index each group on its own grid (``fake_worker.py``, ``model.py``).
"""

from __future__ import annotations

from kvoffload.core.types import ConfigError


def page_tokens(engine) -> int:
    """The block size whose page every group's page is: the engine's, or the largest group's."""
    return max(group.tokens_per_block(engine.block_size) for group in engine.kv_model.groups)


def own_shape(engine, group, shape: dict, page_bytes) -> dict:
    """A spec's keywords for ``group``: ``shape`` (the engine's block size), or for a model with
    groups of their own block sizes the group's, its page padded to ``page_bytes(largest)``."""
    if not engine.kv_model.has_own_block_sizes:
        return shape
    size, largest = group.tokens_per_block(engine.block_size), page_tokens(engine)
    return {**shape, "block_size": size, "page_size_padded": page_bytes(largest) if size < largest else None}


def stock_chunking(engine, common: dict) -> dict:
    """The stock connector's chunk option: ``block_size`` (tokens per chunk; every release since
    0.25 reads it). Groups of their own block sizes get none, a chunk of one block each: with it
    set, vLLM asserts one block size for every group (0.25 ``OffloadingSpec.__init__``, 0.32
    ``build_offloading_config``)."""
    if not engine.kv_model.has_own_block_sizes:
        return {**common, "block_size": engine.tokens_per_chunk}
    if engine.blocks_per_chunk != 1:
        raise ConfigError(f"model {engine.model!r}: vLLM's stock connector chunks groups of their own block sizes "
                          f"one block each, got blocks_per_chunk={engine.blocks_per_chunk}")
    return common


def differ(kv_cache_config) -> bool:
    return len({group.kv_cache_spec.block_size for group in kv_cache_config.kv_cache_groups}) > 1


def scheduler_block_sizes(config, kv_cache_config) -> dict:
    """The block sizes ``EngineCore`` hands vLLM's scheduler: the cache's, or for groups of
    different block sizes their lcm and gcd."""
    if not differ(kv_cache_config):
        return {"block_size": config.cache_config.block_size}
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    return dict(zip(("block_size", "hash_block_size"), resolve_kv_cache_block_sizes(kv_cache_config, config)))
