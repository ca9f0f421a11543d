"""A best-effort cache must not ask vLLM for KV delivery (docs/fidelity.md, "A connector that asks
for KV delivery").

Since 0.27.0 vLLM's connector base class asks, for a kv_both connector, that a request preempted
with output still in flight drops that output (``requires_kv_delivery``); vLLM's
OffloadingConnector opts out, and so does ours. Under async scheduling, on shared-prefix-small,
vLLM 0.27.0-0.29.0 preempt all four running requests in one step, re-admit the same four, and,
their in-flight tokens dropped, fill the pool to the last block again: the same state every two
steps, forever. The replay's progress watchdog stops it with a verdict; the 0.30+ scheduler
preempts one request at a time and gets through. The release-telling replays are on demand:
``scripts/vllm-on-demand .venv-vllm-0.29.0`` shows the cycle.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

import vllm  # noqa: E402

from kvoffload.engine.watchdog import ProgressWatchdog  # noqa: E402
from kvoffload.vllm.build import REFERENCE, STOCK, ConnectorLoad  # noqa: E402
from kvoffload.vllm.replay import VllmSchedulerReplay  # noqa: E402
from kvoffload.workloads import load_workload  # noqa: E402

ASKS_FOR_DELIVERY = "tests.vllm.broken_connector:AsksForKvDeliveryConnector"
# The releases whose scheduler cycles with a connector that asks (kvoffload releases, 0.25.0-0.32.0
# each replayed; 0.25 and 0.26 have no such request).
CYCLES_WITH_DELIVERY = {"0.27.0", "0.27.1", "0.28.0", "0.29.0"}


def shared_prefix_async(load: ConnectorLoad) -> VllmSchedulerReplay:
    workload = load_workload("shared-prefix-small", {"scheduling": "async"})
    return VllmSchedulerReplay(workload.requests, workload.engine, load)


@pytest.mark.parametrize("source", [STOCK, REFERENCE])
def test_vllms_connector_and_ours_are_best_effort_caches(source):
    scheduler = shared_prefix_async(ConnectorLoad(source, "vllm-0.29" if source == REFERENCE else None)).scheduler
    if not hasattr(scheduler, "requires_kv_delivery"):
        pytest.skip(f"vLLM {vllm.__version__} has no KV-delivery request (0.27.0 brought it)")
    assert scheduler.requires_kv_delivery is False


# The two replays below tell releases apart: scripts/vllm-on-demand runs them in any release's venv
# (CI's 0.32.0 stage keeps the two checks above and below, within its time).
@pytest.mark.vllm_on_demand
def test_a_connector_that_asks_for_delivery_cycles_exactly_on_the_releases_that_preempt_all_at_once():
    replay = shared_prefix_async(ConnectorLoad(ASKS_FOR_DELIVERY, "vllm-0.29"))
    if not hasattr(replay.scheduler, "requires_kv_delivery"):
        pytest.skip(f"vLLM {vllm.__version__} has no KV-delivery request (0.27.0 brought it)")
    record = replay.run()
    if vllm.__version__ in CYCLES_WITH_DELIVERY:
        # The four requests of the first crowded step, preempted together again and again.
        assert record.livelock is not None, record.livelock_message
        assert set(record.livelock["preemptions"]) == {"g3-q3", "g1-q7", "g2-q5", "g3-q6"}
        assert record.livelock["last_progress_step"] < 10
        assert len(record.stuck_requests) == 32 and record.finished_requests == 0
    else:
        assert record.livelock is None and not record.stuck_requests
        assert record.finished_requests == 32


@pytest.mark.vllm_on_demand
def test_our_connector_gets_through_where_the_asking_one_cycles():
    record = shared_prefix_async(ConnectorLoad(REFERENCE, "vllm-0.29")).run()
    assert record.livelock is None and not record.stuck_requests
    assert record.finished_requests == 32 and record.preemptions > 0


def test_the_replay_stops_with_the_watchdogs_verdict():
    """A window of one step: the first step whose passes only recompute what a preemption threw
    away ends the replay, and the record names the requests left alive."""
    replay = shared_prefix_async(ConnectorLoad(REFERENCE, "vllm-0.29"))
    replay.watchdog = ProgressWatchdog(0, window=1)
    record = replay.run()
    assert record.livelock is not None and record.livelock["window"] == 1
    assert record.steps == record.livelock["step"] + 1
    assert set(record.stuck_requests) == set(record.livelock["alive"]) and 0 < len(record.stuck_requests) < 32
    assert "livelock: no request finished" in record.livelock_message
