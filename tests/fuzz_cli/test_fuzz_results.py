"""Fuzzed result files and asv result files, read as ``compare`` and ``report`` read them (issue 22:
a string ``provenance`` raised AttributeError, a 5,000-digit number or an infinite asv date a
traceback).

A result is a bundled one with keys replaced by hostile JSON values (or a number in it made
5,000 digits long); ``compare`` must answer with a table (exit 0) or one line (exit 2), and the
report's reader must list the file as read or as ignored, never raise. An asv file is a bundled
one with its fields replaced the same way; the reader returns points or raises ResultError.
"""

from __future__ import annotations

import json
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

from fuzz_inputs import HUGE, INPUTS, dumps, fuzz_settings, json_values
from hypothesis import given
from hypothesis import strategies as st

from kvoffload.cli import main
from kvoffload.report.sources import find_asv_points, find_runs
from kvoffload.results import ResultError

REPO = Path(__file__).resolve().parents[2]
RESULT = json.loads((REPO / "results" / "runs" / "bench-multi-turn-reference.json").read_text())
ASV = next(path for path in sorted((REPO / "results" / "asv").glob("*/*.json")) if path.name != "machine.json")
ASV_RESULT = json.loads(ASV.read_text())


def _paths(document: dict) -> list[tuple[str, ...]]:
    """Every key path of ``document`` down to two levels: what a change may replace."""
    paths = []
    for key, value in document.items():
        paths.append((key,))
        if isinstance(value, dict):
            paths += [(key, inner) for inner in value]
    return paths


@st.composite
def changed(draw, document: dict) -> str:
    """``document`` as JSON with one to three values (or keys' values two levels down) replaced."""
    data = json.loads(json.dumps(document))
    for path in draw(st.lists(st.sampled_from(_paths(document)), min_size=1, max_size=3)):
        target = data
        for key in path[:-1]:
            target = target.get(key) if isinstance(target, dict) else None
        if isinstance(target, dict):
            target[path[-1]] = draw(st.one_of(json_values, st.just(HUGE)))
    return dumps(data)


@fuzz_settings(60)
@given(text=changed(RESULT))
def test_fuzzed_result_files(text, tmp_path):
    INPUTS["result files"] += 1
    (tmp_path / "a.json").write_text(text)
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["compare", str(tmp_path / "a.json"), str(tmp_path / "a.json")])
    assert code in (0, 2), err.getvalue()
    if code == 2:
        assert len(err.getvalue().splitlines()) == 1 and err.getvalue().startswith("kvoffload: error: ")
    runs, ignored = find_runs(tmp_path)  # the report's reader: one or the other, never a traceback
    assert len(runs) + len(ignored) <= 1 and (code == 0) == bool(runs)


@fuzz_settings(40)
@given(text=changed(ASV_RESULT))
def test_fuzzed_asv_files(text, tmp_path):
    INPUTS["asv files"] += 1
    (tmp_path / "asv" / "machine").mkdir(parents=True, exist_ok=True)
    (tmp_path / "asv" / "machine" / ASV.name).write_text(text)
    try:
        points, _ = find_asv_points(tmp_path / "asv")
    except ResultError as error:
        assert "\n" not in str(error) and str(tmp_path) in str(error)
        return
    assert all(0 <= point.date < 253402300800000 for point in points)
