"""What crosses into and out of a release's venv (``kvoffload releases``): where the venv is, the
process tree it runs, the rows it prints and the table file they end up in. Nothing from the
venv is trusted: its rows and the table are checked key by key before anyone reads them, and its
processes die with the command that started them.

The process tree (docs/commands.md, "releases: the venvs' processes"): the release's interpreter runs in a session
of its own, so a timeout or a Ctrl-C ends every process in it (``os.killpg``), not only the direct
child while vLLM's replays run on. When ``kvoffload releases`` itself dies, even by SIGKILL, two
guards end the tree: the kernel's parent-death signal on the direct child (``PR_SET_PDEATHSIG``,
Linux), and a watcher process the child starts first (:func:`die_with_parent`, which
``kvoffload.vllm.rows`` calls before vLLM's import) that kills the whole process group when the
pipe from the parent reaches end of file, whatever ended the parent.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

from kvoffload.results import ResultError

PARENT_FD_ENV = "KVOFFLOAD_PARENT_FD"  # the read end of the pipe whose end of file is the parent's death
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class ReleaseFailed(Exception):
    """A release's venv could not produce its rows: one line naming the release and why."""


# ---- where the venv is ----------------------------------------------------------------------


def venv_places(checkout: Path) -> list[Path]:
    """The folders a release venv is looked for in: the current folder, then the checkout whose
    code runs (``scripts/setup-vllm`` creates the venvs in its root), once each."""
    places = [Path(".")]
    if checkout.resolve() != Path(".").resolve():
        places.append(checkout)
    return places


def venv_python(venv: str, places: Sequence[Path]) -> Path | None:
    """``venv``'s interpreter in the first of ``places`` that has one, or None."""
    for place in places:
        python = place / venv / "bin" / "python"
        if python.exists():
            return python
    return None


# ---- the process tree -----------------------------------------------------------------------


def parent_death_guard(parent: int):
    """A function that makes the calling process get SIGKILL when its parent dies (Linux's
    ``PR_SET_PDEATHSIG``), and exit at once if ``parent`` died before it was set; None off Linux.
    Run between fork and exec (``run_rows``), or first thing in a process (``kvoffload.cli``
    under ``KVOFFLOAD_DIE_WITH_PARENT=1``)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded here, not in a forked child
    except (OSError, AttributeError):
        return None

    def guard() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return guard


def run_rows(python: Path, jobs: Sequence[tuple[str, str]], preset: str | None, env: dict[str, str],
             timeout: float, options: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """``python -m kvoffload.vllm.rows [--preset P] [OPTIONS] WORKLOAD:SCHEDULING ...`` (``python``: a release
    venv's interpreter), its process tree bounded by ``timeout`` seconds: every process of its
    session is killed on a timeout (``subprocess.TimeoutExpired``), on any exception here (a
    Ctrl-C) and when it has exited (a child it left behind). Its output goes to temporary files,
    not pipes: a child it left behind holds a pipe open, and reading to its end waited for that
    child (until the timeout). A finished run's result."""
    read_end, write_end = os.pipe()  # both close on exec; the child gets the read end only
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        try:
            process = subprocess.Popen([str(python), "-m", "kvoffload.vllm.rows",
                                        *(("--preset", preset) if preset else ()), *options,
                                        *(f"{workload}:{scheduling}" for workload, scheduling in jobs)],
                                       env={**env, PARENT_FD_ENV: str(read_end)}, stdin=subprocess.DEVNULL,
                                       stdout=stdout, stderr=stderr, start_new_session=True, pass_fds=(read_end,),
                                       preexec_fn=parent_death_guard(os.getpid()))
        finally:
            os.close(read_end)
        try:
            process.wait(timeout=timeout)
        finally:
            kill_session(process)
            os.close(write_end)  # after the kill: the watcher must not fire while the release still runs
        return subprocess.CompletedProcess(process.args, process.returncode, _text(stdout), _text(stderr))


def _text(output) -> str:
    output.seek(0)
    return output.read().decode("utf-8", errors="replace")


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL to every process of ``process``'s session (it leads its own group), then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # every process of it has exited already
        pass
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:  # not ours to wait for longer: SIGKILL was sent
        pass


def die_with_parent() -> None:
    """In a release's interpreter, first thing: a watcher process that kills this process group
    when the parent's pipe closes (the parent exited, or was killed by any signal). A process,
    not a thread: the parent-death signal kills this interpreter at once, and its threads with
    it, before a thread could end the replays it started. Does nothing when not started by
    :func:`run_rows` (run by hand)."""
    fd_text = os.environ.pop(PARENT_FD_ENV, None)
    if fd_text is None or not fd_text.isdigit():
        return
    fd, group = int(fd_text), os.getpgrp()
    if os.fork() == 0:  # the watcher: it holds no pipe of the release's output, only the parent's
        try:
            null = os.open(os.devnull, os.O_RDWR)
            for standard in (0, 1, 2):
                os.dup2(null, standard)
            os.closerange(3, fd)
            os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))
            while os.read(fd, 1):  # the parent never writes: only end of file comes
                pass
        finally:
            os.killpg(group, signal.SIGKILL)
            os._exit(0)
    os.close(fd)


