"""Mutation score from a tool (cosmic-ray): generated mutants, a deterministic sample, per-module
test selection, then the rest of CI against the survivors.

    .venv/bin/python scripts/mutation_tool prepare [--sample N]   # snapshot, generate, sample
    .venv/bin/python scripts/mutation_tool baseline                # each selection passes unmutated
    .venv/bin/python scripts/mutation_tool exec                    # cosmic-ray exec, one session a module
    .venv/bin/python scripts/mutation_tool stage main|gate|vllm [--refresh-tests]
    .venv/bin/python scripts/mutation_tool report                  # results/mutation/tool/

Why cosmic-ray (docs/mutation.md): one session per module, each with its own test command, is
per-mutant test selection without a plugin; every mutant runs in a fresh interpreter, so the
suite's alarm-based hang bound and torch's threads behave as in CI; its session database lets a
sample be taken by marking the rest skipped, and an interrupted run resumes.

Work lives in ``.mutation/`` (ignored by git): a snapshot of the tree (so the worktree stays
editable while mutants are planted in the copy), one config and sqlite session per module, and
each stage's verdicts. Runs at ``nice -n 10`` and one mutant at a time (a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / ".mutation"
TREE = WORK / "tree"
sys.path.insert(0, str(Path(__file__).parent))

from targets import MAIN_SUITE_IGNORES, TESTS_OF  # noqa: E402

PACKAGE = "reference/kvoffload/"
FORKSERVER = Path(__file__).parent / "forkserver.py"
SOCKET = WORK / "fork.sock"
PYTHON = sys.executable
VLLM_PYTHON = os.environ.get("KVOFFLOAD_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
PER_TEST_TIMEOUT_S = 240
# The rest of CI, in its order; then "new": the module's selected tests again, with the tests
# written for the survivors (--refresh-tests), which is how a survivor is killed by a new test.
STAGES = ("main", "gate", "vllm", "new")


def session_name(module: str) -> str:
    return module.replace("/", ".").removesuffix(".py")


def copy_tree(target: Path, only: str = "") -> None:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        source = ROOT / name
        # results/ travel too: the gate's baseline, and the files the main suite's tests read (README's
        # tables, asv and run results); this tool's own results do not
        wanted = not name.startswith("results/mutation/")
        if source.is_file() and wanted and name.startswith(only):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def env() -> dict[str, str]:
    # The fuzzer's fresh-seed search is pinned (KVOFFLOAD_FUZZ_SEED): a mutant is killed or not by
    # the same examples every time it is run, as in scripts/mutation.
    return dict(os.environ, PYTHONPATH=str(TREE / "reference"), KVOFFLOAD_TEST_TIMEOUT=str(PER_TEST_TIMEOUT_S),
                KVOFFLOAD_FUZZ="ci", KVOFFLOAD_FUZZ_SEED="0", PYTHONDONTWRITEBYTECODE="1")


def pytest_command(tests: tuple[str, ...]) -> list[str]:
    """pytest in the snapshot, through the fork server when it runs (``forkserver.py``)."""
    return [PYTHON, str(FORKSERVER), "run", str(SOCKET), "--", "-x", "-q", "-p", "no:cacheprovider", "--no-header",
            *tests, *(f"--deselect={test}" for test in deselected())]


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
    command = shlex.join(pytest_command(TESTS_OF[module]))
    config.write_text(f'[cosmic-ray]\nmodule-path = "{PACKAGE}{module}"\ntimeout = {timeout:.0f}\n'
                      f'excluded-modules = []\ntest-command = {json.dumps(command)}\n\n'
                      '[cosmic-ray.distributor]\nname = "local"\n')
    return config


def cosmic_ray(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nice", "-n", "10", str(Path(PYTHON).parent / "cosmic-ray"), *args], cwd=TREE, env=env(),
                          capture_output=True, text=True)


def items(module: str) -> list[dict]:
    """Every work item of a module's session, with its result when it has one: read from the
    session database directly (what ``cosmic-ray dump`` prints, without its start-up per module)."""
    with contextlib.closing(sqlite3.connect(WORK / f"{session_name(module)}.sqlite")) as connection:
        found = connection.execute(
            "SELECT s.job_id, s.operator_name, s.occurrence, s.start_pos_row, s.start_pos_col, s.end_pos_row, "
            "s.end_pos_col, r.worker_outcome, r.output, r.test_outcome, r.diff FROM mutation_specs s "
            "LEFT JOIN work_results r ON r.job_id = s.job_id ORDER BY s.job_id").fetchall()
    rows = []
    for job, operator, occurrence, row0, col0, row1, col1, worker, output, test, diff in found:
        result = None if worker is None else {"worker_outcome": worker.lower(), "output": output,
                                              "test_outcome": test.lower() if test else None, "diff": diff}
        rows.append({"job": job, "module": module, "operator": operator, "occurrence": occurrence,
                     "start": (row0, col0), "end": (row1, col1), "result": result})
    return rows


def key(row: dict) -> str:
    return f"{row['module']}:{row['operator']}:{row['occurrence']}"


def rank(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def annotation_spans(module: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) of every annotation in a module. Every mutated module starts with ``from
    __future__ import annotations`` (PEP 563): an annotation is never evaluated, so a mutant
    inside one is equivalent by construction and is left out of the sample."""
    source = (TREE / PACKAGE / module).read_text()
    tree = ast.parse(source)
    assert any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
               and any(alias.name == "annotations" for alias in node.names) for node in tree.body), module
    spans = []
    for node in ast.walk(tree):
        notes = []
        if isinstance(node, ast.arg) and node.annotation is not None:
            notes.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            notes.append(node.returns)
        if isinstance(node, ast.AnnAssign):
            notes.append(node.annotation)
        spans += [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in notes]
    return spans


