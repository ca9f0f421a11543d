"""The ``kvoffload`` command line.

Exit codes: 0 success; 1 the run failed (a connector crash: the result file records it);
2 bad input (usage, flags, workload file or trace, --set key or value, output path): one line
naming what was wrong, nothing written; 130 interrupted (Ctrl-C): one line, nothing half-written.

Layout: ``app`` (the parser, dispatch and the exit-code mapping), ``flags`` (argparse actions
that refuse a repeated flag), ``outputs`` (every output path checked before any work), one
module per command (``run``, ``bench``, ``sweep``, ``info``). A new command is a module with a
``register(subparsers)`` function, listed in ``app.COMMANDS``.

This module imports nothing heavy: torch loads inside ``main``, so a Ctrl-C in the first
seconds is caught like any other.
"""

from __future__ import annotations

import os
import signal
import sys

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process killed by Ctrl-C
# Set by a script whose steps are kvoffload commands (benchmarks/publish): each dies when the
# script dies, SIGKILL included, instead of running on as an orphan (issue 31's fault trials; its
# temporary files are removed by the next writer: results.remove_left_overs).
DIE_WITH_PARENT = "KVOFFLOAD_DIE_WITH_PARENT"


def main(argv: "list[str] | None" = None) -> int:
    """Run one command; ``argv`` None means this process's command line (the console script)."""
    from kvoffload import interrupts

    if argv is None and os.environ.get(DIE_WITH_PARENT) == "1":  # a script's step: it dies with the script
        from kvoffload.release_io import parent_death_guard

        guard = parent_death_guard(os.getppid())
        if guard is not None:
            guard()
    try:
        with interrupts.handling_ctrl_c():  # from the first import on: kvoffload/interrupts.py
            try:
                from kvoffload.cli.app import dispatch

                code = dispatch(argv)
            except Exception:
                interrupts.check()  # an error a Ctrl-C caused (numpy's import turns one into an ImportError)
                raise
            interrupts.check()  # a Ctrl-C a finaliser swallowed: the files are whole, the exit is 130
    except KeyboardInterrupt:
        code = interrupted()
    if argv is None:
        # The work is done and its files are whole: a Ctrl-C from here on would only turn into a
        # traceback from torch's clean-up at interpreter exit, so it is ignored.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if code == INTERRUPTED and not _resource_tracker_started():
            # Interrupted, everything of ours unwound: exit now. An interrupt that came while a
            # library ran Python code from C during its import leaves CPython's flag for "an
            # unhandled KeyboardInterrupt" set, handled or not, and the interpreter then killed
            # itself with SIGINT at exit (status -2, not 130) or aborted in torch's clean-up
            # (issue 31's fault trials: 6 of 30 Ctrl-Cs in the first second of a report).
            # os._exit skips the exit functions: multiprocessing's are run first, or a parallel
            # sweep's semaphores were never unregistered and its resource tracker warned of them
            # on stderr after our one line (found by the nightly CLI fuzz).
            multiprocessing_util = sys.modules.get("multiprocessing.util")
            if multiprocessing_util is not None:
                multiprocessing_util._exit_function()  # registered with atexit by multiprocessing itself
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(code)
    return code


def _resource_tracker_started() -> bool:
    """Whether multiprocessing started its resource tracker here (a parallel sweep's pool). Such a
    process exits the interpreter's way even when interrupted: skipping the interpreter's shutdown
    (os._exit) left the pool's semaphores registered about one time in ten however the exit
    functions were run first, and the tracker then warned of them on stderr after our one line
    (tests/sweep/test_sweep_processes.py, Ctrl-C while the workers start)."""
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    return tracker is not None and getattr(getattr(tracker, "_resource_tracker", None), "_pid", None) is not None


def interrupted() -> int:
    try:
        print("kvoffload: interrupted", file=sys.stderr)
    except (KeyboardInterrupt, OSError):  # a second Ctrl-C, or stderr gone: the exit code says it
        pass
    return INTERRUPTED


__all__ = ["INTERRUPTED", "main"]
