"""Where the commands write when told nothing: an ignored folder (out/), never the committed
results/, which changes only through benchmarks/publish from a clean commit."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kvoffload import __version__
from kvoffload.cli import main
from kvoffload.cli.app import build_parser
from kvoffload.cli.outputs import DEFAULT_ROOT

REPO = Path(__file__).resolve().parents[2]


def test_the_default_output_folder_is_ignored_by_git():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    for path in (DEFAULT_ROOT / "runs" / "bench-summary.json", DEFAULT_ROOT / "charts" / "index.html",
                 DEFAULT_ROOT / "releases" / "releases.json", DEFAULT_ROOT / "runs-vllm" / "vllm" / "x.json"):
        assert subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", str(path)]).returncode == 0, path
    assert subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "results/runs/x.json"]).returncode == 1


def test_run_and_report_write_under_the_ignored_folder_by_default(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--workload", "multi-turn-small", "--quiet"]) == 0
    assert main(["run", "--workload", "multi-turn-small", "--quiet", "--preset", "vllm-0.25"]) == 0
    assert sorted(p.name for p in (tmp_path / "out" / "runs").iterdir()) == [
        "multi-turn-small-reference.json", "multi-turn-small-vllm-0.25.json"]
    assert main(["report"]) == 0
    assert (tmp_path / "out" / "charts" / "index.html").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing else, no results/


@pytest.mark.parametrize("command, flag, default", [
    ("sweep", "--out-dir", "out/sweep"),  # bench's depends on --engine: test_bench_vllm_folders.py
    ("report", "--out", "out/charts"), ("report", "--from", "out"),
    ("releases", "--out", "out/releases/releases.json"),
])
def test_every_output_default_is_under_the_ignored_folder_and_has_help(command, flag, default):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    (action,) = [a for a in sub._actions if flag in a.option_strings]
    assert str(action.default) == default and action.help


def test_compare_and_every_command_has_help():
    commands = next(a for a in build_parser()._actions if a.dest == "command")
    assert all(choice.help for choice in commands._choices_actions)
    compare = commands.choices["compare"]
    assert all(action.help for action in compare._actions)


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"kvoffload {__version__}"


def test_preset_reference_is_the_reference_in_run_as_in_sweep(tmp_path, capsys):
    """sweep takes --preset reference; run took it as an unknown preset (exit 2)."""
    named, plain = tmp_path / "named.json", tmp_path / "plain.json"
    assert main(["run", "--workload", "multi-turn-small", "--quiet", "--preset", "reference", "--out", str(named)]) == 0
    assert main(["run", "--workload", "multi-turn-small", "--quiet", "--out", str(plain)]) == 0
    a, b = json.loads(named.read_text()), json.loads(plain.read_text())
    assert a["connector"] == b["connector"] and a["connector"]["label"] == "reference"


def test_publish_refuses_a_tree_with_changes(tmp_path):
    """Published results never say -dirty: publish stops before any work on a changed tree."""
    shutil.copytree(REPO / "benchmarks", tmp_path / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)

    git("init", "-q")
    git("add", "benchmarks")
    git("commit", "-q", "-m", "clean")
    (tmp_path / "benchmarks" / "README.md").write_text("changed\n")
    done = subprocess.run([str(tmp_path / "benchmarks" / "publish")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "tracked files differ from HEAD" in done.stderr
    assert not (tmp_path / "results").exists()


def test_every_part_of_the_committed_results_has_a_documented_writer():
    """benchmarks/README.md's table of writers names each folder under results/ that git tracks,
    so "what changes results/" is answered for all of it, not only for publish's part."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "results"], capture_output=True, text=True,
                             check=True).stdout.split()
    parts = {path.split("/")[1] for path in tracked if path.count("/") >= 2}
    readme = (REPO / "benchmarks" / "README.md").read_text()
    table = readme[readme.index("| writer | what it writes |"):]
    table = table[:table.index("\n\n")]
    assert parts and {part for part in parts if f"`results/{part}/" not in table} == set()
    assert "This is the only way" not in readme
