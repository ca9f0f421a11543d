"""The index pages of a report: ``index.html`` (figures inline) and ``index.md`` (same content)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from kvoffload.metrics import format_value
from kvoffload.report.figures import Chart, label_order
from kvoffload.report.sources import RunFile

SUMMARY_METRICS = ("last_block_hit_rate", "offload_hit_rate", "poisoned_loads", "lifecycle_violations",
                   "crashes", "store_submit_delay_steps_p50", "store_visible_delay_steps_p99", "tokens_per_s_modeled")


@dataclass
class Page:
    source: Path
    charts: list[Chart] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # sections skipped, and why
    ignored: list[str] = field(default_factory=list)  # 'path: reason' of malformed result files
    runs: Sequence[RunFile] = ()

    def sections(self) -> dict[str, list[Chart]]:
        found: dict[str, list[Chart]] = {}
        for chart in self.charts:
            found.setdefault(chart.section, []).append(chart)
        return found

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


def write_html(page: Page, path: Path) -> None:
    e = html.escape
    parts = ["<!doctype html>", "<html><head><meta charset='utf-8'><title>kvoffload-bench report</title>",
             "<style>body{font-family:sans-serif;max-width:1400px;margin:2em auto;padding:0 1em}"
             "img{max-width:100%;border:1px solid #ddd}table{border-collapse:collapse;font-size:0.85em}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:nth-child(-n+2){text-align:left}"
             "figcaption{color:#444;font-size:0.9em}details{margin-bottom:2em;font-size:0.85em}</style></head><body>",
             "<h1>kvoffload-bench report</h1>",
             f"<p>Drawn from result files under <code>{e(str(page.source))}</code>: {len(page.runs)} run results.</p>"]
    for section, charts in page.sections().items():
        parts.append(f"<h2>{e(section)}</h2>")
        for chart in charts:
            parts.append(f"<figure><h3>{e(chart.title)}</h3><a href='{e(chart.filename)}'>"
                         f"<img src='{e(chart.filename)}' alt='{e(chart.title)}'></a>"
                         f"<figcaption>{e(chart.caption)}</figcaption></figure>")
            if chart.provenance:
                header, *rows = chart.provenance
                parts.append(f"<details><summary>Provenance of the points ({len(rows)} sources)</summary><table><tr>"
                             + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"
                             + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
                             + "</table></details>")
    if page.notes:
        parts.append("<h2>Not drawn</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in page.notes) + "</ul>")
    if page.runs:
        parts.append("<h2>Runs</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEADERS) + "</tr>")
        for row in page.summary_rows():
            parts.append("<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>")
        parts.append("</table>")
    if page.ignored:
        parts.append("<h2>Ignored files</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in page.ignored) + "</ul>")
    parts.append("</body></html>")
    path.write_text("\n".join(parts) + "\n")


def write_markdown(page: Page, path: Path) -> None:
    lines = ["# kvoffload-bench report", "",
             f"Drawn from result files under `{page.source}`: {len(page.runs)} run results.", ""]
    for section, charts in page.sections().items():
        lines += [f"## {section}", ""]
        for chart in charts:
            lines += [f"### {chart.title}", "", f"![{chart.title}]({chart.filename})", "", chart.caption, ""]
            if chart.provenance:
                header, *rows = chart.provenance
                lines += ["<details><summary>Provenance of the points</summary>", "",
                          "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                lines += ["| " + " | ".join(row) + " |" for row in rows] + ["", "</details>", ""]
    if page.notes:
        lines += ["## Not drawn", ""] + [f"- {note}" for note in page.notes] + [""]
    if page.runs:
        lines += ["## Runs", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
        lines += ["| " + " | ".join(row) + " |" for row in page.summary_rows()] + [""]
    if page.ignored:
        lines += ["## Ignored files", ""] + [f"- {item}" for item in page.ignored] + [""]
    path.write_text("\n".join(lines))
