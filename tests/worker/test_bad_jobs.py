"""Malformed jobs are refused at submission with a message naming the job and the bad value.

A refused job is never queued: nothing is copied, nothing is reported, no block is pending.
"""

from __future__ import annotations


import pytest

from kvoffload.core.types import TransferKind
from kvoffload.worker import TransferJobError
from kvoffload.worker.copy import plan_copy


def _assert_refused(handler, submit, job, message: str) -> None:
    with pytest.raises(TransferJobError, match=message) as refused:
        submit(job)
    assert f"job {job.job_id}" in str(refused.value)
    handler.wait_all()
    assert handler.get_finished() == []
    assert handler.pending_store_source_blocks() == frozenset()


def test_gpu_block_out_of_range(any_handler, kv, jobs):
    """Block 32 of a 32-block cache (and -1) would index past the tensor or wrap around."""
    handler = any_handler(kv)
    _assert_refused(
        handler,
        handler.submit_store,
        jobs.store([32], chunk_slots=[0]),
        "gpu block id 32 is out of range",
    )
    _assert_refused(
        handler,
        handler.submit_load,
        jobs.load([-1], chunk_slots=[0]),
        "gpu block id -1 is out of range",
    )


def test_chunk_slot_out_of_range(any_handler, kv, jobs):
    handler = any_handler(kv)
    _assert_refused(
        handler,
        handler.submit_store,
        jobs.store([1, 2], chunk_slots=[3, 16]),
        "chunk slot 16 is out of range",
    )


def test_wrong_block_count_for_the_chunks(any_handler, kv_factory, jobs):
    """Two chunks of four blocks, one skipped, need seven GPU blocks: six is refused."""
    handler = any_handler(kv_factory(blocks_per_chunk=4))
    job = jobs.load([1, 2, 3, 4, 5, 6], chunk_slots=[0, 1], skip_blocks=1)
    _assert_refused(handler, handler.submit_load, job, "lists 6 gpu blocks .* = 7")


def test_a_job_id_submitted_twice(any_handler, kv, jobs):
    """Reusing an id would make completions ambiguous: the second submission is refused."""
    handler = any_handler(kv)
    first = jobs.store([1], chunk_slots=[0])
    handler.submit_store(first)
    handler.wait_all()
    handler.get_finished()

    again = first._replace(gpu_block_ids=(2,), chunk_slots=(1,))
    _assert_refused(handler, handler.submit_store, again, "already submitted")
    assert not handler.kv.tier_blocks[1].any()


def test_kind_and_method_must_agree(any_handler, kv, jobs):
    handler = any_handler(kv)
    _assert_refused(
        handler, handler.submit_load, jobs.store([1], chunk_slots=[0]), "submitted as a load"
    )


def test_stores_never_skip_and_loads_skip_less_than_a_chunk(any_handler, kv_factory, jobs):
    handler = any_handler(kv_factory(blocks_per_chunk=2))
    store = jobs.store([1], chunk_slots=[0])._replace(skip_blocks=1)
    _assert_refused(handler, handler.submit_store, store, "store with skip_blocks=1")
    _assert_refused(
        handler,
        handler.submit_load,
        jobs.load([], chunk_slots=[0], skip_blocks=2),
        "skip_blocks=2 is outside",
    )


def test_two_copies_into_one_destination_are_refused(any_handler, kv, jobs):
    """A store writing a chunk slot twice, or a load writing a GPU block twice: no right answer."""
    handler = any_handler(kv)
    _assert_refused(
        handler,
        handler.submit_store,
        jobs.store([1, 2], chunk_slots=[4, 4]),
        "writes chunk slot 4 twice",
    )
    _assert_refused(
        handler,
        handler.submit_load,
        jobs.load([3, 3], chunk_slots=[1, 2]),
        "writes gpu block 3 twice",
    )


def test_a_job_without_chunks_is_refused(kv, jobs):
    with pytest.raises(TransferJobError, match="has no chunk slots"):
        plan_copy(kv, jobs.store([], chunk_slots=[]), TransferKind.STORE)


def test_rows_pair_gpu_blocks_with_chunk_sub_blocks_in_order(kv_factory, jobs):
    """The copy.py docstring example: slots (7, 2), four blocks a chunk, first block skipped."""
    kv = kv_factory(blocks_per_chunk=4)
    job = jobs.load([10, 11, 12, 3, 4, 5, 9], chunk_slots=[7, 2], skip_blocks=1)

    plan = plan_copy(kv, job, TransferKind.LOAD)

    assert plan.tier_rows == (29, 30, 31, 8, 9, 10, 11)
    # runs consecutive on both sides: 10-12 <- 29-31, 3-5 <- 8-10, 9 <- 11
    assert plan.runs == ((10, 29, 3), (3, 8, 3), (9, 11, 1))
    assert plan.num_bytes == 7 * kv.block_bytes
