"""The index pages of a report: ``index.html`` (figures inline) and ``index.md`` (same content).

A table of contents first, then one section per question a reader brings (``figures.SECTIONS``:
did this commit regress? what does each fix buy? what did each release lose?), each chart with
its caption, a link to its data (the CSV beside it) and the provenance of its points. In the
HTML page, a history chart names the commit under the pointer (a tooltip per commit slot).
Both pages are written whole or not at all.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from kvoffload.metrics import format_value
from kvoffload.report.figures import SECTIONS, Chart, label_order
from kvoffload.report.sources import RunFile
from kvoffload.results import atomic_output

# What each section answers, under its heading.
SECTION_INTROS = {
    SECTIONS[0]: "The asv history of every tracked number along main, newest right: a step up at the newest "
                 "commit is a regression, unless a dashed line marks an intended change there.",
    SECTIONS[1]: "The reference with every fix, the reference with each fix flag off in turn, and each vLLM "
                 "release preset, on the same workload and configuration: what a fix's bar loses when it is "
                 "off is what the fix buys.",
    SECTIONS[2]: "The release presets against the reference: store delays and hit rate against CPU capacity "
                 "(the presets' bars of the ablation charts are under the previous question).",
}

SUMMARY_METRICS = ("last_block_hit_rate", "last_chunk_offloaded_rate", "offload_hit_rate", "poisoned_loads",
                   "lifecycle_violations", "crashes", "store_submit_delay_steps_p50", "store_visible_delay_steps_p99",
                   "tokens_per_s_modeled")


@dataclass
class Page:
    source: Path
    charts: list[Chart] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # sections skipped, and why
    ignored: list[str] = field(default_factory=list)  # 'path: reason' of malformed result files
    runs: Sequence[RunFile] = ()
    # under the first question: what moved at the newest commit (report.moves): a sentence, a table
    moves: tuple[str, tuple[tuple[str, ...], ...]] = ("", ())

    def sections(self) -> dict[str, list[Chart]]:
        """Charts by section, in the page's order of questions (others after them)."""
        found: dict[str, list[Chart]] = {}
        for chart in self.charts:
            found.setdefault(chart.section, []).append(chart)
        order = {section: i for i, section in enumerate(SECTIONS)}
        return dict(sorted(found.items(), key=lambda item: order.get(item[0], len(order))))

    def summary_rows(self) -> list[list[str]]:
        rows = []
        order = {label: i for i, label in enumerate(label_order([run.label for run in self.runs]))}
        for run in sorted(self.runs, key=lambda r: (r.workload, order[r.label], _chunks(r), str(r.path))):
            rows.append([run.workload, run.label + (" (crashed)" if run.crashed else ""),
                         str(run.config.get("cpu_chunks", ""))]
                        + [format_value(m, run.metrics.get(m)) for m in SUMMARY_METRICS])
        return rows


def _chunks(run: RunFile) -> int:
    chunks = run.config.get("cpu_chunks")
    return chunks if isinstance(chunks, int) else -1


HEADERS = ["workload", "connector", "cpu_chunks", *SUMMARY_METRICS]


def _anchor(text: str) -> str:
    """A section's id: its words in lower case (``did_this_commit_regress``). A chart's id is its
    file name, unique by ``figures.slug``."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_").lower() or "x"


# Figures are at most figures.MAX_FIGURE_WIDTH_PX wide: a 1400 px window shows them at 1:1. The image's frame is
# an outline, which takes no room: a chart's box is its image, so a hover box's percentages are the image's pixels. A table wider than the body scrolls inside its own box, never the page.
STYLE = ("body{font-family:sans-serif;max-width:1500px;margin:2em auto;padding:0 1em}"
         ".table{max-width:100%;overflow-x:auto}"
         "img{max-width:100%;height:auto;outline:1px solid #ddd;display:block}"
         ".chart{position:relative;display:inline-block;max-width:100%}.chart a.slot{position:absolute;display:block}"
         ".chart a.slot:hover{background:rgba(123,50,148,0.12)}"
         "table{border-collapse:collapse;font-size:0.85em}"
         "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:nth-child(-n+2){text-align:left}"
         "figure{margin:1em 0 2em 0}figcaption{color:#444;font-size:0.9em}"
         "details{margin-bottom:2em;font-size:0.85em}nav li{margin:2px 0}"
         "tr.worse td{background:#fde0dc;font-weight:bold}")



def _worse(row: Sequence[str]) -> bool:
    """A row of the newest commit's moves (report.moves) whose verdict is a regression."""
    return bool(row) and str(row[-1]).startswith("worse")


def _table_html(header: Sequence[str], rows: Sequence[Sequence[str]], highlight=lambda row: False) -> str:
    """A table in its own scrolling box; a header may break after each '_' (long metric names);
    rows ``highlight`` picks are marked (class 'worse')."""
    e = html.escape
    head = "".join(f"<th>{e(h).replace('_', '_<wbr>')}</th>" for h in header)
    body = "".join(("<tr class='worse'>" if highlight(row) else "<tr>") + "".join(f"<td>{e(c)}</td>" for c in row)
                   + "</tr>" for row in rows)
    return f"<div class='table'><table><tr>{head}</tr>{body}</table></div>"


