"""The reference connector inside vLLM 0.32: loaded by vLLM's factory in both roles, planning
from vLLM's scheduler, copying between vLLM's paged KV tensors and its host tier."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from vllm.v1.request import RequestStatus  # noqa: E402

from kvoffload.core.types import ConfigError, TransferKind  # noqa: E402
from kvoffload.engine.config import EngineConfig  # noqa: E402
from kvoffload.vllm import build, tiny_kv  # noqa: E402
from kvoffload.vllm.build import ConnectorLoad  # noqa: E402
from kvoffload.vllm.connector import ConnectorOptions, KVOffloadConnector  # noqa: E402
from kvoffload.vllm.replay import VllmSchedulerReplay  # noqa: E402


def _scheduler(engine: EngineConfig, load: ConnectorLoad):
    config = build.build_vllm_config(engine, load.transfer_config(engine, "stepped"), 512)
    return build.build_scheduler(config, build.build_kv_cache_config(config, engine))


def test_vllm_builds_our_connector_by_module_path_with_its_options():
    engine = EngineConfig(gpu_blocks=40, cpu_chunks=24, block_size=16, blocks_per_chunk=2)
    scheduler = _scheduler(engine, ConnectorLoad("reference", disabled=("aborted_watermark",)))
    connector = scheduler.connector
    assert isinstance(connector, KVOffloadConnector)
    assert connector.config.cpu_chunks == 24 and connector.config.blocks_per_chunk == 2
    assert connector.core.fixes.disabled() == ("aborted_watermark",)
    assert connector.core.manager is not None and scheduler.kv_cache_manager.block_pool.num_gpu_blocks == 40


@pytest.mark.parametrize("extra, message", [
    ({"cpu_chunks": 8, "bogus": 1}, "unknown KVOffloadConnector option 'bogus'"),
    ({"cpu_chunks": 8, "cpu_bytes_to_use": 1 << 20}, "exactly one of cpu_bytes_to_use and cpu_chunks"),
    ({}, "exactly one of cpu_bytes_to_use and cpu_chunks"),
    ({"cpu_chunks": 8, "block_size": 24}, "multiple of the GPU block size 16"),
    ({"cpu_chunks": 8, "block_size": 32, "blocks_per_chunk": 2}, "not both"),
    ({"cpu_chunks": 8, "block_size": 0}, "multiple of the GPU block size 16, got 0"),
    ({"cpu_chunks": 8, "blocks_per_chunk": 0}, "blocks_per_chunk must be a positive integer, got 0"),
    ({"cpu_chunks": 8, "blocks_per_chunk": True}, "blocks_per_chunk must be a positive integer, got True"),
    ({"cpu_chunks": 8, "preset": "vllm-9"}, "unknown preset 'vllm-9'"),
    ({"cpu_chunks": 8, "disable_fixes": ["nope"]}, "unknown fix 'nope'"),
    ({"cpu_chunks": 8, "transfer": "dma"}, "transfer must be one of"),
])
def test_bad_options_are_named(extra, message):
    with pytest.raises(ConfigError, match=message):
        ConnectorOptions.parse(extra, gpu_block_size=16)


def test_capacity_in_bytes_becomes_chunks_and_block_size_becomes_blocks_per_chunk():
    options = ConnectorOptions.parse({"cpu_bytes_to_use": 10 * 2 * 16384 + 5, "block_size": 32}, gpu_block_size=16)
    assert options.blocks_per_chunk == 2
    assert options.num_chunks(bytes_per_block=16384) == 10
    assert options.offload_prompt_only is True  # vLLM's default


@pytest.mark.parametrize("gpu_block_size", [1, 16])
def test_a_chunk_of_one_gpu_block_in_tokens_is_one_block_per_chunk(gpu_block_size):
    """``block_size`` in tokens may be the GPU block size itself, whatever that is (vLLM allows
    a block of one token: ``CacheConfig.block_size`` only has to be > 0, vllm/config/cache.py): one
    block per chunk, as ``blocks_per_chunk`` would say."""
    options = ConnectorOptions.parse({"cpu_chunks": 8, "block_size": gpu_block_size}, gpu_block_size=gpu_block_size)
    assert options.blocks_per_chunk == 1 == ConnectorOptions.parse({"cpu_chunks": 8}, gpu_block_size).blocks_per_chunk


def test_the_shipped_model_config_matches_the_kv_shape_the_harness_assumes():
    config = json.loads((build.TINY_MODEL_DIR / "config.json").read_text())
    assert config["num_hidden_layers"] == tiny_kv.NUM_LAYERS
    assert config["num_key_value_heads"] == tiny_kv.NUM_KV_HEADS
    assert config["head_dim"] == tiny_kv.HEAD_SIZE
    assert config["vocab_size"] == 32_000  # the workloads' vocabulary (kvoffload.workloads.tokens)


@pytest.mark.parametrize("name, scheduling", [("shared-prefix-small", "sync"), ("multi-turn-small", "sync"),
                                              ("spec-decode-small", "sync"), ("spec-decode-small", "async")])
def test_stores_and_loads_through_vllms_block_manager_and_every_loaded_slot_holds_the_right_kv(
        small_workload, name, scheduling):
    workload = small_workload(name, scheduling=scheduling)
    replay = VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad("reference"))
    record = replay.run()
    stats = replay.scheduler.connector.core.stats
    assert record.crash is None and not record.stuck_requests and not record.leaked_requests
    assert record.finished_requests == record.requests == len(workload.requests)
    assert stats.store_jobs > 0 and stats.load_jobs > 0
    assert record.connector_hit_tokens_admitted > 0
    assert replay.checked_load_tokens == replay.ledger.loaded_tokens > 0  # every loaded slot was checked
    assert record.poisoned == []
    assert record.lifecycle_violations == 0


def test_the_threaded_handler_copies_in_the_background_with_the_same_verdict(small_workload):
    workload = small_workload("multi-turn-small")
    replay = VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad("reference"), transfer="threaded")
    record = replay.run()
    assert record.crash is None and not record.leaked_requests
    assert replay.checked_load_tokens > 0
    assert record.poisoned == []


def test_a_run_ends_only_after_the_last_background_store_is_reported(small_workload, monkeypatch):
    """The last request's final store is still copying when the scheduler goes idle: the run
    waits for it, so no request is left tracked by a copy thread's timing (CI once saw one)."""
    from kvoffload.worker.copy import CpuBlockCopier

    copy = CpuBlockCopier.copy

    def slow_store(self, plan):
        if plan.is_store:
            time.sleep(0.02)
        copy(self, plan)

    monkeypatch.setattr(CpuBlockCopier, "copy", slow_store)
    workload = small_workload("shared-prefix-small")
    replay = VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad("reference"), transfer="threaded")
    record = replay.run()
    assert record.crash is None and not record.stuck_requests
    assert record.leaked_requests == ()
    assert replay.scheduler.connector.core.stats.store_jobs > 0


