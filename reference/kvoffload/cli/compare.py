"""``kvoffload compare A B``: two result files metric by metric, each change judged.

The verdict of a change (better, worse, info, same) is read from the glossary's direction
(``metrics.judge``). Measured metrics (wall-clock: the glossary marks them) are judged too, but
they move between any two runs, so ``--fail-on-worse`` counts only the deterministic ones.

A and B must replay one workload on one engine configuration (``config``, the connector's source
aside): what may differ is the connector (a preset, a fix flag off, stock vs reference) and the
code (two commits). Two workloads, two engines or a ``--set`` override in one of them would make
every verdict a comparison of two setups, so that is one line and exit 2, naming both files and
what differs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvoffload.cli.flags import Once, OnceTrue, UsageError
from kvoffload.metrics import MEASURED_METRICS, METRIC_NAMES, format_value, judge
from kvoffload.results import differences, read_result
from kvoffload.tables import FORMATS, render

HEADER = ("metric", "a", "b", "change", "verdict", "kind")


def register(sub) -> None:
    compare = sub.add_parser("compare", help="two result files metric by metric, each change judged "
                                             "better / worse / info by the glossary's direction")
    compare.add_argument("a", type=Path, metavar="A", help="the result file to compare against (before)")
    compare.add_argument("b", type=Path, metavar="B", help="the result file judged (after): the same workload and "
                                                            "engine configuration as A; another connector or commit")
    compare.add_argument("--fail-on-worse", action=OnceTrue,
                         help="exit 1 when a deterministic metric got worse from A to B")
    compare.add_argument("--format", action=Once, choices=FORMATS, default="text",
                         help="text (default), json, csv (the rows only) or markdown")
    compare.set_defaults(handler=_cmd_compare)


def compare_rows(a: dict, b: dict) -> list[tuple]:
    """One row per metric either file has, glossary metrics first in glossary order: (metric, a,
    b, b - a, verdict, "measured" | "deterministic"). A metric neither has (one an engine does
    not observe) is left out; one that only one file has is a row with an empty side."""
    present = set(a["metrics"]) | set(b["metrics"])
    names = [name for name in METRIC_NAMES if name in present] + sorted(present - set(METRIC_NAMES))
    rows = []
    for name in names:
        va, vb = _number(a["metrics"].get(name)), _number(b["metrics"].get(name))
        change = vb - va if va is not None and vb is not None else None
        rows.append((name, va, vb, change, judge(name, va, vb),
                     "measured" if name in MEASURED_METRICS else "deterministic"))
    return rows


# config keys that may differ between A and B: the connector's source (reference, stock, a class)
MAY_DIFFER = ("connector",)


def check_comparable(path_a: Path, a: dict, path_b: Path, b: dict) -> None:
    """UsageError unless A and B replay the same workload (its whole description: name, source,
    seed, requests) on the same engine configuration; the connector and the commit may differ."""
    workload_differs = differences(a["workload"], b["workload"])
    if workload_differs:
        name_a, name_b = a["workload"].get("name"), b["workload"].get("name")
        if name_a != name_b:
            what = f"(workload {name_a}) and {path_b} (workload {name_b}) replay different workloads"
        else:
            what = f"and {path_b} replay different versions of workload {name_a} ({_first_three(workload_differs)})"
        raise UsageError(f"compare: {path_a} {what}; a verdict needs two runs of one workload")
    config_differs = differences(a["config"], b["config"], ignore=MAY_DIFFER)
    if config_differs:
        raise UsageError(f"compare: {path_a} and {path_b} ran {a['workload'].get('name')} on different engine "
                         f"configurations ({_first_three(config_differs)}); a verdict needs one configuration "
                         f"(only the connector and the commit may differ)")


def _first_three(found: list[str]) -> str:
    return ", ".join(found[:3]) + (f", and {len(found) - 3} more" if len(found) > 3 else "")


def _cmd_compare(args: argparse.Namespace) -> int:
    a, b = read_result(args.a), read_result(args.b)
    check_comparable(args.a, a, args.b, b)
    rows = compare_rows(a, b)
    worse = [row[0] for row in rows if row[4] == "worse" and row[5] == "deterministic"]
    counts = {verdict: sum(row[4] == verdict for row in rows) for verdict in ("better", "worse", "info")}
    sides = {"a": _side(args.a, a), "b": _side(args.b, b)}
    notes = [f"{side.upper()}: {entry['file']}  {entry['workload']} [{entry['connector']}]  commit "
             f"{entry['commit'] or 'unknown'}" for side, entry in sides.items()]
    notes.append(f"{counts['better']} better, {counts['worse']} worse, {counts['info']} info; deterministic "
                 f"worse: {', '.join(worse) if worse else 'none'}")
    shown = [(name, format_value(name, va), format_value(name, vb), _difference(name, change), verdict, kind)
             for name, va, vb, change, verdict, kind in rows]
    print(render(args.format, HEADER, rows, shown, right=(1, 2, 3), notes=notes,
                 meta={**sides, "worse": worse, "counts": counts}))
    return 1 if args.fail_on_worse and worse else 0


def _side(path: Path, result: dict) -> dict:
    provenance = result.get("provenance")
    commit = provenance.get("commit") if isinstance(provenance, dict) else None
    return {"file": str(path), "workload": result["workload"]["name"], "connector": result["connector"]["label"],
            "commit": commit if isinstance(commit, str) else None}


def _number(value) -> float | int | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _difference(name: str, delta) -> str:
    """B - A with a sign; "-" when either side has no value; "0" when equal."""
    if delta is None:
        return "-"
    if abs(delta) < 1e-12:
        return "0"
    return ("+" if delta > 0 else "") + format_value(name, delta)
