"""The ``kvoffload`` command line.

Exit codes: 0 success, 1 the run failed (a connector crash; the result file records it),
2 bad input (usage, workload file, --set key or value, --out path) with a one-line reason.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from kvoffload.core.fixes import FIX_INFO, PRESETS, presets_lacking
from kvoffload.core.types import ConfigError
from kvoffload.metrics import GLOSSARY, METRIC_NAMES, format_value
from kvoffload.results import ResultError, check_writable, read_result, write_atomic
from kvoffload.runner import ConnectorChoice, RunOutcome, chrome_trace, replay_workload
from kvoffload.workloads import (
    DEFAULT_WORKLOAD,
    WorkloadError,
    describe_workload,
    list_workloads,
    load_workload,
)

BENCH_WORKLOADS = ("shared-prefix", "multi-turn", "spec-decode")
BENCH_CONNECTORS = (None, "vllm-0.25", "vllm-0.26", "vllm-0.29", "vllm-0.30")
# The metrics of the one-screen comparison (bench) and of a run's table, in order.
TABLE_METRICS = (
    "last_block_hit_rate", "offload_hit_rate", "gpu_hit_rate", "poisoned_loads", "lifecycle_violations",
    "leaked_requests", "crashes", "store_submit_delay_steps_p50", "store_visible_delay_steps_p99",
    "tokens_per_s_modeled", "connector_us_per_step",
)
SHORT_NAMES = {
    "last_block_hit_rate": "last-blk", "offload_hit_rate": "offload", "gpu_hit_rate": "gpu",
    "poisoned_loads": "poison", "lifecycle_violations": "lifecyc", "leaked_requests": "leaked",
    "crashes": "crash", "store_submit_delay_steps_p50": "submit50", "store_visible_delay_steps_p99": "visib99",
    "tokens_per_s_modeled": "tok/s(mod)", "connector_us_per_step": "us/step",
}


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvoffload", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="replay one workload through one connector configuration")
    run.add_argument("--workload", default=DEFAULT_WORKLOAD, help="NAME | PATH.toml | mooncake:FILE | sharegpt:FILE")
    run.add_argument("--scheduling", choices=("sync", "async"))
    run.add_argument("--disable-fix", action="append", default=[], metavar="NAME")
    run.add_argument("--preset", metavar="NAME", help=f"one of {', '.join(PRESETS)}")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings")
    run.add_argument("--out", type=Path, help="result JSON (default results/runs/<workload>-<label>.json)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--trace", type=Path, metavar="FILE", help="also write the jobs as a Chrome trace (JSON)")

    bench = sub.add_parser("bench", help="the main job: bundled workloads x reference and vLLM presets")
    bench.add_argument("--small", action="store_true", help="the -small workloads (seconds, for a smoke run)")
    bench.add_argument("--out-dir", type=Path, default=Path("results/runs"))
    bench.add_argument("--quiet", action="store_true")

    sub.add_parser("fixes", help="the fix flags, what they reproduce, which presets lack them")

    workloads = sub.add_parser("workloads", help="list bundled workloads, or show one")
    workloads.add_argument("action", nargs="?", choices=("list", "show"), default="list")
    workloads.add_argument("name", nargs="?")

    report = sub.add_parser("report", help="draw charts from result files")
    report.add_argument("--from", dest="source", type=Path, default=Path("results"))
    report.add_argument("--out", type=Path, default=Path("results/charts"))

    gate = sub.add_parser("gate", help="this tree's metrics against the committed baseline (regression gate)")
    gate.add_argument("--baseline", metavar="FILE|REF", help="baseline file, or a git ref holding "
                      "results/gate/baseline.json (default: that file in this tree)")
    gate.add_argument("--update", action="store_true", help="rewrite the baseline from this tree instead")
    gate.add_argument("--strict", action="store_true", help="measured numbers beyond their factor fail too")
    gate.add_argument("--machine", help="name of this machine for measured numbers ($KVOFFLOAD_MACHINE, host name)")
    gate.add_argument("--repeats", type=int, default=1, help="replays per run (baseline: 3 measures the spread)")

    compare = sub.add_parser("compare", help="two result files side by side")
    compare.add_argument("a", type=Path)
    compare.add_argument("b", type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        handler = {"run": _cmd_run, "bench": _cmd_bench, "fixes": _cmd_fixes, "workloads": _cmd_workloads,
                   "report": _cmd_report, "compare": _cmd_compare, "gate": _cmd_gate}[args.command]
        return handler(args)
    except BrokenPipeError:  # output piped into `head`: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (UsageError, WorkloadError, ConfigError, ResultError, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"kvoffload: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvoffload: interrupted", file=sys.stderr)
        return 130


# ---- run ------------------------------------------------------------------------------------


def _parse_settings(settings: Sequence[str]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        parsed[key.strip()] = value.strip()
    return parsed


def _cmd_run(args: argparse.Namespace) -> int:
    overrides = _parse_settings(args.settings)
    if args.scheduling:
        overrides["scheduling"] = args.scheduling
    choice = ConnectorChoice.build(args.preset, tuple(args.disable_fix))
    workload = load_workload(args.workload, overrides)
    out = args.out or Path("results/runs") / f"{_slug(workload.name)}-{_slug(choice.label)}.json"
    if args.out is not None:
        check_writable(out)
    if args.trace is not None:
        check_writable(args.trace)
    outcome = _replay(workload, choice, quiet=args.quiet, trace=args.trace is not None)
    write_atomic(out, outcome.result)
    if args.trace is not None:
        write_atomic(args.trace, chrome_trace(outcome.record))
    print(_run_table(outcome))
    print(f"\nresult: {out}")
    if outcome.failed:
        error = outcome.result["error"]
        print(f"kvoffload: run failed at step {error['step']}: {error['message']}", file=sys.stderr)
        return 1
    return 0


def _replay(workload, choice: ConnectorChoice, quiet: bool, position: str = "", trace: bool = False) -> RunOutcome:
    if quiet:
        return replay_workload(workload, choice, trace=trace)
    from tqdm import tqdm

    with tqdm(total=len(workload.requests), desc=f"{position}{workload.name} [{choice.label}]", unit="req",
              file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
        def on_step(step: int, finished: int) -> None:
            if finished > bar.n:
                bar.update(finished - bar.n)
        return replay_workload(workload, choice, on_step=on_step, trace=trace)


def _run_table(outcome: RunOutcome) -> str:
    result = outcome.result
    metrics = result["metrics"]
    config = result["config"]
    head = (f"workload {result['workload']['name']} ({result['workload']['requests']} requests, "
            f"{config['scheduling']} scheduling)   connector {result['connector']['label']}")
    width = max(len(name) for name in METRIC_NAMES)
    lines = [head, "-" * len(head)]
    for name, _, meaning in GLOSSARY:
        lines.append(f"{name:<{width}}  {format_value(name, metrics[name]):>12}   {meaning}".rstrip())
    return "\n".join(lines)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in text.replace(" -", "-no-")).strip("_")


# ---- bench ----------------------------------------------------------------------------------


def _cmd_bench(args: argparse.Namespace) -> int:
    args.out_dir.mkdir(parents=True, exist_ok=True)
    check_writable(args.out_dir / "bench-summary.json")
    suffix = "-small" if args.small else ""
    workloads = [load_workload(name + suffix) for name in BENCH_WORKLOADS]
    choices = [ConnectorChoice.build(preset) for preset in BENCH_CONNECTORS]
    rows = []
    started = time.perf_counter()
    total = len(workloads) * len(choices)
    for w_index, workload in enumerate(workloads):
        for c_index, choice in enumerate(choices):
            position = f"({w_index * len(choices) + c_index + 1}/{total}) "
            outcome = _replay(workload, choice, quiet=args.quiet, position=position)
            path = args.out_dir / f"bench-{_slug(workload.name)}-{_slug(choice.label)}.json"
            write_atomic(path, outcome.result)
            rows.append((workload.name, choice.label, outcome.result["metrics"], outcome.failed))
    elapsed = time.perf_counter() - started
    write_atomic(args.out_dir / "bench-summary.json", {
        "schema": "kvoffload-bench/bench/v1", "seconds": round(elapsed, 1),
        "rows": [{"workload": w, "connector": c, "metrics": m, "failed": f} for w, c, m, f in rows]})
    print(_bench_table(rows))
    print(f"\n{len(rows)} runs in {elapsed:.0f} s; results in {args.out_dir}/")
    return 0


def _bench_table(rows) -> str:
    headers = ["workload", "connector"] + [SHORT_NAMES[name] for name in TABLE_METRICS]
    body = [[w, c] + [format_value(name, m[name]) for name in TABLE_METRICS] for w, c, m, _ in rows]
    widths = [max(len(str(row[i])) for row in [headers] + body) for i in range(len(headers))]
    lines = ["  ".join(h.ljust(widths[i]) if i < 2 else h.rjust(widths[i]) for i, h in enumerate(headers))]
    lines.append("  ".join("-" * w for w in widths))
    previous = None
    for row in body:
        if previous is not None and row[0] != previous:
            lines.append("")
        previous = row[0]
        lines.append("  ".join(str(v).ljust(widths[i]) if i < 2 else str(v).rjust(widths[i])
                               for i, v in enumerate(row)))
    legend = ("last-blk: last_block_hit_rate  offload/gpu: hit rates  poison: poisoned_loads  "
              "submit50/visib99: store delays (steps)  tok/s(mod): tokens_per_s_modeled")
    return "\n".join(lines + ["", legend])


# ---- small commands ---------------------------------------------------------------------------


def _cmd_fixes(args: argparse.Namespace) -> int:
    for info in FIX_INFO:
        lacking = presets_lacking(info.name)
        print(info.name)
        print(f"  rule:        {info.rule}")
        print(f"  reproduces:  {info.reproduces}")
        print(f"  since vLLM:  {info.first_release}")
        print(f"  off in:      {', '.join(lacking) if lacking else '(no preset)'}")
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
    from kvoffload.report import draw_report

    index = draw_report(args.source, args.out)
    print(f"charts: {index}")
    return 0


def _cmd_gate(args: argparse.Namespace) -> int:
    from kvoffload.gate import run_gate

    return run_gate(baseline=args.baseline, update=args.update, strict=args.strict, machine=args.machine,
                    repeats=args.repeats)


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


if __name__ == "__main__":
    sys.exit(main())
