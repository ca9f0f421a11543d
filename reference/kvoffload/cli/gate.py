"""``kvoffload gate``: this tree's deterministic metrics against the committed baseline.

The rules live in ``kvoffload.gate``; this module only parses the flags.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvoffload.cli.flags import Once, OnceTrue, UsageError
from kvoffload.cli.outputs import check_output_file
from kvoffload.tables import FORMATS


def register(sub) -> None:
    gate = sub.add_parser("gate", help="this tree's metrics against the committed baseline (regression gate)")
    gate.add_argument("--baseline", action=Once, metavar="FILE|REF",
                      help="baseline file, or a git ref holding results/gate/baseline.json (default: that "
                           "file in this tree; with --update, the file to write)")
    gate.add_argument("--update", action=OnceTrue, help="rewrite the baseline from this tree instead")
    gate.add_argument("--strict", action=OnceTrue, help="measured numbers beyond their factor fail too")
    gate.add_argument("--machine", action=Once,
                      help="this machine's name for measured numbers (default $KVOFFLOAD_MACHINE, else the host name)")
    gate.add_argument("--repeats", action=Once, type=int, default=1,
                      help="replays per run (the committed baseline uses 3 to measure the spread)")
    gate.add_argument("--override-reason", action=Once, metavar="TEXT",
                      help="with --update: write the baseline even where it blesses must-be-0 numbers above 0 (or "
                           "worse than before), recording TEXT and those numbers in it; a reviewed exception only")
    gate.add_argument("--format", action=Once, choices=FORMATS, default="text",
                      help="the comparison as text (default), json, csv (the rows only) or markdown; each row "
                           "labelled better / worse / info by the glossary's direction")
    gate.set_defaults(handler=_cmd_gate)


def _cmd_gate(args: argparse.Namespace) -> int:
    from kvoffload.gate import BASELINE, SCHEMA, run_gate

    if args.override_reason is not None:
        if not args.update:
            raise UsageError("--override-reason applies to --update (it is recorded in the baseline it writes)")
        if not args.override_reason.strip() or "\n" in args.override_reason:
            raise UsageError("--override-reason needs a reason: one line of text saying why")
    if args.update:
        if args.format != "text":
            raise UsageError(f"--format {args.format} formats the comparison; --update compares nothing")
        # The file to write is checked before the replays: a FIFO, a folder or a missing folder
        # found only when the baseline is written would waste them (and a FIFO would block).
        check_output_file("--baseline", Path(args.baseline) if args.baseline else BASELINE, create_parents=True,
                          kind=SCHEMA)
    return run_gate(baseline=args.baseline, update=args.update, strict=args.strict, machine=args.machine,
                    repeats=args.repeats, fmt=args.format, override_reason=args.override_reason)
