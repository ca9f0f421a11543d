"""Details of the report's figures and files on hand-made runs: a panel holds at least one bar
however narrow, the store-delay CSV holds every run's shares, and a report goes into folders it
makes."""

from __future__ import annotations

import csv
from pathlib import Path

from kvoffload.report import ablation, draw_report
from kvoffload.report.delays import delay_table
from kvoffload.report.sources import RunFile


def run(label: str, metrics=None, distributions=None, index: int = 0) -> RunFile:
    return RunFile(Path(f"r{index}.json"), "w", label, None, (), {"cpu_chunks": 8},
                   metrics or {"last_block_hit_rate": 0.5}, "abc", False, distributions or {})


def test_a_panel_holds_at_least_one_bar_however_narrow():
    assert ablation.bars_per_panel(1000) == 1
    assert ablation.bars_per_panel(1) > 1


def test_the_store_delay_table_holds_every_runs_shares():
    one = run("reference", distributions={"store_submit_delay_steps": {1: 3, 2: 1},
                                          "store_visible_delay_steps": {4: 4}})
    other = run("vllm-0.25", distributions={"store_submit_delay_steps": {0: 2}, "store_visible_delay_steps": {}},
                index=1)
    header, *rows = delay_table([one, other])
    assert [(r[1], r[2], r[3], r[4], r[5]) for r in rows] == [
        ("reference", "store_submit_delay_steps", "1", "3", "0.750000"),
        ("reference", "store_submit_delay_steps", "2", "1", "0.250000"),
        ("reference", "store_visible_delay_steps", "4", "4", "1.000000"),
        ("vllm-0.25", "store_submit_delay_steps", "0", "2", "1.000000")]


def test_a_report_goes_into_folders_it_makes(tmp_path):
    from kvoffload.cli import main

    assert main(["run", "--workload", "multi-turn-small", "--quiet", "--out", str(tmp_path / "runs" / "run.json")]) == 0
    index = draw_report(tmp_path / "runs", tmp_path / "new" / "deeper" / "charts")
    assert index == tmp_path / "new" / "deeper" / "charts" / "index.html" and index.is_file()
    with open(index.with_name("ablation-multi-turn-small.csv"), newline="") as handle:
        assert len(list(csv.reader(handle))) == 2  # the header and the one run


def test_a_crashed_run_is_named_so_under_its_bar():
    from kvoffload.report.figures import tick_labels

    crashed = RunFile(Path("c.json"), "w", "vllm-0.25", None, (), {}, {}, "abc", True)
    assert tick_labels([run("reference -last_block_at_finish"), crashed]) == [
        "reference\n-last_block_at_finish", "vllm-0.25 (crashed)"]


def test_presets_take_the_blues_in_order():
    from kvoffload.report.figures import _PRESET_SHADES, distinct_colors

    colors = distinct_colors(["vllm-0.26", "reference", "vllm-0.25"])
    assert (colors["vllm-0.25"], colors["vllm-0.26"]) == _PRESET_SHADES[:2]


def test_the_footer_names_a_dirty_commit_as_such_inside_the_figure():
    from matplotlib.figure import Figure

    from kvoffload.report.figures import footer

    fig = Figure()
    footer(fig, [RunFile(Path("a.json"), "w", "reference", None, (), {"cpu_chunks": 8}, {}, "0123456789abcdef-dirty",
                         False), run("vllm-0.25", index=1)])
    [text] = fig.texts
    assert text.get_text() == "2 result files; commit 0123456789ab-dirty, abc; cpu_chunks=8"
    x, y = text.get_position()
    assert 0 <= x <= 1 and 0 <= y <= 1


def test_two_capacities_make_a_series():
    from kvoffload.report.figures import capacity_series

    runs = [RunFile(Path(f"c{c}.json"), "w", "reference", None, (), {"cpu_chunks": c}, {}, "abc", False)
            for c in (1024, 2048)]
    assert capacity_series(runs) == {"w": {"reference": runs}}
    assert capacity_series(runs[:1]) == {}


def test_the_markdown_page_has_every_section_and_the_runs(tmp_path):
    from kvoffload.report.figures import REGRESSION, RELEASE_LOSS, Chart
    from kvoffload.report.page import Page, write_markdown

    charts = [Chart(REGRESSION, "a history", "asv-x.png", "c"), Chart(RELEASE_LOSS, "delays", "store-delays-w.png", "c")]
    write_markdown(Page(source=tmp_path, charts=charts, runs=[run("reference")]), tmp_path / "with.md")
    text = (tmp_path / "with.md").read_text()
    assert '<h2 id="did_this_commit_regress">Did this commit regress?</h2>' in text
    assert '<h2 id="what_did_each_release_lose">What did each release lose?</h2>' in text
    contents = text.split("## Contents\n\n")[1].split("\n\n")[0].splitlines()
    assert contents == ["- [Did this commit regress?](#did_this_commit_regress)", "  - [a history](#asv-x.png)",
                        "- [What did each release lose?](#what_did_each_release_lose)",
                        "  - [delays](#store-delays-w.png)"]
    assert "## Runs" in text and "| w | reference |" in text
    write_markdown(Page(source=tmp_path, charts=charts), tmp_path / "without.md")
    assert "## Runs" not in (tmp_path / "without.md").read_text()


