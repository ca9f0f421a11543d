"""What a reader sees on a run-result figure, on hand-made runs: each bar's label on its bar,
percentile bars side by side, difference curves that stand out from the zero line on an axis of
at least +-2 points, a key that names the lines of the first panel, a note where no run differs;
the ablation grows a panel height per row; a release figure keeps its key out of the data and
its agreement axis just above 1; a long name's file name within bounds; a connector's capacity
families numbered in path order; the report's capacity note only where there is no capacity
chart."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from kvoffload.report import delays, draw_report, releases
from kvoffload.report.ablation import PANEL_HEIGHT_IN, ablation_figure
from kvoffload.report.figures import LONGEST_SLUG, capacity_series, slug
from kvoffload.report.sources import RunFile

HEALTHY = {"last_block_hit_rate": 0.9, "last_chunk_offloaded_rate": 1.0, "offload_hit_rate": 0.7,
           "poisoned_loads": 0, "lifecycle_violations": 0, "crashes": 0, "stuck_requests": 0, "leaked_requests": 0}
SUBMIT, VISIBLE = delays.DELAY_METRICS


def run(label: str, index: int = 0, config=None, distributions=None, **metrics) -> RunFile:
    return RunFile(Path(f"runs/r{index:02d}.json"), "w", label, None, (), config or {"cpu_chunks": 64},
                   {**HEALTHY, **metrics}, "abc", False, distributions or {})


def drawn_delays(runs, monkeypatch, tmp_path):
    """The store-delay figure of ``runs``, as draw_store_delays built it (not written)."""
    saved = []
    monkeypatch.setattr(delays, "save_chart", lambda fig, out, filename: saved.append(fig) or filename)
    delays.draw_store_delays(runs, tmp_path)
    [fig] = saved
    FigureCanvasAgg(fig).draw()
    return fig


def panels(fig, prefix: str):
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_title().startswith(prefix)]


# ---- the fix ablation ----------------------------------------------------------------------------


def test_each_row_of_ablation_panels_is_one_panel_high_with_room_for_the_title_and_footer():
    two_metrics = [run("reference"), run("reference -last_block_at_finish", last_block_hit_rate=0.8,
                                         last_chunk_offloaded_rate=0.5)]  # two panels: one row
    three_metrics = [*two_metrics[:1], run("reference -last_block_at_finish", 1, last_block_hit_rate=0.8,
                                           last_chunk_offloaded_rate=0.5, offload_hit_rate=0.6)]  # two rows
    one_row, _ = ablation_figure("w", two_metrics)
    two_rows, _ = ablation_figure("w", three_metrics)
    assert len(panels(one_row, "")) == 2 and len(panels(two_rows, "")) == 3
    assert two_rows.get_figheight() - one_row.get_figheight() == pytest.approx(PANEL_HEIGHT_IN)
    assert one_row.get_figheight() > PANEL_HEIGHT_IN + 0.5  # the title and the footer are not a panel's


def test_a_difference_label_stands_on_its_bar_as_far_below_a_loss_as_above_a_gain():
    fig, _ = ablation_figure("w", [run("reference"), run("reference -last_block_at_finish", 1, last_block_hit_rate=0.8),
                                   run("vllm-0.25", 2, last_block_hit_rate=0.95)])
    [panel] = panels(fig, "last_block_hit_rate")
    labels = {text.get_text(): text for text in panel.texts if "(" in text.get_text()}
    assert set(labels) == {"= (0.900)", "-10.0 (0.800)", "+5.0 (0.950)"}
    for bar, label in zip(panel.patches, labels.values()):
        assert label.xy[0] == pytest.approx(bar.get_x() + bar.get_width() / 2)  # over the bar's middle
    gain, loss = labels["+5.0 (0.950)"], labels["-10.0 (0.800)"]
    assert (gain.get_va(), loss.get_va()) == ("bottom", "top")
    assert gain.xyann[1] > 0 and loss.xyann[1] == -gain.xyann[1]


def test_without_a_reference_each_bar_is_labelled_with_its_own_value():
    """No reference: rates are drawn as they are, to three decimals like the tables; a count as
    it is; a run without the value reads n/a."""
    runs = [run("vllm-0.25", last_block_hit_rate=0.8125, poisoned_loads=3),
            run("vllm-0.26", 1, last_block_hit_rate=None, poisoned_loads=12)]
    fig, _ = ablation_figure("w", runs)
    [rate] = panels(fig, "last_block_hit_rate")
    [count] = panels(fig, "poisoned_loads")
    values = [text.get_text() for text in rate.texts if text.get_rotation() == 90]
    assert values == ["0.812", "n/a"]  # format_value's three decimals
    assert [text.get_text() for text in count.texts if text.get_rotation() == 90] == ["3", "12"]


# ---- store delays ------------------------------------------------------------------------------


def test_percentile_bars_of_a_run_stand_side_by_side_within_its_slot(monkeypatch, tmp_path):
    """Result files without distributions: each run's p50 and p99 against the reference's, two
    bars that neither cover each other nor reach a neighbour's slot."""
    percentiles = {f"{m}_{p}": v for m in (SUBMIT, VISIBLE) for p, v in (("p50", 2), ("p99", 9))}
    runs = [run("reference", **percentiles),
            run("reference -last_block_at_finish", 1, **{**percentiles, f"{SUBMIT}_p99": 12}),
            run("vllm-0.25", 2, **{**percentiles, f"{SUBMIT}_p50": 4})]
    fig = drawn_delays(runs, monkeypatch, tmp_path)
    [panel, _] = panels(fig, "store_")
    bars = sorted(panel.patches, key=lambda bar: bar.get_x())
    assert len(bars) == 4  # p50 and p99 of the two runs that differ
    for slot, (p50, p99) in enumerate(zip(bars[::2], bars[1::2])):
        assert slot - 0.5 <= p50.get_x() and p50.get_x() + p50.get_width() <= p99.get_x() + 1e-9
        assert p99.get_x() + p99.get_width() <= slot + 0.5


