"""Every path and section the documentation cites exists.

The README and the pages under docs/ point at files (``docs/engine.md``, ``reference/kvoffload/
workloads/limits.py``, a link ``[engine](docs/engine.md#the-watchdog)``) and at sections by name
(``docs/engine.md, "Resetting the caches"``); comments in the code point at the same sections.
A file moved or a heading renamed leaves such a pointer dangling without anything failing; these
tests make it fail, naming the file and line of the stale reference.

What counts as a section: a heading of the cited file, named in full or up to its first " (" or
":" (``"Finish order"`` for "Finish order: vLLM's stock connector depends on the string hash
seed"), or the bold lead of a paragraph (``**CI and GPU runners.**``). Case is ignored.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The prose that cites: the front door, the topic pages and the folders' own READMEs (results/
# holds generated pages, which cite nothing by hand).
MARKDOWN_GLOBS = ("README.md", "docs/**/*.md", "benchmarks/README.md", "tests/**/README.md", "workloads/**/*.md")
# Code and scripts cite docs sections in comments and docstrings.
CODE_GLOBS = ("reference/**/*.py", "tests/**/*.py", "benchmarks/*", "scripts/**/*", ".ci/*")
# The documents a section citation can name, by the names the prose uses for them.
CITABLE = r"(?:docs/[\w-]+\.md|[\w-]+\.md|README(?:\.md)?|benchmarks/README\.md|tests/gates/README\.md|workloads/README\.md)"
SECTION_CITE = re.compile(rf"({CITABLE})`{{0,2}}(?:,| \(|, \(| section|'s| ) ?\"([^\"\n]{{2,90}})\"")
DOC_FILE = re.compile(r"(?<![\w/.-])((?:docs|benchmarks|tests/gates|workloads)/[\w/-]*\.md)\b")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
BACKTICKED = re.compile(r"`([^`\s]+)`")
# A backticked token names a repository path when it has a folder and one of these endings.
PATH_LIKE = re.compile(r"^[\w.-]+(?:/[\w.-]+)+(?:\.(?:py|md|toml|json|jsonl|yml|yaml|csv|png|html|tsv|txt|cfg)|/)$")
# Paths that name what a command writes, an example, or another project's file, not a file of
# this repository: command outputs, CI's screenshots, a GPU runner's future asv folder, the
# Mooncake repository's trace.
NOT_REPOSITORY = ("out/", "gpu-runs/", ".venv", "path/to/", "my_pkg", "/tmp/", "~/", "DIR/", "FILE",
                  ".ci/screenshots/", "results/asv/h200-pcie5/", "FAST25-release/")
# vLLM's own files are cited from its package root (``vllm/v1/core/sched/scheduler.py``) or from
# a folder the sentence names (``offloading/scheduler.py`` under kv_connector/v1/): a token that is
# no path here and starts with one of vLLM's folders is vLLM's.
VLLM_FOLDERS = ("vllm/", "v1/", "config/", "distributed/", "kv_connector/", "offloading/", "cpu/", "kv_offload/")


def tracked_files() -> set[str]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split("\n")
    return {line for line in listed if line}


FILES = tracked_files()
FOLDERS = {str(Path(f).parent) + "/" for f in FILES} | {str(p) + "/" for f in FILES for p in Path(f).parents}


def documents(globs) -> list[Path]:
    found = {path for pattern in globs for path in ROOT.glob(pattern)
             if path.is_file() and str(path.relative_to(ROOT)) in FILES}
    return sorted(found)


def resolve_document(name: str, citing: Path) -> Path | None:
    """The markdown file a citation names: README -> README.md; a bare ``engine.md`` next to the
    citing page or under docs/."""
    name = "README.md" if name == "README" else name
    for base in (ROOT, citing.parent, ROOT / "docs"):
        if (base / name).is_file():
            return base / name
    return None


def heading_names(path: Path) -> set[str]:
    names = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence:
            continue
        heading = re.match(r"^#{1,6} (.+?)\s*$", line)
        if heading:
            text = heading.group(1).replace("`", "").strip().lower()
            names.add(text)
            names.add(re.split(r" \(|:", text)[0].strip())
        lead = re.match(r"^\s*(?:[-*] )?\*{1,2}([^*\n]+?)\*{1,2}", line)
        if lead:
            text = lead.group(1).replace("`", "").strip().rstrip(".").lower()
            names.add(text)
            names.add(re.split(r" \(|:", text)[0].strip())
    return names


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+?)\s*$", path.read_text(encoding="utf-8"), re.M)}


def shown(path: Path) -> str:
    """The path as a message names it: from the repository root when it is inside."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return path.name


