"""The regression gate: this tree's metrics against a committed baseline (``kvoffload gate``).

The gate replays the bundled -small workloads through the reference and every vLLM preset and
compares each run's metrics with ``results/gate/baseline.json``:

- deterministic metrics (every glossary metric outside ``metrics.MEASURED_METRICS``: hit rates, counts,
  delays in steps, modelled tokens/s) must match within a tight tolerance, in either direction.
  A change is either a regression or an intended change; both fail until the baseline is
  regenerated on purpose (``kvoffload gate --update``), so the baseline's diff shows what moved.
- measured metrics (µs, s: connector_us_per_step, sim_requests_per_s, copy_gb_per_s) are compared
  only when the baseline was written on the same machine (``--machine``), against a factor that
  grows with the spread the baseline saw across its repeats; they fail the gate only with
  ``--strict``. On another machine they are listed, not compared.
- a number of either kind that only one side has (a metric added to or removed from the
  glossary) is "new" or "missing" and fails on any machine.
- the counted number (``gate_counts``: build_connector_meta's instructions under callgrind) is
  compared on the baseline's machine and count environment only, and fails 3 % above it.

Each row also says which way the number went (better, worse, info), read from the glossary's
direction (``metrics.judge``); the table is written as text, json, csv or markdown. A failure
prints, per moved run, the ``kvoffload run`` command that replays it, the fix flag whose ablation
signature the reference's moves match ("looks like `final_token_watermark` off",
``gate_signatures``), and the exact command that regenerates the baseline (its machine name and
repeats). ``--update`` refuses a baseline that would bless a must-be-0 number above 0 (or one that
got worse) unless given ``--override-reason``, recorded in the baseline (``gate_signatures``); the
baseline file itself is ``gate_baseline``'s.

Exit codes: 0 pass, 1 a deterministic metric moved, appeared or disappeared (or a measured one
with --strict), 2 bad input (no baseline, a malformed one, unknown ref): found before any replay.
"""

from __future__ import annotations

import math
import os
import platform
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from kvoffload import gate_counts
from kvoffload.core.fixes import PRESETS, ablation
from kvoffload.choice import ConnectorChoice
from kvoffload.gate_baseline import BASELINE, SCHEMA, number as _number, read_baseline, write_baseline
from kvoffload.gate_signatures import MUST_BE_ZERO, collect_signatures, looks_like, poisoned_cells, replay_command
from kvoffload.metrics import GLOSSARY, MEASURED_METRICS as MEASURED, judge, same_value
from kvoffload.results import ResultError, git_commit
from kvoffload.runner import replay_workload
from kvoffload.tables import render
from kvoffload.workloads import load_workload
from kvoffload.workloads.bundled import BUNDLED_WORKLOADS, small

WORKLOADS = tuple(small(name) for name in BUNDLED_WORKLOADS)  # kvoffload.workloads.bundled
CONNECTORS: tuple[str | None, ...] = (None, *PRESETS)  # the reference, then every preset

DETERMINISTIC = tuple(name for name, _, _ in GLOSSARY if name not in MEASURED)
# Measured metrics, higher-is-better ones flagged: a regression is a drop for them.
MEASURED_HIGHER_IS_BETTER = frozenset(name for name, direction, _ in GLOSSARY
                                      if name in MEASURED and direction == "higher")
MEASURED_FLOOR_FACTOR = 1.5  # a measured number may drift this much even when the baseline saw no spread


@dataclass(frozen=True)
class Row:
    """One compared number: ``workload/connector``, metric, baseline, now, and the verdict."""

    run: str
    metric: str
    baseline: float | None
    now: float | None
    verdict: str  # "moved", "new", "missing", "slower", "ok", "not compared"
    allowed: str = ""

    @property
    def direction(self) -> str:
        """better / worse / info / same, read from the glossary's direction (metrics.judge)."""
        return judge(self.metric, self.baseline, self.now)


def machine_name(explicit: str | None = None) -> str:
    """The machine the measured numbers belong to: --machine, $KVOFFLOAD_MACHINE, or the host name."""
    return explicit or os.environ.get("KVOFFLOAD_MACHINE") or platform.node() or "unknown"


