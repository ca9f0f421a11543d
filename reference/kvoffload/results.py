"""Result files: one JSON per run, written atomically, read back by ``report`` and ``compare``.

Layout: {"schema", "workload", "connector", "config", "metrics", "provenance", "error"}, and from
a replay "diagnostics" ({"livelock", "invariant_violations"}: what those metrics count, in detail).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import platform
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator

from kvoffload import interrupts, long_numbers

# A bound, not a speed target: git answers in milliseconds; a wedged git must not hang a run.
GIT_SECONDS = 30

SCHEMA = "kvoffload-bench/run/v1"


class ResultError(ValueError):
    """A result file that cannot be read; the message names the file and the problem."""


def provenance(seed: int) -> dict[str, Any]:
    import torch

    from kvoffload import __version__

    return {
        "commit": git_commit(),
        "versions": {"kvoffload": __version__, "python": platform.python_version(), "torch": torch.__version__},
        "machine": {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count()},
        "seed": seed,
    }


def git_commit(root: Path | None = None) -> str | None:
    """HEAD of ``root`` (default: this checkout), with ``-dirty`` when tracked files differ from it;
    None without git. What a run result's ``provenance.commit`` holds, each row of the release
    table, and the gate baseline's commit."""
    root = Path(__file__).resolve().parents[2] if root is None else root
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=GIT_SECONDS, check=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=GIT_SECONDS, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