def lines_of(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return
    for number, line in enumerate(text.splitlines(), 1):
        yield number, line


def stale_section_citations(paths) -> list[str]:
    stale = []
    for path in paths:
        for number, line in lines_of(path):
            for cited, section in SECTION_CITE.findall(line):
                document = resolve_document(cited, path)
                where = f"{shown(path)}:{number}"
                if document is None:
                    stale.append(f"{where}: {cited} does not exist")
                elif section.replace("`", "").strip().lower() not in heading_names(document):
                    stale.append(f"{where}: {cited} has no section {section!r}")
    return stale


def stale_document_names(paths) -> list[str]:
    stale = []
    for path in paths:
        for number, line in lines_of(path):
            for name in DOC_FILE.findall(line):
                if name not in FILES and resolve_document(name, path) is None:
                    stale.append(f"{shown(path)}:{number}: {name} does not exist")
    return stale


def stale_links_and_paths(paths) -> list[str]:
    stale = []
    for path in paths:
        in_fence = False
        for number, line in lines_of(path):
            where = f"{shown(path)}:{number}"
            if line.startswith("```"):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                linked = (path.parent / file_part).resolve() if file_part else path
                if not linked.exists():
                    stale.append(f"{where}: link to {target} (no such file)")
                elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                    stale.append(f"{where}: link to {target} (no such section)")
            for token in BACKTICKED.findall(line):
                if not PATH_LIKE.match(token) or any(part in token for part in NOT_REPOSITORY):
                    continue
                if not any_path_exists(token, path) and not token.startswith(VLLM_FOLDERS):
                    stale.append(f"{where}: `{token}` does not exist")
    return stale


def any_path_exists(token: str, citing: Path) -> bool:
    """Paths are written from the repository root, from the package (``kvoffload/vllm/rows.py``,
    ``core/stores.py``) or from the citing file's folder."""
    citing_dir = shown(citing.parent) if citing.parent != ROOT else ""
    bases = ("", "reference/", "reference/kvoffload/", citing_dir + "/" if citing_dir else "")
    for base in bases:
        candidate = base + token
        if candidate in FILES or candidate in FOLDERS or (token.endswith("/") and candidate in FOLDERS):
            return True
    return False


def citing_files() -> list[Path]:
    """The docs and the code, less this file (its planted examples are stale on purpose)."""
    found = dict.fromkeys(documents(MARKDOWN_GLOBS) + documents(CODE_GLOBS))
    return [path for path in found if path != Path(__file__).resolve()]


def test_every_cited_section_exists():
    stale = stale_section_citations(citing_files())
    assert not stale, "stale section citations:\n" + "\n".join(stale)


def test_every_cited_document_exists():
    stale = stale_document_names(citing_files())
    assert not stale, "documents that do not exist:\n" + "\n".join(stale)


def test_every_link_and_path_of_the_docs_exists():
    stale = stale_links_and_paths(documents(MARKDOWN_GLOBS))
    assert not stale, "stale links or paths:\n" + "\n".join(stale)


@pytest.mark.parametrize("planted, expected", [
    ('see docs/engine.md, "Resetting the cache" there', "docs/engine.md has no section 'Resetting the cache'"),
    ('see docs/design.md, "One engine step" there', "docs/design.md has no section 'One engine step'"),
    ("see docs/engines.md for more", "docs/engines.md does not exist"),
])
def test_a_stale_citation_is_named(tmp_path, planted, expected):
    """The checks name the two kinds of stale pointer a docs move leaves behind in code."""
    citing = tmp_path / "module.py"
    citing.write_text(f"# {planted}\n", encoding="utf-8")
    found = stale_section_citations([citing]) + stale_document_names([citing])
    assert [line.split(": ", 1)[1] for line in found] == [expected]


def test_a_stale_link_and_a_stale_path_are_named(tmp_path):
    (tmp_path / "engine.md").write_text((ROOT / "docs" / "engine.md").read_text(encoding="utf-8"), encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("See [the watchdog](engine.md#the-watchdog), [it](engine.md#the-watchdogs) and "
                    "`reference/kvoffload/core/store.py`, not `reference/kvoffload/core/stores.py`.\n",
                    encoding="utf-8")
    assert stale_links_and_paths([page]) == ["page.md:1: link to engine.md#the-watchdogs (no such section)",
                                             "page.md:1: `reference/kvoffload/core/store.py` does not exist"]


def test_the_module_map_names_every_module_script_and_benchmark():
    """docs/modules.md is the complete map: every module of the package (by its path inside
    ``reference/kvoffload/``), every package, every file of ``scripts/`` and ``benchmarks/``."""
    text = (ROOT / "docs" / "modules.md").read_text(encoding="utf-8")
    package = "reference/kvoffload/"
    wanted = set()
    for name in FILES:
        if name.startswith(package) and name.endswith(".py"):
            inside = name[len(package):]
            folder = str(Path(inside).parent)
            if folder != ".":
                wanted.add(folder + "/")
            if Path(inside).name not in ("__init__.py", "__main__.py") or folder == ".":
                wanted.add(inside)
        elif name.startswith(("scripts/", "benchmarks/")) and not name.endswith(("README.md", "/__init__.py")):
            wanted.add(name)
    wanted.add("benchmarks/__init__.py")  # the suite's conventions live in its docstring
    missing = sorted(path for path in wanted if f"`{path}`" not in text and f"`{package}{path}`" not in text)
    assert not missing, "docs/modules.md does not name: " + ", ".join(missing)


def test_the_readme_test_command_is_what_ci_runs():
    """The Quickstart's second command is CI's (``.ci/run``): a reader who runs it runs CI's tests."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = "./scripts/setup && .venv/bin/python -m pytest -q"
    assert command in ci.splitlines()
    quickstart = (ROOT / "README.md").read_text(encoding="utf-8").split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    assert any(line.startswith(command + " ") or line == command for line in quickstart.splitlines())
