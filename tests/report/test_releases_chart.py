"""The report's "vLLM releases" section, from a release table (``kvoffload releases`` writes it)."""

from __future__ import annotations

import json

import pytest

from kvoffload.releases import SCHEMA
from kvoffload.report.releases import draw_releases
from kvoffload.results import ResultError


def row(workload, scheduling, real, simulated):
    return {"workload": workload, "scheduling": scheduling, "release": {"metrics": real, "error": None},
            "preset": {"metrics": simulated, "error": None}}


def write_table(source, releases, provenance=None):
    (source / "releases").mkdir(parents=True)
    table = {"schema": SCHEMA, "hash_seed": 0, "seconds": 12.5, "releases": releases}
    if provenance is not None:
        table["provenance"] = provenance
    (source / "releases" / "releases.json").write_text(json.dumps(table))


def test_each_release_is_drawn_beside_its_preset_with_its_data(tmp_path):
    write_table(tmp_path / "src", [
        {"release": "0.25.0", "preset": "vllm-0.25", "rows": [
            row("multi-turn-small", "sync", {"last_block_hit_rate": 0.5, "poisoned_loads": 2},
                {"last_block_hit_rate": 0.5, "poisoned_loads": 1}),
            {"workload": "multi-turn-small", "scheduling": "async", "setup_error": "ImportError: x"}]},
        {"release": "0.32.0", "preset": "reference", "rows": [
            row("multi-turn-small", "sync", {"last_block_hit_rate": 1.0, "poisoned_loads": 0},
                {"last_block_hit_rate": 1.0, "poisoned_loads": 0})]},
    ])
    out = tmp_path / "out"
    out.mkdir()
    charts, note = draw_releases(tmp_path / "src", out)
    assert note is None and [c.title for c in charts] == ["vLLM releases: multi-turn-small"]
    assert (out / "releases-multi-turn-small.png").stat().st_size > 0
    header, *rows = charts[0].table
    by_key = {(r[0], r[2], r[3]): (r[4], r[5]) for r in rows}
    assert by_key[("0.25.0", "sync", "poisoned_loads")] == ("2", "1")  # the release beside its preset
    assert by_key[("0.32.0", "sync", "last_block_hit_rate")] == ("1.000", "1.000")
    assert by_key[("0.25.0", "sync", "connector_us_per_step")] == ("", "")  # not in the row: blank
    assert not any(r[2] == "async" for r in rows)  # a row that could not be built draws nothing


@pytest.mark.parametrize("provenance, says", [
    ({"commit": "a" * 40, "commits": {"a" * 40: 2}}, "a" * 40),
    ({"commit": None, "commits": {"a" * 40: 1, "b" * 40 + "-dirty": 1}},
     f"{'a' * 40} (1 rows), {'b' * 40}-dirty (1 rows)"),
    (None, "not recorded (a table written before rows carried their commit)"),
], ids=["one commit", "two commits merged", "an older table"])
def test_the_charts_name_the_commit_their_rows_were_measured_at(tmp_path, provenance, says):
    write_table(tmp_path / "src", [{"release": "0.32.0", "preset": "reference", "rows": [
        row("multi-turn-small", "sync", {"poisoned_loads": 0}, {"poisoned_loads": 0}),
        row("multi-turn-small", "async", {"poisoned_loads": 0}, {"poisoned_loads": 0})]}], provenance)
    (tmp_path / "out").mkdir()
    charts, _ = draw_releases(tmp_path / "src", tmp_path / "out")
    header, values = charts[0].provenance
    assert dict(zip(header, values))["commit"] == says


def test_no_table_is_a_note_and_a_malformed_one_a_one_line_error(tmp_path):
    charts, note = draw_releases(tmp_path, tmp_path)
    assert charts == [] and "kvoffload releases writes it" in note
    (tmp_path / "releases").mkdir()
    (tmp_path / "releases" / "releases.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ResultError, match="not a release table"):
        draw_releases(tmp_path, tmp_path)


def test_every_chart_has_its_key_outside_the_data_and_a_flat_metric_is_named_not_drawn():
    """shared-prefix has no request with a last block to store, and no release crashed: no flat
    panel on a default axis for either, the title names them; the key sits in the spare panel."""
    from kvoffload.report.releases import _figure

    points = [("0.32.0", "reference", "sync", "poisoned_loads", 0, 0),
              ("0.32.0", "reference", "sync", "last_block_hit_rate", None, None),
              ("0.32.0", "reference", "sync", "connector_us_per_step", 170.0, 40.0)]
    fig = _figure("shared-prefix", ["0.32.0"], points)
    assert [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.axison] == []
    title = " ".join(fig.get_suptitle().split())
    assert title.startswith("vLLM releases: shared-prefix Not drawn: last_block_hit_rate no value in any row; "
                            "poisoned_loads 0 in every row;")
    assert title.endswith("connector_us_per_step measured once per row (no spread): in the table")
    key = fig.axes[-1].get_legend()
    assert [t.get_text() for t in key.get_texts()] == ["release, sync", "preset, sync", "release, async",
                                                       "preset, async"]


def test_a_three_point_gap_shows_and_counts_start_at_zero():
    """0.970 against 0.999 (0.25 against its preset, multi-turn async): the axis spans the
    values with a margin, not 0 to 1; poisoned loads from 0."""
    from kvoffload.report.releases import _figure

    points = [("0.25.0", "vllm-0.25", "async", "last_block_hit_rate", 0.970, 0.999),
              ("0.32.0", "reference", "async", "last_block_hit_rate", 0.996, 0.996),
              ("0.26.0", "vllm-0.26", "sync", "poisoned_loads", 19, 19),
              ("0.32.0", "reference", "sync", "poisoned_loads", 0, 0)]
    fig = _figure("multi-turn", ["0.25.0", "0.26.0", "0.32.0"], points)
    by_title = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    low, high = by_title["last_block_hit_rate"].get_ylim()
    assert 0.95 < low < 0.970 and 0.999 < high < 1.01
    assert by_title["poisoned_loads"].get_ylim()[0] == 0

def test_requests_agreeing_on_hits_and_steps_get_a_panel_where_any_row_falls_short():
    """0.29.0's shared-prefix-small async: 28 of 32 on hits, 18 on the admission step, 15 on the
    finish step: the panel's axis reaches below the lowest share; every row at 32/32 is named."""
    from kvoffload.report.releases import _figure

    points = [("0.29.0", "vllm-0.29", "async", "poisoned_loads", 0, 0)]
    short = [("0.29.0", "async", "hits", 28 / 32), ("0.29.0", "async", "admitted", 18 / 32),
             ("0.29.0", "async", "finished", 15 / 32), ("0.32.0", "async", "hits", 1.0)]
    fig = _figure("shared-prefix-small", ["0.29.0", "0.32.0"], points, short)
    [panel] = [ax for ax in fig.axes if ax.get_title().startswith("requests agreeing")]
    assert panel.get_ylim()[0] < 15 / 32 and len(panel.collections) == 3  # async: hits, admitted, finished
    whole = [(r, "async", kind, 1.0) for r in ("0.29.0", "0.32.0") for kind in ("hits", "admitted", "finished")]
    fig = _figure("shared-prefix-small", ["0.29.0", "0.32.0"], points, whole)
    assert not [ax for ax in fig.axes if ax.get_title().startswith("requests agreeing")]
    assert "requests agreeing every request on hits and steps, in every row" in " ".join(fig.get_suptitle().split())
