"""The vllm-scheduler replay's own verdicts (kvoffload/vllm/replay.py): a run cut at its step
bound ends and names what it left, and which metrics the record leaves unmeasured."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.vllm.build import REFERENCE, ConnectorLoad  # noqa: E402
from kvoffload.vllm.replay import STORE_SUBMIT_DELAYS, VllmSchedulerReplay  # noqa: E402
from kvoffload.workloads import load_workload  # noqa: E402


def replay(**kwargs) -> VllmSchedulerReplay:
    workload = load_workload("shared-prefix-small")
    return VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad(REFERENCE), **kwargs)


def test_a_replay_cut_at_its_step_bound_ends_there_and_names_every_request_left():
    record = replay(max_steps=3).run()
    assert record.steps == 3 and record.crash is None
    assert record.stuck_requests and record.finished_requests + len(record.stuck_requests) <= 32


def test_the_reference_copies_through_a_transfer_handler_so_its_store_delays_are_measured():
    unmeasured = replay().unmeasured()
    assert "fence_violations" in unmeasured  # no fence in vLLM's loop
    assert not set(STORE_SUBMIT_DELAYS) & set(unmeasured)
