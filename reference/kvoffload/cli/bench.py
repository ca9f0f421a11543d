"""``kvoffload bench``: the bundled workloads x the reference connector, each fix flag off in
turn, and the vLLM presets."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvoffload.cli.flags import Once, OnceTrue, UsageError
from kvoffload.cli.outputs import DEFAULT_ROOT, check_output_dir, check_output_file
from kvoffload.cli.bench_folders import SUMMARY_SCHEMA, default_out_dir, engine_folder, report_hint
from kvoffload.cli.run import add_step_timeout, replay, slug
from kvoffload.core.fixes import FIX_NAMES, PRESETS, ablation
from kvoffload.core.types import ConfigError
from kvoffload.cli.findings import finding_lines
from kvoffload.engines import ENGINES, SIMULATOR, VLLM, VLLM_SCHEDULER
from kvoffload.metrics import format_value
from kvoffload.results import SCHEMA as RUN_SCHEMA, write_atomic
from kvoffload.choice import ConnectorChoice
from kvoffload.workloads import load_workload
from kvoffload.workloads.bundled import BUNDLED_WORKLOADS, DENSE_WORKLOADS

# The bundled workloads (kvoffload.workloads.bundled). --engine vllm (a real model) serves the
# dense ones without scripted cache resets (vllm/llm_engine.py refuses resets), not the hybrid
# ones: a real model's KV cache groups are its own, not a hybrid workload's.
BENCH_WORKLOADS = BUNDLED_WORKLOADS
MODEL_WORKLOADS = DENSE_WORKLOADS
# (preset, disabled fixes): the reference, the reference without each fix flag in turn (every flag
# moves a figure of the table: docs/fixes.md, "Each fix moves a figure"), every preset in release order
BENCH_CONNECTORS = ((None, ()), *((None, ablation(fix)) for fix in FIX_NAMES), *((preset, ()) for preset in PRESETS))
# The metrics of the one-screen comparison, in order, with their column headings.
TABLE_METRICS = (
    "last_chunk_offloaded_rate", "last_block_hit_rate", "offload_hit_rate", "gpu_hit_rate", "poisoned_loads",
    "lifecycle_violations", "leaked_requests", "stuck_requests", "crashes", "livelock", "invariant_violations",
    "store_submit_delay_steps_p50", "store_visible_delay_steps_p99", "tokens_per_s_modeled", "connector_us_per_step",
)
SHORT_NAMES = {
    "last_chunk_offloaded_rate": "last-chunk", "last_block_hit_rate": "last-blk", "offload_hit_rate": "offload",
    "gpu_hit_rate": "gpu",
    "poisoned_loads": "poison", "lifecycle_violations": "lifecyc", "leaked_requests": "leaked",
    "stuck_requests": "stuck", "crashes": "crash", "livelock": "livelock", "invariant_violations": "invar",
    "store_submit_delay_steps_p50": "submit50", "store_visible_delay_steps_p99": "visib99",
    "tokens_per_s_modeled": "tok/s(mod)", "connector_us_per_step": "us/step",
}


def register(sub) -> None:
    bench = sub.add_parser("bench", help="the main job: bundled workloads x the reference, the reference without "
                                         "each fix flag, and the vLLM presets")
    bench.add_argument("--small", action=OnceTrue, help="the -small workloads (seconds, for a smoke run)")
    bench.add_argument("--out-dir", action=Once, type=Path, metavar="DIR",
                       help=f"folder for one result file per run and the summary (default {default_out_dir(SIMULATOR)}/"
                            f", with --engine E {DEFAULT_ROOT}/runs-E/; a vLLM engine's bench puts each engine's "
                            "runs in DIR/ENGINE/, one folder for kvoffload report --from); files of the same names "
                            "there are replaced")
    bench.add_argument("--quiet", action=OnceTrue, help="no progress bar")
    bench.add_argument("--engine", action=Once, choices=ENGINES, default=SIMULATOR,
                       help="vllm-scheduler: the small workloads on the simulator and on vLLM's scheduler "
                            "with vLLM's stock connector and the reference; vllm: on vLLM's real engine and a "
                            "real model, offload off / stock / reference / a broken one, measured, with the "
                            "output oracle (both need the vllm extra)")
    bench.add_argument("--model", action=Once, type=Path, metavar="PATH",
                       help="--engine vllm: a local model directory (default: the tiny Llama, seeded weights)")
    bench.add_argument("--connector", action="append", metavar="NAME|MODULE:CLASS", default=[],
                       help="--engine vllm-scheduler: also this connector's rows (repeatable; e.g. simple-cpu, "
                            "example, stock+example, MODULE:CLASS); exit 1 when one crashed or could not start")
    bench.add_argument("--workload", action=Once, choices=MODEL_WORKLOADS, metavar="NAME",
                       help="--engine vllm: this workload's -small version only (one of "
                            f"{', '.join(MODEL_WORKLOADS)}; default all three)")
    add_step_timeout(bench)  # foreign code is bounded: a hang is that row's verdict, not the bench's end
    bench.set_defaults(handler=_cmd_bench)


def summary_name(small: bool) -> str:
    """The small bench keeps its own summary: it must never replace the full-size one."""
    return "bench-summary-small.json" if small else "bench-summary.json"


def _cmd_bench(args: argparse.Namespace) -> int:
    out_dir = check_output_dir("--out-dir", args.out_dir or default_out_dir(args.engine))
    three_way = args.engine != SIMULATOR
    suffix = "-small" if args.small or three_way else ""
    if args.model is not None and args.engine != VLLM:
        raise UsageError("--model needs --engine vllm")
    if args.workload is not None and args.engine != VLLM:
        raise UsageError("--workload needs --engine vllm")
    if args.connector and args.engine != VLLM_SCHEDULER:
        raise UsageError("--connector needs --engine vllm-scheduler")
    extra = [ConnectorChoice.build(source=source) for source in args.connector]  # bad names: one line
    names = (args.workload,) if args.workload is not None else MODEL_WORKLOADS if args.engine == VLLM else BENCH_WORKLOADS
    workloads = [load_workload(name + suffix) for name in names]
    if args.engine == VLLM:
        from kvoffload.cli.bench_model import cmd_model_bench

        return cmd_model_bench(args, workloads, out_dir)
    if three_way:  # the simulator's row, then vLLM's scheduler with vLLM's connector and ours
        choices = [(SIMULATOR, ConnectorChoice.build()), (args.engine, ConnectorChoice.build(source="stock")),
                   (args.engine, ConnectorChoice.build()), *((args.engine, choice) for choice in extra)]
    else:
        choices = [(SIMULATOR, ConnectorChoice.build(preset, disabled)) for preset, disabled in BENCH_CONNECTORS]
    plan = [(workload, engine, choice, (engine_folder(out_dir, engine) if three_way else out_dir)
             / f"bench-{slug(workload.name)}-{slug(choice.label)}{'' if engine == SIMULATOR else '-' + engine}.json")
            for workload in workloads for engine, choice in choices]
    summary = out_dir / ("bench-summary-vllm.json" if three_way else summary_name(args.small))
    for _, _, _, path in plan:
        check_output_file("--out-dir", path, create_parents=True, kind=RUN_SCHEMA)
    check_output_file("--out-dir", summary, create_parents=True, kind=SUMMARY_SCHEMA)
    rows, findings = [], {}
    started = time.perf_counter()
    refused, refusals, refused_at = [], [], []
    for index, (workload, engine, choice, path) in enumerate(plan):
        # release rules that cannot replay the model (Fixes.model_refusal; no bundled model today)
        reason = choice.fixes.model_refusal(workload.engine.kv_model)
        if reason is not None:  # a preset of a release that cannot run the model: a row, refused
            refusals.append({"workload": workload.name, "connector": choice.label, "reason": reason})
            refused.append(f"{workload.name} [{choice.label}] refused: {reason}")
            refused_at.append(len(rows))  # its place among the runs, for the table
            continue
        try:
            outcome = replay(workload, choice, quiet=args.quiet, position=f"({index + 1}/{len(plan)}) ", engine=engine,
                             step_bound_s=args.step_timeout)
        except ConfigError as error:
            if choice not in extra:
                raise
            refused.append(f"{workload.name} [{choice.label}] not run: {error}")  # a setting it cannot honour
            continue
        write_atomic(path, outcome.result)
        label = choice.label if not three_way else f"{'sim' if engine == SIMULATOR else 'vllm'} {choice.label}"
        rows.append((workload.name, label, outcome.result["metrics"], outcome.failed))
        findings[(workload.name, label)] = (choice, outcome)
    elapsed = time.perf_counter() - started
    write_atomic(summary, {
        "schema": SUMMARY_SCHEMA, "seconds": round(elapsed, 1),
        "rows": [{"workload": w, "connector": c, "metrics": m, "failed": f} for w, c, m, f in rows],
        "refused": refusals})
    print(_bench_table(rows, zip(refused_at, refusals)))
    lines = refused + bench_findings(findings)
    if lines:
        print("\n" + "\n".join(lines))
    if three_way:
        print("\n" + stock_ratio_lines(rows))
    print(f"\n{len(rows)} runs in {elapsed:.0f} s; results in {out_dir}/ (summary {summary.name})")
    if three_way:
        print(report_hint(out_dir, args.engine))
    return int(any(outcome.failed for choice, outcome in findings.values() if choice in extra))


def bench_findings(findings: dict) -> list[str]:
    """The findings of each row (cli/findings.py) under the table; a connector that could not start
    is said once, not once per workload."""
    lines, not_started = [], set()
    for (workload, label), (_, outcome) in findings.items():
        error = outcome.result.get("error") or {}
        if error.get("could_not_start"):
            if label not in not_started:
                not_started.add(label)
                lines.append(f"{label}: {error['message']}")
            continue
        lines += [f"{workload} [{label}] {line}" for line in finding_lines(outcome.result)]
    return lines


def _bench_table(rows, refusals=()) -> str:
    """One line per run, in the plan's order; a refused row ((runs before it, its refusal)) in its
    place too, "refused" and no figures (the reasons are printed under the table)."""
    headers = ["workload", "connector"] + [SHORT_NAMES[name] for name in TABLE_METRICS]
    body = [[w, c] + [format_value(name, m.get(name)) for name in TABLE_METRICS] for w, c, m, _ in rows]
    for inserted, (at, refusal) in enumerate(refusals):
        body.insert(at + inserted, [refusal["workload"], refusal["connector"], "refused"]
                    + [""] * (len(TABLE_METRICS) - 1))
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
    legend = ("last-chunk: last_chunk_offloaded_rate  last-blk: last_block_hit_rate  offload/gpu: hit rates  "
              "poison: poisoned_loads\nsubmit50/visib99: store delays (steps)  tok/s(mod): tokens_per_s_modeled")
    return "\n".join(lines + ["", legend])


def stock_ratio_lines(rows) -> str:
    """connector_us_per_step of the reference over vLLM's stock connector, per workload, both
    measured on vLLM's scheduler in this run (below 1: the reference is cheaper)."""
    per_step = {(w, c): m.get("connector_us_per_step") for w, c, m, _ in rows}
    lines = ["connector_us_per_step on vLLM's scheduler, reference / stock (same run):"]
    for workload in dict.fromkeys(w for w, _, _, _ in rows):
        ours, stock = per_step.get((workload, "vllm reference")), per_step.get((workload, "vllm vllm-stock"))
        ratio = f"{ours / stock:.2f}x" if ours and stock else "-"
        lines.append(f"  {workload:<22} {format_value('connector_us_per_step', ours):>8} / "
                     f"{format_value('connector_us_per_step', stock):>8} us = {ratio}")
    return "\n".join(lines)
