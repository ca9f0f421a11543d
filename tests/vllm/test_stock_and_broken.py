"""vLLM's own connector and a deliberately broken one, under the same KV oracle.

The stock OffloadingConnector of vLLM 0.32 runs with its real scheduler side (its
OffloadingConnectorScheduler and CPUOffloadingManager) and a torch-copy worker spec. The oracle
finds no poisoned load on the small workloads; that is the expected verdict for a release with
all three fixes (PRs #48596, #49671, #54288), asserted so that a regression shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import OffloadingConnectorScheduler  # noqa: E402

from kvoffload.vllm.build import ConnectorLoad  # noqa: E402
from kvoffload.vllm.replay import VllmSchedulerReplay  # noqa: E402
from kvoffload.vllm.stock import HandlerOffloadingWorker  # noqa: E402

WORKLOADS = [("shared-prefix-small", "sync"), ("multi-turn-small", "sync"), ("spec-decode-small", "sync"),
             ("spec-decode-small", "async")]


@pytest.mark.parametrize("name, scheduling", WORKLOADS)
def test_vllms_stock_connector_loads_only_correct_kv(small_workload, name, scheduling):
    workload = small_workload(name, scheduling=scheduling)
    replay = VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad("stock"))
    assert isinstance(replay.scheduler.connector.connector_scheduler, OffloadingConnectorScheduler)
    assert isinstance(replay.worker.connector_worker.worker, HandlerOffloadingWorker)
    record = replay.run()
    assert record.crash is None and not record.stuck_requests and not record.leaked_requests
    assert replay.checked_load_tokens == replay.ledger.loaded_tokens > 0
    assert record.poisoned == []


@pytest.fixture
def broken_connector_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    return "broken_connector:WatermarkOffConnector"


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_a_connector_storing_the_unwritten_final_slot_shows_poisoned_loads(small_workload, broken_connector_on_path,
                                                                           scheduling):
    """The oracle sees vLLM's KV: a connector that stores a finished request's final token slot
    (never written by a forward; with drafts, a rejected draft's KV) is caught when the next turn
    loads that chunk. The same run with the fix on is clean (previous tests). Under async fewer
    requests show it (19 sync, 11 async on 2026-12-01): a final step that might still fall short
    is followed by one more, whose forward rewrites the slot with the true token."""
    workload = small_workload("spec-decode-small", scheduling=scheduling)
    replay = VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad(broken_connector_on_path))
    assert type(replay.scheduler.connector).__name__ == "WatermarkOffConnector"
    record = replay.run()
    assert record.crash is None
    assert len(record.poisoned) >= 10
    # The poison sits where the bug puts it: one slot (the final token's) per chunk, in a
    # continuation's loaded prefix.
    assert all(p.bad_slots == 1 for p in record.poisoned)
    assert all(workload_request(workload, p.req_id).parent is not None for p in record.poisoned)


def workload_request(workload, req_id):
    return next(spec for spec in workload.requests if spec.req_id == req_id)


def test_a_crashing_connector_stops_the_run_and_is_reported(small_workload, monkeypatch, tmp_path, capsys):
    from kvoffload.cli import main

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    out = tmp_path / "crash.json"
    code = main(["run", "--engine", "vllm-scheduler", "--connector", "broken_connector:CrashOnFirstCompletionConnector",
                 "--workload", "shared-prefix-small", "--quiet", "--out", str(out)])
    assert code == 1
    assert "planted: completion bookkeeping broke" in capsys.readouterr().err
    import json

    result = json.loads(out.read_text())
    assert result["metrics"]["crashes"] == 1 and result["error"]["step"] > 0


def test_a_single_groups_spec_in_either_form_is_one_plain_job():
    """vLLM's ``GPULoadStoreSpec`` says one KV cache group with ``group_sizes=None`` or with one
    size (vllm/v1/kv_offload/base.py); either way the worker hands the handler the plain job: every
    chunk group 0's, a load skipping the sub-blocks of its first chunk that precede its first
    block (block index 5 of 2-block chunks: one), a store none."""
    from types import SimpleNamespace

    from kvoffload.core.types import TransferKind

    jobs = []
    worker = HandlerOffloadingWorker(SimpleNamespace(submit_store=jobs.append, submit_load=jobs.append), 2)
    gpu, cpu = [11, 12, 13], SimpleNamespace(block_ids=[4, 9])
    for sizes, indices in ((None, None), (None, [5]), ([3], [5])):
        spec = SimpleNamespace(block_ids=gpu, group_sizes=sizes, block_indices=indices)
        worker.submit_load(1, cpu, spec)
        worker.submit_store(2, spec, cpu)
    shapes = [(job.kind, job.gpu_block_ids, job.chunk_slots, job.skip_blocks, job.chunk_groups) for job in jobs]
    load, store = TransferKind.LOAD, TransferKind.STORE
    assert shapes == [(load, (11, 12, 13), (4, 9), 0, ()), (store, (11, 12, 13), (4, 9), 0, ()),
                      (load, (11, 12, 13), (4, 9), 1, ()), (store, (11, 12, 13), (4, 9), 0, ()),
                      (load, (11, 12, 13), (4, 9), 1, ()), (store, (11, 12, 13), (4, 9), 0, ())]
