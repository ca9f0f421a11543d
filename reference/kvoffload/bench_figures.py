"""What a bench summary shows, as the docs print it: which figure each fix flag moves, and the
results at a glance (each preset's worst figure over the bundled workloads).

Both read a ``kvoffload bench`` summary (``bench-summary.json``: rows of workload, connector
label, metrics) and only its deterministic figures, so the tables they generate
(``scripts/readme_tables.py``) are the same on every machine for one commit's results.
"""

from __future__ import annotations

from kvoffload.choice import ConnectorChoice
from kvoffload.cli.bench import TABLE_METRICS
from kvoffload.core.fixes import ablation
from kvoffload.core.fixes import FIX_NAMES, PRESETS
from kvoffload.metrics import DIRECTION, MEASURED_METRICS, format_value, judge, same_value

# The bench table's deterministic figures, the counts that name a bug outright first.
FIGURES = tuple(sorted((name for name in TABLE_METRICS if name not in MEASURED_METRICS),
                       key=lambda name: DIRECTION[name] != "zero"))
SHOWN_PER_WORKLOAD = 3  # figures named per workload in the "each fix moves a figure" table


def _rows(summary: dict) -> dict[tuple[str, str], dict]:
    return {(row["workload"], row["connector"]): row["metrics"] for row in summary["rows"]}


def ablation_labels(fix: str) -> tuple[str, str]:
    """The bench's connector label of the run without ``fix``, and of the run it is compared
    with: the reference, or for a fix another one hides (core/fixes.py, HIDDEN_BY) the reference
    without that other fix."""
    disabled = ablation(fix)
    return ConnectorChoice.build(disabled=disabled).label, ConnectorChoice.build(disabled=disabled[:-1]).label


def moved_figures(summary: dict, fix: str) -> dict[str, list[tuple[str, object, object]]]:
    """Per workload, the figures the run without ``fix`` shows differently from the run it is
    compared with (``ablation_labels``), as the bench table prints them (a move below the
    printed precision is no move): (metric, before, fix off), in FIGURES order."""
    rows = _rows(summary)
    off_label, before_label = ablation_labels(fix)
    moved: dict[str, list[tuple[str, object, object]]] = {}
    for (workload, label), off in rows.items():
        reference = rows.get((workload, before_label))
        if label != off_label or reference is None:
            continue
        changes = [(name, reference.get(name), off.get(name)) for name in FIGURES
                   if format_value(name, reference.get(name)) != format_value(name, off.get(name))]
        if changes:
            moved[workload] = changes
    return moved


def fix_moves_markdown(summary: dict) -> str:
    """The docs' "each fix moves a figure" table: one row per fix flag."""
    lines = ["| fix off | workload: figure, reference -> fix off |", "|---|---|"]
    for fix in FIX_NAMES:
        hidden_by = ablation(fix)[:-1]
        moved = moved_figures(summary, fix)
        if not moved:
            cells = ["moves no figure of the bench"]
        else:
            cells = [f"{workload}: " + ", ".join(f"`{name}` {format_value(name, a)} -> {format_value(name, b)}"
                                                 for name, a, b in changes[:SHOWN_PER_WORKLOAD])
                     for workload, changes in moved.items()]
        name = f"`{fix}`" + "".join(f" (with `{other}` off: reference -{other} -> both off)" for other in hidden_by)
        lines.append(f"| {name} | " + "; ".join(cells) + " |")
    return "\n".join(lines)


GLANCE = ("last_chunk_offloaded_rate", "last_block_hit_rate", "poisoned_loads", "lifecycle_violations",
          "crashes", "stuck_requests")


def at_a_glance_markdown(summary: dict, commit: str, date: str) -> str:
    """The README's table: what each vLLM release's preset loses against the reference on the
    bundled workloads. Per figure, the workload where the preset is furthest on the worse side
    of the reference (a rate by how far it falls, a count by how far it rises), as "preset's
    value (reference's, workload)"; "=" where it is never worse."""
    rows = _rows(summary)
    workloads = list(dict.fromkeys(workload for workload, _ in rows))
    lines = ["| preset (release) | " + " | ".join(f"`{name}`" for name in GLANCE) + " |",
             "|---|" + "---|" * len(GLANCE)]
    unmeasured = []
    for label, preset in PRESETS.items():
        if not any((workload, label) in rows for workload in workloads):
            unmeasured.append(f"`{label}`")  # a preset newer than the bench: no row, not "never behind"
            lines.append(f"| `{label}` ({preset.release}) | " + " | ".join("-" for _ in GLANCE) + " |")
            continue
        cells = []
        for name in GLANCE:
            worst = None
            for workload in workloads:
                ours, reference = rows.get((workload, label), {}), rows.get((workload, "reference"), {})
                a, b = reference.get(name), ours.get(name)
                if judge(name, a, b) != "worse" or a is None or b is None:
                    continue
                gap = abs(b - a)
                if worst is None or gap > worst[0]:
                    worst = (gap, workload, a, b)
            cells.append("=" if worst is None else
                         f"{format_value(name, worst[3])} ({format_value(name, worst[2])}, {worst[1]})")
        lines.append(f"| `{label}` ({preset.release}) | " + " | ".join(cells) + " |")
    lines.append("")
    refused: dict[str, list[str]] = {}  # a preset whose release cannot replay a workload's model
    for row in summary.get("refused", ()):
        refused.setdefault(row["workload"], []).append(f"`{row['connector']}`")
    lines.append(f"Each cell: the preset's value where it falls furthest behind the reference, with the "
                 f"reference's value and the workload; \"=\": never behind on {', '.join(workloads)}"
                 + "".join(f" ({' and '.join(labels)} refuse {workload}: no row)" for workload, labels in refused.items())
                 + (f"; \"-\": {' and '.join(unmeasured)} not in this bench" if unmeasured else "")
                 + f". `kvoffload bench` at commit {commit[:7]} ({date}), `results/runs/bench-summary.json`.")
    return "\n".join(lines)
