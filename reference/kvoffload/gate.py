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

Each row also says which way the number went (better, worse, info), read from the glossary's
direction (``metrics.judge``); the table is written as text, json, csv or markdown. A failure
prints the exact command that regenerates the baseline (its machine name and repeats).

Exit codes: 0 pass, 1 a deterministic metric moved, appeared or disappeared (or a measured one
with --strict), 2 bad input (no baseline, a malformed one, unknown ref): found before any replay.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from kvoffload.core.fixes import PRESETS
from kvoffload.choice import ConnectorChoice
from kvoffload.metrics import GLOSSARY, MEASURED_METRICS as MEASURED, judge, same_value
from kvoffload.results import ResultError, git_commit, write_atomic
from kvoffload.runner import replay_workload
from kvoffload.tables import render
from kvoffload.workloads import load_workload
from kvoffload.workloads.bundled import BUNDLED_WORKLOADS, small

SCHEMA = "kvoffload-bench/gate-baseline/v1"
BASELINE = Path("results/gate/baseline.json")
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
                    elif not same_value(deterministic[key], value):
                        raise RuntimeError(f"{key}: {deterministic[key]} then {value}: the replay is not deterministic")
                for metric in sorted(MEASURED):
                    value = _number(metrics.get(metric))
                    if value is not None:
                        measured.setdefault(f"{run}/{metric}", []).append(value)
    return {"deterministic": deterministic, "measured": measured}


def baseline_document(collected: dict, machine: str, commit: str | None, repeats: int = 1) -> dict:
    """The baseline file's content: sorted, one number per line once dumped (a reviewable diff)."""
    return {
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
    }


def write_baseline(path: Path, document: dict) -> None:
    write_atomic(path, document)


