"""The fix ablation as a reader meets it: a rate is drawn as its difference from the reference,
so a 3-point loss is a bar of 3 points; the metric that tells a connector miss from vLLM's
complete-chunk rule stands beside last_block_hit_rate; a metric with nothing to show (n/a, the
reference's value in every run, or 0 where it must be 0) is named once in the subtitle instead of
drawn as an empty or flat panel."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg

from kvoffload.report.ablation import WARNING_COLOR, ablation_colors, ablation_figure, draw_ablation
from kvoffload.report.page import HEADERS, Page
from kvoffload.report.sources import RunFile

HEALTHY = {"last_block_hit_rate": 0.889, "last_chunk_offloaded_rate": 1.0, "offload_hit_rate": 0.7,
           "poisoned_loads": 0, "lifecycle_violations": 0, "crashes": 0, "stuck_requests": 0, "leaked_requests": 0}


def run(label: str, **metrics) -> RunFile:
    return RunFile(path=Path(f"runs/w-{label.replace(' ', '')}.json"), workload="multi-turn-small", label=label,
                   preset=None, disabled=(), config={"cpu_chunks": 64}, metrics={**HEALTHY, **metrics},
                   commit="abc123", crashed=False)


def panel_titles(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes if ax.get_visible()]


def test_the_offloaded_share_of_last_chunks_stands_beside_the_last_block_hit_rate(tmp_path):
    """The reference's 0.889 on multi-turn-small is vLLM's complete-chunk lookup, not a miss: the
    reader sees 1.000 of last chunks offloaded right beside it, in the chart, its data and the runs table."""
    runs = [run("reference"), run("reference -last_block_at_finish", last_chunk_offloaded_rate=0.75,
                                  last_block_hit_rate=0.75),
            run("vllm-0.25", last_chunk_offloaded_rate=0.75, last_block_hit_rate=0.75)]
    fig, _ = ablation_figure("multi-turn-small", runs)
    titles = panel_titles(fig)
    at = titles.index("last_block_hit_rate: points from the reference's 0.889 (higher is better)")
    assert titles[at + 1] == "last_chunk_offloaded_rate: points from the reference's 1.000 (higher is better)"
    panel = [ax for ax in fig.axes if ax.get_title().startswith("last_chunk_offloaded_rate")][0]
    assert [round(bar.get_height(), 6) for bar in panel.patches] == [0.0, -25.0, -25.0]  # points
    # the glossary says higher is better: a low share is a kind's colour, never the must-be-0 warning
    assert ablation_colors("last_chunk_offloaded_rate", runs[1:]) != [WARNING_COLOR] * 2
    [chart] = draw_ablation(runs, tmp_path)
    assert "last_chunk_offloaded_rate" in chart.table[0]
    column = chart.table[0].index("last_chunk_offloaded_rate")
    assert [row[column] for row in chart.table[1:]] == ["1.0", "0.75", "0.75"]  # the data keeps the values
    assert "last_chunk_offloaded_rate (higher is better): of finished requests" in chart.caption
    page = Page(source=tmp_path, runs=runs)
    column = HEADERS.index("last_chunk_offloaded_rate")  # the page's runs table
    assert HEADERS[column - 1] == "last_block_hit_rate"
    assert [row[column] for row in page.summary_rows()] == ["1.000", "0.750", "0.750"]


def test_a_three_point_gap_is_a_bar_of_three_points_on_an_axis_that_shows_it():
    """0.996 against 0.970 (full multi-turn without last_block_at_finish): on a 0-1 axis two
    nearly equal bars; here a bar of -2.6 points on an axis of a few points, labelled with the value."""
    runs = [run("reference", last_block_hit_rate=0.996), run("reference -last_block_at_finish", last_block_hit_rate=0.970)]
    fig, _ = ablation_figure("multi-turn", runs)
    [panel] = [ax for ax in fig.axes if ax.get_title().startswith("last_block_hit_rate")]
    assert [round(bar.get_height(), 6) for bar in panel.patches] == [0.0, -2.6]
    low, high = panel.get_ylim()
    assert -10 < low < -2.6 and 2.6 < high < 10
    assert {text.get_text() for text in panel.texts} >= {"= (0.996)", "-2.6 (0.970)"}


def test_a_crashed_run_gets_no_rate_bar_only_its_crash():
    """A crashed run's rates cover what ran before the crash: no bar, the word, and its crash
    in the crashes panel."""
    runs = [run("reference"), run("reference -last_block_at_finish", last_block_hit_rate=0.7),
            RunFile(**{**run("vllm-0.26", offload_hit_rate=0.0, crashes=1).__dict__, "crashed": True})]
    fig, skipped = ablation_figure("multi-turn", runs)
    [panel] = [ax for ax in fig.axes if ax.get_title().startswith("last_block_hit_rate")]
    assert [round(bar.get_height(), 6) for bar in panel.patches] == [0.0, -18.9, 0.0]
    assert "crashed" in {text.get_text() for text in panel.texts}
    assert skipped["offload_hit_rate"] == "the reference's 0.700 in every run that did not crash"
    assert "crashes (must be 0)" in panel_titles(fig)


def shared_prefix_runs() -> list[RunFile]:
    """As on shared-prefix: no continuation (last_block_hit_rate n/a), nothing poisoned, no violation."""
    return [run(label, last_block_hit_rate=None) for label in
            ("reference", "reference -aborted_watermark", "reference -last_block_at_finish", "vllm-0.25", "vllm-0.26")]


def test_a_metric_with_nothing_to_show_is_named_once_not_drawn_empty(tmp_path):
    runs = shared_prefix_runs()
    runs[2] = run("reference -last_block_at_finish", last_block_hit_rate=None, offload_hit_rate=0.65)
    fig, skipped = ablation_figure("shared-prefix", runs)
    assert panel_titles(fig) == ["offload_hit_rate: points from the reference's 0.700 (higher is better)"]
    assert skipped == {"last_block_hit_rate": "n/a for every run (no continuation of a finished request here: "
                                              "last_block_eligible 0)",
                       "last_chunk_offloaded_rate": "the reference's 1.000 in every run that did not crash",
                       "poisoned_loads": "0 for every run", "lifecycle_violations": "0 for every run",
                       "crashes": "0 for every run", "stuck_requests": "0 for every run",
                       "leaked_requests": "0 for every run"}
    subtitle = " ".join(fig.get_suptitle().split())
    assert "Not drawn: last_block_hit_rate n/a for every run" in subtitle
    assert "last_chunk_offloaded_rate the reference's 1.000 in every run that did not crash" in subtitle
    assert "poisoned_loads and lifecycle_violations and crashes" in subtitle
    [chart] = draw_ablation(shared_prefix_runs(), tmp_path)
    assert "Not drawn: last_block_hit_rate n/a for every run" in chart.caption
    # one poisoned load brings its panel back, in the warning colour
    poisoned = shared_prefix_runs()
    poisoned[3] = run("vllm-0.25", last_block_hit_rate=None, poisoned_loads=3)
    fig, skipped = ablation_figure("shared-prefix", poisoned)
    assert "poisoned_loads (must be 0)" in panel_titles(fig) and "poisoned_loads" not in skipped


def test_no_text_overlaps_a_tick_label(tmp_path):
    """Every annotation and title of a panel keeps clear of its tick labels: it lies within the
    panel's width, or wholly above the panel (the group names, the title)."""
    narrow = [run("reference", last_block_hit_rate=None), run("vllm-0.25", poisoned_loads=2)]
    moving = [run("reference"), run("reference -last_block_at_finish", last_block_hit_rate=0.5),
              run("vllm-0.25", last_block_hit_rate=0.95, offload_hit_rate=0.69)]
    for runs in (shared_prefix_runs(), narrow, moving):
        fig, _ = ablation_figure("w", runs)
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
        for ax in (ax for ax in fig.axes if ax.get_visible()):
            panel = ax.get_window_extent(renderer)
            ticks = [label.get_window_extent(renderer) for label in [*ax.get_yticklabels(), *ax.get_xticklabels()]
                     if label.get_text()]
            for text in [*ax.texts, ax.title]:
                box = text.get_window_extent(renderer)
                assert not any(box.overlaps(tick) for tick in ticks), (ax.get_title(), text.get_text())
                assert box.y0 >= panel.y1 or panel.x0 <= box.x0 and box.x1 <= panel.x1, text.get_text()


