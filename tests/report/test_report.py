"""draw_report: figures from result files written by a tiny real run, and clean refusals.

The run results come from real replays of multi-turn-small (reference, a fix switched off, two
presets, and a capacity sweep); the asv results are a minimal file in asv 0.6's layout.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvoffload.report import draw_report
from kvoffload.report.sources import find_asv_points, find_runs
from kvoffload.results import ResultError, write_atomic
from kvoffload.runner import ConnectorChoice, replay_workload
from kvoffload.workloads import load_workload

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """results/runs-like folder: an ablation of multi-turn-small and a cpu_chunks sweep."""
    root = tmp_path_factory.mktemp("results")
    runs = root / "runs"
    workload = load_workload("multi-turn-small")
    choices = [ConnectorChoice.build(), ConnectorChoice.build(disabled=("last_block_at_finish",)),
               ConnectorChoice.build("vllm-0.25"), ConnectorChoice.build("vllm-0.26")]
    for choice in choices:
        outcome = replay_workload(workload, choice)
        write_atomic(runs / f"multi-turn-small-{choice.label.replace(' ', '')}.json", outcome.result)
    for chunks in (16, 64):
        outcome = replay_workload(load_workload("multi-turn-small", {"cpu_chunks": str(chunks)}), choices[0])
        write_atomic(runs / "sweep" / f"cpu{chunks}.json", outcome.result)
    (runs / "bench-summary.json").write_text(json.dumps({"schema": "kvoffload-bench/bench/v1", "rows": []}))
    (runs / "notes.json").write_text("not json at all")
    return root


def write_asv_results(asv_dir: Path) -> None:
    """Two commits of one parameterized track benchmark on machine 'ci-2core' (asv 0.6 layout)."""
    columns = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
               "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]
    name = "bench_workloads.TrackMultiTurn.track_last_block_miss_rate"
    machine = asv_dir / "ci-2core"
    machine.mkdir(parents=True)
    (machine / "machine.json").write_text(json.dumps({"machine": "ci-2core", "version": 1}))
    for i, (commit, values) in enumerate([("aaaa1111" * 5, [0.0, 0.18]), ("bbbb2222" * 5, [0.0, None])]):
        data = {"commit_hash": commit, "env_name": "existing-py", "date": 1_700_000_000_000 + i,
                "params": {}, "python": "3.11", "requirements": {}, "env_vars": {}, "result_columns": columns,
                "results": {name: [values, [["'reference'", "'vllm-0.25'"]], "1"]}, "durations": {},
                "version": 2}
        (machine / f"{commit[:8]}-existing-py.json").write_text(json.dumps(data))
    (asv_dir / "benchmarks.json").write_text(json.dumps({name: {"unit": "ratio", "type": "track"}, "version": 2}))


def test_the_report_draws_every_section_from_run_results(run_dir, tmp_path):
    out = tmp_path / "charts"
    index = draw_report(run_dir, out)
    assert index == out / "index.html"
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["ablation-multi-turn-small.png", "capacity-multi-turn-small.png",
                    "store-delays-multi-turn-small.png"]
    for name in pngs:
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    page = index.read_text()
    markdown = (out / "index.md").read_text()
    for name in pngs:
        assert f"src='{name}'" in page and f"({name})" in markdown
    assert "asv history: no asv results" in page  # the missing section says why
    assert "kvoffload report --from results" in page  # and where the published history is
    assert "reference -last_block_at_finish" in page  # the run table lists the fix-off run


def test_the_ablation_keeps_one_configuration_and_the_sweep_only_its_own(run_dir):
    from kvoffload.report.figures import ablation_set, capacity_series

    runs, ignored = find_runs(run_dir)
    assert len(runs) == 6 and ignored == []  # the summary and the non-JSON file are passed over
    chosen = ablation_set(runs)
    assert [run.label for run in chosen] == ["reference", "reference -last_block_at_finish",
                                             "vllm-0.25", "vllm-0.26"]
    assert {run.config["cpu_chunks"] for run in chosen} == {256}
    series = capacity_series(runs)
    assert list(series) == ["multi-turn-small"]
    assert {name: [r.config["cpu_chunks"] for r in points] for name, points in series["multi-turn-small"].items()} \
        == {"reference": [16, 64, 256]}


def test_asv_results_become_history_per_machine(run_dir, tmp_path):
    source = tmp_path / "results"
    write_asv_results(source / "asv")
    points, units = find_asv_points(source / "asv")
    assert {(p.params, p.commit[:8], p.value) for p in points} == {
        (("reference",), "aaaa1111", 0.0), (("vllm-0.25",), "aaaa1111", 0.18), (("reference",), "bbbb2222", 0.0)}
    assert units["bench_workloads.TrackMultiTurn.track_last_block_miss_rate"] == "ratio"
    out = tmp_path / "charts"
    index = draw_report(source, out)  # asv results alone are enough
    assert sorted(p.name for p in out.glob("*.png")) == ["asv-bench_workloads.TrackMultiTurn.png"]
    page = index.read_text()
    assert "no run results" in page
    # provenance: each commit's result file is listed under the chart
    assert "Provenance of the points (2 sources)" in page
    assert str(source / "asv" / "ci-2core" / "aaaa1111-existing-py.json") in page


def test_a_value_recorded_under_another_benchmark_version_is_left_out(tmp_path):
    """As in asv: after a version bump, values recorded under the old version are not drawn."""
    asv_dir = tmp_path / "asv"
    write_asv_results(asv_dir)
    name = "bench_workloads.TrackMultiTurn.track_last_block_miss_rate"
    assert len(find_asv_points(asv_dir)[0]) == 3  # recorded as version "1", the suite's too
    (asv_dir / "benchmarks.json").write_text(json.dumps({name: {"unit": "ratio", "version": "2"}, "version": 2}))
    assert find_asv_points(asv_dir)[0] == []
    (asv_dir / "benchmarks.json").write_text(json.dumps({name: {"unit": "ratio", "version": "1"}, "version": 2}))
    assert len(find_asv_points(asv_dir)[0]) == 3


def test_two_machines_share_a_panel_with_their_own_styles(tmp_path):
    from kvoffload.report.history import draw_asv_history, series_style

    source = tmp_path / "results"
    write_asv_results(source / "asv")
    other = source / "asv" / "h200"
    other.mkdir()
    for path in (source / "asv" / "ci-2core").glob("*-existing-py.json"):
        (other / path.name).write_text(path.read_text())
    points, units = find_asv_points(source / "asv")
    charts = draw_asv_history(points, units, tmp_path)
    assert [c.filename for c in charts] == ["asv-bench_workloads.TrackMultiTurn.png"]
    assert {row[0] for row in charts[0].provenance[1:]} == {"ci-2core", "h200"}
    # the same connector on two machines: another colour and line style; the reference on top
    ref_a, ref_b, preset = series_style(0, 0, True), series_style(0, 1, True), series_style(1, 0, False)
    assert ref_a["color"] != ref_b["color"] and ref_a["linestyle"] != ref_b["linestyle"]
    assert ref_a["zorder"] > preset["zorder"] and ref_a["color"] != preset["color"]
    assert len({series_style(i, 0, False)["color"] for i in range(4)}) == 4


@pytest.mark.parametrize("unit, values, factor, label", [
    ("bytes", [3.2e8, 3.4e8], 1 / 2**20, "MiB"),
    ("bytes", [5 * 2**30], 1 / 2**30, "GiB"),
    ("seconds", [0.00012], 1e6, "µs"),
    ("seconds", [0.25], 1e3, "ms"),
    ("seconds", [14.0], 1.0, "s"),
    ("µs/step", [120.0], 1.0, "µs/step"),
])
def test_values_are_shown_in_human_units(unit, values, factor, label):
    from kvoffload.report.history import human_unit

    assert human_unit(unit, values) == (pytest.approx(factor), label)


def test_a_malformed_run_file_is_listed_not_fatal(run_dir, tmp_path):
    source = tmp_path / "results"
    good = next((run_dir / "runs").glob("multi-turn-small-reference.json"))
    (source / "runs").mkdir(parents=True)
    (source / "runs" / good.name).write_text(good.read_text())
    (source / "runs" / "broken.json").write_text(json.dumps({"schema": "kvoffload-bench/run/v1"}))
    index = draw_report(source, tmp_path / "charts")
    assert "broken.json: key &#x27;workload&#x27; missing" in index.read_text()


def test_stale_figures_are_replaced(run_dir, tmp_path):
    out = tmp_path / "charts"
    out.mkdir()
    (out / "ablation-gone.png").write_bytes(PNG_MAGIC)
    (out / "keep-me.png").write_bytes(PNG_MAGIC)
    draw_report(run_dir, out)
    assert not (out / "ablation-gone.png").exists()
    assert (out / "keep-me.png").exists()  # not one of the report's names


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "missing", "no such directory"),
    (lambda tmp: tmp, "no result files"),
])
def test_a_bad_source_is_one_line_naming_the_path(tmp_path, make, message):
    source = make(tmp_path)
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ResultError) as error:
        draw_report(source, tmp_path / "out")
    text = str(error.value)
    assert message in text and str(source) in text and "\n" not in text
    assert not (tmp_path / "out").exists()


def test_a_file_as_source_is_refused(tmp_path):
    path = tmp_path / "result.json"
    path.write_text("{}")
    with pytest.raises(ResultError, match="not a directory"):
        draw_report(path, tmp_path / "out")


def test_a_result_keeps_the_whole_store_delay_distributions(run_dir):
    """The histogram in the result file agrees with the run's own percentiles (nearest rank)."""
    runs, _ = find_runs(run_dir)
    for run in runs:
        for metric in ("store_submit_delay_steps", "store_visible_delay_steps"):
            counts = run.distributions[metric]
            delays = [steps for steps, n in sorted(counts.items()) for _ in range(n)]
            assert delays, (run.path, metric)
            for q in (50, 99):
                rank = -(-len(delays) * q // 100)
                assert delays[rank - 1] == run.metrics[f"{metric}_p{q}"], (run.path, metric, q)


def test_store_delays_draw_distributions_where_kept_else_percentiles(run_dir, tmp_path):
    from kvoffload.report.delays import draw_store_delays
    from kvoffload.report.figures import ablation_set

    runs, _ = find_runs(run_dir)
    [full] = draw_store_delays(runs, tmp_path)
    assert full.caption.startswith("per delay d, the share of a run's stored chunks stored within d steps, "
                                   "minus the reference's")
    without = [dataclasses.replace(run, distributions={}) for run in runs]
    [bars] = draw_store_delays(without, tmp_path)
    assert bars.caption.startswith("each run's p50 and p99 minus the reference's")
    assert [row[2] for row in full.provenance[1:]] == [str(run.path) for run in ablation_set(runs)]


def test_the_ablation_shows_the_reference_each_fix_off_and_the_presets(run_dir):
    from kvoffload.report.ablation import WARNING_COLOR, ablation_colors, ablation_groups
    from kvoffload.report.figures import REFERENCE_COLOR, ablation_set

    runs, _ = find_runs(run_dir)
    chosen = ablation_set([r for r in runs if r.workload == "multi-turn-small"])
    groups = ablation_groups(chosen)
    assert [(name, [r.label for r in members]) for name, members in groups] == [
        ("reference", ["reference"]), ("reference, one fix off", ["reference -last_block_at_finish"]),
        ("vLLM presets", ["vllm-0.25", "vllm-0.26"])]
    # a must-be-0 count that is not 0 stands out in the warning colour; a 0 keeps its kind's colour
    poisoned = dataclasses.replace(chosen[2], metrics={**chosen[2].metrics, "poisoned_loads": 3})
    healthy = dataclasses.replace(chosen[0], metrics={**chosen[0].metrics, "poisoned_loads": 0})
    assert ablation_colors("poisoned_loads", [healthy, poisoned]) == [REFERENCE_COLOR, WARNING_COLOR]
    assert ablation_colors("offload_hit_rate", [poisoned])[0] != WARNING_COLOR  # a rate is never a warning


def test_store_delays_are_drawn_against_the_reference_and_never_ranked(run_dir, tmp_path):
    """A run with the reference's distribution is named, not drawn; one that stores a chunk a step
    earlier is a line above 0 by its share, named with its poisoned loads; a crashed run is left out."""
    from kvoffload.report.delays import draw_store_delays, points_against

    runs, _ = find_runs(run_dir)
    reference = next(run for run in runs if run.label == "reference" and run.workload == "multi-turn-small")
    base = {"store_submit_delay_steps": {1: 30, 2: 10}, "store_visible_delay_steps": {2: 30, 3: 10}}
    early = {"store_submit_delay_steps": {0: 4, 1: 30, 2: 6}, "store_visible_delay_steps": {1: 4, 2: 30, 3: 6}}
    ref = dataclasses.replace(reference, distributions=base)
    same = dataclasses.replace(ref, label="reference -aborted_watermark", path=Path("same.json"))
    watermark_off = dataclasses.replace(ref, label="reference -final_token_watermark", path=Path("off.json"),
                                        distributions=early, metrics={**ref.metrics, "poisoned_loads": 4})
    crashed = dataclasses.replace(ref, label="vllm-0.26", path=Path("crash.json"), crashed=True,
                                  distributions={"store_submit_delay_steps": {}, "store_visible_delay_steps": {}})
    assert points_against(watermark_off, ref, "store_submit_delay_steps", [0, 1, 2]) == pytest.approx([10.0, 10.0, 0.0])
    [chart] = draw_store_delays([ref, same, watermark_off, crashed], tmp_path)
    image = tmp_path / chart.filename
    assert image.read_bytes().startswith(PNG_MAGIC)
    assert "same delays as the reference: reference -aborted_watermark" in chart.caption
    assert "crashed, not drawn: vllm-0.26" in chart.caption
    assert "Earlier is not better" in chart.caption and "better" not in chart.caption.replace("Earlier is not better", "")
    assert chart.section == "What does each fix buy?"