"""Output paths, checked before any work: a run that cannot write its result must not start.

Rules (each failure is one line naming the flag and the path):

- a result or trace file is a regular file or absent: a FIFO, a device node, a socket or a
  symbolic link is never replaced (``--out /dev/null`` as root would otherwise replace the
  device with a regular file);
- its folder exists (or, for default paths, can be created) and is writable;
- an output folder (``bench --out-dir``, ``report --out``) is a folder or absent;
- no two outputs of one command are the same file (``--out X --trace X`` would write the trace
  over the result).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable

from kvoffload.cli.flags import UsageError

# Where run, bench, sweep and report write by default: a folder git ignores (.gitignore), so an
# ad-hoc run never changes the committed results/ (only benchmarks/publish does, from a clean commit).
DEFAULT_ROOT = Path("out")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "an unknown kind of file"


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # absent; the folder check says why
        return None
    except OSError as error:
        raise UsageError(f"{path}: cannot inspect ({error.strerror})") from None


def check_output_file(flag: str, path: Path, *, create_parents: bool = False) -> Path:
    """``path`` may be (re)written as a regular file; returns it. ``create_parents``: missing
    folders are made later (default paths), so the nearest existing one must be writable."""
    info = _lstat(path)
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{flag} {path}: is {_kind(info.st_mode)}; expected a regular file or a new path "
                         f"(it is never replaced)")
    _check_folder(flag, path, path.parent if str(path.parent) else Path("."), create_parents)
    return path


def check_output_dir(flag: str, path: Path) -> Path:
    """``path`` is a folder we may write into, or absent with a writable folder above it."""
    info = _lstat(path)
    if info is not None:
        if not stat.S_ISDIR(os.stat(path).st_mode if stat.S_ISLNK(info.st_mode) else info.st_mode):
            raise UsageError(f"{flag} {path}: is {_kind(info.st_mode)}; expected a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{flag} {path}: directory is not writable")
        return path
    _check_folder(flag, path, path.parent if str(path.parent) else Path("."), create_parents=True)
    return path


def _check_folder(flag: str, path: Path, folder: Path, create_parents: bool) -> None:
    while create_parents and not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        folder = folder.parent
    try:
        is_dir = folder.is_dir()
    except OSError as error:
        raise UsageError(f"{flag} {path}: cannot inspect {folder} ({error.strerror})") from None
    if not is_dir:
        if folder.exists() or folder.is_symlink():
            raise UsageError(f"{flag} {path}: {folder} is not a directory")
        raise UsageError(f"{flag} {path}: directory {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: directory {folder} is not writable")


def check_distinct(outputs: Iterable[tuple[str, Path]]) -> None:
    """No two outputs are one file (compared after resolving symlinks and ``..``)."""
    seen: dict[str, str] = {}
    for flag, path in outputs:
        key = os.path.realpath(path)
        if key in seen:
            raise UsageError(f"{flag} {path}: the same file as {seen[key]}; give each output its own path")
        seen[key] = f"{flag} {path}"
