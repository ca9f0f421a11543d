"""The two KV tiers the worker copies between: GPU blocks and offload-tier (CPU) chunks.

Both tiers are raw bytes (``uint8``). A token slot is ``slot_bytes`` wide; its first
:data:`FINGERPRINT_BYTES` bytes belong to the engine's content oracle (a fingerprint of the token
prefix the slot was computed for). The worker never interprets slot bytes, it only moves them.

Layout::

    gpu  [num_gpu_blocks, block_size, slot_bytes]                   one row per GPU block
    cpu  [num_cpu_chunks, blocks_per_chunk * block_size, slot_bytes] one row per tier chunk slot
    tier_blocks = cpu viewed as [num_cpu_chunks * blocks_per_chunk, block_size, slot_bytes]

``tier_blocks`` shares storage with ``cpu``: sub-block j of chunk slot s is row
``s * blocks_per_chunk + j``. Copies address both tiers block by block through it.
"""

from __future__ import annotations

import torch

from kvoffload.core.types import ConfigError

FINGERPRINT_BYTES = 8


class KVCache:
    """Owns the GPU block tensor and the offload-tier chunk tensor of one worker."""

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        num_cpu_chunks: int,
        blocks_per_chunk: int,
        slot_bytes: int,
        device: str | torch.device = "cpu",
    ) -> None:
        """``device`` holds the GPU blocks: "cpu", "cuda[:n]", or "auto" (CUDA when available)."""
        _check_positive("num_gpu_blocks", num_gpu_blocks)
        _check_positive("block_size", block_size)
        _check_positive("num_cpu_chunks", num_cpu_chunks)
        _check_positive("blocks_per_chunk", blocks_per_chunk)
        _check_positive("slot_bytes", slot_bytes)
        if slot_bytes < FINGERPRINT_BYTES:
            raise ConfigError(
                f"slot_bytes must be >= {FINGERPRINT_BYTES} (the first {FINGERPRINT_BYTES} hold "
                f"the content fingerprint), got {slot_bytes}"
            )
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {str(device)!r} was asked for but CUDA is not available")
        if device.type not in ("cpu", "cuda"):
            raise ConfigError(f"device must be 'cpu' or 'cuda', got {str(device)!r}")

        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.num_cpu_chunks = num_cpu_chunks
        self.blocks_per_chunk = blocks_per_chunk
        self.slot_bytes = slot_bytes
        self.device = device

        self.gpu = torch.zeros(
            (num_gpu_blocks, block_size, slot_bytes), dtype=torch.uint8, device=device
        )
        # Pinned host memory lets CUDA copies run asynchronously; pinning needs a CUDA driver.
        self.cpu = torch.zeros(
            (num_cpu_chunks, blocks_per_chunk * block_size, slot_bytes),
            dtype=torch.uint8,
            pin_memory=torch.cuda.is_available(),
        )
        self.tier_blocks = self.cpu.view(num_cpu_chunks * blocks_per_chunk, block_size, slot_bytes)

    @property
    def block_bytes(self) -> int:
        """Bytes in one GPU block (= one sub-block of a chunk)."""
        return self.block_size * self.slot_bytes

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def __repr__(self) -> str:
        return (
            f"KVCache(num_gpu_blocks={self.num_gpu_blocks}, block_size={self.block_size}, "
            f"num_cpu_chunks={self.num_cpu_chunks}, blocks_per_chunk={self.blocks_per_chunk}, "
            f"slot_bytes={self.slot_bytes}, device={str(self.device)!r})"
        )


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
