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

import signal
import sys

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process killed by Ctrl-C


def main(argv: "list[str] | None" = None) -> int:
    """Run one command; ``argv`` None means this process's command line (the console script)."""
    try:
        from kvoffload.cli.app import dispatch

        code = dispatch(argv)
    except KeyboardInterrupt:
        code = interrupted()
    if argv is None:
        # The work is done and its files are whole: a Ctrl-C from here on would only turn into a
        # traceback from torch's clean-up at interpreter exit, so it is ignored.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


def interrupted() -> int:
    try:
        print("kvoffload: interrupted", file=sys.stderr)
    except (KeyboardInterrupt, OSError):  # a second Ctrl-C, or stderr gone: the exit code says it
        pass
    return INTERRUPTED


__all__ = ["INTERRUPTED", "main"]
