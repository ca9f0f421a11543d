"""``kvoffload report`` held to ``run``'s contract (issue 31): a file per workload, whatever its
name; what index.md embeds escaped; the temporary files of a killed report removed by the next
one; one Ctrl-C ends it with 130, even one a finaliser swallowed. (A release table the report
cannot read is refused before anything is written: ``tests/cli/hostile_commands.py``.)"""

from __future__ import annotations

import csv
import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from kvoffload.cli import main

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "results" / "runs" / "bench-multi-turn-reference.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_result(folder: Path, file_name: str, workload: str, steps: int = 100) -> None:
    """The bundled reference run of multi-turn, renamed ``workload``, its step count ``steps``."""
    data = json.loads(RESULT.read_text())
    data["workload"]["name"] = workload
    data["metrics"]["steps"] = steps
    folder.mkdir(parents=True, exist_ok=True)
    (folder / file_name).write_text(json.dumps(data))


def drawn_workloads(csv_file: Path) -> set[str]:
    with open(csv_file, newline="") as handle:
        return {row["workload"] for row in csv.DictReader(handle)}


def test_two_workloads_whose_names_map_to_one_file_name_get_two_charts(tmp_path, capsys):
    """``a/b`` and ``a_b`` shared ``ablation-a_b.png`` before issue 31: the page showed one
    workload's chart under the other's heading."""
    run_result(tmp_path / "src", "one.json", "a/b", steps=111)
    run_result(tmp_path / "src", "two.json", "a_b", steps=222)
    assert main(["report", "--from", str(tmp_path / "src"), "--out", str(tmp_path / "charts")]) == 0, \
        capsys.readouterr().err
    charts = tmp_path / "charts"
    assert drawn_workloads(charts / "ablation-a~2fb.csv") == {"a/b"}
    assert drawn_workloads(charts / "ablation-a_b.csv") == {"a_b"}
    page = (charts / "index.html").read_text()
    for title, image in (("fix ablation: a/b", "ablation-a~2fb.png"), ("fix ablation: a_b", "ablation-a_b.png")):
        assert f"<h3>{title}</h3><div class='chart'><img src='{image}'" in page


def test_a_300_character_workload_name_is_drawn_under_a_short_file_name(tmp_path, capsys):
    """A file name past 255 bytes failed after ``--out`` was created (issue 31); the name is now
    cut and hashed, and the chart is still its workload's."""
    name = "w" * 300
    run_result(tmp_path / "src", "r.json", name)
    assert main(["report", "--from", str(tmp_path / "src"), "--out", str(tmp_path / "charts")]) == 0, \
        capsys.readouterr().err
    (chart,) = (tmp_path / "charts").glob("ablation-*.png")
    assert len(chart.name) < 160 and chart.read_bytes().startswith(PNG_MAGIC)
    assert drawn_workloads(chart.with_suffix(".csv")) == {name}


def test_index_md_escapes_what_it_embeds(tmp_path, capsys):
    """A workload named ``<script>...`` reached index.md raw (the HTML page escaped it); a ``|``
    split its row of the runs table."""
    name = "<script>alert(1)</script>|*x*"
    run_result(tmp_path / "src", "r.json", name)
    assert main(["report", "--from", str(tmp_path / "src"), "--out", str(tmp_path / "charts")]) == 0, \
        capsys.readouterr().err
    markdown = (tmp_path / "charts" / "index.md").read_text()
    assert "<script>" not in markdown and "<script>" not in (tmp_path / "charts" / "index.html").read_text()
    assert r"&lt;script&gt;alert(1)&lt;/script&gt;\|\*x\*" in markdown
    lines = markdown.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("| workload | connector |")))
    row = lines[header + 2]
    unescaped = lambda line: line.replace("\\|", "").count("|")  # noqa: E731 - the cells' borders
    assert unescaped(row) == unescaped(lines[header])


