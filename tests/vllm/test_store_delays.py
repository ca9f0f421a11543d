"""Store submission delays in the vLLM engine, counted at the transfer handler
(``kvoffload.vllm.observe.StoreSubmitDelays``) on a hand-computed case. No vLLM needed."""

from __future__ import annotations

from types import SimpleNamespace

from kvoffload.core.types import TransferJob, TransferKind
from kvoffload.engine.record import RunRecord
from kvoffload.metrics import compute_metrics
from kvoffload.vllm.observe import StoreSubmitDelays


class Handler:
    def __init__(self):
        self.submitted = []

    def submit_store(self, job):
        self.submitted.append(job.job_id)


def schedule(new_tables=(), appended=()):
    """A scheduler output with new requests' tables and running requests' appended blocks."""
    return SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(block_ids=(tuple(t),)) for t in new_tables],
                           scheduled_cached_reqs=SimpleNamespace(new_block_ids=[(tuple(a),) for a in appended]))


def store(job_id, blocks, chunks):
    return TransferJob(job_id, "", TransferKind.STORE, tuple(blocks), tuple(range(chunks)), ())


def test_a_chunk_counts_from_the_step_its_last_slot_was_written():
    record, handler = RunRecord(), Handler()
    delays = StoreSubmitDelays(block_size=4, record=record)
    delays.attach(handler)
    table = [10, 11, 12, 13]
    delays.allocated(schedule(new_tables=[table]))
    delays.written(2, table, 0, 6)  # block 10 full at step 2; block 11 half written
    delays.written(3, table, 6, 16)  # blocks 11, 12, 13 full at step 3
    delays.step = 5
    handler.submit_store(store(1, [10, 11, 12, 13], chunks=2))  # chunks end in blocks 11 and 13
    assert record.store_submit_delays == [2, 2]
    assert handler.submitted == [1]  # the real submission still happens

    delays.written(6, table, 0, 3)  # no block's last slot: nothing newly full
    delays.step = 9
    handler.submit_store(store(2, [10, 11], chunks=1))
    assert record.store_submit_delays == [2, 2, 6]  # block 11 is still full since step 3

    # Handed to a request again (a prefix-cache hit): what the old owner wrote no longer counts;
    # the chunk counts from the step that handed it out and planned its store, as the simulator's
    # observer counts a chunk it saw no write of from the plan's step.
    delays.allocated(schedule(appended=[[11]]))
    delays.step = 10
    handler.submit_store(store(3, [10, 11], chunks=1))
    assert record.store_submit_delays == [2, 2, 6, 1]
    metrics = compute_metrics(record)
    assert (metrics["store_submit_delay_steps_p50"], metrics["store_submit_delay_steps_p99"]) == (2, 6)
