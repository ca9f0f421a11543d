"""Output paths, checked before any work: a run that cannot write its result must not start.

Rules (each failure is one line naming the flag and the path):

- a result or trace file is a regular file or absent: a FIFO, a device node, a socket or a
  symbolic link is never replaced (``--out /dev/null`` as root would otherwise replace the
  device with a regular file);
- its folder is created when the file is written (``results.write_atomic``), for every command
  and every output: the nearest folder that exists must be a writable directory, and no path
  on the way may exist as anything but a folder (``--out notes.txt/r.json``);
- an output folder (``bench``/``sweep --out-dir``, ``report --out``) is a folder or absent (then
  created the same way);
- no two outputs of one command are the same file (``--out X --trace X`` would write the trace
  over the result), by path (symbolic links and ``..`` resolved) or by inode (a hard link);
- an existing file is replaced only by what it holds (``kind``): a run result by a run result, a
  release table by a release table, an empty file by anything; a file of another kind, or not
  ours at all (a note, a Chrome trace where a result goes), is never replaced;
- the file and the temporary file it is written through (``results.write_atomic``) have names
  and paths the file system takes (NAME_MAX, PATH_MAX);
- no output goes under /proc or /sys, or into any kernel pseudo file system (procfs, sysfs,
  cgroupfs, ...): root may "write" there as far as ``os.access`` can tell, and the write fails
  only when the result is written, after the replay.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Iterable

from kvoffload import results
from kvoffload.cli.flags import UsageError

# Where run, bench, sweep, report and releases write by default: a folder git ignores (.gitignore),
# so an ad-hoc run never changes the committed results/ (benchmarks/README.md lists its writers).
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


def check_output_file(flag: str, path: Path, *, create_parents: bool = False, kind: str | None = None) -> Path:
    """``path`` may be (re)written as a regular file; returns it. ``create_parents``: missing
    folders are made later (default paths), so the nearest existing one must be writable.
    ``kind`` (a schema of ours, or ``TRACE``, ``REPORT_PAGE``): what the command writes there; an
    existing file holding something else is refused (``check_replaceable``)."""
    info = _lstat(path)
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{flag} {path}: is {_kind(info.st_mode)}; expected a regular file or a new path "
                         f"(it is never replaced)")
    if info is not None and kind is not None:
        check_replaceable(flag, path, kind)
    existing = _check_folder(flag, path, path.parent if str(path.parent) else Path("."), create_parents)
    _check_file_system(flag, path, existing)
    _check_name_lengths(flag, path, existing)
    return path


def check_output_dir(flag: str, path: Path) -> Path:
    """``path`` is a folder we may write into, or absent with a writable folder above it."""
    info = _lstat(path)
    if info is not None:
        if not stat.S_ISDIR(os.stat(path).st_mode if stat.S_ISLNK(info.st_mode) else info.st_mode):
            raise UsageError(f"{flag} {path}: is {_kind(info.st_mode)}; expected a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{flag} {path}: directory is not writable")
        _check_file_system(flag, path, path)
        return path
    existing = _check_folder(flag, path, path.parent if str(path.parent) else Path("."), create_parents=True)
    _check_file_system(flag, path, existing)
    return path


def _check_folder(flag: str, path: Path, folder: Path, create_parents: bool) -> Path:
    """The folder ``path`` will be written in, or with ``create_parents`` its nearest existing
    ancestor, checked to be a writable directory; returns it."""
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
    return folder


# Kernel interfaces mounted as file systems: they hold no regular files a program may create.
PSEUDO_FILE_SYSTEMS = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore", "bpf", "configfs",
    "efivarfs", "fusectl", "binfmt_misc", "devpts", "mqueue", "nsfs", "autofs", "rpc_pipefs", "selinuxfs",
    "hugetlbfs"})
KERNEL_TREES = ("/proc", "/sys")  # by convention (FHS), whatever is mounted there in a container


def _check_file_system(flag: str, path: Path, folder: Path) -> None:
    """``folder`` (an existing directory) is not a kernel interface: /proc, /sys or a pseudo file
    system found in this process's mount table."""
    real = os.path.realpath(folder)
    for tree in KERNEL_TREES:
        if real == tree or real.startswith(tree + "/"):
            raise UsageError(f"{flag} {path}: {real} is in {tree}, the kernel's interface, not a place for files")
    kind = mount_type(real)
    if kind in PSEUDO_FILE_SYSTEMS:
        raise UsageError(f"{flag} {path}: {real} is on a {kind} file system (a kernel interface, not a place "
                         f"for files)")


