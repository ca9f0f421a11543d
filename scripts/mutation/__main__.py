"""Mutation score of the test suite: plant each mutant of ``mutants.py`` in a copy of the tree,
run the gates against it, and write the score and the survivors to ``results/mutation/``.

    .venv/bin/python scripts/mutation [--only TEXT]... [--jobs N] [--timeout S]

Why an own list rather than mutmut or cosmic-ray: no new dependency; every mutant is a plausible
bug chosen by hand (the issue's survivors, the fix flags, the catalogue's mechanisms) instead of
thousands of operator swaps, so a full run fits in minutes on 2 cores; and it is deterministic
(exact text replacement, derandomized fuzz profile). The price: anchors are exact text, so a
refactor can make a mutant NOT APPLICABLE. Such a mutant is reported loudly and counted apart,
never as killed. Runs on demand (the fix-flag part runs in CI as tests/gates/test_fix_flags.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "reference"))
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mutants import MUTANTS, Mutant  # noqa: E402
from script_args import StrictParser  # noqa: E402

# Fast, sharp tests first: with -x a mutant is usually killed within the first directory.
TESTS = ["tests/gates", "tests/metrics", "tests/core", "tests/worker", "tests/engine", "tests/fuzz"]
# The flag check replays the gates itself; the anchor check reads each mutant's text in the
# source, so a planted mutant always "fails" it: a kill by text, not by behaviour.
IGNORE = ["--ignore=tests/gates/test_fix_flags.py", "--ignore=tests/gates/test_mutant_anchors.py"]
PER_TEST_TIMEOUT_S = 240  # generous: a loaded 2-core machine; a real hang still ends the run


def applicable(mutant: Mutant) -> bool:
    return (ROOT / mutant.path).read_text().count(mutant.old) == 1


def copy_tree(target: Path) -> None:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        source = ROOT / name
        # results/ are outputs, except the release table and the bench results the docs' generated
        # tables are made from (tests/core/test_facts.py reads them)
        if source.is_file() and (not name.startswith("results/") or name.startswith(("results/releases/",
                                                                                        "results/runs/bench-"))):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def run_tests(tree: Path, timeout: int) -> tuple[str, str, float]:
    """(status, killer, seconds) of the test run in ``tree``."""
    # The fuzzer's fresh-seed search is pinned (KVOFFLOAD_FUZZ_SEED): a mutant is killed or not
    # by the same examples every time it is run.
    env = dict(os.environ, PYTHONPATH=str(tree / "reference"), KVOFFLOAD_TEST_TIMEOUT=str(PER_TEST_TIMEOUT_S),
               KVOFFLOAD_FUZZ="ci", KVOFFLOAD_FUZZ_SEED="0")
    env.pop("KVOFFLOAD_GATES_DISABLE", None)
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header",
                               "-rf", *TESTS, *IGNORE], cwd=tree, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return "killed", f"(hang: the run passed {timeout} s)", time.perf_counter() - started
    seconds = time.perf_counter() - started
    lines = done.stdout.splitlines()
    failed = next((line.split(" - ")[0][len("FAILED "):] for line in lines if line.startswith("FAILED ")), "")
    if done.returncode == 0:
        return "survived", "", seconds
    if done.returncode == 1:
        return "killed", failed or "(a test failed)", seconds
    if done.returncode == 2 and any("hung" in line for line in lines):
        return "killed", f"{failed} (hang bound)".strip(), seconds
    return "error", f"pytest exit {done.returncode}: {(done.stdout + done.stderr)[-300:]}", seconds


def main() -> int:
    parser = StrictParser(prog="scripts/mutation", description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="run the mutants whose name contains this text (repeatable: any of them)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per mutant run")
    parser.add_argument("--out", default=str(ROOT / "results" / "mutation"))
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or any(text in m.name for text in args.only)]
    unmatched = [text for text in args.only if not any(text in m.name for m in MUTANTS)]
    if unmatched or not chosen:
        print(f"error: no mutant name contains {unmatched[0] if unmatched else ''!r}", file=sys.stderr)
        return 2
    stale = [m for m in chosen if not applicable(m)]
    for m in stale:
        print(f"!! MUTANT NOT APPLICABLE: {m.name!r}: its text is not found exactly once in {m.path}; "
              "update its anchor in scripts/mutation/mutants.py", file=sys.stderr)
    runnable = [m for m in chosen if m not in stale]
    trees = [Path(tempfile.mkdtemp(prefix=f"mutation-{i}-")) for i in range(max(1, args.jobs))]
    for tree in trees:
        copy_tree(tree)
    status, killer, seconds = run_tests(trees[0], args.timeout)
    if status != "survived":
        print(f"error: the unmutated tree fails its tests ({killer}); fix that first", file=sys.stderr)
        return 1
    print(f"baseline: the unmutated tree passes in {seconds:.0f} s", flush=True)
    free = list(trees)
    results: dict[str, dict] = {}

    def one(mutant: Mutant) -> None:
        tree = free.pop()
        target = tree / mutant.path
        original = target.read_text()
        try:
            target.write_text(original.replace(mutant.old, mutant.new, 1))
            state, by, took = run_tests(tree, args.timeout)
        finally:
            target.write_text(original)
            free.append(tree)
        results[mutant.name] = {"file": mutant.path, "status": state, "killed_by": by, "seconds": round(took),
                                "listed": mutant.listed, "why": mutant.why}
        print(f"{state:9} {mutant.name:45} {by}", flush=True)

    with ThreadPoolExecutor(max_workers=len(trees)) as pool:
        list(pool.map(one, runnable))
    for tree in trees:
        shutil.rmtree(tree, ignore_errors=True)
    for m in stale:
        results[m.name] = {"file": m.path, "status": "not applicable", "killed_by": "", "seconds": 0,
                           "listed": m.listed, "why": m.why}
    if args.only:  # a partial rerun updates the last full run's entries
        previous = Path(args.out) / "score.json"
        if previous.exists():
            kept = json.loads(previous.read_text())["mutants"]
            results = {**{k: v for k, v in kept.items() if k in {m.name for m in MUTANTS}}, **results}
    order = [m.name for m in MUTANTS if m.name in results]
    write_results(Path(args.out), order, results)
    survivors = [name for name, r in results.items() if r["status"] != "killed"]
    return 1 if any(results[name]["listed"] for name in survivors) else 0


def write_results(out: Path, order: list[str], results: dict[str, dict]) -> None:
    killed = sum(r["status"] == "killed" for r in results.values())
    survived = sum(r["status"] == "survived" for r in results.values())
    score = killed / (killed + survived) if killed + survived else None
    summary = {"score": score, "killed": killed, "survived": survived,
               "not_applicable": sum(r["status"] == "not applicable" for r in results.values()),
               "errors": sum(r["status"] == "error" for r in results.values()),
               "mutants": {name: results[name] for name in order}}
    out.mkdir(parents=True, exist_ok=True)
    table = ["# Mutation run", "", f"Score: {killed} killed of {killed + survived} "
             f"({'-' if score is None else f'{score:.1%}'}); not applicable: {summary['not_applicable']}; "
             f"errors: {summary['errors']}. Command: `.venv/bin/python scripts/mutation`.", "",
             "| mutant | file | listed | status | killed by |", "|---|---|---|---|---|"]
    for name in order:
        r = results[name]
        table.append(f"| {name} | {r['file'].split('kvoffload/')[-1]} | {'yes' if r['listed'] else ''} | "
                     f"{r['status']} | {r['killed_by']} |")
    for path, text in ((out / "score.json", json.dumps(summary, indent=2) + "\n"),
                       (out / "README.md", "\n".join(table) + "\n")):
        partial = path.with_suffix(path.suffix + ".partial")
        partial.write_text(text)
        partial.replace(path)
    print(f"score {table[2]}")


if __name__ == "__main__":
    sys.exit(main())
