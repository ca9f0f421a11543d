"""``releases --step-timeout`` reaches the release's own venv: each replay runs in a child process
(``python -m kvoffload.vllm.rows``), and the bound given on the command line is passed to it, for
the stock rows, the preset's second pass and the connector x release matrix alike. (The child
applying it to a connector that never returns: tests/vllm/test_foreign_failures.py.)"""

from __future__ import annotations

import subprocess

import pytest

import kvoffload.cli.releases as releases_cli
from kvoffload.cli import main


@pytest.fixture
def child_commands(monkeypatch, tmp_path):
    """The options each release's child would get (release_io.run_rows), the child not started."""
    commands = []

    def run_rows(python, jobs, preset, env, timeout, options=()):
        commands.append([*options, *(f"{w}:{s}" for w, s in jobs)])
        raise subprocess.TimeoutExpired(str(python), timeout)  # stop at the first child

    monkeypatch.setattr(releases_cli, "run_rows", run_rows)
    monkeypatch.setattr(releases_cli, "venv_python", lambda name, places: tmp_path / name / "bin" / "python")
    import kvoffload.cli.releases_family as family_cli  # the connector matrix looks its venvs up too
    monkeypatch.setattr(family_cli, "venv_python", lambda name, places: tmp_path / name / "bin" / "python")
    monkeypatch.chdir(tmp_path)
    return commands


@pytest.mark.parametrize("family", [[], ["--connector", "simple-cpu"]], ids=["stock-beside-preset", "connector-matrix"])
def test_the_child_replays_under_the_bound_given(child_commands, family, tmp_path):
    code = main(["releases", "--release", "0.32.0", "--workload", "multi-turn-small", "--scheduling", "sync",
                 "--out", str(tmp_path / "t.json"), "--step-timeout", "2.5", *family])
    assert code == 2  # the stand-in child "timed out": one line, nothing written
    (command,) = child_commands
    assert command[command.index("--step-timeout") + 1] == "2.5"
    assert command[-1] == "multi-turn-small:sync"  # the jobs come after every option


def test_without_the_option_the_child_keeps_its_own_default_bound(child_commands, tmp_path):
    """The child's default is the same constant (engine/bounded.py), so nothing is passed on."""
    main(["releases", "--release", "0.32.0", "--workload", "multi-turn-small", "--scheduling", "sync",
          "--out", str(tmp_path / "t.json")])
    (command,) = child_commands
    assert "--step-timeout" not in command
