"""bench_transfer: every benchmark method of TransferCopy runs once on the CPU, and the copies
it times move the bytes they claim to move.

CUDA parameters are n/a without a GPU: setup raises NotImplementedError, which asv records as n/a.
"""

from __future__ import annotations

import pytest
import torch

DIRECTIONS = ["store", "load"]


@pytest.fixture(scope="module")
def module(suite):
    return suite("bench_transfer")


@pytest.fixture
def bench(module, request):
    created = []

    def make(device: str, direction: str):
        instance = module.TransferCopy()
        instance.setup(device, direction)
        created.append((instance, device, direction))
        return instance

    yield make
    for instance, device, direction in created:
        instance.teardown(device, direction)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_every_method_runs_once_on_the_cpu(module, bench, methods_of, direction):
    methods = methods_of(module.TransferCopy)
    assert methods == ["time_contiguous_torch_copy", "time_handler_copy", "time_plain_torch_copy",
                       "track_handler_slowdown"]
    b = bench("cpu", direction)
    for method in methods:
        if method.startswith("track_"):
            continue
        assert getattr(b, method)("cpu", direction) is None
    handler_s, plain_s = b.median_seconds(rounds=3)  # the track's body, with few rounds
    assert handler_s > 0 and plain_s > 0


def test_the_track_returns_a_positive_finite_ratio(bench):
    b = bench("cpu", "store")
    ratio = b.track_handler_slowdown("cpu", "store")
    assert isinstance(ratio, float) and 0 < ratio < float("inf")


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_the_handler_moves_the_job_bytes_each_call(bench, direction):
    """Each call submits a fresh job id (a NamedTuple's _replace) and copies exactly the job's blocks."""
    b = bench("cpu", direction)
    b.handler_copy()
    b.handler_copy()  # a second job: a reused job id would be refused by the handler
    n = len(b.template.chunk_slots)
    gpu_blocks = b.kv.gpu[0: 2 * n: 2]
    tier_rows = b.kv.tier_blocks[n: 2 * n]
    expected = 1 if direction == "store" else 2  # setup fills the GPU with 1s and the tier with 2s
    assert torch.equal(gpu_blocks, tier_rows)
    assert bool((gpu_blocks == expected).all())
    untouched = b.kv.gpu[1: 2 * n: 2]  # odd GPU blocks are not in the job
    assert bool((untouched == 1).all())


def test_cuda_parameters_are_not_applicable_without_a_gpu(module):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(NotImplementedError):
        module.TransferCopy().setup("cuda", "store")