def in_annotation(row: dict, spans) -> bool:
    return any(start <= row["start"] and row["end"] <= end for start, end in spans)


def sample(rows: list[dict], size: int) -> set[str]:
    """Deterministic: one mutant per source site outside annotations (the site's lowest-hash
    operator), then the ``size`` sites of lowest hash over all modules. A hash of names and
    positions, not a seeded RNG: the same tree always yields the same sample, and a module's
    share follows its size."""
    spans = {module: annotation_spans(module) for module in TESTS_OF}
    per_site: dict[tuple, dict] = {}
    for row in rows:
        if in_annotation(row, spans[row["module"]]):
            continue
        site = (row["module"], row["start"], row["end"])
        if site not in per_site or rank(key(row)) < rank(key(per_site[site])):
            per_site[site] = row
    chosen = sorted(per_site.values(), key=lambda row: rank(f"{row['module']}:{row['start']}:{row['end']}"))
    return {row["job"] for row in chosen[:size]}


def mark_sample(rows: list[dict], size: int) -> set[str]:
    """Mark every mutant outside the sample skipped. A resample keeps the verdicts of mutants
    already run: the sample of size n is the first n of one fixed order, so a run can grow in
    rounds (n = 100, 200, 330) and each round is a prefix of the next."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult
    chosen = sample(rows, size)
    for module in TESTS_OF:
        database = WORK / f"{session_name(module)}.sqlite"
        with sqlite3.connect(database) as connection:
            connection.execute("DELETE FROM work_results WHERE worker_outcome IN ('SKIPPED', 'skipped')")
        with use_db(str(database), WorkDB.Mode.open) as db:
            skipped = [row["job"] for row in rows if row["module"] == module and row["job"] not in chosen
                       and (row["result"] is None or row["result"]["worker_outcome"] == "skipped")]
            db.set_multiple_results(skipped, WorkResult(output="not in the sample",
                                                        worker_outcome=WorkerOutcome.SKIPPED))
    return chosen


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
    union = tuple(dict.fromkeys(path for selection in TESTS_OF.values() for path in selection))
    started = time.perf_counter()
    command = [c for c in pytest_command(union) if c != "-x"] + ["-rf"]
    done = subprocess.run(["nice", "-n", "10", *command], cwd=TREE, env=env(), capture_output=True, text=True)
    took = time.perf_counter() - started
    failed = [line.split(" - ")[0][len("FAILED "):] for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    print(f"exit {done.returncode} in {took:.0f} s; failing unmutated: {failed}", flush=True)
    if done.returncode not in (0, 1) or (done.returncode == 1 and not failed):
        print(done.stdout[-3000:], file=sys.stderr)
        return 1
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


def snapshot_tests() -> None:
    """The snapshot's tests/ exactly as its commit had them: what the rest of CI (main, gate, vLLM)
    ran then. The branch's newer test files may test code newer than the snapshot and fail on it."""
    commit = json.loads((WORK / "meta.json").read_text())["commit"]
    shutil.rmtree(TREE / "tests", ignore_errors=True)
    archive = subprocess.run(["git", "archive", commit, "tests"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(TREE)], input=archive, check=True)


