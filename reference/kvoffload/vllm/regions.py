"""vLLM's paged KV caches seen as block regions the project's transfer handlers can copy.

vLLM (0.32, ``vllm/v1/worker/utils.py: allocate_kv_cache``) allocates one backing buffer and
hands each attention layer a strided ``[B, H, N, C]`` view of it; the layout (``LBHNC``,
``BLHNC``, ...) decides whether a block's pages of all layers sit side by side. The offloading
worker copies whole blocks, so all it needs per layer is "block b is ``page`` bytes at
``base + b * block_stride``" (vLLM's offloading worker reduces the caches to the same thing,
``register_kv_caches`` in ``.../offloading/worker.py``).

A :class:`BlockRegion` is such a byte range per block, covering one layer or several adjacent
ones. :class:`RegionKV` presents one region as the project's :class:`KVCache` (its GPU side is
the region itself, its offload side a host tensor of the same row size), and
:class:`FanOutHandler` runs one project handler per region and reports a job once every region
copied it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from kvoffload.core.types import BlockId, ConfigError, JobId, TransferJob, TransferResult
from kvoffload.worker.handler import HandlerStats, TransferHandler
from kvoffload.worker.kv import KVCache


@dataclass(frozen=True)
class BlockRegion:
    """``num_blocks`` rows of ``page_bytes`` bytes, ``block_stride`` bytes apart, as int8."""

    rows: torch.Tensor  # [num_blocks, page_bytes] int8 view of vLLM's buffer
    layers: tuple[str, ...]

    @property
    def page_bytes(self) -> int:
        return self.rows.shape[1]


def _block_rows(view: torch.Tensor, num_blocks: int) -> tuple[torch.Tensor, int, int]:
    """(int8 rows view, byte address of block 0, block stride in bytes) of one layer view."""
    if view.shape[0] != num_blocks:
        raise ConfigError(f"a KV cache view has {view.shape[0]} blocks, the KV cache config {num_blocks} "
                          "(kernel block splitting is not supported)")
    if not view[0].is_contiguous():
        raise ConfigError("a KV cache layer view does not keep each block's page contiguous "
                          f"(strides {tuple(view.stride())}): use a block-compact layout such as LBHNC")
    elem = view.element_size()
    page = view[0].numel() * elem
    stride = view.stride(0) * elem
    rows = torch.empty(0, dtype=torch.int8, device=view.device).set_(
        view.untyped_storage(), view.storage_offset() * elem, (num_blocks, page), (stride, 1))
    return rows, view.data_ptr(), stride


def _page_view(view, num_blocks: int) -> torch.Tensor:
    """A layer's ``[num_blocks, page]`` int8 view. vLLM 0.25-0.26 hand a Mamba layer over as a list
    of state tensors inside one page array; their offloading worker rebuilt the pages from the
    first one's storage, which must start at it and hold exactly ``num_blocks`` pages (0.25.0
    ``offloading/worker.py`` register_kv_caches, the ``MambaSpec`` branch; vllm/compat/v0_27.py)."""
    if not isinstance(view, (list, tuple)):
        return view
    storage = view[0].untyped_storage()
    if view[0].storage_offset() or storage.nbytes() % num_blocks:
        raise ConfigError(f"a Mamba layer's state tensors do not start a storage of {num_blocks} pages")
    page = storage.nbytes() // num_blocks
    return torch.empty(0, dtype=torch.int8, device=view[0].device).set_(storage, 0, (num_blocks, page), (page, 1))


def block_regions(kv_caches: dict[str, torch.Tensor], num_blocks: int) -> list[BlockRegion]:
    """One region per run of layers whose pages are adjacent in every block (block-outermost
    layouts merge all layers into one region; layer-outermost ones keep a region per layer).
    Layers aliasing the same bytes are copied once."""
    seen: dict[tuple[int, int], str] = {}
    spans: list[tuple[int, int, int, str, torch.Tensor]] = []  # address, page, stride, layer, view
    for name, view in kv_caches.items():
        view = _page_view(view, num_blocks)
        rows, address, stride = _block_rows(view, num_blocks)
        if (address, stride) in seen:
            continue
        seen[(address, stride)] = name
        spans.append((address, rows.shape[1], stride, name, view))
    spans.sort(key=lambda span: span[0])
    regions: list[BlockRegion] = []
    group: list[tuple[int, int, int, str, torch.Tensor]] = []
    for span in spans:
        if group and (span[2] != group[0][2] or span[0] != group[-1][0] + group[-1][1]):
            regions.append(_merge(group, num_blocks))
            group = []
        group.append(span)
    if group:
        regions.append(_merge(group, num_blocks))
    return regions


def _merge(group: list, num_blocks: int) -> BlockRegion:
    first_view = group[0][4]
    elem = first_view.element_size()
    page = sum(span[1] for span in group)
    rows = torch.empty(0, dtype=torch.int8, device=first_view.device).set_(
        first_view.untyped_storage(), first_view.storage_offset() * elem, (num_blocks, page), (group[0][2], 1))
    return BlockRegion(rows, tuple(span[3] for span in group))


class RegionKV(KVCache):
    """A :class:`KVCache` whose GPU side is a region of vLLM's buffer (not a copy of it).

    A block row of ``page_bytes`` is shown as ``block_size`` slots of ``page_bytes / block_size``:
    the handlers only ever copy whole rows, so the slot split is bookkeeping. The offload side
    is a fresh host tensor, pinned when CUDA is present (the CUDA handler needs that).
    """

    def __init__(self, region: BlockRegion, block_size: int, num_cpu_chunks: int, blocks_per_chunk: int):
        # Deliberately not KVCache.__init__: that allocates the GPU side, here it already exists.
        rows = region.rows
        if region.page_bytes % block_size:
            raise ConfigError(f"a KV page of {region.page_bytes} bytes does not split into {block_size} slots")
        self.num_gpu_blocks = rows.shape[0]
        self.block_size = block_size
        self.num_cpu_chunks = num_cpu_chunks
        self.blocks_per_chunk = blocks_per_chunk
        self.slot_bytes = region.page_bytes // block_size
        self.device = rows.device
        self.gpu = rows.view(torch.uint8).view(self.num_gpu_blocks, block_size, self.slot_bytes)
        self.cpu = torch.zeros((num_cpu_chunks, blocks_per_chunk * block_size, self.slot_bytes),
                               dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        self.tier_blocks = self.cpu.view(num_cpu_chunks * blocks_per_chunk, block_size, self.slot_bytes)


class FanOutHandler:
    """One handler per region; a job is finished once every region reported it.

    Keeps the project's handler contract (``worker/handler.py``): FIFO per direction holds per
    region, so reports come out in the order the slowest region finished them.
    """

    def __init__(self, handlers: Sequence[TransferHandler]):
        if not handlers:
            raise ConfigError("no KV cache regions to copy")
        self.handlers = tuple(handlers)
        self.kv = self.handlers[0].kv
        self._pending: dict[JobId, list[TransferResult]] = {}
        self._is_store: dict[JobId, bool] = {}  # until reported
        # Finished copies per direction: [bytes, seconds] (seconds: the slowest region's).
        self.totals = {True: [0, 0.0], False: [0, 0.0]}

    def submit_store(self, job: TransferJob) -> None:
        for handler in self.handlers:
            handler.submit_store(job)
        self._is_store[job.job_id] = True

    def submit_load(self, job: TransferJob) -> None:
        for handler in self.handlers:
            handler.submit_load(job)
        self._is_store[job.job_id] = False

    def run_submitted(self) -> None:
        """For stepped handlers: copy what was submitted (the engine calls it after the forward)."""
        for handler in self.handlers:
            run = getattr(handler, "run_submitted", None)
            if run is not None:
                run()

    def get_finished(self) -> list[TransferResult]:
        finished: list[TransferResult] = []
        needed = len(self.handlers)
        for handler in self.handlers:
            for result in handler.get_finished():
                parts = self._pending.setdefault(result.job_id, [])
                parts.append(result)
                if len(parts) == needed:
                    del self._pending[result.job_id]
                    done = TransferResult(result.job_id, all(p.success for p in parts),
                                          sum(p.num_bytes for p in parts), max(p.seconds for p in parts))
                    finished.append(done)
                    totals = self.totals[self._is_store.pop(result.job_id)]
                    totals[0] += done.num_bytes
                    totals[1] += done.seconds
        return finished

    def wait(self, job_ids: Iterable[JobId]) -> None:
        ids = tuple(job_ids)
        for handler in self.handlers:
            handler.wait(ids)

    def wait_all(self) -> None:
        for handler in self.handlers:
            handler.wait_all()

    @property
    def unreported_jobs(self) -> int:
        """Jobs submitted whose result get_finished has not yet handed out."""
        return len(self._is_store)

    def pending_store_source_blocks(self) -> frozenset[BlockId]:
        return frozenset().union(*(h.pending_store_source_blocks() for h in self.handlers))

    def stats(self) -> HandlerStats:
        return self.handlers[0].stats()

    def shutdown(self) -> None:
        for handler in self.handlers:
            handler.shutdown()


TRANSFER_KINDS = ("auto", "threaded", "cuda", "stepped")


def make_handler(regions: Sequence[BlockRegion], block_size: int, num_cpu_chunks: int, blocks_per_chunk: int,
                 transfer: str = "auto", completion_steps: int = 1) -> FanOutHandler:
    """The project's CUDA handler for regions on a CUDA device, the threaded CPU handler
    otherwise; ``stepped`` is the simulator's deterministic handler (copies when the engine
    calls ``run_submitted``), for replays that must repeat exactly."""
    from kvoffload.worker.cuda import CudaTransferHandler
    from kvoffload.worker.stepped import SteppedTransferHandler
    from kvoffload.worker.threaded import ThreadedCopyHandler

    if transfer not in TRANSFER_KINDS:
        raise ConfigError(f"transfer must be one of {', '.join(TRANSFER_KINDS)}, got {transfer!r}")
    kvs = [RegionKV(region, block_size, num_cpu_chunks, blocks_per_chunk) for region in regions]
    if transfer == "auto":
        transfer = "cuda" if kvs and kvs[0].is_cuda else "threaded"
    factory: Callable[[KVCache], TransferHandler] = {
        "cuda": CudaTransferHandler,
        "threaded": ThreadedCopyHandler,
        "stepped": lambda kv: SteppedTransferHandler(kv, completion_steps),
    }[transfer]
    return FanOutHandler([factory(kv) for kv in kvs])
