"""``kvoffload bench --engine vllm``: the -small workloads on a real model, measured.

Per workload, one run each on vLLM's real engine: ``off`` (no connector, no prefix caching: the
output oracle's second run), vLLM's ``stock`` OffloadingConnector, the ``reference``, and the
reference with ``final_token_watermark`` off (a connector known to be wrong: the oracle must
catch it where outputs end on chunk boundaries and chunks are offloaded past the prompt). The
simulator's modelled figure for the same workload stands beside them. Every connector run is
checked against the ``off`` run's outputs (``kvoffload.vllm.outputs``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvoffload.choice import ConnectorChoice
from kvoffload.cli.bench import SUMMARY_SCHEMA
from kvoffload.cli.bench_folders import engine_folder, report_hint
from kvoffload.cli.outputs import check_output_file
from kvoffload.cli.run import engine_options, oracle_line, replay, slug
from kvoffload.engines import SIMULATOR, VLLM
from kvoffload.metrics import format_value
from kvoffload.results import SCHEMA as RUN_SCHEMA, write_atomic

BROKEN_FIX = "final_token_watermark"
WARM_UP_STEPS = 60
MODEL_CONNECTORS = (("off", ()), ("stock", ()), ("reference", ()), ("reference", (BROKEN_FIX,)))
COLUMNS = (("output_tokens_per_s", "out tok/s"), ("total_tokens_per_s", "tot tok/s"), ("ttft_ms_p50", "ttft50"),
           ("ttft_ms_p99", "ttft99"), ("tpot_ms_p50", "tpot50"), ("tpot_ms_p99", "tpot99"),
           ("prefill_tokens_computed", "prefill"), ("prefill_tokens_saved", "saved"),
           ("offload_hit_rate", "offload"), ("gpu_hit_rate", "gpu"), ("store_submit_delay_steps_p50", "sub50"),
           ("store_submit_delay_steps_p99", "sub99"), ("output_mismatches", "mismatch"),
           ("wall_seconds", "wall s"), ("engine_start_seconds", "start s"), ("tokens_per_s_modeled", "tok/s(mod)"))


def run_model_bench(workloads, out_dir: Path, quiet: bool, model: Path | None, step_bound_s: float | None,
                    *, on_step=None) -> tuple[list, dict]:
    """Every workload through the simulator and the four real-model runs; rows and oracles.
    ``cmd_model_bench`` runs it whole under the pinned hash seed (``kvoffload.vllm.pinned``), so
    every run shares one warmed process (``on_step``: that call's signature, unused)."""
    plan = []
    for workload in workloads:
        plan.append((workload, SIMULATOR, ConnectorChoice.build()))
        for source, disabled in MODEL_CONNECTORS:
            plan.append((workload, VLLM, ConnectorChoice.build(disabled=disabled, source=source)))
    paths = [engine_folder(out_dir, e) / f"bench-{slug(w.name)}-{slug(c.label)}-{e}.json" for w, e, c in plan]
    for path in paths:
        check_output_file("--out-dir", path, create_parents=True, kind=RUN_SCHEMA)
    baselines: dict = {}  # the off run's outcomes, per workload, for the connector runs' oracle
    options = {**engine_options(VLLM, model, True), "baselines": baselines}
    # The first engine of a process pays one-time costs in its replay (kernel primitives built
    # for each new batch shape, allocator growth): measured on 2 loaded cores, shared-prefix-small
    # with offload off ran 42 s first and about 4x faster later. A short replay, discarded, warms
    # the process so that the first row measured is not the one that pays.
    replay(workloads[0], ConnectorChoice.build(source="off"), quiet=True, engine=VLLM, max_steps=WARM_UP_STEPS,
           engine_options={**engine_options(VLLM, model, False)})
    rows, oracles = [], {}
    for index, ((workload, engine, choice), path) in enumerate(zip(plan, paths)):
        outcome = replay(workload, choice, quiet=quiet, position=f"({index + 1}/{len(plan)}) ", engine=engine,
                         engine_options=options if engine == VLLM else None, step_bound_s=step_bound_s)
        write_atomic(path, outcome.result)
        label = f"sim {choice.label}" if engine == SIMULATOR else choice.label
        rows.append((workload.name, label, outcome.result["metrics"], outcome.failed))
        if "oracle" in outcome.result:
            oracles[(workload.name, label)] = outcome.result["oracle"]
    return rows, oracles


def model_bench_table(rows, oracles: dict) -> str:
    headers = ["workload", "connector"] + [short for _, short in COLUMNS]
    body = []
    for workload, label, metrics, failed in rows:
        cells = [format_value(name, metrics.get(name)) for name, _ in COLUMNS]
        oracle = oracles.get((workload, label))
        if oracle is not None:  # "identical of compared" says more than a mismatch count alone
            cells[[n for n, _ in COLUMNS].index("output_mismatches")] = f"{oracle['identical']}/{oracle['compared']}"
        body.append([workload, label + (" FAILED" if failed else "")] + cells)
    widths = [max(len(str(row[i])) for row in [headers] + body) for i in range(len(headers))]
    lines = ["  ".join(h.ljust(widths[i]) if i < 2 else h.rjust(widths[i]) for i, h in enumerate(headers)),
             "  ".join("-" * w for w in widths)]
    previous = None
    for row in body:
        if previous is not None and row[0] != previous:
            lines.append("")
        previous = row[0]
        lines.append("  ".join(str(v).ljust(widths[i]) if i < 2 else str(v).rjust(widths[i]) for i, v in enumerate(row)))
    legend = ("ttft/tpot: ms, p50/p99 (measured); prefill/saved: prompt tokens computed / loaded by the connector; "
              "sub50/sub99: store submission delay in engine steps, p50/p99 (what vLLM's scheduler and the "
              "connector's transfer handler report); "
              "mismatch: requests identical to the offload-off run / compared (output oracle); "
              "tok/s(mod): the simulator's modelled figure")
    return "\n".join(lines + ["", legend])


def ratio_lines(rows) -> str:
    """Measured output tok/s, TTFT p50 and TPOT p50 of each connector over offload off, same run."""
    metrics = {(w, c): m for w, c, m, _ in rows}
    lines = ["measured, over offload off (same run): output tok/s, TTFT p50, TPOT p50"]
    for workload in dict.fromkeys(w for w, _, _, _ in rows):
        off = metrics.get((workload, "off"), {})
        for label in ("vllm-stock", "reference"):
            ours = metrics.get((workload, label), {})
            cells = []
            for name in ("output_tokens_per_s", "ttft_ms_p50", "tpot_ms_p50"):
                a, b = ours.get(name), off.get(name)
                cells.append(f"{a / b:.2f}x" if a and b else "-")
            lines.append(f"  {workload:<22} {label:<11} " + "  ".join(cells))
    return "\n".join(lines)


def cmd_model_bench(args: argparse.Namespace, workloads, out_dir: Path) -> int:
    summary = out_dir / "bench-summary-engine-vllm.json"
    check_output_file("--out-dir", summary, create_parents=True, kind=SUMMARY_SCHEMA)
    started = time.perf_counter()
    from kvoffload.vllm.pinned import call_pinned  # no vLLM import: the child imports it

    rows, oracles = call_pinned(run_model_bench, workloads, out_dir, args.quiet, args.model, args.step_timeout,
                                bound_s=args.step_timeout)
    elapsed = time.perf_counter() - started
    write_atomic(summary, {"schema": SUMMARY_SCHEMA, "seconds": round(elapsed, 1),
                           "rows": [{"workload": w, "connector": c, "metrics": m, "failed": f,
                                     "oracle": oracles.get((w, c))} for w, c, m, f in rows]})
    print(model_bench_table(rows, oracles))
    print("\n" + ratio_lines(rows))
    for (workload, label), oracle in oracles.items():
        print(f"\n{workload} [{label}] {oracle_line(oracle)}")
    print(f"\n{len(rows)} runs in {elapsed:.0f} s; results in {out_dir}/ (summary {summary.name})")
    print(report_hint(out_dir, VLLM))
    wrong = [key for key, oracle in oracles.items() if oracle["mismatches"] and BROKEN_FIX not in key[1]]
    for workload, label in wrong:
        print(f"kvoffload: {workload} [{label}]: outputs differ from the offload-off run", file=sys.stderr)
    return 1 if wrong or any(failed for *_, failed in rows) else 0
