"""Stand-ins for the batched DMA copy (``cuMemcpyBatchAsync`` / ``hipMemcpyBatchAsync`` behind
``build_params`` and ``copy_blocks``, ``vllm/v1/simple_kv_offload/cuda_mem_ops.py``) and for
host-memory pinning (``cudaHostRegister`` behind ``pin_tensor``).

``build_params`` keeps what the real one keeps (one base and bytes-per-block per region, the
stream) as tensors instead of raw addresses; ``copy_blocks`` checks what the driver would reject
or silently corrupt (mismatched lists, a block outside its region) and queues the copy on the
stream: it lands after the step's forward (``timeline.py``). A copy the driver would run out of
bounds raises here, at submission, naming the block: on a GPU it writes someone else's memory.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvoffload.vllm.standins import timeline as timelines
from kvoffload.vllm.standins.streams import Stream


class BatchCopyParams(NamedTuple):
    sources: tuple[torch.Tensor, ...]  # per region, [num_blocks, bytes per block] (int8 rows)
    destinations: tuple[torch.Tensor, ...]
    stream: Stream
    names: tuple[str, ...]


def _rows(tensor: torch.Tensor) -> torch.Tensor:
    """A region as [num_blocks, bytes per block] int8 rows, as the real op addresses it:
    block b at ``data_ptr + b * stride(0) * element_size``."""
    elem = tensor.element_size()
    width = tensor.stride(0) * elem
    return torch.empty(0, dtype=torch.int8, device=tensor.device).set_(
        tensor.untyped_storage(), tensor.storage_offset() * elem, (tensor.shape[0], width), (width, 1))


def build_params(src_caches: dict, dst_caches: dict, stream, src_access_order: int = 3) -> BatchCopyParams:
    if list(src_caches) != list(dst_caches):
        raise AssertionError(f"batch copy regions differ: {list(src_caches)} vs {list(dst_caches)}")
    sources, destinations = [], []
    for name in src_caches:
        src, dst = _rows(src_caches[name]), _rows(dst_caches[name])
        if src.shape[1] != dst.shape[1]:
            raise AssertionError(f"region {name!r}: {src.shape[1]} bytes per block to {dst.shape[1]}")
        sources.append(src)
        destinations.append(dst)
    if not isinstance(stream, Stream):
        raise TypeError(f"batch copy on {type(stream).__name__}, not a stand-in stream")
    return BatchCopyParams(tuple(sources), tuple(destinations), stream, tuple(src_caches))


def copy_blocks(src_block_ids, dst_block_ids, params: BatchCopyParams) -> None:
    src_ids, dst_ids = [int(b) for b in src_block_ids], [int(b) for b in dst_block_ids]
    if len(src_ids) != len(dst_ids):
        raise RuntimeError(f"batch memcpy: {len(src_ids)} source blocks for {len(dst_ids)} destinations")
    if not src_ids:
        return
    for ids, regions, side in ((src_ids, params.sources, "source"), (dst_ids, params.destinations, "destination")):
        rows = regions[0].shape[0]
        bad = [b for b in ids if not 0 <= b < rows]
        if bad:
            raise RuntimeError(f"batch memcpy: {side} block {bad[0]} outside its region of {rows} blocks "
                               f"(a DMA out of bounds)")
    src_index, dst_index = torch.tensor(src_ids), torch.tensor(dst_ids)

    def land() -> None:
        for src, dst in zip(params.sources, params.destinations):
            dst.index_copy_(0, dst_index, src.index_select(0, src_index))

    params.stream.submit(land)


def pin_tensor(tensor: torch.Tensor) -> None:
    """``cudaHostRegister``: the tensor must be host memory in one piece; nothing to register."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise RuntimeError("cudaHostRegister failed: not a contiguous host tensor")
    timelines.current().pinned_bytes += tensor.nbytes
