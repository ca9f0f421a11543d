"""One rule for the whole suite: no test can hang.

Every test runs under a wall-clock bound (``KVOFFLOAD_TEST_TIMEOUT`` seconds, default 300; 0
turns it off). A test that runs past it fails with ``TestTimedOut`` and the run stops there: a
stuck replay costs one failed test and five minutes at most, not the CI job. A plain ``signal.alarm``
(POSIX, main thread) rather than a plugin: no new dependency. The alarm re-arms every few
seconds after it fired, so code that catches the first error and carries on is interrupted again
rather than left to hang.

A property test (hypothesis) is bounded per example instead: each example gets the whole bound,
and one that runs past it fails with ``ExampleTimedOut``, an ordinary exception, so hypothesis
reports (and shrinks) it as the failing example. A bound on the whole test would cut a long
search (the nightly fuzz profile) at an arbitrary point inside hypothesis's own machinery, where
an exception is an INTERNALERROR, not a failing example (issue 22). Hypothesis bounds the rest:
``max_examples`` examples, and at most five minutes of shrinking.
"""

from __future__ import annotations

import functools
import os
import signal
import threading

import pytest

TEST_TIMEOUT_S = int(os.environ.get("KVOFFLOAD_TEST_TIMEOUT", "300"))
REARM_S = 5


class TestTimedOut(BaseException):
    """A test ran past the suite's bound (BaseException: no `except Exception` in the code under
    test may swallow it)."""

    __test__ = False  # not a test class, despite its name


class ExampleTimedOut(Exception):
    """One example of a property test ran past the bound (an Exception: hypothesis's failure)."""


@pytest.fixture(autouse=True)
def _no_test_can_hang(request):
    if TEST_TIMEOUT_S <= 0 or not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return
    nodeid = request.node.nodeid
    hypothesis_handle = getattr(getattr(request, "function", None), "hypothesis", None)
    per_example = hypothesis_handle is not None

    def expire(signum, frame):
        signal.alarm(REARM_S)
        request.session.shouldstop = f"{nodeid} hung (over {TEST_TIMEOUT_S} s): run stopped"
        if per_example:
            raise ExampleTimedOut(f"an example of {nodeid} ran past {TEST_TIMEOUT_S} s (KVOFFLOAD_TEST_TIMEOUT)")
        raise TestTimedOut(f"{nodeid} ran past {TEST_TIMEOUT_S} s (KVOFFLOAD_TEST_TIMEOUT)")

    previous = signal.signal(signal.SIGALRM, expire)
    if per_example:  # hypothesis calls inner_test once per example (its documented wrapping point)
        inner = hypothesis_handle.inner_test

        @functools.wraps(inner)
        def one_bounded_example(*args, **kwargs):
            signal.alarm(TEST_TIMEOUT_S)
            try:
                return inner(*args, **kwargs)
            finally:
                signal.alarm(0)

        hypothesis_handle.inner_test = one_bounded_example
    else:
        signal.alarm(TEST_TIMEOUT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        if per_example:
            hypothesis_handle.inner_test = inner