def delay_runs(*shares) -> list[RunFile]:
    """The reference and one run per ``(submit, visible)`` pair of distributions ({steps: chunks})."""
    reference = {SUBMIT: {1: 10}, VISIBLE: {2: 10}}
    return [run("reference", distributions=reference),
            *(run(f"reference -fix_{i}", i + 1, distributions={SUBMIT: submit, VISIBLE: visible})
              for i, (submit, visible) in enumerate(shares))]


def test_a_difference_curve_is_drawn_thicker_than_the_zero_line(monkeypatch, tmp_path):
    """A run whose share sits on 0 for most delays is still seen over the zero line."""
    fig = drawn_delays(delay_runs(({0: 1, 1: 9}, {2: 10})), monkeypatch, tmp_path)
    for panel in panels(fig, "store_"):
        [curve] = [line for line in panel.get_lines() if not line.get_label().startswith("_")]
        [zero] = [line for line in panel.get_lines() if list(line.get_ydata()) == [0, 0]]
        assert curve.get_linewidth() > zero.get_linewidth()


def test_a_small_difference_is_drawn_on_an_axis_of_at_least_2_points(monkeypatch, tmp_path):
    """One chunk in a thousand a step early is 0.1 points: not blown up to fill the panel."""
    fig = drawn_delays(delay_runs(({0: 1, 1: 999}, {1: 1, 2: 999})), monkeypatch, tmp_path)
    for panel in panels(fig, "store_"):
        low, high = panel.get_ylim()
        assert low <= -2 and high >= 2


def test_the_key_names_the_lines_of_the_first_panel(monkeypatch, tmp_path):
    """Two runs with the same submission delays are one line there (their names together), while
    their visibility delays differ: the key below the panels holds the submission panel's lines."""
    fig = drawn_delays(delay_runs(({1: 5, 2: 5}, {2: 4, 3: 6}), ({1: 5, 2: 5}, {3: 10})), monkeypatch, tmp_path)
    [key] = [ax for ax in fig.axes if ax.get_legend() is not None]
    assert [text.get_text() for text in key.get_legend().get_texts()] == [
        "reference -fix_0; reference -fix_1"]


def test_with_no_run_differing_each_panel_says_so_in_its_middle(monkeypatch, tmp_path):
    fig = drawn_delays(delay_runs(({1: 10}, {2: 10})), monkeypatch, tmp_path)
    renderer = fig.canvas.get_renderer()
    shown = panels(fig, "store_")
    assert len(shown) == 2
    for panel in shown:
        [note] = panel.texts
        assert note.get_text() == "no run differs from the reference"
        box, area = note.get_window_extent(renderer), panel.get_window_extent(renderer)
        assert area.x0 <= box.x0 and box.x1 <= area.x1
        assert (box.x0 + box.x1) / 2 == pytest.approx((area.x0 + area.x1) / 2, abs=1)