def test_the_temporary_files_of_a_killed_report_are_removed_by_the_next_one(tmp_path, capsys):
    """``kill -9`` during a report leaves a hidden temporary PNG (its writer cannot clean up);
    before issue 31 no later report removed them. One a live writer holds is left alone."""
    run_result(tmp_path / "src", "r.json", "w")
    charts = tmp_path / "charts"
    charts.mkdir()
    left = [".ablation-gone.png.abcd1234.tmp", ".index.html.x_y_z_w1.tmp", ".store-delays-w.csv.00000000.tmp"]
    for name in left:
        (charts / name).write_bytes(PNG_MAGIC)  # cut short where the writer was killed
    (charts / ".notes.txt.abcd1234.tmp").write_text("not a report's")
    live = charts / ".capacity-w.png.live0000.tmp"
    live.write_bytes(b"")
    with open(live, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as atomic_output holds it while it writes
        assert main(["report", "--from", str(tmp_path / "src"), "--out", str(charts)]) == 0, capsys.readouterr().err
    hidden = sorted(path.name for path in charts.iterdir() if path.name.startswith("."))
    assert hidden == [".capacity-w.png.live0000.tmp", ".notes.txt.abcd1234.tmp"]


# A report whose chart drawing drops a finaliser: its __del__ gets the SIGINT, and the
# KeyboardInterrupt raised there is printed as "Exception ignored" and dropped by Python.
SWALLOWED_CTRL_C = """
import os, signal, sys
import kvoffload.report as report
from kvoffload.cli import main

class Finaliser:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs here, inside __del__
            pass

drawn = report.draw_capacity

def draw_capacity(runs, out):
    Finaliser()
    return drawn(runs, out)

report.draw_capacity = draw_capacity
sys.exit(main(sys.argv[1:]))
"""


def test_a_ctrl_c_a_finaliser_swallowed_still_ends_the_report_with_130(tmp_path):
    """Issue 31: one Ctrl-C was swallowed and the report ran on to exit 0."""
    run_result(tmp_path / "src", "r.json", "w")
    done = subprocess.run([sys.executable, "-c", SWALLOWED_CTRL_C, "report", "--from", str(tmp_path / "src"),
                           "--out", str(tmp_path / "charts")], capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done.stderr
    assert "KeyboardInterrupt" in done.stderr  # Python's own line about the one it dropped
    assert done.stderr.splitlines()[-1] == "kvoffload: interrupted"
    written = sorted(path.name for path in (tmp_path / "charts").iterdir())
    assert written == ["ablation-w.png"]  # drawn before the Ctrl-C, whole; nothing after it
    assert (tmp_path / "charts" / "ablation-w.png").read_bytes().startswith(PNG_MAGIC)


def test_an_earlier_reports_figures_go_only_when_this_one_is_whole(tmp_path, capsys, monkeypatch):
    """Removed first before issue 31: a report interrupted halfway left the folder without the
    figures it had not redrawn yet (an interrupted ``publish --charts`` deleted 22 tracked charts).
    Now they are removed at the end, only those this report did not redraw."""
    import kvoffload.report as report

    run_result(tmp_path / "src", "r.json", "w")
    charts = tmp_path / "charts"
    charts.mkdir()
    earlier = {"ablation-w.png": PNG_MAGIC + b"old", "asv-gone.png": PNG_MAGIC, "releases-gone.csv": "a,b\n"}
    for name, content in earlier.items():
        (charts / name).write_bytes(content if isinstance(content, bytes) else content.encode())

    def interrupted(runs, out):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(report, "draw_store_delays", interrupted)
        assert main(["report", "--from", str(tmp_path / "src"), "--out", str(charts)]) == 130
    assert sorted(path.name for path in charts.iterdir()) == sorted(earlier)  # all there, ablation-w.png redrawn
    assert (charts / "ablation-w.png").read_bytes() != earlier["ablation-w.png"]

    assert main(["report", "--from", str(tmp_path / "src"), "--out", str(charts)]) == 0, capsys.readouterr().err
    assert not any((charts / name).exists() for name in ("asv-gone.png", "releases-gone.csv"))
    assert (charts / "ablation-w.png").exists() and (charts / "index.html").exists()
