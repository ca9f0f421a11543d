"""The parser, the dispatch to one command module, and the mapping of errors to exit codes."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Sequence

from kvoffload.cli import bench, compare, gate, info, releases, run, sweep
from kvoffload.cli.flags import BAD_INPUT, UsageError

# Each module's register(subparsers) adds its subcommand(s), in this order in --help.
COMMANDS = (run, bench, sweep, info, compare, gate, releases)



class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    from kvoffload import __version__
    from kvoffload.cli import __doc__ as doc

    parser = _Parser(prog="kvoffload", description=doc.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvoffload {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND",
                                help="one of these; kvoffload COMMAND --help for its options")
    for module in COMMANDS:
        module.register(sub)
    return parser


def dispatch(argv: Sequence[str] | None = None) -> int:
    survive_any_encoding()
    try:
        for text in sys.argv[1:] if argv is None else argv:
            if "\0" in text:  # no path or value can hold one (a shell cannot pass one; a caller can)
                raise UsageError(f"argument {text!r}: holds a NUL byte")
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except BrokenPipeError:  # output piped into `head`: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except BAD_INPUT as error:
        message = str(error).splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"kvoffload: error: {shorten(message)}", file=sys.stderr)
        return 2


def survive_any_encoding() -> None:
    """A workload name, a path or a label may hold any character; a terminal or pipe that takes
    ASCII only (``PYTHONIOENCODING=ascii``, ``LANG=C`` on an old Python) gets it as ``\\u00e9``
    instead of a UnicodeEncodeError after the result was written."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a closed or detached stream: nothing will be printed to it
                pass


LONGEST_WORD = 256  # characters of one value echoed in an error line (a path, a --set value)


def shorten(message: str) -> str:
    """``message`` with each run of more than LONGEST_WORD non-blank characters cut in the middle:
    a 5,000-digit --set value stays one readable line, its start and end still shown."""
    return re.sub(r"\S{%d,}" % (LONGEST_WORD + 1),
                  lambda match: f"{match[0][:160]}...({len(match[0]):,} characters)...{match[0][-60:]}", message)