def read_baseline(spec: str | None, root: Path) -> tuple[dict, str]:
    """The baseline named by ``spec``: a file, or a git ref whose committed baseline is read.

    Returns (document, where it came from), its whole body checked (``check_baseline``). Raises
    ResultError (exit 2) when there is none or it is malformed: all before any replay.
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
        text, origin = _committed_baseline(spec, root), f"{spec}:{BASELINE}"
    try:
        document = json.loads(text)
    except ValueError as error:
        raise ResultError(f"{origin}: not JSON ({error})") from None
    except RecursionError:
        raise ResultError(f"{origin}: not a gate baseline (JSON nested too deeply)") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ResultError(f"{origin}: not a gate baseline (schema {SCHEMA!r} expected)")
    check_baseline(document, origin)
    return document, origin


def _committed_baseline(ref: str, root: Path) -> str:
    """The baseline committed at git ref ``ref``. The user's string reaches git only as a revision
    after ``--end-of-options`` (``--output=X`` would otherwise be an option that writes a file), and
    the file is then read from the commit id git resolved, never from the user's string."""
    unknown = ResultError(f"--baseline {ref}: neither a file nor a git ref with {BASELINE}")
    if not ref or ref.startswith("-"):
        raise unknown
    try:
        resolved = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", "--end-of-options",
                                   f"{ref}^{{commit}}"], capture_output=True, text=True, timeout=30)
        commit = resolved.stdout.strip()
        if resolved.returncode != 0 or not commit or not all(c in "0123456789abcdef" for c in commit):
            raise unknown
        shown = subprocess.run(["git", "-C", str(root), "show", f"{commit}:{BASELINE.as_posix()}"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        raise unknown from None
    if shown.returncode != 0:
        raise unknown
    return shown.stdout


def check_baseline(document: dict, origin: str) -> None:
    """Every field the comparison reads has the type it needs (ResultError naming the first that
    does not): a malformed body is bad input found before the replays, not a traceback after."""
    def fail(where: str, expected: str, got) -> None:
        raise ResultError(f"{origin}: not a gate baseline ({where}: expected {expected}, got {_brief(got)})")

    for name in ("commit", "machine"):
        if document.get(name) is not None and not isinstance(document[name], str):
            fail(name, "a string", document[name])
    repeats = document.get("repeats", 1)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        fail("repeats", "a positive integer", repeats)
    for section in ("deterministic", "measured"):
        if not isinstance(document.get(section), dict):
            fail(section, "an object", document.get(section))
    for key, value in document["deterministic"].items():
        if key.count("/") < 2:
            fail(f"deterministic key {key!r}", "workload/connector/metric", key)
        if value is not None and _finite(value) is None:
            fail(f"deterministic.{key}", "a number or null", value)
    for key, entry in document["measured"].items():
        if key.count("/") < 2:
            fail(f"measured key {key!r}", "workload/connector/metric", key)
        if not isinstance(entry, dict):
            fail(f"measured.{key}", "an object with median, min, max", entry)
        for field in ("median", "min", "max"):
            if _finite(entry.get(field)) is None:
                fail(f"measured.{key}.{field}", "a finite number", entry.get(field))


def _finite(value) -> float | None:
    try:
        number = _number(value)
    except OverflowError:  # an integer beyond a float's range
        return None
    return number if number is not None and math.isfinite(number) else None


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
    bad = {"moved", "new", "missing"} | ({"slower"} if strict else set())
    return [row for row in rows if row.verdict in bad]


TABLE_HEADER = ("run", "metric", "baseline", "now", "change", "verdict", "direction")


def table_rows(rows: Iterable[Row]) -> tuple[list[tuple], list[tuple]]:
    """The rows as values (json, csv) and as shown (text, markdown), in TABLE_HEADER's columns."""
    values, shown = [], []
    for row in rows:
        change = row.now - row.baseline if row.now is not None and row.baseline is not None else None
        verdict = row.verdict + (f" (allowed {row.allowed})" if row.allowed else "")
        values.append((row.run, row.metric, row.baseline, row.now, change, row.verdict, row.direction))
        shown.append((row.run, row.metric, _show(row.baseline), _show(row.now), _change(row.baseline, row.now),
                      verdict, row.direction))
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


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


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
             root: Path = Path("."), echo: Callable[[str], None] = print, fmt: str = "text") -> int:
    """``kvoffload gate``: compare (or, with ``update``, rewrite) the baseline; return the exit code.
    The command line has checked the paths (an --update target that is a FIFO or a folder)."""
    if repeats < 1:
        raise ResultError(f"--repeats must be at least 1, got {repeats}")
    machine = machine_name(machine)
    if not update:
        document, origin = read_baseline(baseline, root)  # bad input fails before any replay
    collected = collect(repeats)
    if update:
        path = Path(baseline) if baseline else root / BASELINE
        write_baseline(path, baseline_document(collected, machine, git_commit(root), repeats))
        echo(f"gate baseline written: {path} ({len(collected['deterministic'])} deterministic numbers, "
             f"measured on {machine}); review it with: git diff {path}")
        return 0
    rows = compare(document, collected, machine)
    bad = failures(rows, strict)
    command = update_command(document, baseline, root)
    status = (f"kvoffload gate: FAIL ({len(bad)} numbers). If the change is intended, regenerate the baseline "
              f"with `{command}` and commit it with the change." if bad else "kvoffload gate: pass")
    head = (f"baseline: {origin} (commit {document.get('commit')}, machine {document.get('machine')}); "
            f"this machine: {machine}")
    if fmt != "text":
        values, shown = table_rows(rows)
        echo(render(fmt, TABLE_HEADER, values, shown, right=(2, 3, 4), notes=[head, status],
                    meta={"baseline": origin, "baseline_commit": document.get("commit"),
                          "baseline_machine": document.get("machine"), "machine": machine,
                          "passed": not bad, "failures": len(bad), "update_command": command}))
        return 1 if bad else 0
    moved = [row for row in rows if row.verdict in ("moved", "new", "missing")]
    measured = [row for row in rows if row.verdict in ("ok", "slower", "not compared")]
    echo(head)
    echo(f"deterministic: {len(collected['deterministic'])} numbers over {len(WORKLOADS)} workloads x "
         f"{len(CONNECTORS)} connectors; {len(moved)} moved, new or missing")
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
    echo("\n" + status)
    return 1 if bad else 0
