"""The gate's baseline file (``results/gate/baseline.json``): its schema, reading it from a file
or a git ref, checking its whole body before any replay, writing it whole.

Fields: ``schema``, ``commit``, ``machine``, ``repeats``, ``workloads``, ``connectors``,
``deterministic`` ({``workload/connector/metric``: number or null}), ``measured``
({key: median, min, max, repeats}), and since issue 29 ``signatures`` ({``workload/flag``: the
metrics the reference moves with that fix flag off, as they are then}: ``kvoffload.gate_signatures``)
``override`` (present only when ``--update --override-reason`` blessed must-be-0 numbers: the
reason and those numbers), and ``counted`` with ``count_environment`` (instructions under callgrind,
``kvoffload.gate_counts``, where valgrind was there). The later fields are optional, so older baselines (a git ref's) read.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

from kvoffload.results import ResultError, write_atomic

SCHEMA = "kvoffload-bench/gate-baseline/v1"
BASELINE = Path("results/gate/baseline.json")


def number(value) -> float | None:
    """A JSON number as a float; None for anything else (null, a bool, a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


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
    signatures = document.get("signatures", {})
    if not isinstance(signatures, dict):
        fail("signatures", "an object", signatures)
    for key, signature in signatures.items():
        if key.count("/") != 1 or not isinstance(signature, dict):
            fail(f"signatures.{key}", "workload/flag: an object of metrics", signature)
        for metric, value in signature.items():
            if value is not None and _finite(value) is None:
                fail(f"signatures.{key}.{metric}", "a number or null", value)
    for key, value in (document.get("counted") or {}).items():
        if key.count("/") < 2 or _finite(value) is None:
            fail(f"counted.{key}", "workload/connector/metric: a finite number", value)
    environment = document.get("count_environment", {})
    if not isinstance(environment, dict) or not all(isinstance(v, str) for v in environment.values()):
        fail("count_environment", "an object of strings", environment)
    override = document.get("override")
    if override is not None and (not isinstance(override, dict) or not isinstance(override.get("reason"), str)
                                 or not isinstance(override.get("cells"), list)):
        fail("override", "an object with a reason and its cells", override)


def _finite(value) -> float | None:
    try:
        found = number(value)
    except OverflowError:  # an integer beyond a float's range
        return None
    return found if found is not None and math.isfinite(found) else None


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
