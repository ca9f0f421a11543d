"""Ctrl-C that nothing swallows.

Python raises KeyboardInterrupt wherever the main thread happens to be when SIGINT arrives, and
that may be a finaliser (``__del__``, a weakref callback: matplotlib's figures have many, and
importlib's module locks), where an exception is printed as "Exception ignored" and dropped; the
command then ran on to exit 0. Or a library turns it into another error (numpy's import into an
ImportError: exit 1 with a traceback). While the command line runs (``handling_ctrl_c``, from
its first import), SIGINT also records that it came; every file write checks the record first
(``results.atomic_output`` calls :func:`check`), and so does the command line when the command
returns or fails: a Ctrl-C dropped or disguised once still ends the command with 130.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

_came = threading.Event()  # set by the handler (the main thread); read anywhere


def _on_sigint(signum, frame) -> None:
    _came.set()
    raise KeyboardInterrupt


def check() -> None:
    """KeyboardInterrupt if a Ctrl-C came while a command ran, whoever caught the first one."""
    if _came.is_set():
        raise KeyboardInterrupt


def came() -> bool:
    return _came.is_set()


@contextlib.contextmanager
def handling_ctrl_c() -> Iterator[None]:
    """Record every Ctrl-C for the block's duration (main thread, where SIGINT has Python's
    default handler; a SIGINT the shell ignores, a background job's, stays ignored); the handler
    before it is restored after it."""
    _came.clear()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
