"""bench_counts: the counted tracks ask kvoffload.counts for the decode batch of this suite and for
this checkout's workload definition; without valgrind they are skipped (n/a), as asv records it."""

from __future__ import annotations

import pytest

from kvoffload import counts


def test_the_counted_tracks_count_this_suites_batch_and_this_checkouts_workload(suite, monkeypatch):
    module = suite("bench_counts")
    asked = []
    monkeypatch.setattr(counts, "count", lambda mode, subject, where=None: asked.append((mode, subject, where)) or 7.0)
    monkeypatch.setattr(module.shutil, "which", lambda name: "/usr/bin/valgrind")
    meta, replay = module.CountBuildConnectorMeta(), module.CountReplay()
    meta.setup(4)
    replay.setup("multi-turn-small")
    assert meta.track_instructions_per_step(4) == 7.0 and replay.track_instructions_per_request("multi-turn-small") == 7.0
    assert asked[0] == ("connector", "4", module.SUITE)
    assert asked[1][:2] == ("replay", str(module.WORKLOADS_DIR / "multi-turn-small.toml"))
    assert (module.CountBuildConnectorMeta.track_instructions_per_step.unit,
            module.CountReplay.track_instructions_per_request.unit) == ("instructions/step", "instructions/request")


def test_without_valgrind_the_counted_tracks_are_skipped(suite, monkeypatch):
    module = suite("bench_counts")
    monkeypatch.setattr(module.shutil, "which", lambda name: None)
    with pytest.raises(NotImplementedError):
        module.CountBuildConnectorMeta().setup(1)


def test_a_callgrind_report_gives_its_total():
    assert counts.total_instructions("version: 1\ncmd: python\nevents: Ir\nsummary: 53503384\n") == 53503384
    with pytest.raises(RuntimeError):
        counts.total_instructions("events: Ir\n")


def test_a_count_is_the_callgrind_total_over_what_the_child_counted(monkeypatch):
    """valgrind played: the child's report says it counted 128 steps, callgrind's total is 1,280."""
    import json
    import subprocess
    from pathlib import Path

    ran = []

    def valgrind(argv, **kwargs):
        ran.append(argv)
        (Path(kwargs["cwd"]) / "callgrind.out").write_text("events: Ir\nsummary: 1280\n")
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps({"per": 128}) + "\n", stderr="")

    monkeypatch.setattr(counts.subprocess, "run", valgrind)
    assert counts.count("connector", "1") == 10.0
    assert ran[0][:2] == ["valgrind", "--tool=callgrind"] and ran[0][-2:] == ["--", "1"]


def test_counting_the_connector_needs_the_suites_batch(tmp_path):
    with pytest.raises(RuntimeError, match=f"needs the checkout's {tmp_path / 'bench_connector.py'}"):
        counts.count("connector", "1", tmp_path)
