"""vLLM's SimpleCPUOffloadConnector in the loop: its own scheduler-side manager and worker
bookkeeping on vLLM's scheduler, only its GPU calls on the CPU stand-ins (``kvoffload.vllm.standins``).

Every load it makes is checked by the KV content oracle; the stand-ins are in place while it
runs and gone after; and a connector whose copies go unfenced is caught (its pins removed, a
store copies a block the scheduler already handed on: a verdict, not a silent pass).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.vllm.build import ConnectorLoad  # noqa: E402
from kvoffload.vllm.replay import VllmSchedulerReplay  # noqa: E402


@pytest.mark.parametrize("source", ["simple-cpu", "simple-cpu-lazy"])
def test_simple_cpu_loads_only_correct_kv_and_every_load_is_checked(small_workload, source):
    import vllm.v1.simple_kv_offload.worker as simple_worker

    workload = small_workload("multi-turn-small", scheduling="sync")
    replay = VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad(source))
    manager = replay.scheduler.connector.scheduler_manager
    assert manager._lazy_mode == (source == "simple-cpu-lazy")
    timeline = replay.worker.kvoffload_timeline
    assert simple_worker.torch.cuda.Stream.priority_range() == (0, 0)  # the stand-in, while it runs
    record = replay.run()
    assert (record.crash, record.poisoned, record.stuck_requests, record.leaked_requests) == (None, [], (), ())
    assert replay.checked_load_tokens == replay.ledger.loaded_tokens > 0
    assert timeline.copies_landed > 0 and timeline.pinned_bytes > 0
    assert simple_worker.torch is __import__("torch")  # taken out again by close()


def test_a_connector_whose_copies_are_unpinned_is_caught(small_workload, monkeypatch):
    """SimpleCPU pins (touches) the GPU blocks its copies read; without the pins a finished
    request's blocks are handed out and evicted while their store is in flight, and the store's
    completion finds a block with no hash: vLLM's assert, reported with the manager's frame."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    workload = small_workload("multi-turn-small", scheduling="sync")
    record = VllmSchedulerReplay(workload.requests, workload.engine,
                                 ConnectorLoad("foreign_connectors:UnpinnedSimpleCPU")).run()
    assert record.crash_type == "AssertionError"
    assert record.crash.startswith("AssertionError: assert primary_hash is not None (vllm/v1/simple_kv_offload/manager.py")
    assert "in _process_store_completion" in record.crash_frames[-1]


@pytest.mark.parametrize("source", ["simple-cpu", "simple-cpu-lazy"])
def test_simple_cpus_tier_holds_cpu_chunks_chunks_of_blocks_per_chunk_blocks(source):
    """The tier's size is given in bytes (``cpu_bytes_to_use``): ``cpu_chunks`` chunks of
    ``blocks_per_chunk`` GPU blocks each, so the manager's CPU pool holds their product in blocks,
    whatever the split between the two settings (docs/connectors.md)."""
    from kvoffload.engine.requests import RequestSpec
    from kvoffload.gates.story import TINY, tokens

    sizes = {}
    for cpu_chunks, blocks_per_chunk in ((12, 1), (6, 2), (3, 4)):
        engine = TINY.replace(cpu_chunks=cpu_chunks, blocks_per_chunk=blocks_per_chunk)
        replay = VllmSchedulerReplay([RequestSpec("A", tokens(1, 8), tokens(2, 1))], engine, ConnectorLoad(source))
        try:
            sizes[cpu_chunks, blocks_per_chunk] = replay.scheduler.connector.scheduler_manager.num_cpu_blocks
        finally:
            replay.close()
    assert sizes == {(12, 1): 12, (6, 2): 12, (3, 4): 12}
