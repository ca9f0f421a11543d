"""Probes for the equivalent mutants of the run over the rest of the package (``fates_whole.py``):
each shows that no input the guarded code can see tells the mutant from the original."""

from __future__ import annotations

import inspect
from pathlib import Path


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


def failed_rev_parse_prints_nothing() -> None:
    """gate_baseline.py _committed_baseline: ``resolved.returncode != 0`` made ``< 0``. A failed
    ``git rev-parse --verify --quiet`` (exit 1: git never exits below 0, a signal aside) prints
    nothing, so ``not commit`` refuses it either way (checked on an unknown ref, a tree, a blob,
    a malformed and an empty name in a repository of its own)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        def git(*args):
            return subprocess.run(["git", "-C", root, "-c", "user.name=t", "-c", "user.email=t@t", *args],
                                  capture_output=True, text=True, timeout=60)
        git("init", "-q")
        Path(root, "f").write_text("x")
        git("add", "f")
        git("commit", "-qm", "c")
        for ref in ("no-such-ref", "HEAD^{tree}", "HEAD:f", "HEAD~5", "..", ""):
            done = git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
            assert done.returncode == 1 and done.stdout == "", (ref, done)


def ablation_layout_without_panels() -> None:
    """report/ablation.py ablation_figure: the layout rectangle of a figure without panels (every
    metric not drawn), ``0.15``/``0.85`` made ``1.15``/``1.85``: with no axes the constrained
    layout places only the title, the same way whatever the rectangle (the PNGs are compared)."""
    import io

    from kvoffload.report import ablation
    from kvoffload.report.sources import RunFile

    runs = [RunFile(Path(f"r{i}.json"), "w", label, None, (), {"cpu_chunks": 8}, {}, "abc", False)
            for i, label in enumerate(["reference", "vllm-0.25"])]
    drawn = []
    for rect in ((0, 0.15, 1, 0.85), (0, 1.15, 1, 0.85), (0, 0.15, 1, 1.85)):
        fig, skipped = ablation.ablation_figure("w", runs)
        assert not [ax for ax in fig.axes if ax.get_visible()] and skipped
        fig.get_layout_engine().set(rect=rect)
        png = io.BytesIO()
        fig.savefig(png, format="png", metadata={"Software": None})
        drawn.append(png.getvalue())
    assert drawn[0] == drawn[1] == drawn[2]


def samples_are_at_least_one() -> None:
    """report/history_text.py one_sample: ``p.samples > 1`` made ``p.samples != 1``. A point's
    sample count is at least 1 whatever the result file says (``sources`` reads a missing, zero,
    negative or fractional ``stats_repeat`` as 1: checked on such a file), and on 1, 2, ... the two
    comparisons agree."""
    import json
    import tempfile

    from kvoffload.report.sources import find_asv_points

    columns = ["result", "params", "version", "stats_q_25", "stats_q_75", "stats_repeat"]
    with tempfile.TemporaryDirectory() as root:
        folder = Path(root) / "m"
        folder.mkdir()
        for i, repeat in enumerate((None, 0, -3, 0.5, 1, 7)):
            (folder / f"{i:08x}-env.json").write_text(json.dumps({
                "commit_hash": f"{i:040x}", "env_name": "env", "date": i, "result_columns": columns,
                "results": {"b.C.track_x": [[1.0], [["1"]], "1", [0.9], [1.1], [repeat]]}}))
        points, _ = find_asv_points(Path(root))
    assert sorted(p.samples for p in points) == [1, 1, 1, 1, 1, 7]
    for samples in range(1, 1000):
        assert (samples > 1) == (samples != 1)


def third_heading_is_never_narrower_than_its_rates() -> None:
    """cli/bench.py _bench_table: the headings left-justified up to column ``i < 2`` made ``i < 3``.
    The third column is the last-chunk rate: its heading (10 characters) is at least as wide as any
    value a rate shows (``format_value``: None as '-', an int rate 0 or 1, a float in [0, 1] to
    three decimals, 5 characters), so the column is the heading's width and ljust and rjust of the
    heading give the same text."""
    from kvoffload.cli.bench import SHORT_NAMES, TABLE_METRICS
    from kvoffload.metrics import format_value

    third = TABLE_METRICS[0]
    assert third.endswith("_rate") and len(SHORT_NAMES[third]) == 10
    values = [None, 0, 1, *(i / 10_000 for i in range(10_001))]
    assert max(len(format_value(third, value)) for value in values) <= len(SHORT_NAMES[third])
    assert SHORT_NAMES[third].ljust(10) == SHORT_NAMES[third].rjust(10)


PROBES_WHOLE = [samples_are_at_least_one, rounds_count_from_zero, progress_never_goes_back, failed_rev_parse_prints_nothing,
                ablation_layout_without_panels, third_heading_is_never_narrower_than_its_rates]
