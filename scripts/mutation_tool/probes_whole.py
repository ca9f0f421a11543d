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


def signed_or_unsigned_fingerprints_extend_alike() -> None:
    """vllm/model.py: ``_U64 = (1 << 64) - 1`` made ``(1 >> 64) - 1`` (-1, so ``& _U64`` keeps a
    fingerprint signed). Every use of the masked value is taken mod 2**64: ``extend_fingerprint``
    masks ``previous * B + token + 1``, which depends on ``previous`` mod 2**64 only, and
    ``to_signed_int`` maps an int64 value and its unsigned twin to the same number. Checked: the
    drafts and the writes past a script of sequences whose fingerprints have the top bit set and
    not, at every start, draft count and acceptance, with the mask as shipped and as mutated."""
    import random

    from kvoffload.vllm import model

    rng = random.Random(0)
    sequences = [model.ScriptedSequence(tuple(rng.randrange(32_000) for _ in range(n))) for n in (1, 2, 7, 40)]
    assert any(int(f) < 0 for s in sequences for f in s.fingerprints)
    assert any(int(f) > 0 for s in sequences for f in s.fingerprints)

    def everything():
        out = []
        for s in sequences:
            for start in range(len(s.truth)):
                for drafts in range(5):
                    out += [s.draft_fingerprints(start, drafts, accepted) for accepted in range(drafts + 1)]
                out += [s.written(start, count).tolist() for count in range(1, 6)]
        return out

    shipped = everything()
    model._U64, mask = -1, model._U64
    try:
        assert everything() == shipped
    finally:
        model._U64 = mask


def the_buffer_is_the_one_every_view_shares() -> None:
    """vllm/model.py FingerprintCells: the buffer taken from ``views[0]`` made ``views[-1]``. The
    constructor refuses any view whose storage is not the buffer's, so when it returns the first
    and the last view share one storage (``words`` is the same), and when a view lies elsewhere
    both forms refuse with the same message. Checked on one view, three views of one buffer and
    views of two buffers in both orders, the mutated class built from the shipped source."""
    import inspect

    import torch

    from kvoffload.vllm import model

    source = inspect.getsource(model.FingerprintCells)
    assert source.count("views[0]") == 1
    namespace = dict(vars(model))
    exec(compile(source.replace("views[0]", "views[-1]"), "mutant", "exec"), namespace)  # noqa: S102
    mutant = namespace["FingerprintCells"]

    def views_of(buffer, count):
        return {f"l{i}": buffer[i * 24:(i + 1) * 24].view(3, 2, 2, 1, 2) for i in range(count)}

    one, other = torch.zeros(72), torch.zeros(72)
    for views in (views_of(one, 1), views_of(one, 3), {**views_of(one, 1), "x": views_of(other, 1)["l0"]},
                  {"x": views_of(other, 1)["l0"], **views_of(one, 2)}):
        outcomes = []
        for cells in (model.FingerprintCells, mutant):
            try:
                built = cells(views)
                outcomes.append((built.words.data_ptr(), built.words.numel(), built._base, built._block, built._slot))
            except ValueError as error:
                outcomes.append(str(error))
        assert outcomes[0] == outcomes[1], outcomes


def poisson_draws_are_never_negative() -> None:
    """workloads/distributions.py poisson: the default floor ``0`` made ``-1``. The floor only
    clamps a draw (``_clamp``: ``max(value, low)``), and ``poisson_variate`` never returns below 0:
    the multiplication method counts up from 0; PTRS continues on ``k < 0`` and its fast
    acceptance (``us >= 0.07``, so ``|u| <= 0.43``) has ``k >= floor(mean + 0.43 - 0.43 * (2a / 0.07
    + b))``, at least 4 for every mean from 10 on (checked on a grid of means, a = -0.059 +
    0.02483 b, b = 0.931 + 2.53 sqrt(mean)). ``max(k, 0) == max(k, -1)`` for k >= 0; the draws of
    both forms are compared on seeded streams at small and large means."""
    import math
    import random

    from kvoffload.workloads import distributions

    for mean in [10 + i / 10 for i in range(1000)] + [10 ** (1 + i / 100) for i in range(700)]:
        b = 0.931 + 2.53 * math.sqrt(mean)
        a = -0.059 + 0.02483 * b
        assert math.floor(mean + 0.43 - 0.43 * (2 * a / 0.07 + b)) >= 4, mean
    for mean in (0.0, 0.5, 3.0, 9.99, 10.0, 40.0, 150.0, 1e6):
        shipped, mutant = distributions.poisson(mean), distributions.poisson(mean, floor=-1)
        first, second = random.Random(7), random.Random(7)
        draws = [shipped.sample(first) for _ in range(20_000)]
        assert draws == [mutant.sample(second) for _ in range(20_000)] and min(draws) >= 0