def collect(repeats: int = 1) -> dict:
    """Replay every gate run ``repeats`` times: {"deterministic": {key: v}, "measured": {key: [v...]}};
    a run whose preset refuses the workload's model (:func:`refused_runs`) has no numbers.

    Keys are ``workload/connector/metric``. Deterministic values come from the first repeat; a
    later repeat that disagrees is a determinism bug and raises.
    """
    deterministic: dict[str, float | None] = {}
    measured: dict[str, list[float]] = {}
    for name in WORKLOADS:
        workload = load_workload(name)
        for preset in CONNECTORS:
            choice = ConnectorChoice.build(preset)
            run = f"{name}/{choice.label}"
            if choice.fixes.model_refusal(workload.engine.kv_model) is not None:
                continue
            for repeat in range(repeats):
                metrics = replay_workload(workload, choice).result["metrics"]
                for metric in DETERMINISTIC:
                    key, value = f"{run}/{metric}", _number(metrics.get(metric))
                    if repeat == 0:
                        deterministic[key] = value
                    elif not same_value(deterministic[key], value):
                        raise RuntimeError(f"{key}: {deterministic[key]} then {value}: the replay is not deterministic")
                for metric in sorted(MEASURED):
                    value = _number(metrics.get(metric))
                    if value is not None:
                        measured.setdefault(f"{run}/{metric}", []).append(value)
    return {"deterministic": deterministic, "measured": measured}


def refused_runs() -> dict[str, str]:
    """{``workload/connector``: why} for the gate runs a preset refuses, having no numbers on either
    side: its release's rules cannot replay the workload's model (``Fixes.check_model``; the
    presets of vLLM 0.25-0.28 on a Mamba group, docs/hybrid.md)."""
    refused = {}
    for name in WORKLOADS:
        model = load_workload(name).engine.kv_model
        for preset in CONNECTORS:
            choice = ConnectorChoice.build(preset)
            reason = choice.fixes.model_refusal(model)
            if reason is not None:
                refused[f"{name}/{choice.label}"] = reason
    return refused


def ablation_metrics(workload: str, flag: str) -> dict[str, float | None]:
    """The reference's deterministic metrics on gate workload ``workload`` with fix ``flag`` off, as
    the bench ablates it (``core.fixes.ablation``: after the fix that hides it, if any)."""
    metrics = replay_workload(load_workload(workload), ConnectorChoice.build(None, ablation(flag))).result["metrics"]
    return {metric: _number(metrics.get(metric)) for metric in DETERMINISTIC}


def baseline_document(collected: dict, machine: str, commit: str | None, repeats: int = 1,
                      signatures: dict | None = None, override: dict | None = None,
                      counted: dict | None = None) -> dict:
    """The baseline file's content: sorted, one number per line once dumped (a reviewable diff)."""
    document = {
        "schema": SCHEMA,
        "commit": commit,
        "machine": machine,
        "repeats": repeats,
        "workloads": list(WORKLOADS),
        "connectors": [ConnectorChoice.build(p).label for p in CONNECTORS],
        "deterministic": dict(sorted(collected["deterministic"].items())),
        "measured": {key: {"median": statistics.median(values), "min": min(values), "max": max(values),
                           "repeats": len(values)}
                     for key, values in sorted(collected["measured"].items())},
        "signatures": dict(sorted((signatures or {}).items())),
    }
    if counted:  # instructions under callgrind (gate_counts), with what else they depend on
        document["counted"] = dict(sorted(counted.items()))
        document["count_environment"] = gate_counts.environment()
    if override:
        document["override"] = override
    return document


def compare(baseline: dict, collected: dict, machine: str) -> list[Row]:
    """Every compared number, deterministic ones first, each kind in key order (rules: module docstring).
    A key (a run's metric) in only one of the two is "new" or "missing", whatever its kind: the set
    of what is measured changed, and that fails like a moved number."""
    rows: list[Row] = []
    before, now = baseline["deterministic"], collected["deterministic"]
    for key in sorted(set(before) | set(now)):
        run, metric = key.rsplit("/", 1)
        if key not in now:
            rows.append(Row(run, metric, before[key], None, "missing"))
        elif key not in before:
            rows.append(Row(run, metric, None, now[key], "new"))
        elif not same_value(before[key], now[key]):
            rows.append(Row(run, metric, before[key], now[key], "moved"))
    same_machine = baseline.get("machine") == machine
    base_measured, now_measured = baseline["measured"], collected["measured"]
    for key in sorted(set(base_measured) | set(now_measured)):
        run, metric = key.rsplit("/", 1)
        entry, values = base_measured.get(key), now_measured.get(key)
        value = statistics.median(values) if values else None
        if values is None or entry is None:
            rows.append(Row(run, metric, entry and entry["median"], value, "new" if entry is None else "missing"))
        elif not same_machine:
            rows.append(Row(run, metric, entry["median"], value, "not compared"))
        else:
            factor = allowed_factor(entry)
            worse = (value < entry["median"] / factor if metric in MEASURED_HIGHER_IS_BETTER
                     else value > entry["median"] * factor)
            rows.append(Row(run, metric, entry["median"], value, "slower" if worse else "ok", f"x{factor:.2f}"))
    return rows


