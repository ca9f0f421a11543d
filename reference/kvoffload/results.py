"""Result files: one JSON per run, written atomically, read back by ``report`` and ``compare``.

Layout: {"schema", "workload", "connector", "config", "metrics", "provenance", "error"}, and from
a replay "diagnostics" ({"livelock", "invariant_violations"}: what those metrics count, in detail).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator

SCHEMA = "kvoffload-bench/run/v1"


class ResultError(ValueError):
    """A result file that cannot be read; the message names the file and the problem."""


def provenance(seed: int) -> dict[str, Any]:
    import torch

    from kvoffload import __version__

    return {
        "commit": _git_commit(),
        "versions": {"kvoffload": __version__, "python": platform.python_version(), "torch": torch.__version__},
        "machine": {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count()},
        "seed": seed,
    }


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def build_result(*, workload: dict, connector: dict, config: Any, metrics: dict, seed: int,
                 error: dict | None = None) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "workload": workload,
        "connector": connector,
        "config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config),
        "metrics": metrics,
        "provenance": provenance(seed),
        "error": error,
    }


@contextlib.contextmanager
def atomic_output(path: Path, mode: str = "w") -> Iterator[IO]:
    """A file to write ``path``'s new content into: it replaces ``path`` whole when the block
    ends, and an interrupt or error inside it leaves the old file, or none, never a partial one.

    The content goes to a temporary file beside ``path`` and is renamed into place. Only a regular
    file is ever replaced (commands check their outputs before any work; checked again here because
    the path may have changed meanwhile): a FIFO, a device or a symbolic link raises OSError, so a
    FIFO never blocks the write and a link is never written through.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        raise OSError(f"{path}: not a regular file; refusing to replace it")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; results are meant to be shared
        with os.fdopen(fd, mode) as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON to ``path`` whole or not at all (``atomic_output``)."""
    with atomic_output(path) as handle:
        json.dump(data, handle, indent=2, sort_keys=False)
        handle.write("\n")


def read_result(path: Path) -> dict[str, Any]:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read forever
            raise ResultError(f"{path}: not a regular file (expected a kvoffload result)")
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ResultError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ResultError(f"{path}: cannot read ({error})") from None
    except json.JSONDecodeError as error:
        raise ResultError(f"{path}: not JSON (line {error.lineno}: {error.msg})") from None
    except RecursionError:
        raise ResultError(f"{path}: not a kvoffload result (JSON nested too deeply)") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResultError(f"{path}: not a kvoffload result (expected schema {SCHEMA!r})")
    for key in ("workload", "connector", "config", "metrics"):
        if not isinstance(data.get(key), dict):
            raise ResultError(f"{path}: key {key!r} missing or not an object")
    for section, key in (("workload", "name"), ("connector", "label")):
        if not isinstance(data[section].get(key), str):
            raise ResultError(f"{path}: key {section}.{key}: expected a string, got {data[section].get(key)!r}")
    for name, value in data["metrics"].items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ResultError(f"{path}: key metrics.{name}: expected a number or null, got {value!r}")
    return data
