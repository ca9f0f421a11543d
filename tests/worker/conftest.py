"""Fixtures for the worker tests: a small KV cache, job builders and recognisable block contents."""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

import pytest
import torch

from kvoffload.core.types import TransferJob, TransferKind
from kvoffload.worker import KVCache, SteppedTransferHandler, ThreadedCopyHandler

# Tiny slots keep correctness runs fast; the copy path is the same as with real widths.
SLOT_BYTES = 16
BLOCK_SIZE = 4


class JobMaker:
    """Builds TransferJobs with fresh ids (1, 2, ...), the way the scheduler side numbers them."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def store(self, gpu_blocks, chunk_slots, req_id: str = "r") -> TransferJob:
        return TransferJob(
            job_id=next(self._ids),
            req_id=req_id,
            kind=TransferKind.STORE,
            gpu_block_ids=tuple(gpu_blocks),
            chunk_slots=tuple(chunk_slots),
            chunk_indices=tuple(range(len(chunk_slots))),
        )

    def load(self, gpu_blocks, chunk_slots, skip_blocks: int = 0, req_id: str = "r") -> TransferJob:
        return TransferJob(
            job_id=next(self._ids),
            req_id=req_id,
            kind=TransferKind.LOAD,
            gpu_block_ids=tuple(gpu_blocks),
            chunk_slots=tuple(chunk_slots),
            chunk_indices=tuple(range(len(chunk_slots))),
            skip_blocks=skip_blocks,
        )


@pytest.fixture
def jobs() -> JobMaker:
    return JobMaker()


def make_kv(
    blocks_per_chunk: int = 1, slot_bytes: int = SLOT_BYTES, device: str = "cpu"
) -> KVCache:
    return KVCache(
        num_gpu_blocks=32,
        block_size=BLOCK_SIZE,
        num_cpu_chunks=16,
        blocks_per_chunk=blocks_per_chunk,
        slot_bytes=slot_bytes,
        device=device,
    )


@pytest.fixture
def kv() -> KVCache:
    return make_kv()


@pytest.fixture
def kv_factory() -> Callable[..., KVCache]:
    return make_kv


def block_pattern(kv: KVCache, tag: int) -> torch.Tensor:
    """Bytes of one block that differ in every slot and for every tag (on the KV's device)."""
    n = kv.block_size * kv.slot_bytes
    values = (torch.arange(n, dtype=torch.int64) * 7 + tag * 131 + 1) % 251
    return values.to(torch.uint8).view(kv.block_size, kv.slot_bytes).to(kv.device)


@pytest.fixture
def paint() -> Callable[[KVCache, int, int], torch.Tensor]:
    """paint(kv, block, tag): write a recognisable pattern into a GPU block, return a CPU copy."""

    def _paint(kv: KVCache, block: int, tag: int) -> torch.Tensor:
        pattern = block_pattern(kv, tag)
        kv.gpu[block].copy_(pattern)
        return pattern.cpu()

    return _paint


HANDLER_KINDS = ("stepped", "threaded")


def open_handler(kind: str, kv: KVCache, completion_steps: int = 0):
    if kind == "stepped":
        return SteppedTransferHandler(kv, completion_steps=completion_steps)
    if kind == "threaded":
        return ThreadedCopyHandler(kv)
    raise ValueError(kind)


def settle(handler) -> None:
    """Make every submitted copy happen, whatever the handler kind (wait_all, named for intent)."""
    handler.wait_all()


@pytest.fixture(params=HANDLER_KINDS)
def any_handler(request) -> Iterator[Callable]:
    """open(kv) -> a handler of each CPU kind in turn; shut down after the test."""
    opened = []

    def _open(kv: KVCache, completion_steps: int = 0):
        handler = open_handler(request.param, kv, completion_steps)
        opened.append(handler)
        return handler

    _open.kind = request.param
    yield _open
    for handler in opened:
        handler.shutdown()


@pytest.fixture
def settle_copies() -> Callable:
    return settle
