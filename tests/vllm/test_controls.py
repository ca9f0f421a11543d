"""The release table's stated causes, each checked by a control: the named rule of vLLM's
scheduler switched in a release (``kvoffload.vllm.controls``), and the row moves to what the
release on the other side of the rule measured (docs/fidelity.md, "Real releases against their
presets"). A control patches vLLM for the rest of its process, so each run is a subprocess of
``python -m kvoffload.vllm.rows --control NAME``; the replays are the on-demand kind
(scripts/vllm-on-demand runs them in any release's venv). CI runs the refusals and, for each
control of its release, the one scheduler question the control changes (``control_probe.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.core.types import ConfigError  # noqa: E402
from kvoffload.releases import PRESET_OF, agreement, compare, simulator_row  # noqa: E402
from kvoffload.vllm.compat import RELEASE  # noqa: E402
from kvoffload.vllm.controls import CONTROLS, apply_control  # noqa: E402

RELEASE_TEXT = ".".join(map(str, RELEASE))


def rows(*args: str) -> dict[tuple[str, str], dict]:
    done = subprocess.run([sys.executable, "-m", "kvoffload.vllm.rows", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"}, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    found = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {(row["workload"], row["scheduling"]): row for row in found}


def against_preset(row: dict) -> dict:
    """The row as the release table compares it: with the simulator replaying the preset."""
    return compare(row, simulator_row(row["workload"], row["scheduling"], PRESET_OF.get(RELEASE_TEXT)))


def in_range(name: str) -> bool:
    (first, last), _ = CONTROLS[name]
    return first <= RELEASE <= last


def test_a_control_names_the_releases_it_changes_and_refuses_the_others():
    with pytest.raises(ConfigError, match="unknown control 'no-such-rule'"):
        apply_control("no-such-rule")
    outside = next(name for name in CONTROLS if not in_range(name))  # every release lacks one of the rules
    with pytest.raises(ConfigError, match=f"changes a rule of vLLM .*; this is {RELEASE_TEXT}"):
        apply_control(outside)


def probe(*controls: str) -> tuple[dict, dict]:
    """A scheduler's answers before and after ``controls`` (tests/vllm/control_probe.py)."""
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("control_probe.py")), *controls],
                          capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.splitlines()[-1])
    return answers["before"], answers["after"]


# control -> the one answer it changes, and to what; every other answer must stay
CHANGES = {
    "no-spec-decode-reservation-admitting": ("spec_step_blocks", lambda before: 0),
    "no-spec-decode-reservation-inflight": ("remaining_blocks", lambda before: before - 1),
    "preempt-victims-in-flight": ("victim_allowed", lambda before: True),
}


@pytest.mark.parametrize("name", [name for name in CHANGES if in_range(name)] or [pytest.param(
    "none", marks=pytest.mark.skip(reason=f"no control of {RELEASE_TEXT} asks a probed question"))])
def test_a_control_changes_the_one_answer_it_names(name):
    """The 46-token request of a k = 2 scheduler: 3 blocks of its own and a 4th for a spec step;
    its step is in flight, so its blocks are not freed now, nor is it a victim. Each control
    switches one of these answers, and the deferred free stays as it was."""
    answer, expected = CHANGES[name]
    before, after = probe(name)
    assert (before["victim_allowed"], before["blocks_freed_now"]) == (False, False)
    if "remaining_blocks" in before:
        assert (before["spec_step_blocks"], before["remaining_blocks"]) == (1, 4)
    assert after[answer] == expected(before[answer]) != before[answer]
    # 0.31 adds the spec step's blocks to a request's remaining ones from _spec_decode_step_blocks()
    # itself, so the admitting half moves both there (0.32 counts the step's tokens instead)
    unchanged = {key for key in before if key != answer and not (RELEASE < (0, 32, 0) and key == "remaining_blocks")}
    assert {key: after[key] for key in unchanged} == {key: before[key] for key in unchanged}


@pytest.mark.vllm_on_demand
@pytest.mark.skipif(not in_range("no-spec-decode-reservation"), reason="the reservation arrived in 0.31")
def test_without_the_spec_decode_reservation_the_rows_are_those_of_0_30():
    """Both halves of 0.31's rule off: spec-decode-small sync and async disagree with the
    simulator as 0.30.0's rows do (49/51, 50/51; s17-t02 admitted from the GPU prefix cache).
    One half alone moves the sync row only: the async row needs both (every load in flight
    counting a spec step too), which is why the documented 'reservation' looked innocent there."""
    both = rows("--control", "no-spec-decode-reservation", "spec-decode-small:sync", "spec-decode-small:async")
    sync, asynchronous = (against_preset(both[("spec-decode-small", s)]) for s in ("sync", "async"))
    assert (sync["agreeing"], asynchronous["agreeing"]) == (49, 50)
    assert {d["request"]: d["release"] for d in sync["first_differences"]} == {"s17-t02": [80, 0],
                                                                                "s19-t02": [160, 0]}
    assert asynchronous["first_differences"] == [{"request": "s17-t02", "release": [112, 0], "preset": [48, 48]}]
    half = rows("--control", "no-spec-decode-reservation-admitting", "spec-decode-small:sync",
                "spec-decode-small:async")
    assert [against_preset(half[("spec-decode-small", s)])["agreeing"] for s in ("sync", "async")] == [49, 51]


@pytest.mark.vllm_on_demand
@pytest.mark.skipif(not in_range("preempt-victims-in-flight"), reason="the victim check arrived in 0.30")
def test_taking_victims_with_a_step_in_flight_moves_the_async_shared_prefix_row():
    """Up to 0.29 a running request whose async step is in flight could be preempted; the row
    then disagrees (0.29: 28/32 on hits); with the check it agrees on every hit."""
    plain = against_preset(rows("shared-prefix-small:async")[("shared-prefix-small", "async")])
    control = against_preset(rows("--control", "preempt-victims-in-flight", "shared-prefix-small:async")[
        ("shared-prefix-small", "async")])
    assert plain["agreeing"] == 32 and control["agreeing"] < 32
    assert control["release"]["metrics"]["preemptions"] > plain["release"]["metrics"]["preemptions"]


@pytest.mark.vllm_on_demand
@pytest.mark.skipif(not in_range("skipped-requests-wait-behind-preempted"), reason="0.31 changed the queues")
def test_with_0_31s_waiting_order_the_readmission_rows_agree():
    """0.25-0.30 serve requests skipped in earlier steps before a request preempted later; with
    0.31's order the shared-prefix-small rows agree with the simulator on every hit and step
    (sync: the offload hit rate 0.305 -> 0.308)."""
    control = rows("--control", "skipped-requests-wait-behind-preempted", "shared-prefix-small:sync",
                   "shared-prefix-small:async")
    # async before 0.30 also takes victims whose step is in flight (the control above): sync only there
    for scheduling in ("sync", "async") if RELEASE >= (0, 30, 0) else ("sync",):
        row = against_preset(control[("shared-prefix-small", scheduling)])
        assert agreement(row) == "32/32 · 32/32 · 32/32", scheduling
    assert round(control[("shared-prefix-small", "sync")]["metrics"]["offload_hit_rate"], 3) == 0.308