def _snapshot_source(path: str) -> str:
    """A module's text at the whole run's snapshot commit (results/mutation/tool/whole/score.json):
    for mutants of code main has rewritten since."""
    import json
    import subprocess

    root = Path(__file__).resolve().parents[2]
    commit = json.loads((root / "results/mutation/tool/whole/score.json").read_text())["commit"]
    return subprocess.run(["git", "show", f"{commit}:reference/kvoffload/{path}"], cwd=root, capture_output=True,
                          text=True, check=True, timeout=60).stdout


def _both(source: str, old: str, new: str) -> tuple[dict, dict]:
    """The snapshot's module executed as shipped and with ``old`` made ``new`` (once)."""
    assert source.count(old) == 1, old
    namespaces = ({}, {})
    for namespace, text in zip(namespaces, (source, source.replace(old, new))):
        exec(compile(text, "snapshot", "exec"), namespace)  # noqa: S102
    return namespaces


def one_group_is_its_first_and_its_last() -> None:
    """vllm/connector.py _single_group (snapshot): ``return groups[0]`` made ``groups[-1]``, right
    after ``if len(groups) != 1: raise``: a list of one holds one group at both ends. Checked with
    the snapshot's function on configs of 0, 1 and 2 groups."""
    from types import SimpleNamespace

    import ast

    source = _snapshot_source("vllm/connector.py")
    function = next(node for node in ast.parse(source).body if getattr(node, "name", "") == "_single_group")
    shipped, mutant = _both("from kvoffload.core.types import ConfigError\n" + ast.get_source_segment(source, function),
                            "    return groups[0]", "    return groups[-1]")
    for count in (0, 1, 2):
        config, outcomes = SimpleNamespace(kv_cache_groups=[object() for _ in range(count)]), []
        for namespace in (shipped, mutant):
            try:
                outcomes.append(namespace["_single_group"](config))
            except Exception as error:  # noqa: BLE001 - the refusal is part of what is compared
                outcomes.append(str(error))
        assert outcomes[0] == outcomes[1], (count, outcomes)


def a_store_of_no_chunk_counts_no_delay() -> None:
    """vllm/observe.py StoreSubmitDelays.attach (snapshot): ``per_chunk = ... if chunks else 0``
    made ``else -1``: ``per_chunk`` is read only inside the generator over ``range(chunks)``, which
    is empty when ``chunks`` is 0. Checked with the snapshot's class on stores of 0, 1 and 2 chunks."""
    from types import SimpleNamespace

    from kvoffload.engine.record import RunRecord

    shipped, mutant = _both(_snapshot_source("vllm/observe.py"),
                            "len(job.gpu_block_ids) // chunks if chunks else 0",
                            "len(job.gpu_block_ids) // chunks if chunks else -1")
    seen = []
    for namespace in (shipped, mutant):
        record = RunRecord()
        delays = namespace["StoreSubmitDelays"](4, record)
        handler = SimpleNamespace(submit_store=lambda job: job)
        delays.attach(handler)
        table = [5, 6, 7, 8, 9, 10]
        for step in range(len(table)):  # block table[i] full at step i (4-token blocks)
            delays.written(step, table, 4 * step, 4 * step + 4)
        delays.step = 9
        for blocks, slots in (((), ()), ((5, 6), (0,)), ((7, 8, 9, 10), (1, 2))):
            handler.submit_store(SimpleNamespace(gpu_block_ids=blocks, chunk_slots=slots))
        seen.append(list(record.store_submit_delays))
    assert seen[0] == seen[1] == [9 - 1, 9 - 3, 9 - 5], seen  # each chunk from its last block's step


PROBES_WHOLE = [one_group_is_its_first_and_its_last, a_store_of_no_chunk_counts_no_delay, poisson_draws_are_never_negative, signed_or_unsigned_fingerprints_extend_alike, the_buffer_is_the_one_every_view_shares, samples_are_at_least_one, rounds_count_from_zero, progress_never_goes_back, failed_rev_parse_prints_nothing,
                ablation_layout_without_panels, third_heading_is_never_narrower_than_its_rates]
