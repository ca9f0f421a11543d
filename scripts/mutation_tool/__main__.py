"""Mutation score from a tool (cosmic-ray): generated mutants, a deterministic sample, per-module
test selection, then the rest of CI against the survivors.

    .venv/bin/python scripts/mutation_tool prepare [--sample N]   # snapshot, generate, sample
    .venv/bin/python scripts/mutation_tool baseline                # each selection passes unmutated
    .venv/bin/python scripts/mutation_tool exec                    # cosmic-ray exec, one session a module
    .venv/bin/python scripts/mutation_tool stage main|gate|vllm|packaged [--refresh-tests]
    .venv/bin/python scripts/mutation_tool report                  # results/mutation/tool/

Why cosmic-ray (docs/mutation.md): one session per module, each with its own test command, is
per-mutant test selection without a plugin; every mutant runs in a fresh interpreter, so the
suite's alarm-based hang bound and torch's threads behave as in CI; its session database lets a
sample be taken by marking the rest skipped, and an interrupted run resumes.

Work lives in ``.mutation/`` (ignored): a snapshot of the tree to plant mutants in, a config and sqlite
session per module, each stage's verdicts. ``nice -n 10``, one mutant at a time (a shared 2-core machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from script_args import StrictParser  # noqa: E402
from places import PACKAGE, RESULTS, ROOT, SET, TREE, WORK, copy_tree  # noqa: E402
from sampling import annotation_spans, in_annotation, mark_sample  # noqa: E402
from sessions import STAGES, items, key, session_name, survivors_after, verdicts  # noqa: E402
from snapshot_tests import deselected, refresh_tests, snapshot_tests  # noqa: E402
from targets import MAIN_SUITE_IGNORES, TESTS_OF, VLLM_MODULES  # noqa: E402

FORKSERVER = Path(__file__).parent / "forkserver.py"
SOCKET = WORK / ("fork.sock" if TREE == WORK / "tree" else f"fork-{TREE.name}.sock")  # one server a tree
PYTHON = sys.executable
VLLM_PYTHON = os.environ.get("KVOFFLOAD_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
PER_TEST_TIMEOUT_S = 240
CI_VLLM_MARKS = "vllm and not vllm_on_demand"  # CI's vLLM stage (.ci/run); the on-demand tests are not CI


def env() -> dict[str, str]:
    # The fuzzer's fresh-seed search is pinned (KVOFFLOAD_FUZZ_SEED): a mutant is killed or not by
    # the same examples every time it is run, as in scripts/mutation.
    return dict(os.environ, PYTHONPATH=str(TREE / "reference"), KVOFFLOAD_TEST_TIMEOUT=str(PER_TEST_TIMEOUT_S),
                KVOFFLOAD_FUZZ="ci", KVOFFLOAD_FUZZ_SEED="0", PYTHONDONTWRITEBYTECODE="1")


def pytest_command(tests: tuple[str, ...], module: str = "") -> list[str]:
    """pytest in the snapshot, through the fork server when it runs (``forkserver.py``); a module
    of VLLM_MODULES in the vLLM venv, as CI's vLLM stage runs (one hash seed), without it."""
    options = ["-x", "-q", "-p", "no:cacheprovider", "--no-header", *tests,
               *(f"--deselect={test}" for test in deselected())]
    if module in VLLM_MODULES:  # without the tests CI leaves out (vllm_on_demand: scripts/vllm-on-demand)
        return ["env", "PYTHONHASHSEED=0", VLLM_PYTHON, "-m", "pytest", "-m", "not vllm_on_demand", *options]
    return [PYTHON, str(FORKSERVER), "run", str(SOCKET), "--", *options]