# ---- the rows a release prints --------------------------------------------------------------


def split_job(job: str, schedulings: Sequence[str] = ("sync", "async")) -> tuple[str, str]:
    """``WORKLOAD:SCHEDULING`` (what :func:`run_rows` passes) as its two parts, split at the last
    colon, so ``mooncake:FILE:sync`` keeps its workload whole; without a scheduling after the last
    colon the whole job is the workload, replayed sync."""
    workload, _, scheduling = job.rpartition(":")
    return (workload, scheduling) if workload and scheduling in schedulings else (job, "sync")


def parse_rows(release: str, stdout: str, jobs: Sequence[tuple[str, str]]) -> list[dict]:
    """The release's rows (its lines that start with ``{``), one per job in order, each checked
    for every key ``releases`` reads; ReleaseFailed naming the release, the row and the key."""
    rows = []
    for number, line in enumerate(stdout.splitlines(), 1):
        if not line.startswith("{"):
            continue  # vLLM's own chatter on stdout
        try:
            rows.append(json.loads(line))
        except (ValueError, RecursionError) as error:
            raise ReleaseFailed(f"vLLM {release}: output line {number} is not a JSON row ({_short(error)})") from None
    if len(rows) != len(jobs):
        raise ReleaseFailed(f"vLLM {release}: {len(rows)} rows for {len(jobs)} replays")
    for index, (row, job) in enumerate(zip(rows, jobs), 1):
        problem = row_problem(row, job)
        if problem:
            raise ReleaseFailed(f"vLLM {release}: row {index} ({job[0]}:{job[1]}): {problem}")
    return rows


