"""The per-step bound on foreign code (``kvoffload.engine.bounded``): a block that runs past it
is interrupted with a verdict naming the connector call in progress and its request, a
blocking wait included, and an alarm armed outside (the suite's per-test bound) survives it."""

from __future__ import annotations

import signal
import threading
import time
from types import SimpleNamespace

import pytest

from kvoffload.engine.bounded import CallsInProgress, ConnectorTimeout, StepBound, bound_methods, deadline


class Stuck:
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        threading.Event().wait()  # a lock nobody releases

    def build_connector_meta(self, scheduler_output):
        return "meta"


def test_a_call_that_never_returns_is_stopped_and_named():
    bound = StepBound(0.2)
    connector = Stuck()
    bound_methods(connector, ("get_num_new_matched_tokens", "build_connector_meta"), bound.calls)
    started = time.monotonic()
    with pytest.raises(ConnectorTimeout) as stopped:
        with bound.watching():
            for step in range(7):
                bound.at(step)
                assert connector.build_connector_meta(None) == "meta"  # returns: no longer in progress
            bound.at(7)
            connector.get_num_new_matched_tokens(SimpleNamespace(request_id="C"), 0)
    assert str(stopped.value) == "step 7 did not finish within 0.2 s: in get_num_new_matched_tokens for request C"
    assert time.monotonic() - started < 5
    assert bound.calls.stack == []


def test_a_step_that_ends_in_time_leaves_the_outer_alarm_as_it_was():
    """The suite's own bound (tests/conftest.py, armed around this test) keeps its handler and is
    re-armed with what is left of it; with none armed, none is left behind."""
    handler, outer_left = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)[0]
    with deadline(30, lambda: "never"):
        time.sleep(0.05)
    after = signal.getitimer(signal.ITIMER_REAL)[0]
    assert signal.getsignal(signal.SIGALRM) is handler
    assert (0 < after <= outer_left) if outer_left else after == 0


def test_steps_that_keep_moving_are_never_stopped():
    bound = StepBound(0.05)
    with bound.watching():
        for step in range(8):
            bound.at(step)
            time.sleep(0.03)  # each step well inside the bound, the run four times longer


def test_a_start_that_never_ends_is_stopped(monkeypatch):
    monkeypatch.setattr("kvoffload.engine.bounded.START_BOUND_S", 0.1)
    with pytest.raises(ConnectorTimeout, match="the connector did not start within 0.1 s"):
        with StepBound(0.05).start():
            time.sleep(10)


def test_nothing_running_says_so():
    assert CallsInProgress().describe() == "no connector call was running (the engine's own code)"


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match="above 0 seconds"):
        StepBound(0)


def test_a_simulator_step_that_hangs_is_a_named_verdict(monkeypatch):
    from kvoffload.core.scheduler import ReferenceConnectorScheduler
    from kvoffload.engine.config import EngineConfig
    from kvoffload.engine.engine import Engine
    from kvoffload.engine.requests import RequestSpec

    monkeypatch.setattr(ReferenceConnectorScheduler, "build_connector_meta", lambda self, *args: time.sleep(60))
    started = time.monotonic()
    record = Engine([RequestSpec("A", tuple(range(3, 35)), (7, 8))], EngineConfig(gpu_blocks=64, block_size=4),
                    step_bound_s=0.3).run()
    assert record.crash_type == "ConnectorTimeout" and time.monotonic() - started < 10
    assert record.crash.startswith("ConnectorTimeout: step 0 did not finish within 0.3 s")
