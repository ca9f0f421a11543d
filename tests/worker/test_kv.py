"""The KV cache holder: shapes of both tiers, and refusing geometry it cannot hold."""

from __future__ import annotations

import pytest
import torch

from kvoffload.core.types import ConfigError
from kvoffload.worker import KVCache


def test_tiers_have_the_documented_shapes_and_share_tier_storage():
    """GPU rows are blocks, CPU rows are chunks; tier_blocks views the same bytes block by block."""
    kv = KVCache(
        num_gpu_blocks=6, block_size=4, num_cpu_chunks=3, blocks_per_chunk=2, slot_bytes=16
    )

    assert kv.gpu.shape == (6, 4, 16) and kv.gpu.dtype == torch.uint8
    assert kv.cpu.shape == (3, 8, 16) and kv.cpu.dtype == torch.uint8
    assert kv.tier_blocks.shape == (6, 4, 16)
    assert kv.block_bytes == 64

    # sub-block 1 of chunk slot 2 is tier row 2 * 2 + 1
    kv.tier_blocks[5].fill_(9)
    assert torch.all(kv.cpu[2, 4:8] == 9)
    assert torch.all(kv.cpu[2, :4] == 0)


@pytest.mark.parametrize(
    "field, value",
    [
        ("slot_bytes", 7),
        ("num_gpu_blocks", 0),
        ("block_size", -1),
        ("blocks_per_chunk", True),
        ("num_cpu_chunks", 2.0),
    ],
)
def test_bad_geometry_is_a_config_error_naming_the_value(field, value):
    """A slot narrower than the fingerprint, or a non-positive size, is refused by name."""
    sizes = dict(num_gpu_blocks=4, block_size=4, num_cpu_chunks=4, blocks_per_chunk=1, slot_bytes=8)
    sizes[field] = value

    with pytest.raises(ConfigError, match=f"{field}.*{value!r}"):
        KVCache(**sizes)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_asking_for_cuda_without_cuda_is_a_config_error():
    """Falling back to the CPU silently would measure the wrong thing: refuse instead."""
    with pytest.raises(ConfigError, match="cuda"):
        KVCache(4, 4, 4, 1, 8, device="cuda")


def test_auto_device_picks_cuda_only_when_present():
    kv = KVCache(4, 4, 4, 1, 8, device="auto")

    assert kv.is_cuda == torch.cuda.is_available()


def test_the_cuda_handler_refuses_a_cache_in_host_memory():
    """CUDA streams cannot order copies of host tensors: a CPU cache is a configuration error."""
    from kvoffload.worker import CudaTransferHandler

    with pytest.raises(ConfigError, match="CUDA device"):
        CudaTransferHandler(KVCache(4, 4, 4, 1, 8))