def row_problem(row: Any, job: tuple[str, str]) -> str | None:
    """What is wrong with one printed row for ``job`` (workload, scheduling), or None."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {_shown(row)}"
    for key, expected in zip(("workload", "scheduling"), job):
        if row.get(key) != expected:
            return f"key {key}: expected {expected!r}, got {_shown(row.get(key))}"
    if "setup_error" in row:
        return None if isinstance(row["setup_error"], str) else f"key setup_error: expected a string, got " \
                                                                   f"{_shown(row['setup_error'])}"
    checks = (("metrics", _metrics_problem), ("error", _error_problem), ("leaked", _list_problem),
              ("first_admission", _admissions_problem))
    for key, check in checks:
        problem = check(row.get(key)) if key in row else "missing"
        if problem:
            return f"key {key}: {problem}"
    seconds = row.get("seconds")
    if seconds is not None and not _number(seconds):
        return f"key seconds: expected a finite number, got {_shown(seconds)}"
    return None


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and (math.isfinite(value) if isinstance(value, float) else abs(value) < 2**1023))


def _metrics_problem(metrics: Any) -> str | None:
    if not isinstance(metrics, dict):
        return f"expected an object of metrics, got {_shown(metrics)}"
    for name, value in metrics.items():
        if value is not None and not _number(value):
            return f"{name}: expected a finite number or null, got {_shown(value)}"
    return None


def _error_problem(error: Any) -> str | None:
    if error is None:
        return None
    if not (isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("step"), int)
            and not isinstance(error.get("step"), bool)):
        return f"expected null or {{\"message\": text, \"step\": integer}}, got {_shown(error)}"
    return None


def _list_problem(value: Any) -> str | None:
    return None if isinstance(value, list) else f"expected a list, got {_shown(value)}"


def _admissions_problem(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"expected {{request: [GPU-hit tokens, connector-hit tokens]}}, got {_shown(value)}"
    for request, hits in value.items():
        if not (isinstance(hits, list) and len(hits) == 2
                and all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**63 for n in hits)):
            return f"request {request!r}: expected [GPU-hit tokens, connector-hit tokens], got {_shown(hits)}"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _short(error: Exception) -> str:
    return str(error).splitlines()[0][:120] if str(error) else type(error).__name__


# ---- the table file -------------------------------------------------------------------------


def check_release_table(data: Any, where: str, schema: str, schedulings: Sequence[str], *,
                        drawn: bool = True) -> None:
    """ResultError naming ``where`` and the first key of a release table (``kvoffload releases``'
    ``--out``, the report's ``releases/releases.json``) that is not what its readers take: the
    report draws from it and ``releases`` merges new rows into it, and neither may fail halfway.
    ``drawn``: each measured row's two sides and their metrics too (what the report draws; the
    merge reads only the rows' workload and scheduling)."""
    if not isinstance(data, dict) or data.get("schema") != schema:
        raise ResultError(f"{where}: not a release table (schema {schema} expected)")
    problem = _table_problem(data, schedulings, drawn)
    if problem:
        raise ResultError(f"{where}: not a release table ({problem})")


def _table_problem(data: dict, schedulings: Sequence[str], drawn: bool) -> str | None:
    provenance = data.get("provenance")
    if provenance is not None and not (isinstance(provenance, dict)
                                       and isinstance(provenance.get("commits") or {}, dict)):
        return f"key provenance: expected an object with an object of commits, got {_shown(provenance)}"
    if not isinstance(data.get("releases"), list):
        return f"key releases: expected a list, got {_shown(data.get('releases'))}"
    for number, entry in enumerate(data["releases"], 1):
        where = f"releases[{number - 1}]"
        if not isinstance(entry, dict):
            return f"{where}: expected an object, got {_shown(entry)}"
        for key in ("release", "preset"):
            if not isinstance(entry.get(key), str):
                return f"{where}.{key}: expected a string, got {_shown(entry.get(key))}"
        if "seconds" in entry and not _number(entry["seconds"]):
            return f"{where}.seconds: expected a finite number, got {_shown(entry['seconds'])}"
        if not isinstance(entry.get("rows"), list):
            return f"{where}.rows: expected a list, got {_shown(entry.get('rows'))}"
        for index, row in enumerate(entry["rows"]):
            problem = _table_row_problem(row, schedulings, drawn)
            if problem:
                return f"{where}.rows[{index}]: {problem}"
    return None


def _table_row_problem(row: Any, schedulings: Sequence[str], drawn: bool) -> str | None:
    if not isinstance(row, dict):
        return f"expected an object, got {_shown(row)}"
    if not isinstance(row.get("workload"), str):
        return f"key workload: expected a string, got {_shown(row.get('workload'))}"
    if row.get("scheduling") not in schedulings:
        return f"key scheduling: expected one of {', '.join(schedulings)}, got {_shown(row.get('scheduling'))}"
    if "setup_error" in row or not drawn:
        return None
    for side in ("release", "preset"):
        value = row.get(side)
        if not isinstance(value, dict):
            return f"key {side}: expected an object, got {_shown(value)}"
        problem = _metrics_problem(value.get("metrics"))
        if problem:
            return f"key {side}.metrics: {problem}"
    return None
