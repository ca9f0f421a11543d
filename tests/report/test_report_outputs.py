"""``kvoffload report --out D``: only regular files are replaced, each written whole or not at all.

A FIFO as ``D/index.html`` would block the write forever, a symbolic link would be written
through, a FIFO named like a chart would be replaced; each is refused with one line and exit 2
before anything is drawn. An interrupt while a figure is being written leaves the old figure, or
none, never a truncated PNG.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from kvoffload.report.figures import save_figure
from kvoffload.results import atomic_output

REPO = Path(__file__).resolve().parents[2]


def kvoffload(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvoffload.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.fixture
def source(tmp_path) -> Path:
    """A source that draws quickly: one asv result file."""
    root = tmp_path / "results"
    asv = root / "asv" / "ci"
    asv.mkdir(parents=True)
    columns = ["result", "params", "version"]
    data = {"commit_hash": "a" * 40, "env_name": "py", "date": 1, "result_columns": columns,
            "results": {"bench_connector.BuildConnectorMeta.track_us_per_step": [[50.0], [["1"]], "2"]}}
    (asv / "aaaaaaaa-py.json").write_text(__import__("json").dumps(data))
    return root


@pytest.mark.parametrize("name", ["index.html", "index.md", "asv-bench_connector.BuildConnectorMeta.png",
                                  "ablation-old.csv"])
def test_a_fifo_among_the_outputs_is_refused_not_waited_on(source, tmp_path, name):
    out = tmp_path / "charts"
    out.mkdir()
    os.mkfifo(out / name)
    result = kvoffload("report", "--from", str(source), "--out", str(out), timeout=60)  # a hang fails here
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and name in result.stderr and "a FIFO" in result.stderr
    assert (out / name).is_fifo()  # never replaced
    assert sorted(p.name for p in out.iterdir()) == [name]  # nothing drawn


def test_a_symlinked_index_is_not_written_through(source, tmp_path):
    out = tmp_path / "charts"
    out.mkdir()
    target = tmp_path / "precious.html"
    target.write_text("keep me")
    (out / "index.html").symlink_to(target)
    result = kvoffload("report", "--from", str(source), "--out", str(out))
    assert result.returncode == 2 and "a symbolic link" in result.stderr
    assert target.read_text() == "keep me" and (out / "index.html").is_symlink()


def test_a_clean_report_replaces_its_own_files(source, tmp_path):
    out = tmp_path / "charts"
    for _ in range(2):  # the second run replaces the first run's regular files
        result = kvoffload("report", "--from", str(source), "--out", str(out))
        assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "asv-bench_connector.BuildConnectorMeta.csv", "asv-bench_connector.BuildConnectorMeta.png",
        "index.html", "index.md"]


class Interrupted(KeyboardInterrupt):
    pass


def test_an_interrupted_figure_leaves_the_old_one_and_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "ablation-x.png"
    fig = Figure(figsize=(2, 2))
    fig.add_subplot().plot([0, 1])
    save_figure(fig, path)
    old = path.read_bytes()

    def savefig_cut_short(self, handle, **kwargs):
        handle.write(old[:100])  # part of an image, then Ctrl-C
        raise Interrupted

    monkeypatch.setattr(Figure, "savefig", savefig_cut_short)
    with pytest.raises(Interrupted):
        save_figure(fig, path)
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ablation-x.png"]  # no temporary file left


def test_the_writer_itself_refuses_a_fifo(tmp_path):
    """Checked again when written: the path may have become a FIFO after the command's check."""
    path = tmp_path / "index.html"
    os.mkfifo(path)
    with pytest.raises(OSError, match="not a regular file"):
        with atomic_output(path) as handle:
            handle.write("never")
    assert path.is_fifo() and len(list(tmp_path.iterdir())) == 1
