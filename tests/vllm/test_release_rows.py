"""The child of ``kvoffload releases`` inside one vLLM release (kvoffload/vllm/rows.py): its
command line (options before the jobs, one line and exit 2 when it cannot run) and what a
crashed connector's row keeps of the crash (docs/releases.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.vllm import rows  # noqa: E402


def test_without_a_job_the_child_prints_its_usage_and_exits_2(capsys):
    assert rows.main([]) == 2
    assert capsys.readouterr().err.startswith("usage: python -m kvoffload.vllm.rows ")
    assert rows.main(["--preset", "vllm-0.29"]) == 2  # options alone are no job either
    assert capsys.readouterr().err.startswith("usage: ")


def test_an_unknown_control_is_named_in_one_line_before_any_job_runs(capsys):
    assert rows.main(["--control", "no-such-control", "shared-prefix-small:sync"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvoffload.vllm.rows: unknown control 'no-such-control' (known: ")
    assert len(err.strip().splitlines()) == 1


def test_a_crashed_connectors_row_keeps_its_message_step_and_innermost_frames(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    row = rows.release_row("shared-prefix-small", "sync", source="foreign_connectors:AttributeErrorConnector")
    error = row["error"]
    assert error["message"] == "AttributeError: planted: 'NoneType' object has no attribute 'slot_mapping'"
    assert error["step"] > 0
    assert 1 <= len(error["frames"]) <= 3 and "in build_connector_meta" in error["frames"][-1]