def allowed_factor(entry: dict) -> float:
    """How far a measured number may move before it counts: the floor, or twice the baseline's own
    max/min spread across its repeats (a noisy number gets more room), whichever is larger."""
    low, high = entry["min"], entry["max"]
    spread = high / low if low > 0 else math.inf
    return max(MEASURED_FLOOR_FACTOR, spread ** 2)


def failures(rows: Iterable[Row], strict: bool) -> list[Row]:
    bad = {"moved", "new", "missing", "costlier"} | ({"slower"} if strict else set())
    return [row for row in rows if row.verdict in bad]


TABLE_HEADER = ("run", "metric", "baseline", "now", "change", "verdict", "direction")
# json, csv and markdown carry each row's replay command in a column; text lists them under the
# table, one line per run, so the table stays as wide as a terminal
REPLAY_HEADER = (*TABLE_HEADER, "replay")


def table_rows(rows: Iterable[Row], replay: bool = False) -> tuple[list[tuple], list[tuple]]:
    """The rows as values (json, csv) and as shown (text, markdown), in TABLE_HEADER's columns
    (REPLAY_HEADER's with ``replay``)."""
    values, shown = [], []
    for row in rows:
        change = row.now - row.baseline if row.now is not None and row.baseline is not None else None
        verdict = row.verdict + (f" (allowed {row.allowed})" if row.allowed else "")
        command = (replay_command(row.run),) if replay else ()
        values.append((row.run, row.metric, row.baseline, row.now, change, row.verdict, row.direction, *command))
        shown.append((row.run, row.metric, _show(row.baseline), _show(row.now), _change(row.baseline, row.now),
                      verdict, row.direction, *command))
    return values, shown


def format_table(rows: Iterable[Row], fmt: str = "text") -> str:
    values, shown = table_rows(rows)
    if not values and fmt in ("text", "markdown"):
        return "(nothing to show)"
    return render(fmt, TABLE_HEADER, values, shown, right=(2, 3, 4))


def update_command(document: dict, spec: str | None, root: Path) -> str:
    """The exact command that rewrites this baseline from this tree: its machine name and repeats,
    and its file when it is not the default one (a git ref's baseline is the default file)."""
    repeats = document.get("repeats") or max((entry.get("repeats", 1) for entry in document["measured"].values()),
                                             default=1)
    command = ["kvoffload", "gate", "--update", "--machine", document.get("machine") or machine_name(),
               "--repeats", str(repeats)]
    if spec is not None and Path(spec).is_file() and Path(spec).resolve() != (root / BASELINE).resolve():
        command += ["--baseline", spec]
    return shlex.join(command)


def _show(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.6g}"


def _change(before: float | None, now: float | None) -> str:
    if before is None or now is None:
        return "-"
    delta = now - before
    if before:
        return f"{delta:+.4g} ({delta / abs(before):+.1%})"
    return f"{delta:+.4g}"


