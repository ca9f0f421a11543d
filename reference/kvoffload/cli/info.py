"""The small commands: ``fixes``, ``workloads [list | show NAME]``, ``report``, ``compare A B``."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvoffload.cli.flags import Once, UsageError
from kvoffload.cli.outputs import check_output_dir, check_output_file
from kvoffload.core.fixes import FIX_INFO, PRESETS, Fixes, presets_lacking
from kvoffload.metrics import METRIC_NAMES, format_value
from kvoffload.results import read_result
from kvoffload.workloads import describe_workload, list_workloads, load_workload


def register(sub) -> None:
    sub.add_parser("fixes", help="the fix flags, what they reproduce, which presets lack them").set_defaults(
        handler=_cmd_fixes)

    workloads = sub.add_parser("workloads", help="list bundled workloads, or show one")
    workloads.add_argument("action", nargs="?", choices=("list", "show"), default="list")
    workloads.add_argument("name", nargs="?")
    workloads.set_defaults(handler=_cmd_workloads)

    report = sub.add_parser("report", help="draw charts from result files")
    report.add_argument("--from", dest="source", action=Once, type=Path, default=Path("results"))
    report.add_argument("--out", action=Once, type=Path, default=Path("results/charts"))
    report.set_defaults(handler=_cmd_report)

    compare = sub.add_parser("compare", help="two result files side by side")
    compare.add_argument("a", type=Path)
    compare.add_argument("b", type=Path)
    compare.set_defaults(handler=_cmd_compare)


def _cmd_fixes(args: argparse.Namespace) -> int:
    for fix in FIX_INFO:
        lacking = presets_lacking(fix.name)
        print(fix.name)
        print(f"  rule:        {fix.rule}")
        print(f"  reproduces:  {fix.reproduces}")
        print(f"  since vLLM:  {fix.first_release}")
        print(f"  off in:      {', '.join(lacking) if lacking else '(no preset)'}")
    print("\nrelease rules (docs/design.md, \"Connector rules\"):")
    for label, rules in [(p.name, p.rules) for p in PRESETS.values()] + [("reference", Fixes().rules)]:
        cursor = "monotonic" if rules.store_cursor_monotonic else "rewinds after preemption"
        print(f"  {label:<10}  recency {rules.recency.value}, store cursor {cursor}")
    return 0


def _cmd_workloads(args: argparse.Namespace) -> int:
    if args.action == "list":
        if args.name:
            raise UsageError(f"'workloads list' takes no name (did you mean 'workloads show {args.name}'?)")
        entries = list_workloads()
        width = max(len(name) for name, _ in entries)
        for name, description in entries:
            print(f"{name:<{width}}  {description}")
        return 0
    if not args.name:
        raise UsageError("'workloads show' needs a NAME or PATH")
    print(describe_workload(load_workload(args.name)))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from kvoffload.report import draw_report, report_outputs

    out = check_output_dir("--out", args.out)
    for path in report_outputs(out):  # what the report replaces or removes: regular files only
        check_output_file("--out", path)
    index = draw_report(args.source, out)
    print(f"charts: {index}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    a, b = read_result(args.a), read_result(args.b)
    label_a = f"{a['workload']['name']} [{a['connector']['label']}]"
    label_b = f"{b['workload']['name']} [{b['connector']['label']}]"
    width = max(len(name) for name in METRIC_NAMES)
    print(f"{'metric':<{width}}  {'A':>12}  {'B':>12}  {'B - A':>12}")
    for name in METRIC_NAMES:
        va, vb = a["metrics"].get(name), b["metrics"].get(name)
        print(f"{name:<{width}}  {format_value(name, va):>12}  {format_value(name, vb):>12}  "
              f"{_difference(name, va, vb):>12}")
    print(f"\nA: {args.a} {label_a}\nB: {args.b} {label_b}")
    return 0


def _difference(name: str, a, b) -> str:
    """B - A with a sign; "-" when either side has no value; "0" when equal."""
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return "-"
    delta = b - a
    if abs(delta) < 1e-12:
        return "0"
    return ("+" if delta > 0 else "") + format_value(name, delta)
