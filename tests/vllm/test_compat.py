"""kvoffload.vllm.compat: each release's side of an API change. The installed vLLM (0.32 in CI)
takes the ``since`` side of every adapter; the ``before`` sides are checked here on the same
objects, so a release-venv run (kvoffload releases) is not their only test."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.engine.config import EngineConfig  # noqa: E402
from kvoffload.vllm import compat  # noqa: E402
from kvoffload.vllm.build import (  # noqa: E402
    LAYER_NAMES,
    ConnectorLoad,
    block_bytes,
    build_kv_cache_config,
    build_vllm_config,
)
from kvoffload.vllm.compat import v0_26, v0_27, v0_29, v0_30  # noqa: E402
from kvoffload.vllm.model import FingerprintCells  # noqa: E402
from kvoffload.vllm.regions import block_regions  # noqa: E402


@pytest.mark.parametrize("version, release", [("0.25.0", (0, 25, 0)), ("0.32.0+cpu", (0, 32, 0)),
                                              ("0.30.1.dev3+g1234", (0, 30, 1)), ("main", (0, 32, 0))])
def test_the_release_is_read_from_the_version_string(version, release):
    assert compat._release(version) == release


def test_the_installed_release_takes_the_newer_side_of_every_adapter():
    assert compat.RELEASE >= (0, 32, 0)
    assert compat.allocate_kv_caches is v0_29.allocate_since
    assert compat.use_kv_cache_layout is v0_29.use_layout_since
    assert compat.for_connector is v0_27.for_connector_since


def test_before_0_29_each_layer_has_its_own_page_array_that_the_harness_can_read_and_copy():
    engine = EngineConfig(gpu_blocks=12, cpu_chunks=8, block_size=16, blocks_per_chunk=2)
    config = build_vllm_config(engine, ConnectorLoad("stock").transfer_config(engine, "stepped"), 256)
    kv_cache_config = build_kv_cache_config(config, engine)
    views = v0_29.allocate_before(config, kv_cache_config)
    page = block_bytes(engine.block_size) // len(LAYER_NAMES)  # one layer's page of one block
    assert list(views) == list(LAYER_NAMES)
    for index, view in enumerate(views.values()):
        # block b of layer l at l * (all of a layer's pages) + b * page, as vLLM <= 0.28 allocated it
        assert view.stride(0) * view.element_size() == page
        assert view.storage_offset() * view.element_size() == index * page * engine.gpu_blocks
        assert view.shape[0] == engine.gpu_blocks and view[0].is_contiguous()
    assert FingerprintCells(views).num_layers == len(LAYER_NAMES)  # one shared buffer
    regions = block_regions(views, engine.gpu_blocks)
    assert sum(region.page_bytes for region in regions) == block_bytes(engine.block_size)
    # the since side on the same config covers the same bytes per block
    since = v0_29.allocate_since(config, kv_cache_config)
    assert sum(r.page_bytes for r in block_regions(since, engine.gpu_blocks)) == block_bytes(engine.block_size)


def test_before_027_a_connector_gets_a_mamba_layer_as_state_tensors_over_its_pages():
    """What 0.25-0.26's runner hands ``register_kv_caches`` for a Mamba layer: one state tensor per
    ``MambaSpec`` shape, ``(num_blocks, *shape)`` in the state's dtype, starting its pages'
    storage (the offloading worker rebuilds the page array from it); block ``b`` of the state is
    page ``b``'s bytes. Attention layers are handed over as allocated."""
    qwen = EngineConfig(model="qwen3-next", gpu_blocks=64, cpu_chunks=64, block_size=16)
    config = build_vllm_config(qwen, ConnectorLoad("stock").transfer_config(qwen, "threaded"), 512)
    kv_cache_config = build_kv_cache_config(config, qwen)
    kv_caches = compat.allocate_kv_caches(config, kv_cache_config)
    attention, mamba = LAYER_NAMES
    pages = kv_caches[mamba]
    page = kv_cache_config.kv_cache_groups[1].kv_cache_spec.page_size_bytes
    assert (pages.dtype, pages.shape) == (torch.int8, (64, 1, 1, page))  # what 0.27+ hand over
    before = v0_29.allocate_before(config, kv_cache_config)[mamba]  # 0.25-0.28's allocation: the same view
    assert (before.dtype, before.shape, before.stride(0)) == (torch.int8, (64, 1, 1, page), page)
    handed = v0_27.for_connector_before(kv_caches, kv_cache_config)
    assert handed[attention] is kv_caches[attention]
    (state,) = handed[mamba]
    assert (state.dtype, state.shape) == (torch.bfloat16, (64, page // 2))
    assert state.untyped_storage().data_ptr() == pages.untyped_storage().data_ptr()
    assert state.storage_offset() * 2 == pages.storage_offset()
    state[5, 0] = 3.0
    assert pages[5].reshape(-1)[:2].view(torch.bfloat16).item() == 3.0 and not pages[4].any()
    assert v0_27.for_connector_since(kv_caches, kv_cache_config) is kv_caches


def test_the_offloading_specs_geometry_by_its_names_before_and_since():
    before = SimpleNamespace(gpu_block_size=(16,), block_size_factor=4, num_blocks=30)
    since = SimpleNamespace(tokens_per_block=(16,), blocks_per_chunk=4, num_chunks=30)
    assert v0_26.chunk_shape_before(before) == v0_26.chunk_shape_since(since) == (16, 4)
    assert v0_30.num_chunks_before(before) == v0_30.num_chunks_since(since) == 30
    assert compat.offload_geometry(since) == (16, 4, 30)
