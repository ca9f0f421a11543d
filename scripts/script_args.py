"""The argument parser of the project's Python scripts: the contract every command keeps.

argparse prints its usage block and the error (two lines or more) and exits 2; a script of this
project says what was wrong in exactly one stderr line, exit 2, before any work (docs/design.md).
The scripts put this folder on ``sys.path`` and build their parser from :class:`StrictParser`.
"""

from __future__ import annotations

import argparse
import sys


class StrictParser(argparse.ArgumentParser):
    """An ArgumentParser whose every refusal (an unknown or extra argument, a missing value, a
    value of the wrong type) is one line on stderr and exit 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --rep for --repeats is a guess, not a name
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value
