"""The history chart's drawing rules on hand-made points: a figure as wide as its panels and the
key, counts and rates on axes from 0, human units, each line's colour and layer, gaps bridged only
where a commit has no result (a long line too), spread bars where asv kept quartiles, one hover
box per commit edge to edge, an arrow naming the way a commit moved its panel's lines, centred
over that commit."""

from __future__ import annotations

import pytest

from kvoffload.report import history
from kvoffload.report.figures import REFERENCE_COLOR
from kvoffload.report.history import PANEL_SIZE, draw_asv_history, human_unit, series_style
from kvoffload.report.history_text import one_sample
from kvoffload.report.sources import AsvPoint, MainCommit

TRACK = "bench_workloads.TrackMultiTurn.track_last_block_miss_rate"
OTHER = "bench_workloads.TrackMultiTurn.track_poisoned_loads"


def line_of(count: int) -> list[MainCommit]:
    return [MainCommit(f"{i:040x}", "2026-11-20", f"commit {i}") for i in range(count)]


def point(commit: str, value: float, params=("reference",), benchmark=TRACK, machine="ci", env="py", **kw) -> AsvPoint:
    return AsvPoint(machine, env, benchmark, params, commit, int(commit, 16), value, **kw)


def drawn(points, main, monkeypatch, tmp_path, units=None):
    saved = []
    monkeypatch.setattr(history, "save_figure", lambda fig, path, dpi: saved.append(fig))
    [chart] = draw_asv_history(points, units or {TRACK: "ratio", OTHER: "chunks"}, tmp_path, {}, main)
    return chart, saved[0]


def visible(fig):
    return [ax for ax in fig.axes if ax.get_visible()]


def test_the_figure_is_as_wide_as_its_panels_and_the_key(monkeypatch, tmp_path):
    main = line_of(3)
    points = [point(c.commit, v, benchmark=b) for c in main for b, v in ((TRACK, 0.25), (OTHER, 1.0))]
    _, fig = drawn(points, main, monkeypatch, tmp_path)
    assert fig.get_figwidth() == pytest.approx(PANEL_SIZE[0] * 2 + 2.6)  # two panels, and the key's 2.6 in


def test_a_rate_starts_at_0_and_keeps_room_above_its_largest_value(monkeypatch, tmp_path):
    main = line_of(3)
    _, fig = drawn([point(c.commit, v) for c, v in zip(main, (0.0, 0.25, 0.5))], main, monkeypatch, tmp_path)
    [ax] = visible(fig)
    bottom, top = ax.get_ylim()
    assert bottom == 0 and 0.5 < top < 1  # not stretched to 1: a 0.5 rate fills the panel


def test_seconds_are_shown_in_the_unit_that_fits():
    assert human_unit("seconds", [2.0]) == (1.0, "s")
    assert human_unit("seconds", [0.002]) == (1e3, "ms")
    assert human_unit("seconds", [2e-5]) == (1e6, "µs")
    assert human_unit("bytes", [3 * 2**30]) == (1 / 2**30, "GiB")


def test_the_reference_is_green_thick_and_on_top_and_presets_above_the_change_lines():
    reference, preset = series_style(0, 0, True), series_style(1, 0, False)
    assert reference["color"] == REFERENCE_COLOR and reference["linewidth"] > preset["linewidth"]
    assert reference["zorder"] > preset["zorder"] > 1  # intended-change lines are drawn at 1
    assert preset["color"] != series_style(1, 1, False)["color"]  # a second machine: another shade
    assert series_style(0, 1, True)["color"] != REFERENCE_COLOR
    presets = [series_style(index, 0, False)["color"] for index in range(1, 10)]
    assert len(set(presets)) == 9  # nine connectors, nine hues
    assert series_style(0, 1, True)["color"] not in presets  # the reference's green is nobody else's


