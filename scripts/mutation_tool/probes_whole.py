"""Probes for the equivalent mutants of the run over the rest of the package (``fates_whole.py``):
each shows that no input the guarded code can see tells the mutant from the original."""

from __future__ import annotations

import inspect


def rounds_count_from_zero() -> None:
    """cli/bench_model.py run_model_bench: ``round_index == 0`` made ``<= 0``. The index comes from
    ``range(rounds)`` (the source is checked), so it is never negative, and on 0 .. rounds the two
    comparisons agree."""
    from kvoffload.cli import bench_model

    source = inspect.getsource(bench_model.run_model_bench)
    assert "for r in range(rounds)" in source and "(r, i)" in source
    assert source.count("round_index") == 2  # bound once from the order, read once
    for index in range(bench_model.ROUNDS + 100):
        assert (index == 0) == (index <= 0)


def progress_never_goes_back() -> None:
    """cli/run.py replay's progress: ``finished > bar.n`` made ``finished is not bar.n``. The bar
    only ever advances to ``finished``, which never decreases (checked on a replay), so the two
    differ only when ``finished == bar.n`` as distinct int objects (past 256), where the mutant
    calls ``bar.update(0)``: tqdm's update of 0 leaves the count as it was (checked)."""
    import io

    from tqdm import tqdm

    from kvoffload.choice import ConnectorChoice
    from kvoffload.runner import replay_workload
    from kvoffload.workloads import load_workload

    seen = []
    replay_workload(load_workload("multi-turn-small"), ConnectorChoice.build(),
                    on_step=lambda step, finished: seen.append(finished))
    assert seen and all(a <= b for a, b in zip(seen, seen[1:]))
    with tqdm(total=1000, file=io.StringIO()) as bar:
        bar.update(300)
        bar.update(0)
        assert bar.n == 300


PROBES_WHOLE = [rounds_count_from_zero, progress_never_goes_back]
