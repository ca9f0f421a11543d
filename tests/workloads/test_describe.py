"""`kvoffload workloads show`: the lines a user reads before running a workload."""

from __future__ import annotations

from kvoffload.workloads import describe_workload, load_workload


def test_the_request_line_splits_first_turns_from_follow_ups():
    # multi-turn-small: conversations of several turns; every request with a parent is a
    # follow-up, the rest open a conversation, and the two add up to the requests.
    workload = load_workload("multi-turn-small")
    follow_ups = sum(spec.parent is not None for spec in workload.requests)
    first_turns = len(workload.requests) - follow_ups
    assert 0 < follow_ups and 0 < first_turns
    assert (f"  requests        {len(workload.requests):,} ({first_turns:,} first turns, {follow_ups:,} follow-ups)"
            in describe_workload(workload).splitlines())


def test_the_engine_settings_wrap_five_to_a_line_under_their_heading():
    lines = describe_workload(load_workload("spec-decode-small")).splitlines()
    settings = [line for line in lines if line.startswith("  engine ") or line.startswith(" " * 18)]
    assert settings[0].startswith("  engine          ") and len(settings) > 1
    assert all(line.startswith(" " * 18) and not line[18].isspace() for line in settings[1:])
    assert all(len(line.split()) == 5 for line in settings[1:-1])
    assert len(settings[0].split()) == 6  # the heading and five settings
