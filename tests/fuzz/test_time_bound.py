"""The suite's time bound (tests/conftest.py) as a property test meets it: per example.

Each story runs a small test file in a pytest of its own (a subprocess: the alarm needs the main
thread) with the suite's conftest and a 2-second bound. Issue 22: the nightly fuzz profile, whose
search runs far past any whole-test bound, died in an INTERNALERROR when the alarm fired inside
hypothesis's own code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

SUITE_CONFTEST = (Path(__file__).parents[1] / "conftest.py").read_text()

PROPERTY_TESTS = '''
import time
from hypothesis import given, settings, strategies as st

@settings(max_examples=30, deadline=None, database=None, derandomize=True)
@given(st.integers(0, 10**6))
def test_quick_examples_that_add_up_past_the_bound(n):
    time.sleep(0.1)

@settings(max_examples=50, deadline=None, database=None, derandomize=True)
@given(st.integers(0, 10))
def test_one_example_hangs(n):
    if n == 7:
        time.sleep(60)
'''


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.setenv("KVOFFLOAD_TEST_TIMEOUT", "2")
    pytester.makeconftest(SUITE_CONFTEST)
    pytester.makepyfile(test_property=PROPERTY_TESTS)
    return pytester


def test_a_search_longer_than_the_bound_passes(suite):
    result = suite.runpytest_subprocess("-k", "add_up", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1)


def test_an_example_that_hangs_is_the_failing_example_not_an_internal_error(suite):
    result = suite.runpytest_subprocess("-k", "hangs", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "INTERNALERROR" not in output
    assert "ExampleTimedOut: an example of test_property.py::test_one_example_hangs ran past 2 s" in output
    assert "n=7," in output  # hypothesis's falsifying example, shrunk to the one that hangs