def test_a_failed_load_is_reported_to_vllm_and_never_read_as_computed_kv(small_workload):
    """Every load copies garbage (a failing copy scribbles its destination). The worker hands
    the failed loads' blocks to vLLM (``get_block_ids_with_load_errors``, read right after the
    pass that reports the load), and vLLM's scheduler fails those requests under its default
    ``kv_load_failure_policy`` instead of treating the garbage as computed KV. Without the
    method vLLM's base class says "no errors", and the replay's oracle finds the garbage."""
    workload = small_workload("multi-turn-small")
    replay = VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad("reference"))
    for handler in replay.worker.worker.handler.handlers:
        handler.fail_jobs(lambda job: job.kind is TransferKind.LOAD)
    record = replay.run()
    assert record.crash is None and not record.stuck_requests
    assert replay.ledger.loaded_tokens > 0  # loads were admitted, and every one of them failed
    assert replay.checked_load_tokens == 0
    assert record.poisoned == []
    loaded = {r for r, (_, hits) in replay.ledger.first_admission.items() if hits}
    failed = {r for r, request in replay._requests.items() if request.status == RequestStatus.FINISHED_ERROR}
    assert loaded and loaded <= failed
    # A request failed while still waiting for its load has finished all the same, and the
    # conversation goes on: every turn of the workload arrives and is counted as finished.
    assert record.requests == record.finished_requests == len(workload.requests)