@contextlib.contextmanager
def fork_server():
    """The fork server for the duration of a command (torch imported once, a fork per run)."""
    SOCKET.unlink(missing_ok=True)
    server = subprocess.Popen(["nice", "-n", "10", PYTHON, str(FORKSERVER), "serve", str(SOCKET)], cwd=TREE,
                              env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not SOCKET.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        yield
    finally:
        server.terminate()
        server.wait()
        SOCKET.unlink(missing_ok=True)


def write_config(module: str, timeout: float) -> Path:
    config = WORK / f"{session_name(module)}.toml"
    command = shlex.join(pytest_command(TESTS_OF[module], module))
    config.write_text(f'[cosmic-ray]\nmodule-path = "{PACKAGE}{module}"\ntimeout = {timeout:.0f}\n'
                      f'excluded-modules = []\ntest-command = {json.dumps(command)}\n\n'
                      '[cosmic-ray.distributor]\nname = "local"\n')
    return config


def cosmic_ray(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nice", "-n", "10", str(Path(PYTHON).parent / "cosmic-ray"), *args], cwd=TREE, env=env(),
                          capture_output=True, text=True)


def cmd_resample(args) -> int:
    meta = json.loads((WORK / "meta.json").read_text())
    rows = [row for module in TESTS_OF for row in items(module)]
    meta["sampled"] = len(mark_sample(rows, args.sample))
    meta["annotation_mutants"] = sum(in_annotation(r, annotation_spans(r["module"])) for r in rows)
    (WORK / "meta.json").write_text(json.dumps(meta, indent=2))
    print(json.dumps(meta))
    return 0


def cmd_prepare(args) -> int:
    """Snapshot the tree and generate every mutant; a module whose text is the same as in the
    last snapshot keeps its generated session (generation takes minutes on a loaded machine)."""
    fresh = WORK / "tree.new"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    copy_tree(fresh)
    unchanged = {module for module in TESTS_OF if (TREE / PACKAGE / module).exists()
                 and (TREE / PACKAGE / module).read_bytes() == (fresh / PACKAGE / module).read_bytes()
                 and (WORK / f"{session_name(module)}.sqlite").exists()}
    shutil.rmtree(TREE, ignore_errors=True)
    fresh.rename(TREE)
    for stale in ("stages.json",):
        (WORK / stale).unlink(missing_ok=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "reference"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip())
    rows = []
    for module in TESTS_OF:
        config = write_config(module, 600)
        if module not in unchanged:
            done = cosmic_ray("init", "--force", str(config), str(WORK / f"{session_name(module)}.sqlite"))
            if done.returncode:
                print(f"error: cosmic-ray init {module}: {done.stderr[-500:]}", file=sys.stderr)
                return 1
        rows += items(module)
    chosen = mark_sample(rows, args.sample)
    meta = {"commit": commit, "reference_dirty": dirty, "generated": len(rows),
            "annotation_mutants": sum(in_annotation(r, annotation_spans(r["module"])) for r in rows),
            "sites": len({(r["module"], r["start"], r["end"]) for r in rows}), "sampled": len(chosen),
            "prepared_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (WORK / "meta.json").write_text(json.dumps(meta, indent=2))
    print(json.dumps(meta))
    return 0


def cmd_baseline(args) -> int:
    """Every selected test runs once on the unmutated snapshot (the union of the selections, each
    file once, no -x). A test that fails there is deselected from every mutant's run and named
    in the report: it would otherwise "kill" every mutant. A mutant that hangs is cut at 1.5x
    this run's time."""
    meta = json.loads((WORK / "meta.json").read_text())
    meta["overlay"] = refresh_tests()
    meta["deselect"] = []
    (WORK / "meta.json").write_text(json.dumps(meta, indent=2))
    failed, took = [], 0.0
    for in_vllm in (False, True):  # each venv's selections once, unmutated
        union = tuple(dict.fromkeys(path for module, selection in TESTS_OF.items()
                                    if (module in VLLM_MODULES) == in_vllm for path in selection))
        if not union:
            continue
        started = time.perf_counter()
        command = [c for c in pytest_command(union, next(iter(VLLM_MODULES)) if in_vllm else "") if c != "-x"] + ["-rf"]
        done = subprocess.run(["nice", "-n", "10", *command], cwd=TREE, env=env(), capture_output=True, text=True)
        took = max(took, time.perf_counter() - started)
        failing = [line.split(" - ")[0][len("FAILED "):] for line in done.stdout.splitlines()
                   if line.startswith("FAILED ")]
        print(f"{'vLLM venv' if in_vllm else 'main venv'}: exit {done.returncode} in {time.perf_counter() - started:.0f}"
              f" s; failing unmutated: {failing}", flush=True)
        if done.returncode not in (0, 1) or (done.returncode == 1 and not failing):
            print(done.stdout[-3000:], file=sys.stderr)
            return 1
        failed += failing
    meta["deselect"] = failed
    meta["baseline_s"] = round(took)
    (WORK / "meta.json").write_text(json.dumps(meta, indent=2))
    for module in TESTS_OF:
        write_config(module, max(300.0, 1.5 * took))
    return 0


def cmd_recheck(args) -> int:
    """The deselected tests again on the unmutated snapshot, with the snapshot's own tests: those
    that pass now (the snapshot was fixed, not the tests: the first round's lacked
    results/releases/) join the stages again. Exec's verdicts stand; the report names them."""
    meta = json.loads((WORK / "meta.json").read_text())
    if not meta.get("deselect"):
        print("nothing deselected")
        return 0
    snapshot_tests()
    command = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", "-rf", *meta["deselect"]]
    ran = subprocess.run(["nice", "-n", "10", *command], cwd=TREE, env=env(), capture_output=True, text=True)
    failing = [line.split(" - ")[0][len("FAILED "):] for line in ran.stdout.splitlines() if line.startswith("FAILED ")]
    if ran.returncode not in (0, 1) or (ran.returncode == 1 and not failing):
        print(ran.stdout[-3000:], file=sys.stderr)
        return 1
    meta.setdefault("deselect_in_exec", meta["deselect"])
    meta["deselect"] = failing
    (WORK / "meta.json").write_text(json.dumps(meta, indent=2))
    print(f"still failing unmutated: {failing}; selected again: {sorted(set(meta['deselect_in_exec']) - set(failing))}")
    return 0


def cmd_exec(args) -> int:
    with fork_server():
        return _exec(args)


def _exec(args) -> int:
    first = list(dict.fromkeys(m for prefix in args.first for m in TESTS_OF if m.startswith(prefix)))
    for module in first + [m for m in TESTS_OF if m not in first]:
        if args.only and args.only not in module:
            continue
        started = time.perf_counter()
        done = cosmic_ray("exec", str(WORK / f"{session_name(module)}.toml"),
                          str(WORK / f"{session_name(module)}.sqlite"))
        rows = [r for r in items(module) if r["result"] and r["result"]["worker_outcome"] != "skipped"]
        survived = [key(r) for r in rows if r["result"].get("test_outcome") == "survived"]
        print(f"{module}: {len(rows)} run in {time.perf_counter() - started:.0f} s, survivors {survived}"
              f"{' (exec exit ' + str(done.returncode) + ')' if done.returncode else ''}", flush=True)
    return 0


def stage_command(stage: str, row: dict, first: tuple[str, ...] = (), within: tuple[str, ...] = ()) -> list[str]:
    if stage == "new":  # the tests written for this survivor (fates.NEW_TESTS), in its module's venv
        from fates import NEW_TESTS
        return pytest_command(NEW_TESTS[key(row)], row["module"])
    if within:  # a part of the stage's suite (--within): its failure is the stage's, its passing says nothing
        if stage == "main":
            return pytest_command((*within, "-m", "not vllm"))
        return [VLLM_PYTHON, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-m", CI_VLLM_MARKS,
                *within]
    if stage == "main":  # the whole main suite, the files that import the mutated module first (-x)
        # ``first``: test files to run before the rest (a known likely killer): the order of a -x run
        # changes only its time, not its verdict, since the whole suite runs if they pass
        return pytest_command((*first, *importers(row["module"]), "tests", *(f"--ignore={path}" for path in MAIN_SUITE_IGNORES),
                               "-m", "not vllm"))
    if stage == "gate":
        return [PYTHON, "-m", "kvoffload.cli", "gate"]
    if stage == "packaged":  # CI's last step: the packaged gates against stock and the reference
        return [str(TREE / "scripts" / "packaged-gates"), str(Path(VLLM_PYTHON).parents[1])]
    return [VLLM_PYTHON, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-m", CI_VLLM_MARKS,
            "tests/vllm"]


def importers(module: str) -> list[str]:
    """The main suite's test files that import ``module`` (``kvoffload.engine.engine`` or
    ``from kvoffload.engine import engine``) outside its selection (those passed already): the
    likeliest killers of its survivors, run first, smallest first (the property and fuzz runs,
    minutes each, are large files)."""
    dotted = "kvoffload." + module.removesuffix(".py").replace("/", ".")
    parent, name = dotted.rsplit(".", 1)
    pattern = re.compile(rf"{re.escape(dotted)}\b|from {re.escape(parent)} import [^\n]*\b{name}\b")
    files = sorted((TREE / "tests").rglob("test_*.py"), key=lambda path: (path.stat().st_size, path))
    return [str(path.relative_to(TREE)) for path in files if pattern.search(path.read_text(errors="replace"))
            and not str(path.relative_to(TREE)).startswith(MAIN_SUITE_IGNORES + TESTS_OF.get(module, ()) + ("tests/vllm",))]


def failing_unmutated(command: list[str]) -> list[str]:
    """The tests of a pytest command that fail on the unmutated snapshot (run once, without -x)."""
    ran = subprocess.run(["nice", "-n", "10", *[c for c in command if c != "-x"], "-rf"], cwd=TREE, env=env(),
                         capture_output=True, text=True)
    return [line.split(" - ")[0][len("FAILED "):] for line in ran.stdout.splitlines() if line.startswith("FAILED ")]


def cmd_stage(args) -> int:
    with fork_server():
        return _stage(args)


def _stage(args) -> int:
    if args.stage != "new":
        snapshot_tests()  # the rest of CI as it was at the snapshot (the new stage adds this branch's tests)
    elif args.refresh_tests:  # new tests written for the survivors join the snapshot's
        meta = json.loads((WORK / "meta.json").read_text())
        meta["overlay"] = refresh_tests()
        (WORK / "meta.json").write_text(json.dumps(meta, indent=2))
    done = verdicts()
    from fates import FATES
    from fates import NEW_TESTS
    broken: set[str] = set()
    if args.stage == "new":  # a new test must pass on the unmutated snapshot, or its failure kills nothing
        chosen = {k: v for k, v in NEW_TESTS.items() if not args.only or any(text in k for text in args.only)}
        meta = json.loads((WORK / "meta.json").read_text())
        rechecked = {test for tests in chosen.values() for test in tests}
        for in_vllm in (False, True):  # each venv's tests in that venv (a vLLM module's run there)
            tests = tuple(dict.fromkeys(test for k, tests in chosen.items()
                                        if (k.split(":")[0] in VLLM_MODULES) == in_vllm for test in tests))
            venv_of = next(iter(VLLM_MODULES)) if in_vllm else ""
            broken |= set(failing_unmutated(pytest_command(tests, venv_of))) if tests else set()
        meta["new_failing_unmutated"] = sorted(broken | (set(meta.get("new_failing_unmutated", [])) - rechecked))
        (WORK / "meta.json").write_text(json.dumps(meta, indent=2))
        print(f"new tests failing unmutated (their mutants are not run): {sorted(broken)}", flush=True)
    if args.within:  # the part must pass on the unmutated snapshot, or its failure kills nothing
        failing = failing_unmutated(stage_command(args.stage, {"module": ""}, within=tuple(args.within)))
        if failing:
            print(f"error: --within fails unmutated: {failing}", file=sys.stderr)
            return 1
    elif args.stage == "main":  # the suite must collect on the unmutated snapshot, or every "kill" is its error
        command = stage_command("main", {"module": ""})
        collected = subprocess.run(["nice", "-n", "10", PYTHON, "-m", "pytest", "--collect-only", "-q",
                                    *command[command.index("--") + 1:]], cwd=TREE, env=env(), capture_output=True,
                                   text=True)
        if collected.returncode != 0:
            print(f"error: the main suite does not collect unmutated:\n{collected.stdout[-2000:]}", file=sys.stderr)
            return 1
    for row in survivors_after(args.stage):
        if args.only and not any(text in key(row) for text in args.only):
            continue
        if args.stage == "new" and (key(row) in FATES or key(row) not in NEW_TESTS
                                    or broken & set(NEW_TESTS[key(row)])):
            continue  # shown equivalent, no test written for it yet, or a test that fails unmutated
        if args.stage != "new" and not args.all and (key(row) in FATES or key(row) in NEW_TESTS):
            continue  # resolved already (a probe, or a test written for it): the rest of CI is for the others
        target = TREE / PACKAGE / row["module"]
        original = target.read_text()
        try:
            applied = cosmic_ray("apply", f"{PACKAGE}{row['module']}", row["operator"], str(row["occurrence"]))
            if applied.returncode:
                print(f"error: cannot apply {key(row)}: {applied.stderr[-300:]}", file=sys.stderr)
                continue
            started = time.perf_counter()
            try:
                command = stage_command(args.stage, row, tuple(args.first), tuple(args.within))
                ran = subprocess.run(["nice", "-n", "10", *command], cwd=TREE,
                                     # the vLLM stage runs as CI runs it (.ci/run): every replay under one hash seed
                                     env=dict(env(), PYTHONHASHSEED="0") if args.stage == "vllm" else env(),
                                     capture_output=True, text=True, timeout=args.timeout)
                verdict = "survived" if ran.returncode == 0 else "killed"
                lines = ran.stdout.splitlines()
                by = next((line.split(" - ")[0][len("FAILED "):] for line in lines if line.startswith("FAILED ")),
                          lines[-1] if lines and verdict == "killed" else "")
            except subprocess.TimeoutExpired:
                verdict, by = "killed", f"(hang: past {args.timeout} s)"
        finally:
            target.write_text(original)
        if args.within and verdict == "survived":  # a part passing is no verdict of the whole stage
            print(f"passed   {key(row):60} within {' '.join(args.within)} ({time.perf_counter() - started:.0f} s)")
            continue
        done = verdicts()  # read again: a stage in another tree (KVOFFLOAD_MUTATION_TREE) may have written since
        entry = done.setdefault(key(row), {})
        entry[args.stage] = verdict
        entry[f"{args.stage}_by"] = by
        written = WORK / f"stages.json.{os.getpid()}"
        written.write_text(json.dumps(done, indent=2))
        written.replace(WORK / "stages.json")
        print(f"{verdict:8} {key(row):60} {by} ({time.perf_counter() - started:.0f} s)", flush=True)
    return 0


def cmd_report(args) -> int:
    from fates import FATES
    from summary import FIRST_SCOPE, WHOLE_SCOPE, write_report

    meta = json.loads((WORK / "meta.json").read_text())
    every = [r for module in TESTS_OF for r in items(module)]
    lines = write_report(meta, every, key, verdicts(), FATES, STAGES, RESULTS,
                         WHOLE_SCOPE if SET == "whole" else FIRST_SCOPE)
    print(lines[2], "\n", "\n".join(lines[4:14]))
    return 0


def main() -> int:
    parser = StrictParser(prog="scripts/mutation_tool", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=StrictParser)
    prepare = sub.add_parser("prepare")
    prepare.add_argument("--sample", type=int, default=330)
    resample = sub.add_parser("resample")
    resample.add_argument("--sample", type=int, default=330)
    sub.add_parser("baseline")
    sub.add_parser("recheck")
    execute = sub.add_parser("exec")
    execute.add_argument("--only", default="")
    execute.add_argument("--first", nargs="*", default=[], help="module prefixes to run before the rest")
    stage = sub.add_parser("stage")
    stage.add_argument("stage", choices=STAGES)
    stage.add_argument("--refresh-tests", action="store_true")
    stage.add_argument("--timeout", type=int, default=900)
    stage.add_argument("--only", action="append", default=[], help="only the survivors whose key holds this text")
    stage.add_argument("--first", action="append", default=[],
                       help="main: a test file to run before the rest of the suite (a likely killer)")
    stage.add_argument("--within", action="append", default=[],
                       help="main, vllm: only this test file of the stage's suite; a kill counts, a pass records nothing")
    stage.add_argument("--all", action="store_true",
                       help="main, gate, vllm: also the survivors a probe or a new test has resolved")
    sub.add_parser("report")
    args = parser.parse_args()
    return globals()[f"cmd_{args.command}"](args)


if __name__ == "__main__":
    sys.exit(main())
