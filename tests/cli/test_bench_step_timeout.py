"""``bench --step-timeout`` bounds every replay of the bench, as ``run --step-timeout`` bounds its
one (engine/bounded.py; the hang itself is proven in tests/engine/test_bounded.py and, with a
planted connector, tests/vllm/test_foreign_failures.py). Here: the bound the user gave reaches
each row's replay, and the real-model bench's pinned child too."""

from __future__ import annotations

import pytest

import kvoffload.cli.bench
import kvoffload.vllm.pinned
from kvoffload.cli import main
from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S
from kvoffload.runner import replay_workload


@pytest.fixture
def bounds_seen(monkeypatch):
    seen = []
    outcomes = {}

    def replay(workload, choice, quiet, position="", engine="simulator", step_bound_s=DEFAULT_STEP_BOUND_S, **_):
        seen.append(step_bound_s)
        if workload.name not in outcomes:  # one real simulator replay per workload keeps it quick
            outcomes[workload.name] = replay_workload(workload, choice)
        return outcomes[workload.name]

    monkeypatch.setattr(kvoffload.cli.bench, "replay", replay)
    return seen


def test_every_row_of_the_bench_gets_the_bound_given(bounds_seen, tmp_path):
    assert main(["bench", "--small", "--quiet", "--out-dir", str(tmp_path), "--step-timeout", "7.5"]) == 0
    assert len(bounds_seen) > 1 and set(bounds_seen) == {7.5}


def test_without_the_option_the_default_bound_holds(bounds_seen, tmp_path):
    assert main(["bench", "--small", "--quiet", "--out-dir", str(tmp_path)]) == 0
    assert set(bounds_seen) == {DEFAULT_STEP_BOUND_S}


def test_the_real_model_bench_bounds_its_child_and_each_replay(monkeypatch, tmp_path):
    calls = []

    def call_pinned(fn, *args, bound_s=DEFAULT_STEP_BOUND_S, **_):
        calls.append((fn.__name__, args[-1], bound_s))
        return [], {}

    monkeypatch.setattr(kvoffload.vllm.pinned, "call_pinned", call_pinned)
    main(["bench", "--engine", "vllm", "--quiet", "--out-dir", str(tmp_path), "--step-timeout", "3"])
    assert calls == [("run_model_bench", 3.0, 3.0)]


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf"])
def test_a_bound_that_is_no_positive_number_is_one_line_of_bad_input(value, tmp_path, capsys):
    assert main(["bench", "--small", "--quiet", "--out-dir", str(tmp_path), "--step-timeout", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--step-timeout" in err[0] and "expected seconds above 0" in err[0]
