"""Rules of single flags of ``run`` and ``sweep``, each on a hand-made case: a setting checked by
its flag's name before any replay, a shard that a count of 20 digits or 2 and more shares may
name, a trace written into folders it creates, and a progress bar that leaves no line behind."""

from __future__ import annotations

import json

import pytest

import kvoffload.cli.sweep as sweep
from kvoffload.cli import main
from kvoffload.cli.flags import UsageError


@pytest.fixture
def no_sweep(monkeypatch):
    monkeypatch.setattr(sweep, "run_grid", lambda *args, **kwargs: pytest.fail("the sweep ran"))


def test_a_bad_set_value_is_named_by_its_flag_before_any_replay(no_sweep, tmp_path, capsys):
    assert main(["sweep", "--workload", "multi-turn-small", "--set", "cpu_chunks=banana",
                 "--out-dir", str(tmp_path / "sweep")]) == 2
    assert capsys.readouterr().err.startswith("kvoffload: error: --set cpu_chunks=banana: expected a chunk count")


def test_a_shard_takes_any_count_of_at_least_one_and_fewer_than_20_digits():
    assert sweep._parse_shard("1/2") == (1, 2) and sweep._parse_shard("0/1") == (0, 1)
    assert sweep._parse_shard("0/" + "9" * 19) == (0, int("9" * 19))
    for text in ("0/" + "1" * 20, "0/0", "2/2", "1", "-1/2"):
        with pytest.raises(UsageError):
            sweep._parse_shard(text)


def test_a_trace_goes_into_folders_made_for_it(tmp_path):
    trace = tmp_path / "new" / "deeper" / "trace.json"
    assert main(["run", "--workload", "multi-turn-small", "--quiet", "--out", str(tmp_path / "run.json"),
                 "--trace", str(trace)]) == 0
    assert json.loads(trace.read_text())


def test_the_progress_bar_leaves_no_line_behind(tmp_path, capsys):
    """Without --quiet the bar redraws one line on stderr and clears it when the run ends."""
    assert main(["run", "--workload", "multi-turn-small", "--out", str(tmp_path / "run.json")]) == 0
    err = capsys.readouterr().err
    assert "req/s" in err or "req]" in err  # the bar was drawn
    assert "\n" not in err  # and not left as a line of its own