# ---- file names and capacity series ------------------------------------------------------------


def test_a_long_name_is_cut_to_the_longest_slug_ending_in_a_hash_of_the_whole():
    name = "multi-turn-" + "x" * 300
    cut = slug(name)
    assert len(cut) == LONGEST_SLUG  # "ablation-" + this + ".png" stays far within 255 bytes
    assert cut == name[:LONGEST_SLUG - 18] + "~~" + hashlib.sha256(name.encode()).hexdigest()[:16]
    assert slug(name + "y") != cut  # the hash tells two long names apart


def test_two_capacity_families_of_one_connector_are_numbered_in_path_order():
    """One label from two connector sources (the simulator's reference rules and vLLM's stock
    connector under one preset): the family of the first file in path order keeps the plain label."""
    runs = [run("vllm-0.25", i, config={"cpu_chunks": chunks, "connector": source})
            for i, (source, chunks) in enumerate((("stock", 16), ("stock", 64), ("reference", 16), ("reference", 64)))]
    series = capacity_series(runs)["w"]
    assert {name: [r.config["connector"] for r in points] for name, points in series.items()} == {
        "vllm-0.25": ["stock", "stock"], "vllm-0.25 (2)": ["reference", "reference"]}


def test_the_capacity_note_stands_only_where_no_capacity_chart_is_drawn(tmp_path, monkeypatch):
    import kvoffload.report as report

    for name in ("draw_ablation", "draw_store_delays"):  # not what this is about; kept quick
        monkeypatch.setattr(report, name, lambda runs, out: [])
    bundled = json.loads((Path(__file__).resolve().parents[2] / "results/runs/bench-multi-turn-reference.json")
                         .read_text())
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "r.json").write_text(json.dumps(bundled))
    note = "hit rate against CPU capacity: no runs that differ only in config.cpu_chunks"
    assert note in draw_report(tmp_path / "one", tmp_path / "out-one").read_text()
    bundled["config"]["cpu_chunks"] //= 2
    (tmp_path / "one" / "half.json").write_text(json.dumps(bundled))
    page = draw_report(tmp_path / "one", tmp_path / "out-two").read_text()
    assert "capacity-multi-turn.png" in page and note not in page


# ---- vLLM releases -----------------------------------------------------------------------------


def release_figures(rows, monkeypatch, tmp_path):
    table = {"schema": releases.SCHEMA, "releases": [
        {"release": f"0.{25 + i}.0", "preset": f"vllm-0.{25 + i}", "rows": [row]} for i, row in enumerate(rows)]}
    (tmp_path / "releases").mkdir()
    (tmp_path / "releases" / "releases.json").write_text(json.dumps(table))
    saved = []
    monkeypatch.setattr(releases, "save_figure", lambda fig, path: saved.append(fig))
    releases.draw_releases(tmp_path, tmp_path)
    [fig] = saved
    return fig


def release_row(value: int, **counts) -> dict:
    metrics = {name: value for name in ("poisoned_loads", "crashes", "store_submit_delay_steps_p50",
                                        "store_submit_delay_steps_p99")}  # four counts of the table
    return {"workload": "w", "scheduling": "sync", "release": {"metrics": metrics, "error": None},
            "preset": {"metrics": metrics, "error": None}, **counts}


def test_five_panels_and_the_key_each_get_a_place_of_their_own(monkeypatch, tmp_path):
    """Four counts that move across releases and the agreement panel: five panels, and the key in
    a sixth, so it covers no data (a 4-column grid: two rows)."""
    fig = release_figures([release_row(0, requests=10, agreeing=10), release_row(2, requests=10, agreeing=7)],
                          monkeypatch, tmp_path)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    titles = [ax.get_title() for ax in shown if ax.get_title()]
    assert len(titles) == 5 and titles[0].startswith("requests agreeing")  # the agreement and four counts
    [key] = [ax for ax in shown if ax.get_legend() is not None]
    assert key.get_title() == "" and not key.collections  # a panel of its own, no data under it


def test_the_agreement_axis_ends_just_above_every_request_agreeing(monkeypatch, tmp_path):
    fig = release_figures([release_row(0, requests=10, agreeing=10), release_row(2, requests=10, agreeing=5)],
                          monkeypatch, tmp_path)
    [agreement] = [ax for ax in fig.axes if ax.get_title().startswith("requests agreeing")]
    low, high = agreement.get_ylim()
    assert low < 0.5 and 1 < high <= 1.1  # all agreeing (1) is in view, near the top
