"""Every figure fits the page at 1:1 (``figures.MAX_FIGURE_WIDTH_PX``, shown unscaled in a 1400 px
window), so its text stays legible: more runs, a wider delay span or more benchmarks make a
figure taller, never wider than the bound."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from kvoffload.report import draw_report
from kvoffload.report.figures import MAX_FIGURE_WIDTH_PX, save_figure
from kvoffload.report.sources import RunFile
from report_browser import png_size  # on sys.path: conftest.py

REPO = Path(__file__).resolve().parents[2]


def test_every_figure_of_the_published_results_fits_the_page(tmp_path):
    out = tmp_path / "charts"
    draw_report(REPO / "results", out)
    widths = {path.name: png_size(path.read_bytes())[0] for path in out.glob("*.png")}
    assert len(widths) > 10  # ablation, store delays, capacity, asv history, releases
    assert {name: w for name, w in widths.items() if w > MAX_FIGURE_WIDTH_PX} == {}
    store_delays = [w for name, w in widths.items() if name.startswith("store-delays-")]
    assert store_delays and min(store_delays) >= 0.8 * MAX_FIGURE_WIDTH_PX  # bounded, not shrunk to nothing


def wide_runs(count: int, span: int) -> list[RunFile]:
    """``count`` connectors of one workload, stores delayed from 0 to ``span`` steps, each run's
    delays spread a little differently (so each is its own line against the reference)."""
    labels = ["reference"] + [f"reference -fix_{i:02d}" for i in range(count // 2)] + \
             [f"vllm-0.{i}" for i in range(count - 1 - count // 2)]
    return [RunFile(path=Path(f"runs/w-{i:02d}.json"), workload="wide", label=label, preset=None, disabled=(),
                    config={"cpu_chunks": 64}, commit="abc",
                    metrics={"last_block_hit_rate": 0.9 - 0.002 * i, "last_chunk_offloaded_rate": 1.0,
                             "offload_hit_rate": 0.5 + 0.002 * i,
                             "poisoned_loads": i % 3, "lifecycle_violations": 0,
                             "store_submit_delay_steps_p50": 3, "store_submit_delay_steps_p99": span + i,
                             "store_visible_delay_steps_p50": 4, "store_visible_delay_steps_p99": span},
                    crashed=False, distributions={"store_submit_delay_steps": spread(i, span),
                                                  "store_visible_delay_steps": spread(i, span)})
            for i, label in enumerate(labels)]


def spread(run: int, span: int) -> dict[int, int]:
    return {steps: 1 + (steps + run) % 7 for steps in range(span + 1)}


@pytest.mark.parametrize("keep_distributions", [True, False])
def test_a_workload_with_many_runs_and_a_wide_delay_span_grows_down_not_across(tmp_path, keep_distributions):
    """40 connectors with delays over 120 steps: the old store-delay figure was 234,696 px wide."""
    from kvoffload.report.ablation import draw_ablation
    from kvoffload.report.delays import draw_store_delays

    runs = wide_runs(40, 120)
    if not keep_distributions:
        runs = [dataclasses.replace(run, distributions={}) for run in runs]
    [ablation] = draw_ablation(runs, tmp_path)
    width, height = png_size((tmp_path / ablation.filename).read_bytes())
    assert width <= MAX_FIGURE_WIDTH_PX and height > width  # the runs went into rows
    [delays] = draw_store_delays(runs, tmp_path)
    width, height = png_size((tmp_path / delays.filename).read_bytes())
    [few] = draw_store_delays(runs[:3], tmp_path / "few")
    assert width <= MAX_FIGURE_WIDTH_PX and height > png_size((tmp_path / "few" / few.filename).read_bytes())[1]


def test_a_figure_over_the_bound_is_refused_not_shrunk(tmp_path):
    fig = Figure(figsize=(MAX_FIGURE_WIDTH_PX / 100 + 0.5, 3))
    with pytest.raises(ValueError, match=f"over the page's {MAX_FIGURE_WIDTH_PX} px"):
        save_figure(fig, tmp_path / "too-wide.png", dpi=100)
    assert list(tmp_path.iterdir()) == []
