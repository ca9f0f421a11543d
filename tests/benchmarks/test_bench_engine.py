"""bench_engine: the replay timing and peak-memory benchmarks run once on a -small workload."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("workload", ["multi-turn-small", "spec-decode-small"])
def test_replay_benchmarks_run_once(suite, methods_of, workload):
    module = suite("bench_engine")
    bench = module.ReplayWorkload()
    bench.setup(workload)
    assert methods_of(module.ReplayWorkload) == ["peakmem_replay", "time_replay"]
    bench.time_replay(workload)
    bench.peakmem_replay(workload)
    record = bench.replay()
    assert record.requests == len(bench.workload.requests)
    assert record.crash is None and not record.poisoned


def test_full_workloads_are_the_parameters(suite):
    module = suite("bench_engine")
    assert module.ReplayWorkload.params == [["shared-prefix", "multi-turn", "spec-decode"]]
    assert module.workload_spec("multi-turn").endswith("workloads/multi-turn.toml")
