"""Regenerate the README's generated tables from the code that owns them.

    python scripts/readme_tables.py          rewrite README.md in place
    python scripts/readme_tables.py --check  exit 1 (naming the table) if README.md is stale

Each table sits between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->``;
everything outside the markers is left alone. tests/core/test_facts.py runs the check.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from kvoffload.core.fixes import fix_flags_markdown
from kvoffload.metrics import glossary_markdown
from kvoffload.releases import FULL_WORKLOADS, SMALL_WORKLOADS, releases_markdown

README = Path(__file__).resolve().parents[1] / "README.md"
RELEASE_TABLE = README.parent / "results" / "releases" / "releases.json"  # kvoffload releases writes it
TABLES = {"fix-flags": fix_flags_markdown, "metrics": glossary_markdown,
          "releases": lambda: releases_markdown(json.loads(RELEASE_TABLE.read_text()), SMALL_WORKLOADS),
          "releases-full": lambda: releases_markdown(json.loads(RELEASE_TABLE.read_text()), FULL_WORKLOADS)}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated: {name} -->\n)(.*?)(<!-- end generated: {name} -->)", re.S)


def render(text: str) -> str:
    """``text`` with every generated table replaced by what the code generates now."""
    for name, generate in TABLES.items():
        pattern = _pattern(name)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no '<!-- generated: {name} -->' section")
        text = pattern.sub(lambda m: m.group(1) + generate() + "\n" + m.group(3), text)
    return text


def stale_tables(text: str) -> list[str]:
    return [name for name, generate in TABLES.items()
            if (m := _pattern(name).search(text)) is None or m.group(2) != generate() + "\n"]


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    if argv == ["--check"]:
        stale = stale_tables(text)
        if stale:
            print(f"README.md is stale: {', '.join(stale)} (run python scripts/readme_tables.py)", file=sys.stderr)
            return 1
        return 0
    if argv:
        print("usage: python scripts/readme_tables.py [--check]", file=sys.stderr)
        return 2
    README.write_text(render(text), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
