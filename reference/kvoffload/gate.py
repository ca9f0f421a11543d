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

Exit codes: 0 pass, 1 a deterministic metric moved (or a measured one with --strict),
2 bad input (no baseline, unreadable baseline, unknown ref).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from kvoffload.core.fixes import PRESETS
from kvoffload.metrics import GLOSSARY, MEASURED_METRICS as MEASURED
from kvoffload.results import ResultError, write_atomic
from kvoffload.choice import ConnectorChoice
from kvoffload.runner import replay_workload
from kvoffload.workloads import load_workload

SCHEMA = "kvoffload-bench/gate-baseline/v1"
BASELINE = Path("results/gate/baseline.json")
WORKLOADS = ("shared-prefix-small", "multi-turn-small", "spec-decode-small")
CONNECTORS: tuple[str | None, ...] = (None, *PRESETS)  # the reference, then every preset

DETERMINISTIC = tuple(name for name, _, _ in GLOSSARY if name not in MEASURED)
# Measured metrics, higher-is-better ones flagged: a regression is a drop for them.
MEASURED_HIGHER_IS_BETTER = frozenset(name for name, direction, _ in GLOSSARY
                                      if name in MEASURED and direction == "higher")
REL_TOLERANCE, ABS_TOLERANCE = 1e-9, 1e-12  # deterministic: float noise only
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


def machine_name(explicit: str | None = None) -> str:
    """The machine the measured numbers belong to: --machine, $KVOFFLOAD_MACHINE, or the host name."""
    return explicit or os.environ.get("KVOFFLOAD_MACHINE") or platform.node() or "unknown"


def collect(repeats: int = 1) -> dict:
    """Replay every gate run ``repeats`` times: {"deterministic": {key: v}, "measured": {key: [v...]}}.

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
            for repeat in range(repeats):
                metrics = replay_workload(workload, choice).result["metrics"]
                for metric in DETERMINISTIC:
                    key, value = f"{run}/{metric}", _number(metrics.get(metric))
                    if repeat == 0:
                        deterministic[key] = value
                    elif not _same(deterministic[key], value):
                        raise RuntimeError(f"{key}: {deterministic[key]} then {value}: the replay is not deterministic")
                for metric in sorted(MEASURED):
                    value = _number(metrics.get(metric))
                    if value is not None:
                        measured.setdefault(f"{run}/{metric}", []).append(value)
    return {"deterministic": deterministic, "measured": measured}


def baseline_document(collected: dict, machine: str, commit: str | None) -> dict:
    """The baseline file's content: sorted, one number per line once dumped (a reviewable diff)."""
    return {
        "schema": SCHEMA,
        "commit": commit,
        "machine": machine,
        "workloads": list(WORKLOADS),
        "connectors": [ConnectorChoice.build(p).label for p in CONNECTORS],
        "deterministic": dict(sorted(collected["deterministic"].items())),
        "measured": {key: {"median": statistics.median(values), "min": min(values), "max": max(values),
                           "repeats": len(values)}
                     for key, values in sorted(collected["measured"].items())},
    }


def write_baseline(path: Path, document: dict) -> None:
    write_atomic(path, document)


def read_baseline(spec: str | None, root: Path) -> tuple[dict, str]:
    """The baseline named by ``spec``: a file, or a git ref whose committed baseline is read.

    Returns (document, where it came from). Raises ResultError (exit 2) when there is none.
    """
    path = Path(spec) if spec else root / BASELINE
    if os.path.lexists(path) and not path.is_file():  # a FIFO would block the read forever
        kind = "a directory" if path.is_dir() else "a FIFO" if path.is_fifo() else "not a regular file"
        raise ResultError(f"{'--baseline ' if spec else ''}{path}: {kind}; expected a gate baseline file"
                          f"{' or a git ref' if spec else ''}")
    if spec is None or path.is_file():
        try:
            text, origin = path.read_text(), str(path)
        except FileNotFoundError:
            raise ResultError(f"{path}: no gate baseline (write one with: kvoffload gate --update)") from None
        except OSError as error:
            raise ResultError(f"{path}: cannot read ({error.strerror})") from None
        except UnicodeDecodeError as error:
            raise ResultError(f"{path}: expected UTF-8 JSON text (a gate baseline), got undecodable bytes at "
                              f"byte {error.start}") from None
    else:
        shown = subprocess.run(["git", "-C", str(root), "show", f"{spec}:{BASELINE.as_posix()}"],
                               capture_output=True, text=True)
        if shown.returncode != 0:
            raise ResultError(f"--baseline {spec}: neither a file nor a git ref with {BASELINE}")
        text, origin = shown.stdout, f"{spec}:{BASELINE}"
    try:
        document = json.loads(text)
    except ValueError as error:
        raise ResultError(f"{origin}: not JSON ({error})") from None
    except RecursionError:
        raise ResultError(f"{origin}: not a gate baseline (JSON nested too deeply)") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ResultError(f"{origin}: not a gate baseline (schema {SCHEMA!r} expected)")
    return document, origin


