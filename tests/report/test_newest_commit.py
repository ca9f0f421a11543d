"""The newest commit shows: the "did this commit regress?" table puts deterministic moves first and
worse ones first (highlighted on the page), folds wall-time numbers within their noise into one
line, and every history panel marks each commit where a deterministic track moved, above every
line, with its short id; a measured panel that one outlier would flatten is drawn on a log scale."""

from __future__ import annotations

from kvoffload.report.figures import REGRESSION, Chart
from kvoffload.report.history import draw_asv_history
from kvoffload.report.moves import COUNT_BOUND, latest_moves
from kvoffload.report.page import Page, write_html, write_markdown
from kvoffload.report.sources import AsvPoint, MainCommit

LINE = [c * 40 for c in "abcdef"]
MAIN = [MainCommit(c, f"2026-11-2{i}T10:00:00+00:00", f"commit {c[0]}") for i, c in enumerate(LINE)]
POISON = "bench_workloads.TrackSpecDecode.track_poisoned_loads"
MISS = "bench_workloads.TrackSpecDecode.track_offload_miss_rate"
META = "bench_connector.BuildConnectorMeta.track_us_per_step"
COUNT = "bench_counts.CountBuildConnectorMeta.track_instructions_per_step"
UNITS = {POISON: "chunks", MISS: "ratio", META: "µs/step", COUNT: "instructions/step"}


def pt(benchmark: str, params: str, commit: str, value: float, **kw) -> AsvPoint:
    return AsvPoint("ci", "env", benchmark, (params,), commit, LINE.index(commit), value, **kw)


def newest_two(poison_now=19.0, miss_now=0.35, meta=((100.0, (95.0, 105.0)), (104.0, (97.0, 110.0))),
               count=(1_000_000.0, 1_010_000.0)) -> list[AsvPoint]:
    """Commits e then f: the reference's poisoned loads and miss rate move at f; a preset's stay."""
    points = []
    for commit, poison, miss, (us, spread), instructions in zip(LINE[4:], (0.0, poison_now), (0.4, miss_now), meta,
                                                                count):
        points += [pt(POISON, "reference", commit, poison), pt(POISON, "vllm-0.29", commit, 19.0),
                   pt(MISS, "reference", commit, miss), pt(META, "1", commit, us, spread=spread, samples=9),
                   pt(COUNT, "1", commit, instructions)]
    return points


def test_deterministic_moves_come_first_worse_first_and_wall_time_noise_folds_into_one_line():
    sentence, (header, *rows) = latest_moves(newest_two(), UNITS, MAIN)
    assert header[4:6] == (LINE[4][:8], LINE[5][:8])
    # the miss rate went down (better): listed after the poisoned loads that went up (worse)
    assert [(row[0], row[1].split(".")[-1], row[-1]) for row in rows] == [
        ("deterministic", "track_poisoned_loads", "worse"),
        ("deterministic", "track_offload_miss_rate", "better"),
        ("wall time", "1 numbers", "within their noise (quartiles overlap, one sample, or a step their own history makes): folded")]
    assert rows[0][4:7] == ("0", "19", "+19")
    assert "2 deterministic moved, 1 worse; 1 wall-time number(s) within their noise" in sentence
    # a 1 % change of the instruction count is within its bound: not listed, not folded either


def test_a_wall_time_move_beyond_its_noise_and_a_count_beyond_its_bound_are_listed():
    apart = ((100.0, (95.0, 105.0)), (160.0, (150.0, 170.0)))  # +60 %, quartile ranges apart
    _, (header, *rows) = latest_moves(newest_two(poison_now=0.0, miss_now=0.4, meta=apart,
                                                 count=(1_000_000.0, 1_050_000.0)), UNITS, MAIN)
    assert [(row[0], row[-1]) for row in rows] == [
        ("counted", f"worse (beyond the count's {COUNT_BOUND:.0%} bound)"),
        ("wall time, median of 9", "worse (beyond its noise: quartiles apart, a step its history has not made)")]


def test_one_sample_or_overlapping_quartiles_never_count_as_a_wall_time_move():
    overlapping = ((100.0, (60.0, 140.0)), (130.0, (90.0, 170.0)))  # +30 %, but the quartiles overlap
    one_sample = ((100.0, None), (300.0, None))
    for meta in (overlapping, one_sample):
        _, (header, *rows) = latest_moves(newest_two(poison_now=0.0, miss_now=0.4, meta=meta), UNITS, MAIN)
        assert [row[-1][:6] for row in rows] == ["within"]


def test_the_page_highlights_worse_rows(tmp_path):
    page = Page(source=tmp_path, moves=latest_moves(newest_two(), UNITS, MAIN),
                charts=[Chart(REGRESSION, "a history", "asv-x.png", "its caption")])
    write_html(page, tmp_path / "index.html")
    write_markdown(page, tmp_path / "index.md")
    html_text = (tmp_path / "index.html").read_text()
    assert html_text.count("<tr class='worse'>") == 1 and "<tr class='worse'><td>deterministic</td>" in html_text
    # bold, and escaped as every text of index.md is (page.md: an underscore is no emphasis)
    assert r"| **deterministic** | **TrackSpecDecode.track\_poisoned\_loads** |" in (tmp_path / "index.md").read_text()


