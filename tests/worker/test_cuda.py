"""The CUDA handler: byte-exact round trips and stream ordering against the compute stream.

Skipped without a CUDA device. The ordering tests queue slow work on the compute stream just
before submitting, so a transfer stream that did not wait for it would copy too early.
"""

from __future__ import annotations

import pytest
import torch

from kvoffload.core.fixes import Fixes
from kvoffload.core.types import StepPlan

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SPIN_CYCLES = 200_000_000  # ~0.1 s of GPU time on current parts: far longer than a submit takes


@pytest.fixture
def cuda_kv(kv_factory):
    return kv_factory(blocks_per_chunk=4, slot_bytes=4096, device="cuda")


@pytest.fixture
def handler(cuda_kv):
    from kvoffload.worker import CudaTransferHandler

    handler = CudaTransferHandler(cuda_kv)
    yield handler
    handler.shutdown()


def test_the_host_tier_is_pinned(cuda_kv):
    assert cuda_kv.cpu.is_pinned()
    assert cuda_kv.gpu.is_cuda


@pytest.mark.parametrize("skip", [0, 2])
def test_store_then_load_into_other_blocks_is_byte_exact(handler, cuda_kv, jobs, paint, skip):
    kv = cuda_kv
    sources = [3, 9, 4, 20, 21, 22, 5, 30]
    originals = [paint(kv, b, tag=b) for b in sources]
    torch.cuda.synchronize()

    store = jobs.store(sources, chunk_slots=[6, 1])
    handler.submit_store(store)
    handler.wait([store.job_id])
    targets = [10, 11, 12, 13, 1, 2, 7, 8][skip:]
    load = jobs.load(targets, chunk_slots=[6, 1], skip_blocks=skip)
    handler.submit_load(load)
    handler.wait([load.job_id])

    for target, original in zip(targets, originals[skip:], strict=True):
        assert torch.equal(kv.gpu[target].cpu(), original)
    results = handler.get_finished()
    assert [r.job_id for r in results] == [store.job_id, load.job_id]
    assert results[0].num_bytes == 8 * kv.block_bytes and results[0].seconds > 0


def test_a_store_sees_kv_written_by_kernels_queued_before_it(handler, cuda_kv, jobs):
    """Read-after-write across streams (K12): the fill is still queued when the store submits."""
    kv = cuda_kv
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN_CYCLES)  # the compute stream is busy ...
    kv.gpu[5].fill_(77)  # ... so this write is still pending at submit time
    store = jobs.store([5, 6, 7, 8], chunk_slots=[2])

    handler.submit_store(store)
    handler.wait([store.job_id])

    assert torch.all(kv.tier_blocks[8] == 77)


def test_a_load_does_not_overwrite_a_block_an_earlier_kernel_still_reads(handler, cuda_kv, jobs):
    """Write-after-read across streams (K12): a queued read of block 5 sees the old bytes."""
    kv = cuda_kv
    kv.gpu[5].fill_(11)
    kv.tier_blocks[8].fill_(99)
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN_CYCLES)
    snapshot = kv.gpu[5].clone()  # queued behind the spin on the compute stream
    load = jobs.load([5, 6, 7, 8], chunk_slots=[2])

    handler.submit_load(load)
    handler.wait([load.job_id])
    torch.cuda.synchronize()

    assert torch.all(snapshot == 11)
    assert torch.all(kv.gpu[5] == 99)


def test_completions_are_polled_in_fifo_order_per_direction(handler, cuda_kv, jobs):
    stores = [
        jobs.store([4 * i + 1, 4 * i + 2, 4 * i + 3, 4 * i + 4], chunk_slots=[i]) for i in range(5)
    ]
    for store in stores:
        handler.submit_store(store)
    handler.wait_all()

    assert [r.job_id for r in handler.get_finished()] == [s.job_id for s in stores]
    assert handler.pending_store_source_blocks() == frozenset()


def test_unknown_ids_are_ignored_and_counted(handler):
    handler.wait([12345])

    assert handler.stats().unknown_wait_ids == 1


def test_the_worker_fence_holds_on_cuda(handler, cuda_kv, jobs, paint):
    """With the fix, the flushed final store copies before the new owner's forward overwrites it."""
    from kvoffload.worker import WorkerConnector

    kv = cuda_kv
    worker = WorkerConnector(handler, Fixes())
    r_kv = [paint(kv, b, tag=b) for b in (5, 6, 7, 8)]
    final_store = jobs.store([5, 6, 7, 8], chunk_slots=[3])
    plan = StepPlan(store_jobs=(final_store,), jobs_to_flush=frozenset({final_store.job_id}))

    worker.handle_preemptions(plan)
    kv.gpu[5].fill_(1)  # the new owner's forward

    torch.cuda.synchronize()
    assert torch.equal(kv.tier_blocks[12], r_kv[0])
