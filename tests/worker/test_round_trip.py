"""Byte-exact round trips: store GPU blocks to the tier, load them back into other GPU blocks.

Every CPU handler, chunk sizes 1 and 4, a small and a 64 KiB slot width, scattered block ids
(many runs) and loads starting mid-chunk.
"""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("bpc", [1, 4])
@pytest.mark.parametrize("slot_bytes", [16, 65536])
def test_store_then_load_into_other_blocks_is_byte_exact(
    any_handler, settle_copies, kv_factory, jobs, paint, bpc, slot_bytes
):
    """Two chunks stored from scattered blocks come back bit for bit into a fresh set of blocks."""
    kv = kv_factory(blocks_per_chunk=bpc, slot_bytes=slot_bytes)
    handler = any_handler(kv)
    sources = [3, 9, 4, 20, 21, 22, 5, 30][: 2 * bpc]
    originals = {block: paint(kv, block, tag=block) for block in sources}

    handler.submit_store(jobs.store(sources, chunk_slots=[6, 1]))
    settle_copies(handler)
    targets = [10, 11, 12, 13, 1, 2, 7, 8][: 2 * bpc]
    handler.submit_load(jobs.load(targets, chunk_slots=[6, 1]))
    settle_copies(handler)

    for source, target in zip(sources, targets, strict=True):
        assert torch.equal(kv.gpu[target].cpu(), originals[source]), (source, target)
    untouched = set(range(kv.num_gpu_blocks)) - set(sources) - set(targets)
    assert all(not kv.gpu[b].any() for b in untouched)


@pytest.mark.parametrize("skip", [1, 3])
def test_load_starting_mid_chunk_copies_only_the_tail_of_the_first_chunk(
    any_handler, settle_copies, kv_factory, jobs, paint, skip
):
    """A load with skip_blocks leaves the GPU prefix-hit blocks alone, fills the rest in order."""
    kv = kv_factory(blocks_per_chunk=4)
    handler = any_handler(kv)
    sources = list(range(1, 9))  # chunk slots 2 and 5, four blocks each
    originals = [paint(kv, block, tag=block) for block in sources]
    handler.submit_store(jobs.store(sources, chunk_slots=[2, 5]))
    settle_copies(handler)

    targets = list(range(16, 16 + 8 - skip))
    handler.submit_load(jobs.load(targets, chunk_slots=[2, 5], skip_blocks=skip))
    settle_copies(handler)

    for target, original in zip(targets, originals[skip:], strict=True):
        assert torch.equal(kv.gpu[target], original)
    assert not kv.gpu[16 + 8 - skip :].any()


def test_many_scattered_blocks_take_the_gather_path_and_stay_exact(
    any_handler, settle_copies, kv_factory, jobs, paint
):
    """Sixteen blocks with no two neighbours: one gather and one scatter, still byte-exact."""
    kv = kv_factory(blocks_per_chunk=4)
    handler = any_handler(kv)
    sources = list(range(31, 0, -2))  # 31, 29, ..., 1
    originals = [paint(kv, block, tag=block) for block in sources]

    handler.submit_store(jobs.store(sources, chunk_slots=[15, 0, 7, 3]))
    settle_copies(handler)
    targets = list(range(0, 32, 2))
    handler.submit_load(jobs.load(targets[1:], chunk_slots=[15, 0, 7, 3], skip_blocks=1))
    settle_copies(handler)

    for target, original in zip(targets[1:], originals[1:], strict=True):
        assert torch.equal(kv.gpu[target], original)
    assert not kv.gpu[0].any()


def test_results_report_each_job_once_with_its_bytes(any_handler, settle_copies, kv, jobs):
    """get_finished hands out every job exactly once, bytes = blocks x block bytes."""
    handler = any_handler(kv)
    store = jobs.store([1, 2], chunk_slots=[0, 1])
    load = jobs.load([5], chunk_slots=[0])
    handler.submit_store(store)
    handler.submit_load(load)
    settle_copies(handler)

    results = {r.job_id: r for r in handler.get_finished()}
    assert handler.get_finished() == []

    assert set(results) == {store.job_id, load.job_id}
    assert results[store.job_id].num_bytes == 2 * kv.block_bytes
    assert results[load.job_id].num_bytes == kv.block_bytes
    assert all(r.success and r.seconds >= 0 for r in results.values())
    assert handler.stats().jobs_finished == 2