@contextlib.contextmanager
def locked_folder(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` (created if missing) for as long as the block runs: one
    writer at a time of a set of files in it (a release table's read-merge-write, a report)."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock


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

    A writer killed by SIGKILL cannot remove its temporary file; the next writer of the same
    path does (``remove_left_overs``): the temporary file is locked (``flock``) while its
    writer lives, and the kernel drops the lock with the process, so a temporary file that can be
    locked is one nobody writes any more.
    """
    interrupts.check()  # a Ctrl-C swallowed since the last file (kvoffload.interrupts): no new one
    path.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        raise OSError(f"{path}: not a regular file; refusing to replace it")
    fd, tmp = _locked_temporary(path)
    try:
        remove_left_overs(path.parent, (path.name,))
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; results are meant to be shared
        with os.fdopen(os.dup(fd), mode) as handle:  # fd keeps the lock until the rename is done
            yield handle
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)


def _locked_temporary(path: Path) -> tuple[int, str]:
    """A new temporary file beside ``path``, locked by this process (``atomic_output``). A
    temporary file another writer's clean-up removed between its creation and the lock (the
    lock was free for that instant) is given up for a new one."""
    while True:
        fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(path), suffix=TEMPORARY_SUFFIX, dir=path.parent)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_nlink > 0:
                return fd, tmp
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


TEMPORARY_SUFFIX = ".tmp"
# tempfile's random part is 8 characters (CPython 3.x); counted generously, so a future longer
# one still fits what the command line checked.
_TEMPORARY_RANDOM = 16
_TEMPORARY_STEM = 48  # characters of the file's own name kept in the temporary name


def _temporary_prefix(path: Path) -> str:
    """``.<name>.``, the name cut to 48 characters: a temporary name fits wherever a name does."""
    return f".{path.name[:_TEMPORARY_STEM]}."


def remove_left_overs(folder: Path, names: "tuple[str, ...]", *, prefix: bool = False) -> list[str]:
    """Remove the temporary files in ``folder`` that writers of ``names`` (with ``prefix``: of
    names that start so) left when they were killed: each of our temporary names
    (``.NAME.XXXXXXXX.tmp``) that no live writer holds locked. Returns their names."""
    stems = {_temporary_prefix(Path(name)) for name in names}
    removed = []
    try:
        candidates = os.listdir(folder)
    except OSError:
        return removed
    for entry in candidates:
        match = _TEMPORARY.match(entry)
        if not match or not (match[1] in stems or prefix and any(match[1].startswith(s[:-1]) for s in stems)):
            continue
        left = os.path.join(folder, entry)
        try:
            fd = os.open(left, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # gone meanwhile, or a symbolic link: not ours
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a live writer's
                continue
            os.unlink(left)
            removed.append(entry)
        except FileNotFoundError:
            continue
        finally:
            os.close(fd)
    return removed


# What tempfile.mkstemp names our temporary files: the prefix (``_temporary_prefix``), eight
# characters of its alphabet (CPython's ``_RandomNameSequence``), the suffix.
_TEMPORARY = re.compile(r"\A(\..*\.)[a-z0-9_]{8}" + re.escape(TEMPORARY_SUFFIX) + r"\Z", re.DOTALL)


def temporary_name(path: Path) -> str:
    """The longest name ``write_atomic`` may give the temporary file beside ``path`` (what the
    command line checks against the file system's limits before a run)."""
    return _temporary_prefix(path) + "X" * _TEMPORARY_RANDOM + TEMPORARY_SUFFIX


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON to ``path`` whole or not at all (``atomic_output``)."""
    with atomic_output(path) as handle:
        json.dump(data, handle, indent=2, sort_keys=False)
        handle.write("\n")


def read_result(path: Path) -> dict[str, Any]:
    """A result file, checked for everything ``compare``, ``report`` and ``sweep`` read from it:
    ResultError naming the file and the key otherwise (a result edited by hand, cut short, or
    written by another tool)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read forever
            raise ResultError(f"{path}: not a regular file (expected a kvoffload result)")
        text = Path(path).read_text()
        data = json.loads(text)
    except FileNotFoundError:
        raise ResultError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ResultError(f"{path}: cannot read ({error})") from None
    except json.JSONDecodeError as error:
        raise ResultError(f"{path}: not JSON (line {error.lineno}: {error.msg})") from None
    except RecursionError:
        raise ResultError(f"{path}: not a kvoffload result (JSON nested too deeply)") from None
    except ValueError as error:  # not a JSONDecodeError: a number too long to convert
        if not long_numbers.is_too_long(error):
            raise
        raise ResultError(f"{path}: expected {long_numbers.EXPECTED}, got {long_numbers.describe(text)}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResultError(f"{path}: not a kvoffload result (expected schema {SCHEMA!r})")
    check_result(data, str(path))
    return data


# Optional keys and what they hold when present; null is allowed for each.
_OPTIONAL_OBJECTS = ("provenance", "error", "diagnostics", "distributions")


def check_result(data: dict[str, Any], where: str) -> None:
    """ResultError for the first key of a result document that is not what the readers expect."""
    def wrong(key: str, expected: str, value: Any) -> ResultError:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return ResultError(f"{where}: key {key}: expected {expected}, got {shown}")

    for key in ("workload", "connector", "config", "metrics"):
        if not isinstance(data.get(key), dict):
            raise ResultError(f"{where}: key {key!r} missing or not an object")
    for key in _OPTIONAL_OBJECTS:
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise wrong(key, "an object or null", data[key])
    for section, key in (("workload", "name"), ("connector", "label")):
        if not isinstance(data[section].get(key), str):
            raise wrong(f"{section}.{key}", "a string", data[section].get(key))
    for section, key in (("connector", "preset"), ("provenance", "commit")):
        value = (data.get(section) or {}).get(key)
        if value is not None and not isinstance(value, str):
            raise wrong(f"{section}.{key}", "a string or null", value)
    disabled = data["connector"].get("disabled")
    if disabled is not None and not (isinstance(disabled, list) and all(isinstance(n, str) for n in disabled)):
        raise wrong("connector.disabled", "a list of fix names", disabled)
    for name, value in data["metrics"].items():
        if value is not None and not _finite_number(value):
            raise wrong(f"metrics.{name}", "a finite number or null", value)


def differences(a: dict[str, Any], b: dict[str, Any], ignore: tuple[str, ...] = ()) -> list[str]:
    """``key A vs B`` for each key, sorted, whose value differs between two results' objects (their
    ``config``, their ``workload``), ``ignore`` left out: what ``compare`` and ``report`` name when
    they refuse two runs. Values as JSON (equal texts are equal values, NaN included), cut to 40
    characters; "(absent)" where one lacks the key."""
    def text(values: dict[str, Any], key: str) -> str | None:
        return json.dumps(values[key], sort_keys=True, default=str) if key in values else None

    def shown(found: str | None) -> str:
        return "(absent)" if found is None else found[:40]

    keys = sorted(key for key in set(a) | set(b) if key not in ignore and text(a, key) != text(b, key))
    return [f"{key} {shown(text(a, key))} vs {shown(text(b, key))}" for key in keys]


def _finite_number(value: Any) -> bool:
    """An int or float that a float holds (compare subtracts an int from a float), finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) if isinstance(value, float) else abs(value) < 2**1023
