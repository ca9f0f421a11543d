"""The CUDA handler's ordering decisions, checked on any machine against recording fakes.

The real device tests (test_cuda.py) need a GPU. These replace torch.cuda's streams and events
with fakes that record what the handler asked for, so the wiring (which stream waits for what,
FIFO reporting, stream reuse, unknown ids) is checked even where no GPU exists. The copies
themselves run on CPU tensors.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from kvoffload.worker import CudaTransferHandler


class FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.recorded_on = None
        self.done = False

    def record(self, stream) -> None:
        self.recorded_on = stream

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, end: "FakeEvent") -> float:
        return 2.0  # milliseconds


class FakeStream:
    def __init__(self, name: str = "transfer", device=None) -> None:
        self.name = name
        self.waits: list[object] = []

    def wait_stream(self, other: "FakeStream") -> None:
        self.waits.append(other)

    def wait_event(self, event: FakeEvent) -> None:
        self.waits.append(event)


class FakeCudaKV:
    """A CPU KVCache that claims to live on a CUDA device with a pinned tier."""

    def __init__(self, kv) -> None:
        self._kv = kv
        self.is_cuda = True
        self.device = torch.device("cuda")
        self.cpu = type("Pinned", (), {"is_pinned": lambda self: True})()

    def __getattr__(self, name):
        return getattr(self._kv, name)


@pytest.fixture
def compute_stream(monkeypatch):
    compute = FakeStream("compute")
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    return compute


@pytest.fixture
def handler(compute_stream, kv):
    return CudaTransferHandler(FakeCudaKV(kv))


def _finish_all(handler) -> None:
    for transfer in handler._by_job.values():
        transfer.end.done = True


def test_every_transfer_waits_for_the_compute_stream_then_its_predecessor(
    handler, compute_stream, jobs
):
    """Store 2 waits for the compute stream (K12) and for store 1's end event (FIFO)."""
    first, second = jobs.store([1], chunk_slots=[0]), jobs.store([2], chunk_slots=[1])
    load = jobs.load([3], chunk_slots=[5])
    handler.submit_store(first)
    handler.submit_store(second)
    handler.submit_load(load)

    t1, t2, t3 = (handler._by_job[j.job_id] for j in (first, second, load))
    assert t1.stream.waits == [compute_stream]
    assert t2.stream.waits == [compute_stream, t1.end]
    assert t3.stream.waits == [compute_stream], "a load does not queue behind stores"
    assert t2.end.recorded_on is t2.stream


def test_completions_are_reported_from_the_head_only_and_streams_are_reused(handler, kv, jobs):
    """A finished second store waits for the first to be reported: FIFO per direction."""
    first, second = jobs.store([1], chunk_slots=[0]), jobs.store([2], chunk_slots=[1])
    handler.submit_store(first)
    handler.submit_store(second)
    handler._by_job[second.job_id].end.done = True

    assert handler.get_finished() == []
    assert handler.pending_store_source_blocks() == frozenset({1, 2})

    _finish_all(handler)
    results = handler.get_finished()
    assert [r.job_id for r in results] == [first.job_id, second.job_id]
    assert results[0].seconds == pytest.approx(0.002)
    assert results[0].num_bytes == kv.block_bytes
    assert len(handler._idle_streams) == 2


def test_wait_synchronizes_known_ids_and_counts_the_rest(handler, jobs):
    store = jobs.store([1], chunk_slots=[0])
    handler.submit_store(store)

    handler.wait([store.job_id, 404])

    assert handler._by_job[store.job_id].end.done
    assert handler.stats().unknown_wait_ids == 1
    handler.wait([store.job_id])
    assert handler.stats().already_done_wait_ids == 1


def test_a_drain_synchronizes_the_last_transfer_of_each_busy_direction(handler, jobs):
    """``wait_all`` (and so ``shutdown``) waits for each direction's newest transfer, which ends
    after the ones before it on that FIFO; a direction with nothing in flight is passed over."""
    first, second = jobs.store([1], chunk_slots=[0]), jobs.store([2], chunk_slots=[1])
    handler.submit_store(first)
    handler.submit_store(second)
    handler.wait_all()  # no load in flight
    assert [handler._by_job[j.job_id].end.done for j in (first, second)] == [False, True]
    load = jobs.load([3], chunk_slots=[5])
    handler.submit_load(load)
    handler.shutdown()
    assert handler._by_job[load.job_id].end.done
