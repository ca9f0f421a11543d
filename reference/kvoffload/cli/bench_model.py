"""``kvoffload bench --engine vllm``: the -small workloads on a real model, measured with spread.

Per workload, on vLLM's real engine: ``off`` (no connector, no prefix caching: the output oracle's
second run), vLLM's ``stock`` OffloadingConnector, the ``reference``, and the reference with
``final_token_watermark`` off (a connector known to be wrong: the oracle must catch it where
outputs end on chunk boundaries and chunks are offloaded past the prompt). Each runs ``ROUNDS``
times, interleaved (round 1: every connector once, then round 2, ...), so a burst of load from
another process lands on one round of every connector rather than on every run of one: two
identical runs on a shared 2-core machine differed 2-6x, one sample per row said nothing. The
simulator's modelled figure for the same workload stands beside them (deterministic: once).

The table marks each measured column (the glossary's ``MEASURED_METRICS``: times, throughputs,
the real model's counts) with ``*`` and shows its median and min-max over the rounds; the other
columns are deterministic and shown once (``varies`` if a round disagreed). The ratios against
offload off are taken within each round (runs side by side) and shown as median and range. Every
connector run is checked against the ``off`` run's outputs (``kvoffload.vllm.outputs``); each
result file is round 1's run with every round's metrics under ``rounds``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from kvoffload.choice import ConnectorChoice
from kvoffload.cli.bench_folders import SUMMARY_SCHEMA, engine_folder, report_hint
from kvoffload.cli.outputs import check_output_file
from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S
from kvoffload.cli.run import engine_options, oracle_line, replay, slug
from kvoffload.engines import SIMULATOR, VLLM
from kvoffload.metrics import MEASURED_METRICS, format_value, same_value
from kvoffload.results import SCHEMA as RUN_SCHEMA, write_atomic

BROKEN_FIX = "final_token_watermark"
WARM_UP_STEPS = 60
ROUNDS = 3
MODEL_CONNECTORS = (("off", ()), ("stock", ()), ("reference", ()), ("reference", (BROKEN_FIX,)))
COLUMNS = (("output_tokens_per_s", "out tok/s"), ("total_tokens_per_s", "tot tok/s"), ("ttft_ms_p50", "ttft50"),
           ("ttft_ms_p99", "ttft99"), ("tpot_ms_p50", "tpot50"), ("tpot_ms_p99", "tpot99"),
           ("prefill_tokens_computed", "prefill"), ("prefill_tokens_saved", "saved"),
           ("offload_hit_rate", "offload"), ("gpu_hit_rate", "gpu"), ("store_submit_delay_steps_p50", "sub50"),
           ("store_submit_delay_steps_p99", "sub99"), ("output_mismatches", "mismatch"),
           ("wall_seconds", "wall s"), ("engine_start_seconds", "start s"), ("tokens_per_s_modeled", "tok/s(mod)"))
RATIOS = ("output_tokens_per_s", "ttft_ms_p50", "tpot_ms_p50")


def run_model_bench(workloads, out_dir: Path, quiet: bool, model: Path | None,
                    step_bound_s: float | None = DEFAULT_STEP_BOUND_S, *, on_step=None,
                    rounds: int = ROUNDS) -> tuple[list, dict]:
    """Every workload through the simulator once and the four real-model runs ``rounds`` times,
    interleaved; rows ``(workload, label, [metrics of each round], failed)`` and the oracles
    ``{(workload, label): [oracle of each round]}``. ``cmd_model_bench`` runs it whole under the
    pinned hash seed (``kvoffload.vllm.pinned``), so every run shares one warmed process
    (``on_step``: that call's signature, unused)."""
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
    found: dict[int, list] = {index: [] for index in range(len(plan))}  # plan index: outcomes, a round each
    order = [(r, i) for r in range(rounds) for i, (_, engine, _) in enumerate(plan) if engine == VLLM or r == 0]
    for count, (round_index, index) in enumerate(order, 1):
        workload, engine, choice = plan[index]
        outcome = replay(workload, choice, quiet=quiet, position=f"({count}/{len(order)}) ", engine=engine,
                         engine_options=options if engine == VLLM else None, step_bound_s=step_bound_s)
        found[index].append(outcome)
        if round_index == 0 or engine == VLLM:  # round 1's run, every round's metrics so far
            write_atomic(paths[index], {**found[index][0].result,
                                        "rounds": [o.result["metrics"] for o in found[index]]})
    rows, oracles = [], {}
    for index, (workload, engine, choice) in enumerate(plan):
        label = f"sim {choice.label}" if engine == SIMULATOR else choice.label
        outcomes = found[index]
        rows.append((workload.name, label, [o.result["metrics"] for o in outcomes], any(o.failed for o in outcomes)))
        if any("oracle" in o.result for o in outcomes):
            oracles[(workload.name, label)] = [o.result["oracle"] for o in outcomes if "oracle" in o.result]
    return rows, oracles


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def spread_cell(name: str, rounds: list[dict]) -> str:
    """A measured metric as median (min-max) over the rounds; one value when they agree or one ran."""
    values = [m.get(name) for m in rounds if _number(m.get(name)) is not None]  # as recorded: ints stay ints
    if not values:
        return format_value(name, None)
    middle, low, high = statistics.median(values), min(values), max(values)
    if low == high:
        return format_value(name, middle)
    return f"{format_value(name, middle)} ({format_value(name, low)}-{format_value(name, high)})"


def fixed_cell(name: str, rounds: list[dict]) -> str:
    """A deterministic metric: its one value; ``varies (min-max)`` where a round disagreed (on the real
    engine an async transfer may complete a step earlier or later: the table says so, not hides it)."""
    values = [_number(m.get(name)) for m in rounds]
    if any(not same_value(values[0], v) for v in values[1:]):
        known = [m.get(name) for m, v in zip(rounds, values) if v is not None]
        return f"varies ({format_value(name, min(known))}-{format_value(name, max(known))})" if known else "varies"
    return format_value(name, rounds[0].get(name))


def model_bench_table(rows, oracles: dict) -> str:
    headers = ["workload", "connector"] + [short + ("*" if name in MEASURED_METRICS else "") for name, short in COLUMNS]
    body = []
    for workload, label, rounds, failed in rows:
        cells = [spread_cell(name, rounds) if name in MEASURED_METRICS else fixed_cell(name, rounds)
                 for name, _ in COLUMNS]
        checked = oracles.get((workload, label))
        if checked:  # "identical of compared" says more than a mismatch count alone: the worst round's
            worst = min(checked, key=lambda oracle: oracle["identical"])
            cells[[n for n, _ in COLUMNS].index("output_mismatches")] = f"{worst['identical']}/{worst['compared']}"
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
    runs = max((len(rounds) for _, label, rounds, _ in rows if not label.startswith("sim ")), default=1)
    legend = (f"* measured: median (min-max) of {runs} interleaved runs per connector (one value where they agree); "
              "the other columns are deterministic, shown once ('varies' if a run disagreed). "
              "ttft/tpot: ms, p50/p99; prefill/saved: prompt tokens computed / loaded by the connector; "
              "sub50/sub99: store submission delay in engine steps, p50/p99 (what vLLM's scheduler and the "
              "connector's transfer handler report); "
              "mismatch: requests identical to the offload-off run / compared (output oracle, worst run); "
              "tok/s(mod): the simulator's modelled figure")
    return "\n".join(lines + ["", legend])


def ratio_lines(rows) -> str:
    """Measured output tok/s, TTFT p50 and TPOT p50 of each connector over offload off, each taken
    within one round (the runs side by side), shown as median (min-max) over the rounds."""
    metrics = {(w, c): rounds for w, c, rounds, _ in rows}
    lines = ["measured, over offload off within each interleaved round: median (min-max) of the rounds' ratios: "
             "output tok/s, TTFT p50, TPOT p50"]
    for workload in dict.fromkeys(w for w, _, _, _ in rows):
        off = metrics.get((workload, "off"), [])
        for label in ("vllm-stock", "reference"):
            ours = metrics.get((workload, label), [])
            cells = []
            for name in RATIOS:
                ratios = [a / b for m, o in zip(ours, off)
                          if (a := _number(m.get(name))) and (b := _number(o.get(name)))]
                if not ratios:
                    cells.append("-")
                elif len(ratios) == 1 or min(ratios) == max(ratios):
                    cells.append(f"{statistics.median(ratios):.2f}x")
                else:
                    cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
            lines.append(f"  {workload:<22} {label:<11} " + "  ".join(cells))
    return "\n".join(lines)


def cmd_model_bench(args: argparse.Namespace, workloads, out_dir: Path) -> int:
    summary = out_dir / "bench-summary-engine-vllm.json"
    check_output_file("--out-dir", summary, create_parents=True, kind=SUMMARY_SCHEMA)
    started = time.perf_counter()
    from kvoffload.vllm.pinned import call_pinned  # no vLLM import: the child imports it

    bound = getattr(args, "step_timeout", DEFAULT_STEP_BOUND_S)  # bench --step-timeout
    rows, oracles = call_pinned(run_model_bench, workloads, out_dir, args.quiet, args.model, bound, bound_s=bound)
    elapsed = time.perf_counter() - started
    write_atomic(summary, {"schema": SUMMARY_SCHEMA, "seconds": round(elapsed, 1), "rounds": ROUNDS,
                           "rows": [{"workload": w, "connector": c, "metrics": rounds[0], "rounds": rounds,
                                     "failed": f, "oracle": oracles.get((w, c))} for w, c, rounds, f in rows]})
    print(model_bench_table(rows, oracles))
    print("\n" + ratio_lines(rows))
    for (workload, label), checked in oracles.items():  # the worst run's verdict
        print(f"\n{workload} [{label}] {oracle_line(min(checked, key=lambda oracle: oracle['identical']))}")
    runs = sum(len(rounds) for _, _, rounds, _ in rows)
    print(f"\n{runs} runs ({ROUNDS} of each real-model connector, interleaved) in {elapsed:.0f} s; results in "
          f"{out_dir}/ (summary {summary.name})")
    print(report_hint(out_dir, VLLM))
    wrong = [key for key, checked in oracles.items()
             if any(oracle["mismatches"] for oracle in checked) and BROKEN_FIX not in key[1]]
    for workload, label in wrong:
        print(f"kvoffload: {workload} [{label}]: outputs differ from the offload-off run", file=sys.stderr)
    return 1 if wrong or any(failed for *_, failed in rows) else 0
