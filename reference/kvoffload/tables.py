"""One table in the four formats ``compare`` and ``gate`` write (``--format text|json|csv|markdown``).

A table is a header, its rows as values (numbers, None, strings: what ``json`` and ``csv`` keep)
and the same rows as shown to a reader (what ``text`` and ``markdown`` print), plus the facts
around it (``meta``: which files, which commit; ``notes``: the verdict line). ``csv`` is the rows
only, so that a spreadsheet reads it as it is; ``json`` is ``meta`` with the rows as objects.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Sequence

FORMATS = ("text", "json", "csv", "markdown")


def render(fmt: str, header: Sequence[str], rows: Sequence[Sequence[Any]], shown: Sequence[Sequence[str]],
           meta: dict[str, Any] | None = None, notes: Sequence[str] = (), right: Sequence[int] = ()) -> str:
    """The table in ``fmt``; ``right`` lists the columns a text table aligns to the right (numbers)."""
    if fmt == "json":
        return json.dumps({**(meta or {}), "rows": [dict(zip(header, row)) for row in rows]}, indent=2)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(["" if cell is None else cell for cell in row] for row in rows)
        return buffer.getvalue().rstrip("\n")
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i in right else "---"
                                                               for i in range(len(header))) + "|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in shown]
        return "\n".join(lines + [""] + [f"{note}  " for note in notes]).rstrip()
    if fmt != "text":
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    table = [list(header), *[list(row) for row in shown]]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                       for i, cell in enumerate(line)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines + ([""] + list(notes) if notes else []))