def test_a_pooled_line_of_two_machines_keeps_the_first_machines_colour(monkeypatch, tmp_path):
    main = line_of(4)
    points = [point(c.commit, 0.5, machine="m1") for c in main[:2]] + [point(c.commit, 0.5, machine="m2")
                                                                         for c in main[2:]]
    points += [point(c.commit, 9.0, machine=m, benchmark="bench_connector.BuildConnectorMeta.track_us_per_step")
               for c, m in zip(main, ("m1", "m1", "m2", "m2"))]  # a wall-time track keeps the two machines apart
    saved = []
    monkeypatch.setattr(history, "save_figure", lambda fig, path, dpi: saved.append(fig))
    draw_asv_history(points, {TRACK: "ratio", "bench_connector.BuildConnectorMeta.track_us_per_step": "µs/step"},
                     tmp_path, {}, main)
    [ax] = visible(saved[1])  # TrackMultiTurn
    [line] = [line for line in ax.get_lines() if line.get_label() == "reference"]
    assert line.get_color() == REFERENCE_COLOR


def test_two_environments_are_named_in_their_lines(monkeypatch, tmp_path):
    main = line_of(2)
    points = [point(c.commit, 0.5, env=env) for c in main for env in ("virtualenv", "existing-vllm")]
    _, fig = drawn(points, main, monkeypatch, tmp_path)
    labels = {line.get_label() for line in visible(fig)[0].get_lines() if not line.get_label().startswith("_")}
    assert labels == {"reference [virtualenv]", "reference [existing-vllm]"}


def test_a_long_line_is_broken_only_where_a_commit_has_no_result(monkeypatch, tmp_path):
    main = line_of(300)
    recorded = [c for i, c in enumerate(main) if i != 280]  # one gap, past int's small-object cache
    _, fig = drawn([point(c.commit, 0.25 + (i % 2) / 4) for i, c in enumerate(recorded)], main, monkeypatch, tmp_path)
    [solid] = [line for line in visible(fig)[0].get_lines() if line.get_label() == "reference"]
    ys = list(solid.get_ydata())
    assert sum(y != y for y in ys) == 1  # one NaN: the break at the gap


def test_a_spread_bar_stands_where_asv_kept_quartiles(monkeypatch, tmp_path):
    main = line_of(3)
    bare = [point(c.commit, 0.5) for c in main]
    _, fig = drawn(bare, main, monkeypatch, tmp_path)
    assert len(visible(fig)[0].collections) == 0
    with_spread = [point(c.commit, 0.5, spread=(0.4, 0.6), samples=9) for c in main]
    _, fig = drawn(with_spread, main, monkeypatch, tmp_path)
    [bars] = visible(fig)[0].collections
    assert len(bars.get_segments()) == 3


def test_one_hover_box_per_commit_edge_to_edge(monkeypatch, tmp_path):
    main = line_of(5)
    chart, _ = drawn([point(c.commit, 0.5 + i / 10) for i, c in enumerate(main)], main, monkeypatch, tmp_path)
    boxes = chart.hover
    assert len(boxes) == 5
    for box, after in zip(boxes, boxes[1:]):
        assert box.left + box.width == pytest.approx(after.left)


def test_lines_moving_both_ways_at_one_commit_get_a_two_way_arrow(monkeypatch, tmp_path):
    main = line_of(3)
    points = [point(c.commit, v) for c, v in zip(main, (0.5, 0.5, 0.75))]
    points += [point(c.commit, v, params=("vllm-0.25",)) for c, v in zip(main, (0.5, 0.5, 0.25))]
    _, fig = drawn(points, main, monkeypatch, tmp_path)
    assert [text.get_text() for text in visible(fig)[0].texts] == [f"↕{main[2].commit[:7]}"]


def test_a_single_sample_with_quartiles_still_measured_no_spread():
    """asv writes quartiles even of one sample (all equal): no spread was measured there."""
    assert one_sample([point("0" * 40, 1.0, spread=(1.0, 1.0), samples=1)])
    assert not one_sample([point("0" * 40, 1.0, spread=(0.9, 1.1), samples=9)])


def test_a_commits_arrow_stands_centred_over_its_slot(monkeypatch, tmp_path):
    """The arrow and short id name the commit under them: centred on its slot (the newest commit's,
    at the panel's right edge, ends there instead)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    main = line_of(4)
    _, fig = drawn([point(c.commit, v) for c, v in zip(main, (0.5, 0.75, 0.75, 0.75))], main, monkeypatch, tmp_path)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    [ax] = visible(fig)
    [arrow] = ax.texts
    assert arrow.get_text() == f"↑{main[1].commit[:7]}"
    box = arrow.get_window_extent(renderer)
    assert (box.x0 + box.x1) / 2 == pytest.approx(ax.transData.transform((1, 0))[0], abs=0.5)