def drawn(points, units, monkeypatch, tmp_path):
    import kvoffload.report.history as history

    saved = {}
    monkeypatch.setattr(history, "save_figure", lambda fig, path, dpi: saved.setdefault(path.name, fig))
    charts = draw_asv_history(points, units, tmp_path, {}, MAIN)
    return {chart.filename: (chart, saved[chart.filename]) for chart in charts}


def test_a_move_under_another_line_at_the_newest_commit_is_marked_above_every_line(tmp_path, monkeypatch):
    """The issue's chart: the reference's 0 -> 19 poisoned loads at the newest commit sat under a
    preset's line at 19 and showed as one marker on the right edge."""
    points = [pt(POISON, "vllm-0.29", c, 19.0) for c in LINE]
    points += [pt(POISON, "reference", c, 0.0 if c != LINE[-1] else 19.0) for c in LINE]
    chart, fig = drawn(points, {POISON: "chunks"}, monkeypatch, tmp_path)["asv-bench_workloads.TrackSpecDecode.png"]
    [ax] = [ax for ax in fig.axes if ax.get_visible()]
    marks = [line for line in ax.get_lines() if line.get_marker() == "^"]
    assert [(list(m.get_xdata()), list(m.get_ydata())) for m in marks] == [([5], [19.0])]
    assert marks[0].get_zorder() > max(line.get_zorder() for line in ax.get_lines() if line not in marks)
    labels = [text.get_text() for text in ax.texts]
    assert labels == [f"↑{LINE[-1][:7]}"]
    assert f"the commit's short id with its arrow stands at the top of the panel: {LINE[-1][:7]}." in chart.caption


def test_a_measured_panel_that_one_outlier_would_flatten_is_drawn_on_a_log_scale(tmp_path, monkeypatch):
    values = [250.0, 260.0, 7700.0, 255.0, 270.0, 265.0]  # one commit measured under heavy load
    points = [pt(META, "1", c, v, spread=(v * 0.9, v * 1.1), samples=9) for c, v in zip(LINE, values)]
    chart, fig = drawn(points, {META: "µs/step"}, monkeypatch, tmp_path)["asv-bench_connector.BuildConnectorMeta.png"]
    [ax] = [ax for ax in fig.axes if ax.get_visible()]
    assert ax.get_yscale() == "log"
    assert "wall time, log scale" in ax.get_title()
    assert "use a log scale, so one outlier cannot flatten the rest: us_per_step." in chart.caption
    assert not [text for text in ax.texts if text.get_text().startswith("↑")]  # wall time moves are not marked


def test_a_deterministic_track_pools_its_machines_unless_they_disagree(tmp_path, monkeypatch):
    """Its value belongs to the commit: one line per connector from every machine's results; two
    machines that disagree at one commit (a determinism bug) get a line each, and the caption says so."""
    def on(machine, commit, value):
        return AsvPoint(machine, "env", POISON, ("reference",), commit, LINE.index(commit), value)

    agree = [on("m1", c, 0.0) for c in LINE[:4]] + [on("m2", c, 0.0) for c in LINE[3:]]
    chart, _ = drawn(agree, {POISON: "chunks"}, monkeypatch, tmp_path)["asv-bench_workloads.TrackSpecDecode.png"]
    assert "0 on every recorded commit" in chart.caption  # pooled: one all-zero track, listed not drawn
    agree = [on("m1", c, float(i)) for i, c in enumerate(LINE[:4])] + [on("m2", c, float(i + 3))
                                                                        for i, c in enumerate(LINE[3:])]
    chart, fig = drawn(agree, {POISON: "chunks"}, monkeypatch, tmp_path)["asv-bench_workloads.TrackSpecDecode.png"]
    [ax] = [ax for ax in fig.axes if ax.get_visible()]
    assert [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")] == ["reference"]
    disagree = agree + [on("m2", LINE[0], 7.0)]
    chart, fig = drawn(disagree, {POISON: "chunks"}, monkeypatch, tmp_path)["asv-bench_workloads.TrackSpecDecode.png"]
    [ax] = [ax for ax in fig.axes if ax.get_visible()]
    assert sorted(line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")) == [
        "reference @ m1", "reference @ m2"]
    assert "except where two machines disagree at a commit" in chart.caption and "poisoned_loads" in chart.caption


def test_a_series_that_swings_under_load_needs_a_bigger_step_than_its_history_makes():
    """BuildConnectorMeta on the shared runner swung 250 to 7,700 µs: a +60 % step with quartiles
    apart is within what its history does; the same step on a quiet series is listed."""
    swinging = [100.0, 200.0, 90.0, 180.0, 100.0, 210.0, 100.0, 160.0]
    quiet = [100.0, 101.0, 99.0, 100.5, 100.0, 99.5, 100.0, 160.0]
    for history, listed in ((swinging, False), (quiet, True)):
        commits = [c * 40 for c in "abcdefgh"]
        points = [AsvPoint("ci", "env", META, ("1",), c, i, v, spread=(v * 0.98, v * 1.02), samples=9)
                  for i, (c, v) in enumerate(zip(commits, history))]
        _, (header, *rows) = latest_moves(points, UNITS, [MainCommit(c, "2026-11-20", "") for c in commits])
        assert rows[0][-1].startswith("worse") is listed, rows
