"""vLLM 0.29: every layer's KV cache in one buffer, laid out by a named layout (RFC #42082).

From 0.29, ``vllm.v1.worker.utils.allocate_kv_cache`` places all layers in one backing
allocation and views each as ``[B, H, N, C]`` by ``CacheConfig.kv_cache_layout`` (the stock
connector asks for ``LBHNC``, ``OffloadingConnector.get_required_kvcache_layout``).

Before 0.29 (``GPUModelRunner._allocate_kv_cache_tensors`` in 0.25-0.28) each layer got its own
zeroed tensor of ``num_blocks`` pages, block ``b`` at ``b * page_size_bytes`` (the offloading
worker's ``register_kv_caches`` assumes exactly that for unpacked layers), and the attention
backend gave it its shape; the connector's layout (``HND``) was a stride order for that backend,
which the fake model has none of. :func:`allocate_before` keeps the same bytes per layer and
block: the layers' page arrays one after the other in one buffer (the fingerprint cells read all
layers through one buffer), each viewed as ``[B, H, N, C]`` with C holding K and V.
"""

from __future__ import annotations

import torch

from kvoffload.vllm.compat import v0_27


def allocate_since(config, kv_cache_config) -> dict[str, torch.Tensor]:
    from vllm.v1.worker.utils import allocate_kv_cache

    layout = config.cache_config.get_resolved_kv_cache_layout()
    return allocate_kv_cache(kv_cache_config, torch.device("cpu"), layout)


def allocate_before(config, kv_cache_config) -> dict[str, torch.Tensor]:
    """A hybrid model's groups alias one page array per ``KVCacheTensor`` (its ``shared_by``: one
    layer of each group), as 0.25-0.28's runner allocated them; the worker checks the aliasing.
    An attention layer sees its pages as ``[B, H, N, C]``, a Mamba layer as the int8 page view of
    0.27+ (``v0_27.mamba_pages``; 0.25-0.26's connectors get it as state tensors,
    ``v0_27.for_connector_before``)."""
    num_blocks = kv_cache_config.num_blocks
    spec_of = {name: group.kv_cache_spec for group in kv_cache_config.kv_cache_groups for name in group.layer_names}
    # (vLLM 0.32's KVCacheTensor has no shared_by: this side runs there only in its tests.)
    shared = [list(getattr(tensor, "shared_by", ())) for tensor in kv_cache_config.kv_cache_tensors]
    if any(len(names) > 1 for names in shared):
        arrays = shared
    else:  # one group: one array per layer, in the groups' order
        arrays = [[name] for name in spec_of]
    buffer = torch.zeros(sum(spec_of[names[0]].page_size_bytes for names in arrays) * num_blocks, dtype=torch.int8)
    views, offset = {}, 0
    for names in arrays:
        size = spec_of[names[0]].page_size_bytes * num_blocks
        pages = buffer[offset:offset + size]
        for name in names:
            spec = spec_of[name]
            if type(spec).__name__ == "MambaSpec":  # the runner's int8 page view (compat/v0_27.py)
                views[name] = v0_27.mamba_pages(pages, num_blocks, spec.page_size_bytes)
            else:
                views[name] = pages.view(spec.dtype).view(num_blocks, spec.num_kv_heads, spec.block_size,
                                                          2 * spec.head_size)
        offset += size
    return views


def own_storage_per_layer_since(kv_caches: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """From 0.29 every connector sees the one buffer's views, as allocated."""
    return kv_caches


def own_storage_per_layer_before(kv_caches: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What 0.25-0.28 handed a connector's ``register_kv_caches``: each layer a tensor of its own
    allocation (``GPUModelRunner._allocate_kv_cache_tensors``), not a view into a shared one. The
    same bytes as :func:`allocate_before`'s buffer (the fingerprint cells read that), seen through
    one storage per layer: a connector that tells layers apart by their storage (SimpleCPU's
    worker does, until 0.29) finds them as it would on a GPU."""
    views = {}
    for name, view in kv_caches.items():
        start = view.storage_offset() * view.element_size()
        whole = view.untyped_storage()
        words = torch.empty(0, dtype=torch.uint8).set_(whole)[start:start + view.numel() * view.element_size()]
        views[name] = torch.from_numpy(words.numpy()).view(view.dtype).view(view.shape)
    return views


def use_layout_since(config, layout: str) -> None:
    config.cache_config.kv_cache_layout = layout


def use_layout_before(config, layout: str) -> None:
    """No ``CacheConfig.kv_cache_layout`` yet: the layout was the attention backend's business."""