def test_two_files_for_one_bar_are_both_named_in_the_caption(tmp_path):
    """A bench run and the same run of a capacity sweep (same commit and configuration): the chart
    draws one, and its caption says which file it drew, which it passed over, and whether they agree."""
    bench, sweep = run("reference"), run("reference")
    bench = RunFile(**{**bench.__dict__, "path": Path("runs/bench-w-reference.json")})
    sweep = RunFile(**{**sweep.__dict__, "path": Path("runs/capacity/w-reference-cpu64.json")})
    [chart] = draw_ablation([bench, sweep, run("vllm-0.25")], tmp_path)
    assert [row[3] for row in chart.table[1:]] == [str(sweep.path), "runs/w-vllm-0.25.json"]
    assert ("reference: drawn from runs/capacity/w-reference-cpu64.json, runs/bench-w-reference.json passed over "
            "(their deterministic metrics are equal)") in chart.caption
    # a rerun that did not reproduce: the caption names the metrics that differ
    rerun = RunFile(**{**sweep.__dict__, "metrics": {**sweep.metrics, "offload_hit_rate": 0.6,
                                                     "connector_us_per_step": 9.0}})
    [chart] = draw_ablation([bench, rerun], tmp_path)
    assert "passed over (they differ in offload_hit_rate)" in chart.caption
    [chart] = draw_ablation([bench, run("vllm-0.25")], tmp_path)
    assert "passed over" not in chart.caption
