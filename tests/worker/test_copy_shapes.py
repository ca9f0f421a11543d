"""The CPU copier moves each job in one copy call, and every shape of job lands byte for byte.

A job's rows fall into one of five shapes (both sides one run; destination consecutive; source
consecutive; both scattered with few runs; both scattered with many). Each shape is checked in
both directions against a row-by-row model of the copy, and the number of numpy copy calls the
copier made is counted: one per job except where both sides are scattered.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.core.types import TransferKind
from kvoffload.worker.copy import MAX_SLICED_RUNS, CpuBlockCopier, plan_copy

from .conftest import JobMaker, make_kv


def _filled(kv) -> None:
    """Every row of both tiers holds different bytes (GPU rows even-tagged, tier rows odd)."""
    gpu, tier = kv.gpu.numpy(), kv.tier_blocks.numpy()
    gpu[...] = (np.arange(gpu.size, dtype=np.int64).reshape(gpu.shape) * 3 % 251).astype(np.uint8)
    tier[...] = (np.arange(tier.size, dtype=np.int64).reshape(tier.shape) * 5 % 241 + 7).astype(np.uint8)


def _copy_and_model(kv, job, kind):
    """Run the copier on ``job``; return (copier, tiers after, tiers as the row-by-row model says)."""
    _filled(kv)
    gpu, tier = kv.gpu.numpy().copy(), kv.tier_blocks.numpy().copy()
    plan = plan_copy(kv, job, kind)
    for g, t in zip(plan.gpu_rows, plan.tier_rows, strict=True):
        if kind is TransferKind.STORE:
            tier[t] = kv.gpu.numpy()[g]
        else:
            gpu[g] = kv.tier_blocks.numpy()[t]
    copier = CpuBlockCopier(kv)
    copier.copy(plan)
    return copier, (kv.gpu.numpy(), kv.tier_blocks.numpy()), (gpu, tier)


# (gpu blocks, chunk slots) with bpc 1, by shape; the expected number of copy calls
SHAPES = {
    "one run": (([4, 5, 6, 7], [2, 3, 4, 5]), 1),
    "gpu scattered, tier consecutive": (([0, 2, 4, 6, 8, 10, 12, 14], [8, 9, 10, 11, 12, 13, 14, 15]), 1),
    "gpu consecutive, tier scattered": (([3, 4, 5, 6, 7, 8, 9, 10], [15, 1, 7, 3, 11, 0, 5, 9]), 1),
    "both scattered, two runs": (([1, 2, 20, 21], [5, 6, 0, 1]), 2),
    "both scattered, many runs": (([30, 1, 17, 9, 25, 3, 12, 6], [15, 1, 7, 3, 11, 0, 5, 9]), 2),
}


@pytest.mark.parametrize("kind", [TransferKind.STORE, TransferKind.LOAD], ids=["store", "load"])
@pytest.mark.parametrize("shape", SHAPES)
def test_each_job_shape_is_copied_exactly_in_the_promised_number_of_calls(shape, kind):
    (gpu_blocks, slots), calls = SHAPES[shape]
    kv = make_kv(blocks_per_chunk=1)
    jobs = JobMaker()
    job = jobs.store(gpu_blocks, slots) if kind is TransferKind.STORE else jobs.load(gpu_blocks, slots)
    copier, actual, expected = _copy_and_model(kv, job, kind)
    assert np.array_equal(actual[0], expected[0]) and np.array_equal(actual[1], expected[1])
    assert copier.copy_calls == calls


def test_scattered_blocks_into_whole_chunks_are_one_gather():
    """The common store: chunks of 4 from scattered GPU blocks into consecutive slots."""
    kv = make_kv(blocks_per_chunk=4)
    job = JobMaker().store([9, 3, 27, 14, 0, 31, 8, 2], chunk_slots=[6, 7])
    copier, actual, expected = _copy_and_model(kv, job, TransferKind.STORE)
    assert np.array_equal(actual[1], expected[1])
    assert copier.copy_calls == 1


def test_more_scattered_runs_than_the_slice_limit_still_take_two_calls():
    blocks = list(range(1, 2 * (MAX_SLICED_RUNS + 4), 2))[: MAX_SLICED_RUNS + 4]
    slots = list(range(MAX_SLICED_RUNS + 4))[::-1]
    job = JobMaker().load(blocks, slots)
    copier, actual, expected = _copy_and_model(make_kv(), job, TransferKind.LOAD)
    assert np.array_equal(actual[0], expected[0])
    assert copier.copy_calls == 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), bpc=st.sampled_from([1, 2, 4]), is_store=st.booleans())
def test_any_valid_job_lands_like_the_row_by_row_model(data, bpc, is_store):
    kv = make_kv(blocks_per_chunk=bpc)
    num_slots = data.draw(st.integers(1, 4))
    slots = data.draw(st.lists(st.integers(0, kv.num_cpu_chunks - 1), min_size=num_slots,
                               max_size=num_slots, unique=True))
    skip = 0 if is_store else data.draw(st.integers(0, bpc - 1))
    count = num_slots * bpc - skip
    # stores may read a GPU block twice; loads never write one twice
    gpu_rows = st.integers(0, kv.num_gpu_blocks - 1)
    gpu_blocks = data.draw(st.lists(gpu_rows, min_size=count, max_size=count, unique=not is_store))
    jobs = JobMaker()
    kind = TransferKind.STORE if is_store else TransferKind.LOAD
    job = jobs.store(gpu_blocks, slots) if is_store else jobs.load(gpu_blocks, slots, skip_blocks=skip)
    _, actual, expected = _copy_and_model(kv, job, kind)
    assert np.array_equal(actual[0], expected[0])
    assert np.array_equal(actual[1], expected[1])


def test_a_long_prompts_store_of_300_blocks_lands_whole():
    """A 4,800-token prompt in 16-token blocks: one store of 75 chunks of 4 blocks, the GPU blocks
    in reverse order (scattered), lands byte for byte."""
    from kvoffload.worker.kv import KVCache

    from .conftest import SLOT_BYTES

    kv = KVCache(num_gpu_blocks=320, block_size=16, num_cpu_chunks=80, blocks_per_chunk=4, slot_bytes=SLOT_BYTES)
    job = JobMaker().store(list(range(300, 0, -1)), chunk_slots=list(range(75)))
    copier, actual, expected = _copy_and_model(kv, job, TransferKind.STORE)
    assert np.array_equal(actual[1], expected[1])
