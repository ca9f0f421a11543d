"""vLLM 0.27: a Mamba layer reaches a connector's ``register_kv_caches`` as one int8 page array.

From 0.27 the model runner keeps a Mamba layer's KV cache as one contiguous
``[num_blocks, 1, 1, page_size_bytes]`` int8 view of the layer's raw allocation
(``GPUModelRunner._reshape_kv_cache_tensors``, the ``MambaSpec`` branch), and the offloading
worker views it as ``(num_blocks, page_size_bytes)``, asserting int8
(``offloading/worker.py``, ``register_kv_caches``). 0.29's ``allocate_kv_cache`` gives the same
view.

Before 0.27 (0.25, 0.26) the runner handed the layer over as a list of state tensors, one per
``MambaSpec.shapes`` entry: ``(num_blocks, *shape)`` in the state's dtype, strided by the page over
the layer's raw array, the states one after the other inside the page. The offloading worker
rebuilt the page array from the first state tensor's storage, asserting that it starts the
storage (``storage_offset() == 0``) and that the storage is exactly ``num_blocks`` pages
(0.25.0 ``offloading/worker.py`` register_kv_caches, the ``MambaSpec`` branch).

The replay keeps the page view for its own use (``model.py``, ``StateCells``, reads a state
block through it); :func:`for_connector_before` turns it into the list only for the connector.
"""

from __future__ import annotations

import math

import torch


def mamba_pages(pages: torch.Tensor, num_blocks: int, page_size_bytes: int) -> torch.Tensor:
    """A Mamba layer's page view over its raw int8 array (every release's replay keeps this)."""
    return pages[:num_blocks * page_size_bytes].view(num_blocks, 1, 1, page_size_bytes)


def for_connector_since(kv_caches: dict[str, torch.Tensor], kv_cache_config) -> dict[str, torch.Tensor]:
    """From 0.27 a connector registers the page views as allocated."""
    return kv_caches


def for_connector_before(kv_caches: dict[str, torch.Tensor], kv_cache_config) -> dict:
    """0.25-0.26: each Mamba layer's page view becomes the runner's list of state tensors, over
    the same bytes (``storage_offset`` counts from the start of the shared storage, as the
    worker's assertion expects of an array that begins it)."""
    handed = dict(kv_caches)
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        if type(spec).__name__ != "MambaSpec":
            continue
        for name in group.layer_names:
            handed[name] = _state_tensors(kv_caches[name], spec)
    return handed


def _state_tensors(pages: torch.Tensor, spec) -> list[torch.Tensor]:
    num_blocks, page = pages.shape[0], spec.page_size_bytes
    start = pages.storage_offset() * pages.element_size()
    raw = pages.reshape(-1)
    states, offset = [], 0
    for shape, dtype in zip(spec.shapes, spec.dtypes):
        size = torch.empty((), dtype=dtype).element_size()
        if (start + offset) % size or page % size:
            raise ValueError("a Mamba state is not aligned to its dtype in the page")
        states.append(torch.as_strided(raw.view(dtype), (num_blocks, *shape),
                                       (page // size, *_contiguous_strides(shape)), (start + offset) // size))
        offset += math.prod(shape) * size
    return states


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))