def refresh_tests() -> list[str]:
    """The snapshot's tests/: those of the snapshot's commit, with this branch's own test changes
    on top (the files its own commits touched since then, merges left out: what main moved since
    may test code the snapshot lacks). Returns the files overlaid."""
    commit = json.loads((WORK / "meta.json").read_text())["commit"]
    shutil.rmtree(TREE / "tests", ignore_errors=True)
    archive = subprocess.run(["git", "archive", commit, "tests"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(TREE)], input=archive, check=True)
    overlay = sorted(set(subprocess.run(["git", "log", "--first-parent", "--no-merges", "--name-only", "--format=",
                                         f"{commit}..HEAD", "--", "tests"], cwd=ROOT, capture_output=True,
                                        text=True, check=True).stdout.split()))
    overlay += subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "tests"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.split()
    from fates import NEW_TESTS  # a test named for a survivor may come from a file main added since
    overlay = sorted(set(overlay) | {test.split("::")[0] for tests in NEW_TESTS.values() for test in tests})
    for name in overlay:
        source, target = ROOT / name, TREE / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        else:
            target.unlink(missing_ok=True)
    return overlay


def deselected() -> list[str]:
    meta_path = WORK / "meta.json"
    return json.loads(meta_path.read_text()).get("deselect", []) if meta_path.exists() else []


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


