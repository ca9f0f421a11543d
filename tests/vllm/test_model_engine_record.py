"""What the real-model engine (kvoffload/vllm/llm_engine.py) records of its connector once the
run has drained: the requests the connector still tracks are its leaks, counted only for a run
that ended cleanly (a crashed or stuck run was cut off, its requests did not leak), and counted
only for a connector that exposes its request table (else the metric is unmeasured, not 0).

vLLM's engine and model are the slow part and play no role in these rules: the replay's record
is finished on stand-in objects shaped as the engine's config and the connectors (as
tests/vllm/test_connector_parts.py does); tests/vllm/test_real_model.py runs the real engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.engine.config import EngineConfig  # noqa: E402
from kvoffload.engine.record import RunRecord  # noqa: E402
from kvoffload.vllm import llm_engine  # noqa: E402

VLLM_CONFIG = SimpleNamespace(
    model_config=SimpleNamespace(model="tiny-llama", dtype="torch.float32"),
    cache_config=SimpleNamespace(enable_prefix_caching=True),
    scheduler_config=SimpleNamespace(async_scheduling=False), speculative_config=None)


def reference_tracking(*req_ids: str):
    """The reference connector as the record reads it: its core's request table and manager."""
    core = SimpleNamespace(tracked_request_ids=lambda: list(req_ids), manager=SimpleNamespace(violations=[]),
                           stats=SimpleNamespace(store_jobs=1, load_jobs=0))
    return SimpleNamespace(core=core)


def finished(connector, **record_fields) -> llm_engine._Replay:
    """A replay whose run ended as ``record_fields`` say, its record finished."""
    replay = llm_engine._Replay.__new__(llm_engine._Replay)
    replay.llm, replay.engine, replay.record = SimpleNamespace(vllm_config=VLLM_CONFIG), EngineConfig(), RunRecord()
    replay.connector, replay.worker, replay.store_delays, replay._timings = connector, None, None, {}
    for name, value in record_fields.items():
        setattr(replay.record, name, value)
    replay._finish_record()
    return replay


def test_what_the_connector_still_tracks_after_a_clean_run_is_leaked():
    assert finished(reference_tracking("B", "A")).record.leaked_requests == ("A", "B")
    assert finished(reference_tracking()).record.leaked_requests == ()


@pytest.mark.parametrize("ended", [{"crash": "RuntimeError: planted", "crash_step": 3},
                                   {"stuck_requests": ("A",)}])
def test_a_run_cut_off_by_a_crash_or_a_stuck_request_counts_no_leak(ended):
    assert finished(reference_tracking("A", "B"), **ended).record.leaked_requests == ()


def test_leaks_are_unmeasured_only_for_a_connector_that_keeps_no_request_table():
    reference = finished(reference_tracking("A")).unmeasured()
    silent = finished(SimpleNamespace()).unmeasured()
    assert "leaked_requests" not in reference and "lifecycle_violations" not in reference
    assert "leaked_requests" in silent and "lifecycle_violations" in silent
    assert set(llm_engine.UNMEASURED) <= set(reference)  # no transfer handler: no store delays either
