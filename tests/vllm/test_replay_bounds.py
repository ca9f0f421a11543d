"""The vllm-scheduler replay's own rules (kvoffload/vllm/replay.py): a run cut at its step bound
ends and names what it left, which metrics the record leaves unmeasured, the copy volume it
records, and the seeded draft acceptance of a workload that scripts none."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.vllm.build import REFERENCE, ConnectorLoad  # noqa: E402
from kvoffload.vllm.replay import STORE_SUBMIT_DELAYS, VllmSchedulerReplay  # noqa: E402
from kvoffload.workloads import load_workload  # noqa: E402


def replay(settings=None, **kwargs) -> VllmSchedulerReplay:
    workload = load_workload("shared-prefix-small", settings)
    return VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad(REFERENCE), **kwargs)


def test_a_replay_cut_at_its_step_bound_ends_there_and_names_every_request_left():
    record = replay(max_steps=3).run()
    assert record.steps == 3 and record.crash is None
    assert record.stuck_requests and record.finished_requests + len(record.stuck_requests) <= 32


def test_the_reference_copies_through_a_transfer_handler_so_its_store_delays_are_measured():
    unmeasured = replay().unmeasured()
    assert "fence_violations" in unmeasured  # no fence in vLLM's loop
    assert not set(STORE_SUBMIT_DELAYS) & set(unmeasured)


def test_without_scripted_acceptance_every_draft_is_accepted_at_1_and_none_at_0():
    # shared-prefix-small scripts no acceptance: each draft is accepted with probability
    # spec_acceptance (the simulator's rule, LiveRequest.accepted_drafts). All accepted, a request
    # emits three tokens a step and the run takes fewer steps than with none accepted.
    settings = {"spec_tokens": "2", "scheduling": "sync"}
    assert not any(spec.accept_counts for spec in load_workload("shared-prefix-small", settings).requests)
    every = replay({**settings, "spec_acceptance": "1.0"}).run()
    none = replay({**settings, "spec_acceptance": "0.0"}).run()
    assert every.crash is None and none.crash is None
    assert every.finished_requests == none.finished_requests == 32
    assert every.steps < none.steps


def test_the_copy_volume_recorded_is_every_stored_chunk_and_every_loaded_block_in_bytes():
    """The record's store and load bytes (the transfer handler's totals, one direction each) are
    what the connector moved: each stored chunk's blocks_per_chunk blocks and each loaded token's
    block, at the tiny model's bytes per block (tiny_kv.block_bytes)."""
    from kvoffload.vllm.tiny_kv import block_bytes

    built = replay({"scheduling": "sync"})
    record = built.run()
    engine, stats = built.engine, built.scheduler.connector.core.stats
    assert record.crash is None and stats.chunks_stored > 0 and built.checked_load_tokens > 0
    assert record.store_bytes == stats.chunks_stored * engine.blocks_per_chunk * block_bytes(engine.block_size)
    assert record.load_bytes == built.checked_load_tokens // engine.block_size * block_bytes(engine.block_size)
