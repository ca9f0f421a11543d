"""One rule for the whole suite: no test can hang.

Every test runs under a wall-clock bound (``KVOFFLOAD_TEST_TIMEOUT`` seconds, default 300; 0
turns it off). A test that runs past it fails with ``TestTimedOut`` and the run stops there: a
stuck replay costs one failed test and five minutes at most, not the CI job. A plain ``signal.alarm``
(POSIX, main thread) rather than a plugin: no new dependency. The alarm re-arms every few
seconds after it fired, so a framework that catches the first error and retries (hypothesis
shrinking a failing example) is interrupted again rather than left to hang.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

TEST_TIMEOUT_S = int(os.environ.get("KVOFFLOAD_TEST_TIMEOUT", "300"))
REARM_S = 5


class TestTimedOut(BaseException):
    """A test ran past the suite's bound (BaseException: no `except Exception` in the code under
    test, nor hypothesis, may swallow it)."""

    __test__ = False  # not a test class, despite its name


@pytest.fixture(autouse=True)
def _no_test_can_hang(request):
    if TEST_TIMEOUT_S <= 0 or not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        signal.alarm(REARM_S)
        request.session.shouldstop = f"{request.node.nodeid} hung (over {TEST_TIMEOUT_S} s): run stopped"
        raise TestTimedOut(f"{request.node.nodeid} ran past {TEST_TIMEOUT_S} s (KVOFFLOAD_TEST_TIMEOUT)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TEST_TIMEOUT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
