"""Output folders are created, by every command, whatever the flag: ``run --out a/b/r.json``
makes ``a/b`` as ``bench --out-dir a/b`` does. A path on the way that exists as a file is one
line naming it (exit 2), and nothing is written."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

import kvoffload.cli.bench
from kvoffload.cli import main
from kvoffload.cli import releases as releases_cli
from kvoffload.releases import venv_name
from kvoffload.runner import ConnectorChoice, replay_workload
from kvoffload.workloads import load_workload

# Each command with its output below {out} (a folder that does not exist yet), and the file it
# writes there. releases runs a stand-in release (tests/cli/test_releases.py: STAND_IN).
COMMANDS = {
    "run --out": (["run", "--workload", "multi-turn-small", "--quiet", "--out", "{out}/r.json"], "r.json"),
    "run --trace": (["run", "--workload", "multi-turn-small", "--quiet", "--out", "{tmp}/r.json",
                     "--trace", "{out}/jobs.json"], "jobs.json"),
    "bench --out-dir": (["bench", "--small", "--quiet", "--out-dir", "{out}"], "bench-summary-small.json"),
    "sweep --out-dir": (["sweep", "--workload", "multi-turn-small", "--quiet", "--out-dir", "{out}"],
                        "sweep-multi-turn-small-reference.json"),
    "report --out": (["report", "--from", "{tmp}/runs", "--out", "{out}"], "index.html"),
    "releases --out": (["releases", "--release", "0.29.0", "--workload", "multi-turn-small", "--scheduling", "sync",
                        "--out", "{out}/releases.json"], "releases.json"),
}



def _prepare(command: str, tmp_path: Path, monkeypatch) -> None:
    """tmp_path as the working folder, with what ``command`` needs: a run result to report on, a
    stand-in release venv, bench's replays stubbed with one real outcome (the files are under
    test here, not the engine)."""
    monkeypatch.chdir(tmp_path)
    if command.startswith("report"):
        (tmp_path / "runs").mkdir()
        assert main(["run", "--workload", "multi-turn-small", "--quiet", "--out", str(tmp_path / "runs" / "a.json")]) == 0
    if command.startswith("bench"):
        outcome = replay_workload(load_workload("multi-turn-small"), ConnectorChoice.build())
        monkeypatch.setattr(kvoffload.cli.bench, "replay", lambda *args, **kwargs: outcome)
    if command.startswith("releases"):
        spec = importlib.util.spec_from_file_location("stand_in", Path(__file__).with_name("test_releases.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        venv = tmp_path / venv_name("0.29.0") / "bin"
        venv.mkdir(parents=True)
        (venv / "python").write_text(f"#!/bin/sh\nexec {sys.executable} -c '{module.STAND_IN}' \"$@\"\n")
        os.chmod(venv / "python", 0o755)
        monkeypatch.setattr(releases_cli, "git_commit", lambda: "c0ffee")


def _argv(template: list[str], tmp_path: Path, out: Path) -> list[str]:
    return [part.replace("{out}", str(out)).replace("{tmp}", str(tmp_path)) for part in template]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_output_folder_is_created(command, tmp_path, monkeypatch, capsys):
    _prepare(command, tmp_path, monkeypatch)
    template, written = COMMANDS[command]
    out = tmp_path / "new" / "deeper"
    assert main(_argv(template, tmp_path, out)) == 0, capsys.readouterr().err
    assert (out / written).is_file()
    if written.endswith(".json"):
        json.loads((out / written).read_text())  # whole


@pytest.mark.parametrize("command", COMMANDS)
def test_a_file_where_a_folder_should_be_is_one_line_and_nothing_is_written(command, tmp_path, monkeypatch, capsys):
    _prepare(command, tmp_path, monkeypatch)
    template, _ = COMMANDS[command]
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    before = {path: path.stat().st_mtime_ns for path in tmp_path.rglob("*") if not path.is_symlink()}
    capsys.readouterr()
    out = tmp_path / "notes.txt" / "deeper"
    assert main(_argv(template, tmp_path, out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvoffload: error: --") and "notes.txt" in err[0], err
    assert {path: path.stat().st_mtime_ns for path in tmp_path.rglob("*") if not path.is_symlink()} == before
