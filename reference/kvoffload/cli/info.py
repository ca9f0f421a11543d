"""The small commands: ``fixes``, ``workloads [list | show NAME]``, ``report``."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvoffload.cli.flags import Once, UsageError
from kvoffload.cli.outputs import DEFAULT_ROOT, REPORT_PAGE, check_output_dir, check_output_file
from kvoffload.core.fixes import FIX_INFO, presets_lacking, release_rule_cells, release_rules_by_preset
from kvoffload.workloads import describe_workload, list_workloads, load_workload


def register(sub) -> None:
    sub.add_parser("fixes", help="the fix flags, what they reproduce, which presets lack them").set_defaults(
        handler=_cmd_fixes)

    workloads = sub.add_parser("workloads", help="list bundled workloads, or show one")
    workloads.add_argument("action", nargs="?", choices=("list", "show"), default="list",
                           help="list (default): the bundled workloads; show: one workload's requests and reuse")
    workloads.add_argument("name", nargs="?", help="show: a bundled workload's NAME or a PATH.toml")
    workloads.set_defaults(handler=_cmd_workloads)

    report = sub.add_parser("report", help="draw charts from result files")
    report.add_argument("--from", dest="source", action=Once, type=Path, default=DEFAULT_ROOT, metavar="DIR",
                        help=f"folder of result files, read at any depth: run results and asv results under "
                             f"DIR/asv/ (default {DEFAULT_ROOT}/, where run, bench and sweep write; the "
                             f"published ones: --from results)")
    report.add_argument("--out", action=Once, type=Path, default=DEFAULT_ROOT / "charts", metavar="DIR",
                        help=f"folder for index.html and the figures (default {DEFAULT_ROOT / 'charts'}/); "
                             "figures of an earlier report there are replaced")
    report.set_defaults(handler=_cmd_report)


def _cmd_fixes(args: argparse.Namespace) -> int:
    for fix in FIX_INFO:
        lacking = presets_lacking(fix.name)
        print(fix.name)
        print(f"  rule:        {fix.rule}")
        print(f"  reproduces:  {fix.reproduces}")
        print(f"  since vLLM:  {fix.first_release}")
        print(f"  off in:      {', '.join(lacking) if lacking else '(no preset)'}")
    print("\nrelease rules (docs/design.md, \"Connector rules\"):")
    for label, _, rules in release_rules_by_preset():
        print(f"  {label:<10}  " + "; ".join(f"{heading}: {value}" for heading, value in release_rule_cells(rules).items()))
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
    from kvoffload.report import INDEX_FILES, draw_report, report_outputs

    out = check_output_dir("--out", args.out)
    for path in report_outputs(out):  # what the report replaces or removes: regular files only,
        # and an index page only where it is a report's (a README's index.md there is not ours)
        check_output_file("--out", path, kind=REPORT_PAGE if path.name in INDEX_FILES else None)
    index = draw_report(args.source, out)
    print(f"charts: {index}")
    return 0
