"""The optional [aborts] table: seeded client disconnects that leave the stream itself alone."""

from __future__ import annotations

import dataclasses

import pytest

from kvoffload.workloads import WorkloadError, load_workload

DEFINITION = """
name = "aborting"
description = "short conversations, some aborted"
seed = 3

[engine]
block_size = 4

[generator]
kind = "multi-turn"
conversations = 6
turns = 3
prefix_len = 8
user_len = 4
answer_len = 5
think_steps = 2
conversation_gap = 1
"""


def write(tmp_path, text):
    path = tmp_path / "w.toml"
    path.write_text(text)
    return str(path)


def test_aborts_mark_a_share_of_requests_and_change_nothing_else(tmp_path):
    plain = load_workload(write(tmp_path, DEFINITION))
    aborting = load_workload(write(tmp_path, DEFINITION + "\n[aborts]\nshare = 0.5\nafter_steps = 3\n"))
    marked = [spec for spec in aborting.requests if spec.abort_after_steps is not None]
    assert 0 < len(marked) < len(aborting.requests)
    assert all(spec.abort_after_steps == 3 for spec in marked)
    assert [dataclasses.replace(spec, abort_after_steps=None) for spec in aborting.requests] == list(plain.requests)
    again = load_workload(write(tmp_path, DEFINITION + "\n[aborts]\nshare = 0.5\nafter_steps = 3\n"))
    assert again.requests == aborting.requests


@pytest.mark.parametrize("table, message", [
    ("share = 1.5\nafter_steps = 3", "aborts.share"),
    ("share = 0.5\nafter_steps = -1", "aborts.after_steps"),
    ("share = 0.5\nafter_steps = 1\nwhen = 2", "aborts.when"),
])
def test_bad_abort_tables_are_named(tmp_path, table, message):
    with pytest.raises(WorkloadError, match=message):
        load_workload(write(tmp_path, DEFINITION + "\n[aborts]\n" + table + "\n"))


def test_the_share_picks_requests_by_one_seeded_draw_each_in_arrival_order(tmp_path):
    """Which requests abort is part of every result the gate compares: pinned by id. Seed 3, one
    draw of ``random.Random("3/aborts")`` per request in arrival order (turn 0 of conversations
    c0-c5, then turn 1, ...), aborted when the draw is under the share; a constant delay draws
    nothing more."""
    aborting = load_workload(write(tmp_path, DEFINITION + "\n[aborts]\nshare = 0.5\nafter_steps = 3\n"))
    assert [spec.req_id for spec in aborting.requests if spec.abort_after_steps is not None] == [
        "c1-t00", "c2-t00", "c3-t00", "c4-t00", "c5-t00", "c1-t01", "c4-t01", "c1-t02", "c3-t02", "c5-t02"]


def test_the_bundled_multi_turn_small_aborts_two_requests():
    """The gate's workload: 3 % of 53 requests, each delay drawn right after its pick."""
    workload = load_workload("multi-turn-small")
    assert [(spec.req_id, spec.abort_after_steps) for spec in workload.requests
            if spec.abort_after_steps is not None] == [("c4-t03", 7), ("c7-t04", 3)]