def write_html(page: Page, path: Path) -> None:
    e = html.escape
    sections = page.sections()
    parts = ["<!doctype html>", "<html><head><meta charset='utf-8'><title>kvoffload-bench report</title>",
             f"<style>{STYLE}</style></head><body>",
             "<h1>kvoffload-bench report</h1>",
             f"<p>Drawn from result files under <code>{e(str(page.source))}</code>: {len(page.runs)} run results.</p>",
             "<nav><h2>Contents</h2><ol>"]
    for section, charts in sections.items():
        parts.append(f"<li><a href='#{_anchor(section)}'>{e(section)}</a><ul>"
                     + "".join(f"<li><a href='#{c.filename}'>{e(c.title)}</a></li>" for c in charts)
                     + "</ul></li>")
    extras = [("Not drawn", page.notes), ("Runs", page.runs), ("Ignored files", page.ignored)]
    parts += [f"<li><a href='#{_anchor(name)}'>{name}</a></li>" for name, present in extras if present]
    parts.append("</ol></nav>")
    for section, charts in sections.items():
        parts.append(f"<h2 id='{_anchor(section)}'>{e(section)}</h2>")
        if section in SECTION_INTROS:
            parts.append(f"<p>{e(SECTION_INTROS[section])}</p>")
        if section == SECTIONS[0] and page.moves[0]:
            sentence, table = page.moves
            parts.append(f"<p><b>{e(sentence)}</b></p>")
            if table:
                header, *rows = table
                parts.append(_table_html(header, rows, highlight=_worse))
        for chart in charts:
            # Five decimals: a box's edge within 1/20,000 px on a 1,400 px image (_hover_boxes' nudge is 1/256).
            slots = "".join(f"<a class='slot' title='{e(box.title)}' style='left:{box.left:.5f}%;top:{box.top:.3f}%;"
                            f"width:{box.width:.5f}%;height:{box.height:.3f}%'></a>" for box in chart.hover)
            data = f" <a href='{e(chart.data_file)}'>data (CSV)</a>" if chart.table else ""
            parts.append(f"<figure id='{chart.filename}'><h3>{e(chart.title)}</h3>"
                         f"<div class='chart'><img src='{e(chart.filename)}' alt='{e(chart.title)}'>{slots}</div>"
                         f"<figcaption>{e(chart.caption)} <a href='{e(chart.filename)}'>image</a>{data}"
                         "</figcaption></figure>")
            if chart.provenance:
                header, *rows = chart.provenance
                parts.append(f"<details><summary>Provenance of the points ({len(rows)} sources)</summary>"
                             + _table_html(header, rows) + "</details>")
    if page.notes:
        parts.append("<h2 id='not_drawn'>Not drawn</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in page.notes)
                     + "</ul>")
    if page.runs:
        parts.append("<h2 id='runs'>Runs</h2>" + _table_html(HEADERS, page.summary_rows()))
    if page.ignored:
        parts.append("<h2 id='ignored_files'>Ignored files</h2><ul>"
                     + "".join(f"<li>{e(n)}</li>" for n in page.ignored) + "</ul>")
    parts.append("</body></html>")
    with atomic_output(path) as handle:
        handle.write("\n".join(parts) + "\n")


# Markdown's own markup characters (and GitHub's: ~~ strikes through, $ opens math), escaped in
# every text index.md embeds; < > & are written as HTML entities first.
_MARKUP = re.compile(r"([\\`*_\[\]{}|#!~$])")


def md(text: object) -> str:
    """``text`` as Markdown that shows it as it is: a workload named ``<script>`` or ``a|b`` stays
    text in one table cell, a ``*`` starts no emphasis, a line break no new block."""
    escaped = html.escape(str(text), quote=False).replace("\r", " ").replace("\n", " ")
    return _MARKUP.sub(r"\\\1", escaped)


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return (["| " + " | ".join(md(h) for h in header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(md(c) for c in row) + " |" for row in rows])


def write_markdown(page: Page, path: Path) -> None:
    """The same page in Markdown: every embedded text escaped (``md``; ``html.escape`` inside the
    HTML headings, where Markdown is not read)."""
    e = html.escape
    sections = page.sections()
    lines = ["# kvoffload-bench report", "",
             f"Drawn from result files under <code>{md(page.source)}</code>: {len(page.runs)} run results.", "",
             "## Contents", ""]
    for section, charts in sections.items():
        lines.append(f"- [{md(section)}](#{_anchor(section)})")
        lines += [f"  - [{md(chart.title)}](#{chart.filename})" for chart in charts]
    lines.append("")
    for section, charts in sections.items():
        lines += [f'<h2 id="{_anchor(section)}">{e(section)}</h2>', ""]
        if section in SECTION_INTROS:
            lines += [md(SECTION_INTROS[section]), ""]
        if section == SECTIONS[0] and page.moves[0]:
            sentence, table = page.moves
            lines += [f"**{md(sentence)}**", ""]
            if table:
                header, *rows = table
                lines += ["| " + " | ".join(md(h) for h in header) + " |", "|" + "---|" * len(header)]
                lines += ["| " + " | ".join(f"**{md(c)}**" if _worse(row) and c else md(c) for c in row) + " |"
                          for row in rows] + [""]
        for chart in charts:
            data = f" Data: [{md(chart.data_file)}]({chart.data_file})." if chart.table else ""
            lines += [f'<h3 id="{e(chart.filename)}">{e(chart.title)}</h3>', "",
                      f"![{md(chart.title)}]({chart.filename})", "", md(chart.caption) + data, ""]
            if chart.provenance:
                header, *rows = chart.provenance
                lines += ["<details><summary>Provenance of the points</summary>", ""]
                lines += _md_table(header, rows) + ["", "</details>", ""]
    if page.notes:
        lines += ["## Not drawn", ""] + [f"- {md(note)}" for note in page.notes] + [""]
    if page.runs:
        lines += ["## Runs", ""] + _md_table(HEADERS, page.summary_rows()) + [""]
    if page.ignored:
        lines += ["## Ignored files", ""] + [f"- {md(item)}" for item in page.ignored] + [""]
    with atomic_output(path) as handle:
        handle.write("\n".join(lines))