def test_a_release_table_that_is_not_json_is_one_line_naming_it(tmp_path):
    import pytest

    from kvoffload.report.releases import read_release_table
    from kvoffload.results import ResultError

    (tmp_path / "releases").mkdir()
    (tmp_path / "releases" / "releases.json").write_text('{"schema": ')
    with pytest.raises(ResultError, match=r"releases\.json: not JSON \(line 1: .*\); expected a release table$"):
        read_release_table(tmp_path)


def test_a_release_row_that_could_not_set_up_is_passed_over_not_the_rest(tmp_path):
    import json

    from kvoffload.releases import SCHEMA
    from kvoffload.report.releases import draw_releases

    def measured(rate):
        return {"metrics": {"last_block_hit_rate": rate}, "error": None}

    rows = [{"workload": "w", "scheduling": "async", "setup_error": "ImportError: x"},
            {"workload": "w", "scheduling": "sync", "release": measured(0.5), "preset": measured(0.5)}]
    (tmp_path / "releases").mkdir()
    (tmp_path / "releases" / "releases.json").write_text(json.dumps(
        {"schema": SCHEMA, "releases": [{"release": "0.25.0", "preset": "vllm-0.25", "rows": rows}]}))
    (tmp_path / "out").mkdir()
    charts, note = draw_releases(tmp_path, tmp_path / "out")
    assert [chart.filename for chart in charts] == ["releases-w.png"] and note is None


def test_the_scaling_chart_draws_every_series_and_its_linear_guide_on_log_axes(tmp_path, monkeypatch):
    import kvoffload.report.scaling as scaling

    saved = []
    monkeypatch.setattr(scaling, "save_figure", lambda figure, out: saved.append(figure))
    points = [scaling.ScalingPoint(name, n, n / 100, n * 2**20) for name in ("a sync", "b async") for n in (100, 1000)]
    scaling.draw_scaling(points, tmp_path / "s.png")
    [fig] = saved
    [memory_axes] = fig.axes
    assert memory_axes.get_xscale() == memory_axes.get_yscale() == "log"
    named = {line.get_label(): list(line.get_ydata()) for line in memory_axes.get_lines()
             if not line.get_label().startswith("_")}
    assert named == {"a sync": [100 / 1024, 1000 / 1024], "b async": [100 / 1024, 1000 / 1024]}  # GiB
    guides = [list(line.get_ydata()) for line in memory_axes.get_lines() if line.get_linestyle() == ":"]
    assert guides == [[100 / 1024, 1000 / 1024]] * 2  # linear growth from the smallest point


def test_asv_values_are_read_as_asv_writes_them(tmp_path):
    """A missing date is 0 (commit order then falls back to main's line), a missing sample count
    is one sample, a parameter keeps its text unless asv quoted all of it."""
    import json

    import pytest

    from kvoffload.report.sources import _asv_date, _unquote, find_asv_points, read_main_line
    from kvoffload.results import ResultError

    assert (_asv_date(None), _asv_date(1_700_000_000_000)) == (0, 1_700_000_000_000)
    assert [_unquote(t) for t in ("'multi-turn'", '"x"', "'abc", "aba", "4", "''")] == [
        "multi-turn", "x", "'abc", "aba", "4", ""]
    folder = tmp_path / "asv" / "m"
    folder.mkdir(parents=True)
    (folder / "abcdef12-env.json").write_text(json.dumps({
        "commit_hash": "abcdef12" * 5, "env_name": "env", "result_columns": ["result", "params"],
        "results": {"b.C.track_x": [[1.0], [["'reference'"]]]}}))
    [point] = find_asv_points(tmp_path / "asv")[0]
    assert (point.date, point.samples, point.params) == (0, 1, ("reference",))
    (tmp_path / "asv" / "first-parent.tsv").write_text("abc1234\t2026-11-20T10:00:00+00:00\ta short id\n")
    with pytest.raises(ResultError, match="line 1: expected 'commit<TAB>date<TAB>subject'"):
        read_main_line(tmp_path / "asv")


def test_a_long_wrong_value_is_quoted_to_57_characters_and_an_ellipsis(tmp_path):
    import json

    import pytest

    from kvoffload.results import SCHEMA, ResultError, read_result

    path = tmp_path / "run.json"
    path.write_text(json.dumps({"schema": SCHEMA, "workload": {"name": "w"}, "connector": {"label": "reference"},
                                "config": {}, "metrics": {"steps": "x" * 100}}))
    with pytest.raises(ResultError) as raised:
        read_result(path)
    assert str(raised.value).endswith(f"got {repr('x' * 100)[:57]}...")
