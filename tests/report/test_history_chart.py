"""The asv history as a reader meets it: main's first-parent line with its gaps, asv's quartiles,
the intended changes marked, flat-zero tracks listed once, a commit named on hover, the data as CSV."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kvoffload.report import draw_report
from kvoffload.report.changes import Change, read_changes
from kvoffload.report.history import Axis, always_zero, draw_asv_history
from kvoffload.report.sources import AsvPoint, MainCommit, find_asv_points, read_main_line
from kvoffload.results import ResultError

COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
           "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]
MISS = "bench_workloads.TrackMultiTurn.track_last_block_miss_rate"
LEAKS = "bench_workloads.TrackMultiTurn.track_leaked_requests"
META = "bench_connector.BuildConnectorMeta.track_us_per_step"
LINE = [f"{c * 40}" for c in "abcde"]  # five commits of main, oldest first


def write_history(asv_dir: Path, recorded=("a", "c", "e"), main_line=True, machine: str = "ci") -> None:
    """Commits a, c and e of a five-commit main line recorded on ``machine``; b and d have no result.
    The miss rate steps up at d; leaked requests stay 0; the connector benchmark kept quartiles."""
    name, machine = machine, asv_dir / machine
    machine.mkdir(parents=True)
    (machine / "machine.json").write_text(json.dumps({"machine": name, "version": 1}))
    for i, commit in enumerate(LINE):
        if commit[0] not in recorded:
            continue
        miss = 0.0 if commit[0] < "d" else 0.004
        results = {
            MISS: [[miss, 0.05], [["'reference'", "'vllm-0.25'"]], "1"],
            LEAKS: [[0, 0], [["'reference'", "'vllm-0.25'"]], "1"],
            META: [[100.0 + i], [["1"]], "2", 0, 1.0, [90.0], [120.0], [95.0 + i], [105.0 + i], [1], [9], None, None],
        }
        data = {"commit_hash": commit, "env_name": "virtualenv-py3.11", "date": 1_700_000_000_000 + i * 60_000,
                "params": {}, "python": "3.11", "requirements": {}, "env_vars": {}, "result_columns": COLUMNS,
                "results": results, "durations": {}, "version": 2}
        (machine / f"{commit[:8]}-virtualenv-py3.11.json").write_text(json.dumps(data))
    suite = {MISS: {"unit": "ratio", "version": "1"}, LEAKS: {"unit": "requests", "version": "1"},
             META: {"unit": "µs/step", "version": "2"}}
    (asv_dir / "benchmarks.json").write_text(json.dumps(suite))
    if main_line:
        (asv_dir / "first-parent.tsv").write_text(
            "".join(f"{c}\t2026-11-2{i}T10:00:00+00:00\tcommit {c[0]}\n" for i, c in enumerate(LINE)))


def test_the_axis_is_mains_first_parent_line_with_its_gaps(tmp_path):
    write_history(tmp_path / "asv")
    points, units = find_asv_points(tmp_path / "asv")
    line = read_main_line(tmp_path / "asv")
    assert [c.commit for c in line] == LINE
    [_, chart] = draw_asv_history(points, units, tmp_path, {}, line, ())  # BuildConnectorMeta, TrackMultiTurn
    assert "5 commits that carry the suite" in chart.caption and "3 have results" in chart.caption
    # without the list: the recorded commits in date order, and the caption says gaps cannot be seen
    axis = Axis.build(points, [])
    assert [c.commit for c in axis.commits] == [LINE[0], LINE[2], LINE[4]] and not axis.first_parent


def test_every_commit_slot_names_its_commit_on_hover(tmp_path):
    write_history(tmp_path / "asv")
    points, units = find_asv_points(tmp_path / "asv")
    [_, chart] = draw_asv_history(points, units, tmp_path, {}, read_main_line(tmp_path / "asv"), ())
    # one drawn panel (the leak track stayed 0): one box per commit, left to right, inside the image
    assert [box.title.split()[0] for box in chart.hover] == [c[:12] for c in LINE]
    assert [box.title.endswith("(not recorded)") for box in chart.hover] == [False, True, False, True, False]
    lefts = [box.left for box in chart.hover]
    assert lefts == sorted(lefts) and all(0 <= b.left and b.left + b.width <= 100 and 0 <= b.top <= 100
                                          for b in chart.hover)


def test_a_track_that_stayed_zero_is_listed_not_drawn(tmp_path):
    write_history(tmp_path / "asv")
    points, units = find_asv_points(tmp_path / "asv")
    assert always_zero(points) == [LEAKS]
    [_, chart] = draw_asv_history(points, units, tmp_path, {}, read_main_line(tmp_path / "asv"), ())
    assert "so not drawn: leaked_requests" in chart.caption
    assert {row[0] for row in chart.table[1:]} == {MISS, LEAKS}  # the CSV keeps every value


def test_an_intended_change_is_marked_where_its_track_steps(tmp_path):
    write_history(tmp_path / "asv")
    points, units = find_asv_points(tmp_path / "asv")
    step = Change(LINE[3][:7], "last_block_miss_rate", "", "complete-chunk lookup")
    elsewhere = Change(LINE[1][:7], "us_per_step", "", "not a workload track")
    off_line = Change("f" * 7, "*", "", "not on main")
    [meta, multi] = draw_asv_history(points, units, tmp_path, {}, read_main_line(tmp_path / "asv"),
                                     (step, elsewhere, off_line))
    assert f"#2 {LINE[3][:7]} (last_block_miss_rate): complete-chunk lookup" in multi.caption
    assert "not a workload track" not in multi.caption and "not on main" not in multi.caption
    assert f"#1 {LINE[1][:7]} (us_per_step)" in meta.caption  # numbered from the oldest, in every figure


def test_asv_quartiles_are_read_and_kept_in_the_data(tmp_path):
    write_history(tmp_path / "asv")
    points, _ = find_asv_points(tmp_path / "asv")
    meta = sorted((p for p in points if p.benchmark == META), key=lambda p: p.date)
    assert [(p.spread, p.samples) for p in meta] == [((95.0, 105.0), 9), ((97.0, 107.0), 9), ((99.0, 109.0), 9)]
    assert all(p.spread is None for p in points if p.benchmark == MISS)  # a track is one value


def test_the_report_writes_each_charts_data_beside_it(tmp_path):
    write_history(tmp_path / "results" / "asv")
    out = tmp_path / "charts"
    index = draw_report(tmp_path / "results", out)
    with open(out / "asv-bench_connector.BuildConnectorMeta.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["commit"][0], float(r["value"]), r["q25"], r["samples"]) for r in rows] == [
        ("a", 100.0, "95.0", "9"), ("c", 102.0, "97.0", "9"), ("e", 104.0, "99.0", "9")]
    page = index.read_text()
    assert "asv-bench_connector.BuildConnectorMeta.csv" in page
    assert page.index("Contents") < page.index("<h2 id='did_this_commit_regress'>")
    assert page.count("class='slot'") == 2 * len(LINE)  # two figures, one panel column each


def test_a_malformed_first_parent_list_is_one_line(tmp_path):
    write_history(tmp_path / "asv")
    (tmp_path / "asv" / "first-parent.tsv").write_text("not a commit line\n")
    with pytest.raises(ResultError, match="first-parent.tsv: line 1: expected"):
        read_main_line(tmp_path / "asv")


def test_the_listed_changes_name_commits_of_mains_line():
    """Each row of changes.csv names a commit that exists (a typo would mark nothing)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    for change in read_changes():
        found = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", "--end-of-options",
                                f"{change.commit}^{{commit}}"], capture_output=True, text=True)
        assert found.returncode == 0, f"changes.csv: {change.commit} is not a commit"
        assert change.metric and change.reason