def stage_command(stage: str, row: dict, first: tuple[str, ...] = ()) -> list[str]:
    if stage == "new":  # the tests written for this survivor (fates.NEW_TESTS)
        from fates import NEW_TESTS
        return pytest_command(NEW_TESTS[key(row)])
    if stage == "main":  # the whole main suite, the files that import the mutated module first (-x)
        # ``first``: test files to run before the rest (a known likely killer): the order of a -x run
        # changes only its time, not its verdict, since the whole suite runs if they pass
        return pytest_command((*first, *importers(row["module"]), "tests", *(f"--ignore={path}" for path in MAIN_SUITE_IGNORES),
                               "-m", "not vllm"))
    if stage == "gate":
        return [PYTHON, "-m", "kvoffload.cli", "gate"]
    return [VLLM_PYTHON, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-m", "vllm",
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


def verdicts() -> dict[str, dict]:
    path = WORK / "stages.json"
    return json.loads(path.read_text()) if path.exists() else {}


def survivors_after(stage: str) -> list[dict]:
    """The tool's survivors that no other stage killed."""
    done = verdicts()
    others = [s for s in STAGES if s != stage]
    alive = []
    for module in TESTS_OF:
        for row in items(module):
            if (row["result"] or {}).get("test_outcome") == "survived" and not any(
                    done.get(key(row), {}).get(s) == "killed" for s in others):
                alive.append(row)
    return alive


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
        tests = tuple(dict.fromkeys(test for tests in NEW_TESTS.values() for test in tests))
        broken = set(failing_unmutated(pytest_command(tests))) if tests else set()
        meta = json.loads((WORK / "meta.json").read_text())
        meta["new_failing_unmutated"] = sorted(broken)
        (WORK / "meta.json").write_text(json.dumps(meta, indent=2))
        print(f"new tests failing unmutated (their mutants are not run): {sorted(broken)}", flush=True)
    if args.stage == "main":  # the suite must collect on the unmutated snapshot, or every "kill" is its error
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
                ran = subprocess.run(["nice", "-n", "10", *stage_command(args.stage, row, tuple(args.first))], cwd=TREE,
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
        entry = done.setdefault(key(row), {})
        entry[args.stage] = verdict
        entry[f"{args.stage}_by"] = by
        (WORK / "stages.json").write_text(json.dumps(done, indent=2))
        print(f"{verdict:8} {key(row):60} {by} ({time.perf_counter() - started:.0f} s)", flush=True)
    return 0


def cmd_report(args) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from fates import FATES
    meta = json.loads((WORK / "meta.json").read_text())
    done = verdicts()
    every = [r for module in TESTS_OF for r in items(module)]
    rows = [r for r in every if r["result"] and r["result"]["worker_outcome"] != "skipped"]
    pending = [r for r in every if not r["result"]]
    table, counts = [], {"selected tests": 0, "main": 0, "gate": 0, "vllm": 0, "new test": 0, "equivalent": 0,
                         "survived": 0, "incompetent": 0}
    named = {"main": "main", "gate": "gate", "vllm": "vllm", "new": "new test"}
    for row in rows:
        k, result = key(row), row["result"]
        stage_entry = done.get(k, {})
        if result["worker_outcome"] != "normal":
            fate, by = "incompetent", result["worker_outcome"]
        elif result["test_outcome"] == "killed":
            fate, by = "selected tests", _killer(result["output"])
        else:
            stage = next((s for s in STAGES if stage_entry.get(s) == "killed"), None)
            fate, by = (named[stage], stage_entry.get(f"{stage}_by", "")) if stage else ("survived", "")
            if fate == "survived" and k in FATES:
                fate, by = FATES[k]
        counts[fate] += 1
        table.append((k, row["start"][0], fate, by, (result.get("diff") or "")))
    killed = sum(counts[s] for s in ("selected tests", "main", "gate", "vllm", "new test"))
    scored = killed + counts["survived"]
    summary = {"tool": "cosmic-ray 8.7.0", **meta, "run": len(rows), "pending": len(pending), **counts,
               "score": killed / scored if scored else None,
               "score_without_new_tests": (killed - counts["new test"]) / scored if scored else None}
    out = ROOT / "results" / "mutation" / "tool"
    out.mkdir(parents=True, exist_ok=True)
    extra = len(rows) - meta["sampled"]  # run from a larger sample before it was cut to this one
    beyond = f", and {extra} more of a larger one, run before it was cut" if extra > 0 else ""
    lines = ["# Mutation run by a tool (cosmic-ray)", "",
             f"Commit {meta['commit'][:12]}: cosmic-ray generated {meta['generated']} mutants at {meta['sites']} "
             f"sites in core/, engine/, metrics.py, gate.py, worker/connector.py and worker/copy.py; "
             f"a deterministic sample of {meta['sampled']} (the first of one order, docs/mutation.md)"
             f"{beyond}: "
             f"{len(rows)} run, {len(pending)} not yet run. "
             "Regenerate with the commands in docs/mutation.md.", "",
             f"Tests: those of that commit, with this branch's own on top ({', '.join(meta.get('overlay', []))}). "
             f"Failing on the unmutated snapshot, so deselected from every run: "
             f"{', '.join(meta.get('deselect', [])) or 'none'}."
             + (f" Deselected from exec only (they failed on an earlier round's snapshot, which lacked "
                f"results/releases/, and pass on this one: `recheck`), so run in the stages: "
                f"{', '.join(sorted(set(meta['deselect_in_exec']) - set(meta.get('deselect', []))))}."
                if set(meta.get("deselect_in_exec", [])) - set(meta.get("deselect", [])) else "")
             + " Unmutated run of every selected test: "
             f"{meta.get('baseline_s', '?')} s; exec at nice 10, one mutant at a time. "
             f"New tests failing on the unmutated snapshot (so killing nothing): "
             f"{', '.join(meta.get('new_failing_unmutated', [])) or 'none'}.", "",
             "| killed by | mutants |", "|---|---|",
             *(f"| {name} | {counts[name]} |" for name in counts), "",
             f"Score over the whole CI (equivalent mutants left out): {killed} of {scored}"
             f" = {summary['score']:.1%}" if scored else "", "",
             f"Before the new tests: {killed - counts['new test']} of {scored}"
             f" = {summary['score_without_new_tests']:.1%}." if scored else "", "",
             "## Every mutant that survived the selected tests", "",
             "| mutant | line | fate | by / why |", "|---|---|---|---|"]
    for k, line, fate, by, diff in table:
        if fate != "selected tests":
            lines.append(f"| `{k}` | {line} | {fate} | {by.replace('|', '/')} |")
    lines += ["", "## Every mutant run, and what killed it", "",
              "Tests selected per module: `scripts/mutation_tool/targets.py`.", "",
              "| mutant | line | fate | by |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {line} | {fate} | {by.replace('|', '/')} |" for k, line, fate, by, _ in table]
    lines += ["", "## Diffs of the survivors", ""]
    for k, line, fate, by, diff in table:
        if fate != "selected tests":
            lines += [f"`{k}` ({fate})", "", "```diff", diff.strip(), "```", ""]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    summary["mutants"] = {k: {"line": line, "fate": fate, "by": by} for k, line, fate, by, _ in table}
    (out / "score.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(lines[2], "\n", "\n".join(lines[4:14]))
    return 0


def _killer(output: str) -> str:
    if output == "timeout":
        return "(hang: past the timeout)"
    failed = [line.split(" - ")[0][len("FAILED "):] for line in (output or "").splitlines() if line.startswith("FAILED ")]
    return failed[0] if failed else "(collection or import error)"


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/mutation_tool", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
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
    stage.add_argument("--all", action="store_true",
                       help="main, gate, vllm: also the survivors a probe or a new test has resolved")
    sub.add_parser("report")
    args = parser.parse_args()
    return {"prepare": cmd_prepare, "resample": cmd_resample, "baseline": cmd_baseline, "recheck": cmd_recheck, "exec": cmd_exec, "stage": cmd_stage,
            "report": cmd_report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
