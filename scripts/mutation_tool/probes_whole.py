"""Probes for the equivalent mutants of the run over the rest of the package (``fates_whole.py``,
keyed by mutants of its commit): each shows that no input the guarded code can see tells the
mutant from the original."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path


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


def capacity_key_is_the_same_from_either_panel() -> None:
    """report/figures.py draw_capacity: the figure's key taken from ``axes[0]`` made ``axes[1]``.
    Both panels (one per metric of CAPACITY_METRICS, two) plot every series, in the same order,
    with the same label, colour and marker (a missing value is a NaN point, not a missing line),
    and a legend draws its own sample from the handle's style, not its data: the key, and the PNG,
    are the same. Checked on one series, on two connectors, and on a series with a metric missing
    at one capacity, with the function as shipped and as mutated (its source, executed in the
    module's namespace)."""
    import inspect
    import io

    from kvoffload.report import figures
    from kvoffload.report.sources import RunFile

    assert figures.CAPACITY_METRICS == ("offload_hit_rate", "last_block_hit_rate")
    source = inspect.getsource(figures.draw_capacity)
    old = "handles, labels = axes[0].get_legend_handles_labels()"
    assert source.count(old) == 1 and source.count("axes[") == 1

    def png_of(text: str, runs) -> tuple[bytes, list]:
        namespace = dict(vars(figures))
        drawn = []

        def save_chart(fig, out, filename):
            png = io.BytesIO()
            fig.savefig(png, format="png", dpi=figures.DPI, metadata={"Software": None})
            drawn.append((png.getvalue(), [(t.get_text(), h.get_color(), h.get_marker(), h.get_linestyle())
                                           for t, h in zip(fig.legends[0].get_texts(), fig.legends[0].legend_handles)]))
            return filename

        namespace["save_chart"] = save_chart
        exec(compile(text, "capacity", "exec"), namespace)  # noqa: S102
        namespace["draw_capacity"](runs, Path("unused"))
        return drawn

    def run(label, chunks, index, **metrics):
        return RunFile(Path(f"r{index:02d}.json"), "w", label, None, (), {"cpu_chunks": chunks},
                       {"offload_hit_rate": 0.5, "last_block_hit_rate": 0.9, **metrics}, "abc", False)

    cases = [
        [run("reference", 16, 0), run("reference", 64, 1, offload_hit_rate=0.7)],
        [run("reference", 16, 0), run("reference", 64, 1), run("vllm-0.25", 16, 2, last_block_hit_rate=0.4),
         run("vllm-0.25", 64, 3), run("reference -last_block_at_finish", 16, 4),
         run("reference -last_block_at_finish", 32, 5, offload_hit_rate=0.1)],
        [run("vllm-0.26", 16, 0, last_block_hit_rate=None), run("vllm-0.26", 64, 1), run("x", 8, 2), run("x", 9, 3)],
    ]
    for runs in cases:
        shipped, mutant = png_of(source, runs), png_of(source.replace(old, old.replace("[0]", "[1]")), runs)
        assert len(shipped) == 1 and shipped == mutant, runs


def left_overs_are_removed_by_position_and_prefix_keyword() -> None:
    """results.py remove_left_overs: ``(folder, names, *, prefix=False)`` made ``(folder, names, /,
    prefix=False)``. Every call in the checkout (the package, its tests, benchmarks and scripts)
    passes ``folder`` and ``names`` by position and ``prefix``, if at all, by keyword, and the name
    is used nowhere but in such calls (its definition and imports aside): both signatures bind
    those calls to the same arguments."""
    import kvoffload
    from kvoffload import results

    root = Path(kvoffload.__file__).resolve().parents[2]
    shapes = set()
    for folder in ("reference", "tests", "benchmarks", "scripts"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text(errors="replace")
            if "remove_left_overs" not in text or path.resolve() == Path(__file__).resolve():  # this probe
                continue
            tree = ast.parse(text)
            called = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    func = node.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                    if name == "remove_left_overs":
                        assert not any(isinstance(a, ast.Starred) for a in node.args), path
                        assert all(k.arg == "prefix" for k in node.keywords), path  # no **kwargs, no names=
                        shapes.add((len(node.args), tuple(k.arg for k in node.keywords)))
                        called.add(id(func))
            for node in ast.walk(tree):
                if isinstance(node, ast.Name) and node.id == "remove_left_overs":
                    assert id(node) in called, f"{path}: remove_left_overs used other than called"
                if isinstance(node, ast.Attribute) and node.attr == "remove_left_overs":
                    assert id(node) in called, f"{path}: remove_left_overs used other than called"
    assert shapes == {(2, ()), (2, ("prefix",))}, shapes
    shipped = inspect.signature(results.remove_left_overs)
    assert [p.kind for p in shipped.parameters.values()] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 2 + [
        inspect.Parameter.KEYWORD_ONLY]

    def mutated(folder, names, /, prefix=False):
        return folder, names, prefix

    def original(folder, names, *, prefix=False):
        return folder, names, prefix

    for args, kwargs in ((("f", ("n",)), {}), (("f", ("n",)), {"prefix": True}), (("f", ("n",)), {"prefix": False})):
        assert mutated(*args, **kwargs) == original(*args, **kwargs)


def toml_positions_name_a_line_and_a_column_together() -> None:
    """workloads/definition.py _toml_problem: ``match.group(1)`` made ``match.group(2)`` in the
    test for a position. In ``_TOML_POSITION`` both groups are in one alternative, each ``\\d+``
    (never empty), and the other alternative ("at end of document") has neither: a match has both
    or none. Checked on the pattern and on tomllib's messages for broken documents of each kind."""
    import tomllib

    from kvoffload.workloads import definition

    pattern = definition._TOML_POSITION.pattern
    assert pattern == r"\s*\((?:at line (\d+), column (\d+)|at end of document)\)\s*$", pattern
    assert definition._TOML_POSITION.groups == 2
    seen = set()
    for text in ("a = ", "a = 1\nb = [1,", "[x\n", "a = 'x", "a = 1 1", "= 1", "a = {", "a.b = 1\na = 2",
                 "x = 1\n[t]\ny = \"\\q\"", "a = [1, 2", "a = 1979-05-27T", "\n\n  k = tru"):
        try:
            tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            match = definition._TOML_POSITION.search(str(error).strip())
            assert match is not None, str(error)
            assert bool(match.group(1)) == bool(match.group(2)), str(error)
            seen.add(bool(match.group(1)))
            assert definition._toml_problem(error).startswith("line " if match.group(1) else "end of file: ")
        else:
            raise AssertionError(f"{text!r} parsed")
    assert seen == {True, False}  # both kinds of message were met


def the_step_alarm_forgets_what_it_saw_when_it_starts_watching() -> None:
    """engine/bounded.py StepBound.__init__: ``self._ticks_seen = -1`` made ``- 0`` (0). Only the
    alarm's check, defined inside ``watching``, reads ``_ticks_seen``, and ``watching`` sets it to
    -1 first (the source is checked; no other module names it); so the value ``__init__`` gives is
    never read: a bound given 0 there watches as one given -1 (checked under an alarm)."""
    import time

    import kvoffload
    from kvoffload.engine import bounded

    root = Path(kvoffload.__file__).resolve().parent
    named = [path.relative_to(root).as_posix() for path in root.rglob("*.py") if "_ticks_seen" in path.read_text()]
    assert named == ["engine/bounded.py"], named
    source = inspect.getsource(bounded)
    assert source.count("_ticks_seen") == 4, source.count("_ticks_seen")
    watching = inspect.getsource(bounded.StepBound.watching)
    assert watching.index("self._ticks_seen = -1") < watching.index("def check")
    assert "_ticks_seen" not in inspect.getsource(bounded.StepBound.at)
    assert bounded._usable()
    for start in (-1, 0):
        bound = bounded.StepBound(0.05)
        bound._ticks_seen = start
        with bound.watching():
            assert bound._ticks_seen == -1
            bound.at(1)
            try:  # the first alarm takes the step's start, the next finds no new step
                time.sleep(2.0)
            except bounded.ConnectorTimeout as timeout:
                assert "step 1 did not finish within 0.05 s" in str(timeout)
            else:
                raise AssertionError("no timeout")


PROBES_WHOLE = [
    failed_rev_parse_prints_nothing,
    samples_are_at_least_one,
    signed_or_unsigned_fingerprints_extend_alike,
    poisson_draws_are_never_negative,
    capacity_key_is_the_same_from_either_panel,
    left_overs_are_removed_by_position_and_prefix_keyword,
    toml_positions_name_a_line_and_a_column_together,
    the_step_alarm_forgets_what_it_saw_when_it_starts_watching,
]