def compare(baseline: dict, collected: dict, machine: str) -> list[Row]:
    """Every compared number, deterministic ones first, each kind in key order (rules: module docstring)."""
    rows: list[Row] = []
    before, now = baseline["deterministic"], collected["deterministic"]
    for key in sorted(set(before) | set(now)):
        run, metric = key.rsplit("/", 1)
        if key not in now:
            rows.append(Row(run, metric, before[key], None, "missing"))
        elif key not in before:
            rows.append(Row(run, metric, None, now[key], "new"))
        elif not _same(before[key], now[key]):
            rows.append(Row(run, metric, before[key], now[key], "moved"))
    same_machine = baseline.get("machine") == machine
    for key, values in sorted(collected["measured"].items()):
        run, metric = key.rsplit("/", 1)
        value = statistics.median(values)
        entry = baseline["measured"].get(key)
        if entry is None or not same_machine:
            rows.append(Row(run, metric, entry and entry["median"], value, "not compared"))
            continue
        factor = allowed_factor(entry)
        worse = value < entry["median"] / factor if metric in MEASURED_HIGHER_IS_BETTER else value > entry["median"] * factor
        rows.append(Row(run, metric, entry["median"], value, "slower" if worse else "ok", f"x{factor:.2f}"))
    return rows


def allowed_factor(entry: dict) -> float:
    """How far a measured number may move before it counts: the floor, or twice the baseline's own
    max/min spread across its repeats (a noisy number gets more room), whichever is larger."""
    low, high = entry["min"], entry["max"]
    spread = high / low if low > 0 else math.inf
    return max(MEASURED_FLOOR_FACTOR, spread ** 2)


def failures(rows: Iterable[Row], strict: bool) -> list[Row]:
    bad = {"moved", "new", "missing"} | ({"slower"} if strict else set())
    return [row for row in rows if row.verdict in bad]


def format_table(rows: Iterable[Row]) -> str:
    rows = list(rows)
    if not rows:
        return "(nothing to show)"
    table = [("run", "metric", "baseline", "now", "change", "verdict")]
    for row in rows:
        table.append((row.run, row.metric, _show(row.baseline), _show(row.now), _change(row.baseline, row.now),
                      row.verdict + (f" (allowed {row.allowed})" if row.allowed else "")))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(widths[i]) if i < 2 or i == 5 else cell.rjust(widths[i])
                       for i, cell in enumerate(line)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=ABS_TOLERANCE)


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


def git_commit(root: Path) -> str | None:
    """HEAD of ``root``, with ``-dirty`` when tracked files differ from it (baseline provenance)."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def run_gate(*, baseline: str | None, update: bool, strict: bool, machine: str | None, repeats: int,
             root: Path = Path("."), echo: Callable[[str], None] = print) -> int:
    """``kvoffload gate``: compare (or, with ``update``, rewrite) the baseline; return the exit code."""
    if repeats < 1:
        raise ResultError(f"--repeats must be at least 1, got {repeats}")
    machine = machine_name(machine)
    if not update:
        document, origin = read_baseline(baseline, root)  # bad input fails before any replay
    collected = collect(repeats)
    if update:
        path = Path(baseline) if baseline else root / BASELINE
        write_baseline(path, baseline_document(collected, machine, git_commit(root)))
        echo(f"gate baseline written: {path} ({len(collected['deterministic'])} deterministic numbers, "
             f"measured on {machine}); review it with: git diff {path}")
        return 0
    rows = compare(document, collected, machine)
    bad = failures(rows, strict)
    moved = [row for row in rows if row.verdict in ("moved", "new", "missing")]
    measured = [row for row in rows if row.verdict in ("ok", "slower", "not compared")]
    echo(f"baseline: {origin} (commit {document.get('commit')}, machine {document.get('machine')}); "
         f"this machine: {machine}")
    echo(f"deterministic: {len(collected['deterministic'])} numbers over {len(WORKLOADS)} workloads x "
         f"{len(CONNECTORS)} connectors; {len(moved)} moved")
    if moved:
        echo(format_table(moved))
    compared = [row for row in measured if row.verdict != "not compared"]
    echo("")
    if compared:
        slower = [row for row in compared if row.verdict == "slower"]
        echo(f"measured (same machine, fails only with --strict): {len(slower)} of {len(compared)} beyond "
             "their allowed factor")
        echo(format_table(slower or compared))
    else:
        echo(f"measured: not compared (baseline from machine {document.get('machine')!r}, this is {machine!r})")
    if bad:
        echo(f"\nkvoffload gate: FAIL ({len(bad)} numbers). If the change is intended, regenerate the "
             "baseline with `kvoffload gate --update` and commit results/gate/baseline.json with the change.")
        return 1
    echo("\nkvoffload gate: pass")
    return 0
