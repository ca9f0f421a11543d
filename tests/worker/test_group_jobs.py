"""A hybrid model's jobs (docs/engine.md, "Hybrid models"): chunks of several KV cache groups in
one job, each chunk skipping the leading sub-blocks a sliding window already let go (vLLM's
``GPULoadStoreSpec`` with ``group_sizes`` and ``block_indices``)."""

from __future__ import annotations

import pytest

from kvoffload.core.types import TransferJob, TransferKind
from kvoffload.worker.copy import TransferJobError, plan_copy

from .conftest import make_kv


def test_each_chunk_skips_its_own_leading_sub_blocks():
    """Chunks in slots 3 (group 0, whole) and 5 (group 1, its first sub-block behind the window),
    4 blocks a chunk: the 7 GPU blocks pair with tier rows 12-15 and 21-23."""
    kv = make_kv(blocks_per_chunk=4)
    job = TransferJob(1, "A", TransferKind.STORE, (1, 2, 3, 4, 9, 10, 11), (3, 5), (0, 2),
                      chunk_groups=(0, 1), chunk_skips=(0, 1))
    plan = plan_copy(kv, job, TransferKind.STORE)
    assert plan.tier_rows == (12, 13, 14, 15, 21, 22, 23)
    assert job.skips() == (0, 1)


def test_skips_that_do_not_add_up_are_refused_before_anything_is_queued():
    kv = make_kv(blocks_per_chunk=4)
    job = TransferJob(2, "A", TransferKind.LOAD, (1, 2, 3, 4, 9, 10, 11, 12), (3, 5), (0, 2),
                      chunk_groups=(0, 1), chunk_skips=(0, 1))
    with pytest.raises(TransferJobError, match="lists 8 gpu blocks"):
        plan_copy(kv, job, TransferKind.LOAD)
    with pytest.raises(TransferJobError, match="chunk_skips"):
        plan_copy(kv, job._replace(chunk_skips=(0, 4)), TransferKind.LOAD)