def test_the_newest_commit_is_compared_with_the_one_recorded_before_it(tmp_path):
    from kvoffload.report.moves import latest_moves

    write_history(tmp_path / "asv")
    points, units = find_asv_points(tmp_path / "asv")
    sentence, table = latest_moves(points, units, read_main_line(tmp_path / "asv"))
    assert sentence.startswith(f"main's newest recorded commit {LINE[4][:8]}")
    assert (f"recorded before it, {LINE[2][:8]}: 5 number(s) recorded at both; 1 deterministic moved, 1 worse; "
            "1 wall-time number(s) within their noise; 1 commit(s) between them have no result") in sentence
    header, *rows = table
    # the miss rate went up 0 -> 0.004 (worse); the leak count did not move; the measured µs moved
    # 2 % with overlapping quartiles: folded into one line
    assert rows[0] == ("deterministic", "TrackMultiTurn.track_last_block_miss_rate", "reference", "ci", "0", "0.004",
                       "+0.004", "worse")
    assert rows[1][:2] == ("wall time", "1 numbers") and rows[1][-1].endswith("folded")
    assert not any("leaked" in row[1] for row in rows)


def test_a_track_the_suite_no_longer_has_is_drawn_as_history_and_said_so(tmp_path):
    """The Track* classes' single-sample connector_us_per_step moved to the Measure* classes: the old
    points stay, and the chart says no newer point will join them (benchmarks.json lacks the name)."""
    write_history(tmp_path / "asv")
    suite = json.loads((tmp_path / "asv" / "benchmarks.json").read_text())
    del suite[MISS]
    (tmp_path / "asv" / "benchmarks.json").write_text(json.dumps(suite))
    points, units = find_asv_points(tmp_path / "asv")
    [meta, multi] = draw_asv_history(points, units, tmp_path, {}, read_main_line(tmp_path / "asv"), ())
    assert "No longer in the suite (asv's benchmarks.json), so no newer point will join them: " \
           "last_block_miss_rate." in multi.caption
    assert "No longer in the suite" not in meta.caption


