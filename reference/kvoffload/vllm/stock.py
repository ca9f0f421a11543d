"""vLLM's stock OffloadingConnector on a machine without a GPU: a spec whose worker copies
with the project's handlers.

``CPUOffloadingSpec.get_worker`` (``vllm/v1/kv_offload/cpu/spec.py``) refuses platforms that are
neither CUDA-alike nor XPU. The connector lets a deployment name its own spec
(``spec_name`` + ``spec_module_path`` in ``kv_connector_extra_config``, read by
``OffloadingSpecFactory``), so :class:`TorchCopyOffloadingSpec` keeps everything of the stock
spec (its scheduler-side ``CPUOffloadingManager``, chunk geometry, capacity) and replaces only the
worker: :class:`HandlerOffloadingWorker` turns each vLLM transfer into a project
``TransferJob`` and hands it to the same handlers the reference connector uses.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult as VllmTransferResult
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from kvoffload.core.types import TransferJob, TransferKind, packed_chunks
from kvoffload.vllm.compat import offload_geometry
from kvoffload.vllm.regions import BlockRegion, make_handler

SPEC_NAME = "TorchCopyOffloadingSpec"
SPEC_MODULE = __name__


class HandlerOffloadingWorker(OffloadingWorker):
    """vLLM's ``OffloadingWorker`` contract over a project transfer handler."""

    def __init__(self, handler, blocks_per_chunk: int):
        self.handler = handler
        self.blocks_per_chunk = blocks_per_chunk

    def _job(self, job_id, kind: TransferKind, gpu_spec, cpu_spec) -> TransferJob:
        """vLLM's specs as a project job. Each KV cache group's blocks fill its chunks one after
        another from sub-block ``block_indices[g] % blocks_per_chunk`` of its first chunk, the last
        chunk up to where they run out (``CpuGpuOffloadingHandler.transfer_async``,
        ``vllm/v1/kv_offload/cpu/gpu_worker.py``): one group keeps today's job; several give each
        chunk its group, leading skip and count. vLLM 0.25-0.28 store a Mamba group's blocks so,
        and a job with two of its states in it leaves one a sub-block early (docs/hybrid.md, "The
        releases")."""
        gpu = tuple(int(b) for b in gpu_spec.block_ids)
        slots = tuple(int(c) for c in cpu_spec.block_ids)
        bpc, sizes, indices = self.blocks_per_chunk, gpu_spec.group_sizes, gpu_spec.block_indices
        if sizes is None or len(sizes) <= 1:
            # The first GPU block of a load may sit mid-chunk: block_indices[0] is its index.
            skip = int(indices[0]) % bpc if kind is TransferKind.LOAD and indices is not None else 0
            return TransferJob(job_id, "", kind, gpu, slots, (), skip)
        groups, skips, counts = [], [], []
        for g, (size, index) in enumerate(zip(sizes, indices)):
            if not size:
                continue
            group_skips, group_counts = packed_chunks(int(size), int(index) % bpc, bpc)
            groups += [g] * len(group_skips)
            skips += group_skips
            counts += group_counts
        if len(groups) != len(slots):  # the worker's `assert dst_offset == num_dst_blocks`
            raise AssertionError(f"job {job_id}: its groups' blocks fill {len(groups)} chunks, {len(slots)} given")
        return TransferJob(job_id, "", kind, gpu, slots, (), chunk_groups=tuple(groups), chunk_skips=tuple(skips),
                           chunk_counts=tuple(counts))

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        self.handler.submit_store(self._job(job_id, TransferKind.STORE, src_spec, dst_spec))
        return True

    def submit_load(self, job_id, src_spec, dst_spec) -> bool:
        self.handler.submit_load(self._job(job_id, TransferKind.LOAD, dst_spec, src_spec))
        return True

    def get_finished(self) -> list[VllmTransferResult]:
        return [VllmTransferResult(job_id=r.job_id, success=r.success, transfer_size=r.num_bytes,
                                   transfer_time=r.seconds) for r in self.handler.get_finished()]

    def wait(self, job_ids: set[int]) -> None:
        self.handler.wait(job_ids)

    def copy_submitted(self) -> None:
        self.handler.run_submitted()

    def shutdown(self) -> None:
        self.handler.shutdown()


class TorchCopyOffloadingSpec(CPUOffloadingSpec):
    """The stock CPU spec with a worker that runs anywhere torch does.

    Extra options: ``transfer`` and ``completion_steps``, as for the reference connector.
    """

    def get_worker(self, kv_caches) -> OffloadingWorker:
        if getattr(self, "_handler_worker", None) is None:
            # Every group's blocks live in the same tensors (vLLM aliases the groups' layers over one
            # buffer, get_kv_cache_config_from_groups): a block is copied whole, whichever group holds it.
            regions = [BlockRegion(t.tensor, (f"tensor {i}",))
                       for i, t in enumerate(kv_caches.tensors)]
            tokens_per_block, blocks_per_chunk, num_chunks = offload_geometry(self)
            handler = make_handler(regions, tokens_per_block, num_chunks, blocks_per_chunk,
                                   self.extra_config.get("transfer", "auto"),
                                   int(self.extra_config.get("completion_steps", 1)))
            self._handler_worker = HandlerOffloadingWorker(handler, blocks_per_chunk)
        return self._handler_worker
