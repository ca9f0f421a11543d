"""The life of a sweep's worker processes: they end with the sweep, whatever ends it.

- **Ctrl-C**: the terminal sends SIGINT to every process of the foreground group, workers
  included. Workers start with SIGINT blocked (:func:`spawning`) and ignore it from their first
  step on (:func:`start`), so even a worker still importing prints no traceback; the sweep's own
  process gets the KeyboardInterrupt and stops them (:func:`stop`).
- **The sweep's process dies** (``kill -9``, the OOM killer): on Linux the kernel sends each
  worker SIGTERM (``prctl(PR_SET_PDEATHSIG)``, set first thing in :func:`start`); elsewhere a
  thread notices the new parent process id within a second and sends it.
- **SIGTERM** (from :func:`stop` or the kernel): a worker in a cell unwinds it with
  :class:`Stopped` — ``results.write_atomic`` removes the temporary file it was writing — and
  exits (or SIGALRM ends it :data:`UNWIND_SECONDS` later, if something swallowed the Stopped); an idle worker takes the signal's default action, so the kernel ends it whichever of
  its threads the signal reaches. A Python handler would not do there: numpy's OpenBLAS starts a
  thread in each worker, a signal that lands on it only flags the handler for the main thread,
  and an idle main thread is blocked reading the pool's queue, which a sibling worker keeps open
  (a sweep killed while its workers started left one running about once in 25).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator

PR_SET_PDEATHSIG = 1  # linux/prctl.h
POLL_SECONDS = 1.0  # the parent watch where there is no prctl
STOP_SECONDS = 30.0  # how long stop() waits for a worker to clean up before killing it
# A stopped cell unwinds in milliseconds. If it has not ended the worker within this, the Stopped
# was swallowed (a library's bare ``except``, or a finaliser, whose exceptions Python only prints):
# SIGALRM's default action then ends it, whichever thread takes the signal.
UNWIND_SECONDS = 5


class Stopped(BaseException):
    """Raised in a worker by SIGTERM while it runs a cell: not an Exception, so no handler of the
    replay swallows it; ``finally`` and ``except BaseException`` blocks (the temporary file's
    removal) run."""


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """While processes are spawned in this block, SIGINT is blocked here, and so in them (a
    blocked signal stays blocked across fork and exec, until :func:`start` ignores it). Here it
    is only held: a Ctrl-C meanwhile is delivered when the block ends, not lost."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield  # only the main thread handles signals; a caller in a thread handles its own
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def start(parent_pid: int) -> None:
    """A worker's initializer: tie its life to ``parent_pid``, the sweep's process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # held since the spawn; now ignored
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # idle: the kernel ends the process (module docstring)
    if not _death_signal(signal.SIGTERM):
        threading.Thread(target=_watch_parent, args=(parent_pid,), name="parent-watch", daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the watch was set
        os._exit(1)


def run_in_worker(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in a worker, where SIGTERM stops it cleanly: its handler is set for
    the call only (an idle worker dies of the signal itself, see the module docstring)."""
    signal.signal(signal.SIGTERM, _on_terminate)
    try:
        try:
            return function(*args)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except Stopped:  # also one that came while the handler was being reset
        os._exit(128 + signal.SIGTERM)  # the pool's queues may belong to a dead parent: no reply


def stop(pool) -> None:
    """Stop ``pool``'s workers now: queued cells cancelled, running ones ended by SIGTERM (each
    cleans up), then waited for (SIGKILL after STOP_SECONDS)."""
    # ProcessPoolExecutor's own processes: a private attribute (since Python 3.2) because no public
    # call ends running workers before 3.14's terminate_workers.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    if not processes and hasattr(pool, "terminate_workers"):
        pool.terminate_workers()
        return
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def _on_terminate(signum: int, frame: Any) -> None:
    signal.alarm(UNWIND_SECONDS)
    raise Stopped


def _death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent dies; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(POLL_SECONDS)
    os.kill(os.getpid(), signal.SIGTERM)