def run_gate(*, baseline: str | None, update: bool, strict: bool, machine: str | None, repeats: int,
             root: Path = Path("."), echo: Callable[[str], None] = print, fmt: str = "text",
             override_reason: str | None = None) -> int:
    """``kvoffload gate``: compare (or, with ``update``, rewrite) the baseline; return the exit code.
    The command line has checked the paths (an --update target that is a FIFO or a folder)."""
    if repeats < 1:
        raise ResultError(f"--repeats must be at least 1, got {repeats}")
    machine = machine_name(machine)
    if update:
        return _update(Path(baseline) if baseline else root / BASELINE, machine, repeats, root, echo,
                       override_reason)
    document, origin = read_baseline(baseline, root)  # bad input fails before any replay
    collected = collect(repeats)
    rows = compare(document, collected, machine)
    counted = gate_counts.collect() if gate_counts.comparable(document, machine) else {}
    rows += [Row(*row) for row in gate_counts.verdicts(document, counted, machine)]
    bad = failures(rows, strict)
    command = update_command(document, baseline, root)
    matches = looks_like(document, collected["deterministic"], WORKLOADS)
    worse = [row for row in bad if row.metric in MUST_BE_ZERO and row.direction == "worse"]
    if worse:  # --update would refuse these: say so rather than offer it as the remedy
        status = (f"kvoffload gate: FAIL ({len(bad)} numbers; {len(worse)} must-be-0 numbers got worse: a "
                  f"regression, which `{command}` refuses to bless; fix the code, or give --override-reason "
                  "TEXT for a reviewed exception).")
    elif bad:
        status = (f"kvoffload gate: FAIL ({len(bad)} numbers). If the change is intended, regenerate the baseline "
                  f"with `{command}` and commit it with the change.")
    else:
        status = "kvoffload gate: pass"
    head = (f"baseline: {origin} (commit {document.get('commit')}, machine {document.get('machine')}); "
            f"this machine: {machine}")
    if document.get("override"):
        head += f"; the baseline blessed must-be-0 numbers on purpose: {document['override']['reason']}"
    hints = [match.sentence(WORKLOADS) for match in matches] if bad else []
    if fmt != "text":
        values, shown = table_rows(rows, replay=True)
        echo(render(fmt, REPLAY_HEADER, values, shown, right=(2, 3, 4), notes=[head, *hints, status],
                    meta={"baseline": origin, "baseline_commit": document.get("commit"),
                          "baseline_machine": document.get("machine"), "machine": machine,
                          "passed": not bad, "failures": len(bad), "update_command": command,
                          "looks_like": [{"flag": m.flag, "identical": m.identical} for m in matches]}))
        return 1 if bad else 0
    moved = [row for row in rows if row.verdict in ("moved", "new", "missing")]
    counted_rows = [row for row in rows if row.metric == gate_counts.COUNTED_METRIC]
    measured = [row for row in rows if row.verdict in ("ok", "slower", "not compared") and row not in counted_rows]
    echo(head)
    echo(f"deterministic: {len(collected['deterministic'])} numbers over {len(WORKLOADS)} workloads x "
         f"{len(CONNECTORS)} connectors; {len(moved)} moved, new or missing")
    for run, reason in refused_runs().items():
        echo(f"  {run}: refused, no numbers ({reason})")
    if moved:
        echo(format_table(moved))
        echo("\nreplay each moved run (kvoffload compare its result with the same run of the baseline's commit):")
        for run in dict.fromkeys(row.run for row in moved):
            cells = ", ".join(row.metric for row in moved if row.run == run)
            echo(f"  {run} ({cells}): {replay_command(run)}")
    for hint in hints:
        echo("\n" + hint)
    compared = [row for row in measured if row.verdict != "not compared"]
    echo("")
    if compared:
        slower = [row for row in compared if row.verdict == "slower"]
        echo(f"measured (same machine, fails only with --strict): {len(slower)} of {len(compared)} beyond "
             "their allowed factor")
        echo(format_table(slower or compared))
    else:
        echo(f"measured: not compared (baseline from machine {document.get('machine')!r}, this is {machine!r})")
    if counted_rows:
        costlier = [row for row in counted_rows if row.verdict == "costlier"]
        echo(f"\ncounted (instructions under callgrind, load-independent; fails beyond "
             f"+{gate_counts.COUNT_BOUND:.0%}): {len(costlier)} of {len(counted_rows)} costlier")
        echo(format_table(counted_rows))
    echo("\n" + status)
    return 1 if bad else 0


def _update(path: Path, machine: str, repeats: int, root: Path, echo: Callable[[str], None],
            override_reason: str | None) -> int:
    """``--update``: replay, compute the fix flags' signatures, and write the baseline unless it would
    bless must-be-0 numbers (``gate_signatures.poisoned_cells``): exit 1 then, nothing written, each
    number named, unless ``override_reason`` is given (recorded in the baseline with the numbers)."""
    try:  # the baseline being replaced, if it reads: a must-be-0 number may not get worse than there
        previous, _ = read_baseline(str(path), root) if path.is_file() else (None, None)
    except ResultError:
        previous = None
    collected = collect(repeats)
    signatures = collect_signatures(WORKLOADS, collected["deterministic"], ablation_metrics)
    cells = poisoned_cells(collected["deterministic"], signatures, previous)
    if cells and not override_reason:
        echo(f"kvoffload gate --update: refused; {len(cells)} must-be-0 numbers a baseline may not bless "
             f"(nothing written to {path}):")
        for cell in cells:
            echo(f"  {cell.line()}")
            echo(f"    replay: {replay_command(cell.key.rsplit('/', 1)[0])}")
        echo("Fix the code; for a reviewed exception, add --override-reason TEXT (recorded in the baseline).")
        return 1
    override = {"reason": override_reason, "cells": [cell.line() for cell in cells]} if cells else None
    counted = gate_counts.collect()
    write_baseline(path, baseline_document(collected, machine, git_commit(root), repeats, signatures, override,
                                           counted))
    echo(f"gate baseline written: {path} ({len(collected['deterministic'])} deterministic numbers, "
         f"measured on {machine}); review it with: git diff {path}")
    if cells:
        echo(f"  with {len(cells)} must-be-0 numbers blessed on purpose ({override_reason}): "
             + "; ".join(cell.line() for cell in cells))
    elif override_reason:
        echo("  --override-reason: nothing needed overriding; not recorded")
    return 0
