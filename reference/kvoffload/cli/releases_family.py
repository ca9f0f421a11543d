"""``kvoffload releases --connector NAME``: the connector x release matrix.

Each connector family (``stock``: vLLM's OffloadingConnector; ``simple-cpu``,
``simple-cpu-lazy``: vLLM's SimpleCPUOffloadConnector, ``kvoffload.vllm.foreign``) replays the
workloads in every release's own scheduler (``kvoffload.vllm.rows --connector``). No preset
stands beside a foreign family: the simulator models the stock connector only. Per cell: every
zero-metric, the last-block and offload hit rates, the store submission delays, and the crash
or setup failure, each row with the commit that measured it. The table (``--out``, default
``out/releases/connectors.json``) keeps the rows of earlier runs this one did not measure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvoffload.cli.flags import UsageError
from kvoffload.cli.outputs import check_output_file
from kvoffload.metrics import format_value
from kvoffload.release_io import venv_python
from kvoffload.releases import FULL_WORKLOADS, RELEASES, SCHEDULINGS, SMALL_WORKLOADS, ZERO_METRICS, venv_name
from kvoffload.results import git_commit, locked_folder, write_atomic

SCHEMA = "kvoffload-bench/releases-connectors/v1"
CELL_METRICS = ("last_block_hit_rate", "offload_hit_rate", *ZERO_METRICS, "store_submit_delay_steps_p50",
                "store_submit_delay_steps_p99")


def cmd_connector_matrix(args: argparse.Namespace, places: list[Path], out: Path, release_rows) -> int:
    """The matrix of ``args.connector`` x releases into ``out``; ``places``: where the release venvs
    are looked for; ``release_rows``: ``cli/releases.py``'s runner of one release's rows (its
    checks of a release venv's output shared, not repeated here)."""
    releases = args.release or list(RELEASES)
    unknown = [r for r in releases if r not in RELEASES]
    if unknown:
        raise UsageError(f"--release {unknown[0]}: not a known release (known: {', '.join(RELEASES)})")
    pythons = {release: venv_python(venv_name(release), places) for release in releases}
    missing = [release for release, python in pythons.items() if python is None]
    if missing:
        raise UsageError(f"no venv for {', '.join(missing)}: create it with "
                         + "; ".join(f"./scripts/setup-vllm {r}" for r in missing))
    out = check_output_file("--out", out, create_parents=True)
    workloads = args.workload or [*SMALL_WORKLOADS, *(FULL_WORKLOADS if args.full else ())]
    jobs = [(w, s) for w in workloads for s in (args.scheduling or SCHEDULINGS)]
    commit = git_commit()
    measured = []
    for release in releases:
        for connector in args.connector:
            rows, seconds = release_rows(release, pythons[release], jobs, args.timeout, connector=connector,
                                         step_bound_s=args.step_timeout)
            measured += [cell(row, connector, commit, seconds / len(rows)) for row in rows]
            print(matrix_text([c for c in measured if c["release"] == release]), flush=True)
    with locked_folder(out.parent):
        table = merged(earlier(out), measured)
        write_atomic(out, {"schema": SCHEMA, "rows": table})
    print(f"\nconnector x release matrix: {len(measured)} cells measured; table in {out}")
    return 0


def cell(row: dict, connector: str, commit: str | None, seconds: float) -> dict:
    """One cell of the matrix from one row of ``kvoffload.vllm.rows``."""
    out = {"connector": connector, "release": row["release"], "workload": row["workload"],
           "scheduling": row["scheduling"], "commit": commit, "seconds": round(seconds, 2)}
    if "setup_error" in row:
        return {**out, "setup_error": row["setup_error"]}
    metrics = row["metrics"]
    return {**out, "metrics": {name: metrics.get(name) for name in CELL_METRICS}, "error": row["error"],
            "leaked": row["leaked"], "stuck": row["stuck"], "poisoned": row.get("poisoned", []),
            "overrides": row.get("overrides", {})}


def _key(entry: dict) -> tuple:
    return (entry["connector"], entry["release"], entry["workload"], entry["scheduling"])


def merged(before: list[dict], measured: list[dict]) -> list[dict]:
    fresh = {_key(entry) for entry in measured}
    rows = [entry for entry in before if _key(entry) not in fresh] + measured
    order = {release: i for i, release in enumerate(RELEASES)}
    return sorted(rows, key=lambda e: (order.get(e["release"], len(order)), e["workload"], e["scheduling"],
                                       e["connector"]))


def earlier(out: Path) -> list[dict]:
    try:
        table = json.loads(out.read_text())
    except (OSError, ValueError):
        return []
    return table.get("rows", []) if isinstance(table, dict) and table.get("schema") == SCHEMA else []


def summary(entry: dict) -> str:
    """One cell in words: hit rates, then what went wrong (or "clean")."""
    if "setup_error" in entry:
        return f"setup failed: {entry['setup_error']}"
    m = entry["metrics"]
    rates = (f"last-blk {format_value('last_block_hit_rate', m['last_block_hit_rate'])}, "
             f"offload {format_value('offload_hit_rate', m['offload_hit_rate'])}, "
             f"submit {format_value('x', m['store_submit_delay_steps_p50'])}/"
             f"{format_value('x', m['store_submit_delay_steps_p99'])}")
    wrong = [f"{name.split('_')[0]} {m[name]}" for name in ZERO_METRICS if m.get(name)]
    if entry.get("error"):
        wrong.append(f"crash at step {entry['error']['step']}: {entry['error']['message'][:120]}")
    return rates + "; " + (", ".join(wrong) if wrong else "clean")


def matrix_markdown(rows: list[dict], workloads: tuple[str, ...] | None = None) -> str:
    """Releases down, connectors across: one table row per release, workload and scheduling."""
    connectors = sorted(dict.fromkeys(entry["connector"] for entry in rows), key=lambda c: (c != "stock", c))
    by_cell = {_key(entry): entry for entry in rows}
    lines = ["| release | workload | sched | " + " | ".join(connectors) + " |",
             "|---|---|---|" + "---|" * len(connectors)]
    for release, workload, scheduling in dict.fromkeys((e["release"], e["workload"], e["scheduling"]) for e in rows):
        if workloads is not None and workload not in workloads:
            continue
        cells = [summary(by_cell[(c, release, workload, scheduling)]) if (c, release, workload, scheduling) in by_cell
                 else "not run" for c in connectors]
        lines.append(f"| {release} | {workload} | {scheduling} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def matrix_text(rows: list[dict]) -> str:
    lines = []
    for entry in rows:
        lines.append(f"  vLLM {entry['release']:<7} {entry['connector']:<16} {entry['workload']:<20} "
                     f"{entry['scheduling']:<5} {summary(entry)}")
    return "\n".join(lines)