def mount_type(real: str) -> str | None:
    """The file system type of the mount holding ``real`` (a resolved path), from
    /proc/self/mountinfo (Linux); None where there is no such table."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            table = handle.read().splitlines()
    except OSError:
        return None
    best, kind = "", None
    for line in table:
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), parts[4])  # \040 is a space
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):  # the deepest mount wins; a later one over the same point too
            best, kind = point, rest.split()[0]
    return kind


def _check_name_lengths(flag: str, path: Path, folder: Path) -> None:
    """The file's name and path, and those of the temporary file it is written through, fit the
    file system's NAME_MAX and PATH_MAX (``folder``: the nearest existing one, for its limits)."""
    temporary = results.temporary_name(path)
    name_max = _pathconf(folder, "PC_NAME_MAX", 255)
    path_max = _pathconf(folder, "PC_PATH_MAX", 4096)  # counts the final NUL
    for name in (path.name, temporary):
        if len(os.fsencode(name)) > name_max:
            what = "its name" if name == path.name else f"the temporary name {temporary[:40]}..."
            raise UsageError(f"{flag} {path}: {what} is {len(os.fsencode(name)):,} bytes long; this file system "
                             f"takes at most {name_max:,}")
    longest = max(len(os.fsencode(str(path))), len(os.fsencode(str(path.parent / temporary))))
    if longest >= path_max:
        raise UsageError(f"{flag} {path}: a path of up to {longest:,} bytes (the temporary file's included); this "
                         f"system takes at most {path_max - 1:,}")


def _pathconf(folder: Path, name: str, default: int) -> int:
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError):  # not POSIX, or not a limit this file system has
        return default
    return value if value > 0 else default


def check_distinct(outputs: Iterable[tuple[str, Path]]) -> None:
    """No two outputs are one file: compared after resolving symlinks and ``..``, and, for files
    that exist, by device and inode (two hard links of one file are one file)."""
    seen: dict[object, str] = {}
    for flag, path in outputs:
        keys: list[object] = [os.path.realpath(path)]
        try:
            info = os.stat(path)
            keys.append((info.st_dev, info.st_ino))
        except OSError:  # absent (or unreachable: check_output_file said why)
            pass
        for key in keys:
            if key in seen:
                raise UsageError(f"{flag} {path}: the same file as {seen[key]}; give each output its own path")
        for key in keys:
            seen[key] = f"{flag} {path}"


# ---- what an existing output holds ----------------------------------------------------------

TRACE = "chrome-trace"  # kvoffload run --trace (runner.chrome_trace): no schema key of its own
REPORT_PAGE = "report-page"  # kvoffload report's index.html and index.md
_OURS = "kvoffload-bench/"  # every schema of ours starts so (results, releases, gate, bench)
_KIND_NAMES = {"run": "a run result", "releases": "a release table", "gate-baseline": "a gate baseline",
               "bench": "a bench summary", TRACE: "a Chrome trace", REPORT_PAGE: "a kvoffload report page"}
_HEAD_BYTES = 65536  # enough for any of our files' first key; the whole file is parsed only past it
_WHOLE_BYTES = 64 << 20  # a file larger than this and not ours by its head is not parsed whole
_SCHEMA_HEAD = re.compile(rb'\A\s*\{\s*"schema"\s*:\s*"([^"\\]{1,200})"')
_TRACE_HEAD = re.compile(rb'\A\s*\{\s*"traceEvents"\s*:')
_PAGE_HEADS = (b"<!doctype html>\n<html><head><meta charset='utf-8'><title>kvoffload-bench report</title>",
               b"# kvoffload-bench report\n")


def describe_kind(kind: str | None) -> str:
    if kind is None:
        return "a file that is not a kvoffload output"
    if kind.startswith(_OURS):
        name = kind[len(_OURS):].rsplit("/", 1)[0]
        return _KIND_NAMES.get(name, f"a kvoffload {name} file") + f" ({kind})"
    return _KIND_NAMES.get(kind, kind)


def output_kind(path: Path) -> str:
    """What the regular file ``path`` holds: one of our schemas, ``TRACE``, ``REPORT_PAGE``, ""
    when it is empty, or None when it is none of ours. Read without blocking (a FIFO put there
    since the check); the head first: our writers put the telling key first."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise UsageError(f"{path}: cannot read it to tell what it holds ({error.strerror}); it is never "
                         f"replaced unread") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        head = os.read(fd, _HEAD_BYTES)
        if not head.strip():
            return "" if info.st_size <= len(head) else None
        if match := _SCHEMA_HEAD.match(head):
            schema = match[1].decode("utf-8", errors="replace")
            return schema if schema.startswith(_OURS) else None
        if _TRACE_HEAD.match(head):
            return TRACE
        if any(head.startswith(page) for page in _PAGE_HEADS):
            return REPORT_PAGE
        if info.st_size > _WHOLE_BYTES:
            return None
        raw = head + b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep, a number too long
        return None
    if isinstance(data, dict) and isinstance(data.get("schema"), str) and data["schema"].startswith(_OURS):
        return data["schema"]
    return TRACE if isinstance(data, dict) and "traceEvents" in data else None


def check_replaceable(flag: str, path: Path, kind: str) -> None:
    """An existing file at ``path`` holds ``kind`` (or nothing): what the command may replace it
    with. Otherwise a one-line refusal naming what it holds: a run's ``--out`` pointed at a release
    table, or a release table's at a run result, would lose a file of another command."""
    found = output_kind(path)
    if found == "" or found == kind:
        return
    raise UsageError(f"{flag} {path}: holds {describe_kind(found)}, not {describe_kind(kind)}; a file of another "
                     f"kind is never replaced (give another path, or remove it first)")