def point(params: str, commit: str, value: float, **kw) -> AsvPoint:
    return AsvPoint("ci", "py", MISS, (params,), commit, 1_700_000_000_000 + LINE.index(commit), value, **kw)


def drawn_figure(points, monkeypatch, tmp_path):
    """draw_asv_history's chart and the figure it saved."""
    import kvoffload.report.history as history

    saved = []
    monkeypatch.setattr(history, "save_figure", lambda fig, path, dpi: saved.append(fig))
    [chart] = draw_asv_history(points, {MISS: "ratio"}, tmp_path, {}, [MainCommit(c, "2026-11-20", "") for c in LINE])
    return chart, saved[0]


def test_two_identical_lines_are_both_visible_and_named(tmp_path, monkeypatch):
    """A preset that never differs from the reference: drawn under it, it must not vanish."""
    points = [point(who, commit, 0.25) for who in ("reference", "vllm-0.25") for commit in LINE]
    points += [point("vllm-0.26", commit, 0.5) for commit in LINE]
    chart, fig = drawn_figure(points, monkeypatch, tmp_path)
    [ax] = [ax for ax in fig.axes if ax.get_visible()]
    lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    reference, preset = lines["reference"], lines["vllm-0.25"]
    # each keeps its own marker and dashes; the preset's hollow marker is larger, so it rings the reference's
    assert reference.get_marker() != preset.get_marker()
    assert reference.get_linestyle() != preset.get_linestyle()
    assert preset.get_markerfacecolor() == "none" and preset.get_markersize() > reference.get_markersize()
    assert "same at every shared commit: reference = vllm-0.25" in " ".join(ax.get_title().split())
    assert "last_block_miss_rate: reference = vllm-0.25." in chart.caption
    assert "vllm-0.26" not in ax.get_title()  # a line of its own is not listed


def test_a_panel_of_single_samples_claims_no_spread(tmp_path, monkeypatch):
    """A real-model measurement is one sample per commit: the caption and the CSV say no spread was
    measured instead of promising a quartile bar."""
    single = [point("reference", commit, 0.25 + i) for i, commit in enumerate(LINE)]
    chart, _ = drawn_figure(single, monkeypatch, tmp_path)
    assert "interquartile range" not in chart.caption
    assert "One sample per commit, so no spread was measured (every panel)." in chart.caption
    header, *rows = chart.table
    assert {row[header.index("spread")] for row in rows} == {"none measured: one sample"}
    repeated = [point("reference", commit, 0.25, spread=(0.2, 0.3), samples=9) for commit in LINE]
    chart, _ = drawn_figure(repeated, monkeypatch, tmp_path)
    assert "interquartile range of that commit's repeated samples (every panel)" in chart.caption
    assert "no spread" not in chart.caption
    header, *rows = chart.table
    assert {row[header.index("spread")] for row in rows} == {"interquartile range of 9 samples"}


def test_the_title_keeps_clear_of_the_key(tmp_path, monkeypatch):
    """A one-panel history (BuildConnectorMeta) is one panel wide beside its key: the title, with
    a long benchmark name and a machine's, must not run under the key."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from kvoffload.report import history

    drawn = {}
    monkeypatch.setattr(history, "save_figure", lambda fig, path, **_: drawn.setdefault(path.name, fig))
    write_history(tmp_path / "asv", machine="ci-2core-with-a-long-machine-name")
    points, units = find_asv_points(tmp_path / "asv")
    draw_asv_history(points, units, tmp_path, {}, read_main_line(tmp_path / "asv"), ())
    fig = drawn["asv-bench_connector.BuildConnectorMeta.png"]
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    [key] = fig.legends
    assert not fig._suptitle.get_window_extent(renderer).overlaps(key.get_window_extent(renderer))
