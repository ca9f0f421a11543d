"""Regenerate the generated tables of the README and the docs pages from what owns them.

    python scripts/readme_tables.py          rewrite the pages in place
    python scripts/readme_tables.py --check  exit 1 (naming the page and table) if one is stale

Each table sits between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->`` in the
one page that holds it (``TABLES``); everything outside the markers is left alone. The code owns
the fix flags and the glossary; the committed results own the measured tables (the bench
summary in ``results/runs/``, the release table in ``results/releases/``), whose writers
(``benchmarks/publish``) run this script after them. tests/core/test_facts.py runs the check.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from kvoffload.bench_figures import at_a_glance_markdown, fix_moves_markdown
from kvoffload.core.fixes import fix_flags_markdown
from kvoffload.metrics import glossary_markdown
from kvoffload.releases import releases_markdown
from kvoffload.workloads.bundled import DENSE_WORKLOADS, HYBRID_WORKLOADS, small

ROOT = Path(__file__).resolve().parents[1]
RELEASE_TABLE = ROOT / "results" / "releases" / "releases.json"  # kvoffload releases writes it
BENCH_SUMMARY = ROOT / "results" / "runs" / "bench-summary.json"  # kvoffload bench (benchmarks/publish)
BENCH_REFERENCE_RUN = ROOT / "results" / "runs" / "bench-multi-turn-reference.json"  # its provenance


def _bench_summary() -> dict:
    return json.loads(BENCH_SUMMARY.read_text(encoding="utf-8"))


def _glance() -> str:
    commit = json.loads(BENCH_REFERENCE_RUN.read_text(encoding="utf-8"))["provenance"]["commit"]
    date = subprocess.run(["git", "show", "-s", "--format=%cs", commit], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip() or "date unknown"
    return at_a_glance_markdown(_bench_summary(), commit, date)


# table -> (the page that holds it, what generates it)
TABLES = {
    "at-a-glance": ("README.md", _glance),
    "fix-flags": ("docs/fixes.md", fix_flags_markdown),
    "fix-moves": ("docs/fixes.md", lambda: fix_moves_markdown(_bench_summary())),
    "metrics": ("docs/metrics.md", glossary_markdown),
    # the dense workloads' rows; the hybrid ones' are in docs/hybrid.md (releases-hybrid)
    "releases": ("docs/releases.md", lambda: releases_markdown(json.loads(RELEASE_TABLE.read_text()),
                                                               tuple(small(name) for name in DENSE_WORKLOADS))),
    "releases-full": ("docs/releases.md",
                      lambda: releases_markdown(json.loads(RELEASE_TABLE.read_text()), DENSE_WORKLOADS)),
    # the hybrid workloads' rows the committed table holds (those measured at some commit)
    "releases-hybrid": ("docs/hybrid.md",
                        lambda: releases_markdown(json.loads(RELEASE_TABLE.read_text()),
                                                  (*HYBRID_WORKLOADS, *(small(name) for name in HYBRID_WORKLOADS)))),
}
PAGES = tuple(dict.fromkeys(page for page, _ in TABLES.values()))


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated: {name} -->\n)(.*?)(<!-- end generated: {name} -->)", re.S)


def render(page: str, text: str) -> str:
    """``text`` of ``page`` with each of its generated tables replaced by what is generated now."""
    for name, (home, generate) in TABLES.items():
        if home != page:
            continue
        pattern = _pattern(name)
        if not pattern.search(text):
            raise SystemExit(f"{page} has no '<!-- generated: {name} -->' section")
        text = pattern.sub(lambda m: m.group(1) + generate() + "\n" + m.group(3), text)
    return text


def read_pages() -> dict[str, str]:
    return {page: (ROOT / page).read_text(encoding="utf-8") for page in PAGES}


def stale_tables(pages: dict[str, str]) -> list[str]:
    """The tables whose text in ``pages`` (page -> text) differs from what is generated now."""
    stale = []
    for name, (page, generate) in TABLES.items():
        match = _pattern(name).search(pages[page])
        if match is None or match.group(2) != generate() + "\n":
            stale.append(name)
    return stale


def main(argv: list[str]) -> int:
    pages = read_pages()
    if argv == ["--check"]:
        stale = stale_tables(pages)
        if stale:
            named = ", ".join(f"{TABLES[name][0]} ({name})" for name in stale)
            print(f"stale generated tables: {named} (run python scripts/readme_tables.py)", file=sys.stderr)
            return 1
        return 0
    if argv:
        print("usage: python scripts/readme_tables.py [--check]", file=sys.stderr)
        return 2
    for page, text in pages.items():
        (ROOT / page).write_text(render(page, text), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
