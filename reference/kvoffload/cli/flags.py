"""Flags that may be given once: a repeated ``--preset`` is an error, not a silent choice.

argparse keeps the last of a repeated option; a user who typed two presets (or pasted a command
line twice) then gets a run they did not ask for. :class:`Once` and :class:`OnceTrue` record
which destinations the command line set and refuse a second setting; :class:`Each` collects a
repeatable flag but refuses the same value twice.
"""

from __future__ import annotations

import argparse

from kvoffload.core.types import ConfigError
from kvoffload.results import ResultError
from kvoffload.workloads import WorkloadError


class UsageError(Exception):
    """Bad command line: printed as one line, exit code 2."""


# Everything that means "the input was wrong": one line, exit 2 (cli/app.py; run.py holds vLLM's
# import-time warnings back until it knows the verdict is not one of these).
BAD_INPUT = (UsageError, WorkloadError, ConfigError, ResultError, OSError)


def _given(namespace: argparse.Namespace) -> dict[str, object]:
    given = getattr(namespace, "_given", None)
    if given is None:
        given = {}
        setattr(namespace, "_given", given)
    return given


class Once(argparse.Action):
    """Store a value; a second occurrence of the flag is an error naming both values."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = _given(namespace)
        if self.dest in given:
            raise argparse.ArgumentError(
                self, f"given twice ({given[self.dest]!s} and {values!s}): give it once")
        given[self.dest] = values
        setattr(namespace, self.dest, values)


class OnceTrue(argparse.Action):
    """A switch (store_true) that may appear once."""

    def __init__(self, option_strings, dest, default=False, required=False, help=None):
        super().__init__(option_strings, dest, nargs=0, const=True, default=default, required=required,
                         help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        given = _given(namespace)
        if self.dest in given:
            raise argparse.ArgumentError(self, "given twice: give it once")
        given[self.dest] = True
        setattr(namespace, self.dest, True)


class Each(argparse.Action):
    """Append to a list (``--disable-fix A --disable-fix B``); the same value twice is an error."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = list(getattr(namespace, self.dest, None) or [])
        if values in items:
            raise argparse.ArgumentError(self, f"{values!s} given twice: give it once")
        items.append(values)
        setattr(namespace, self.dest, items)
