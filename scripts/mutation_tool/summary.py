"""The tool's report: ``results/mutation/tool/README.md`` (each mutant's fate, the score, the
survivors' diffs) and ``score.json``, written from the sessions' rows, the stages' verdicts and
the run's meta (``scripts/mutation_tool report``)."""

from __future__ import annotations

import json
from pathlib import Path


FIRST_SCOPE = "core/, engine/, metrics.py, gate.py, worker/connector.py and worker/copy.py"
WHOLE_SCOPE = ("every other module of the package (scripts/mutation_tool/targets_whole.py: cli/, report/, "
               "workloads/, vllm/ and gates/ in the vLLM venv, the rest of worker/, the top-level modules)")


def write_report(meta: dict, every: list[dict], key, done: dict, fates: dict, stages: tuple[str, ...],
                 out: Path, scope: str = FIRST_SCOPE) -> list[str]:
    """Write the report of the rows ``every`` (each module's session rows; ``key(row)`` names a
    mutant; ``scope`` says which modules they are) into ``out``; returns its lines."""
    rows = [r for r in every if r["result"] and r["result"]["worker_outcome"] != "skipped"]
    pending = [r for r in every if not r["result"]]
    named = {stage: "new test" if stage == "new" else stage for stage in stages}  # the report's words
    killers = ("selected tests", *named.values())
    table, counts = [], {**dict.fromkeys(killers, 0), "equivalent": 0, "survived": 0, "incompetent": 0}
    for row in rows:
        k, result = key(row), row["result"]
        stage_entry = done.get(k, {})
        if result["worker_outcome"] != "normal":
            fate, by = "incompetent", result["worker_outcome"]
        elif result["test_outcome"] == "killed":
            fate, by = "selected tests", killer(result["output"])
        else:
            stage = next((s for s in stages if stage_entry.get(s) == "killed"), None)
            fate, by = (named[stage], stage_entry.get(f"{stage}_by", "")) if stage else ("survived", "")
            if fate == "survived" and k in fates:
                fate, by = fates[k]
        counts[fate] += 1
        table.append((k, row["start"][0], fate, by, (result.get("diff") or "")))
    killed = sum(counts[s] for s in killers)
    scored = killed + counts["survived"]
    summary = {"tool": "cosmic-ray 8.7.0", **meta, "run": len(rows), "pending": len(pending), **counts,
               "score": killed / scored if scored else None,
               "score_without_new_tests": (killed - counts["new test"]) / scored if scored else None}
    out.mkdir(parents=True, exist_ok=True)
    extra = len(rows) - meta["sampled"]  # run from a larger sample before it was cut to this one
    beyond = f", and {extra} more of a larger one, run before it was cut" if extra > 0 else ""
    lines = ["# Mutation run by a tool (cosmic-ray)", "",
             f"Commit {meta['commit'][:12]}: cosmic-ray generated {meta['generated']} mutants at {meta['sites']} "
             f"sites in {scope}; "
             f"a deterministic sample of {meta['sampled']} (the first of one order, docs/mutation.md)"
             f"{beyond}: "
             f"{len(rows)} run, {len(pending)} not yet run. "
             "Regenerate with the commands in docs/mutation.md.", "",
             f"Tests: those of that commit, with the files of the tests written for its survivors on top "
             f"({', '.join(meta.get('overlay', []))}). "
             f"Failing on the unmutated snapshot, so deselected from every run: "
             f"{', '.join(meta.get('deselect', [])) or 'none'}."
             + (f" Deselected from exec only (they failed on an earlier round's snapshot, which lacked "
                f"results/releases/, and pass on this one: `recheck`), so run in the stages: "
                f"{', '.join(sorted(set(meta['deselect_in_exec']) - set(meta.get('deselect', []))))}."
                if set(meta.get("deselect_in_exec", [])) - set(meta.get("deselect", [])) else "")
             + " Unmutated run of every selected test: "
             f"{meta.get('baseline_s', '?')} s; exec at nice 10, one mutant at a time. "
             f"New tests failing on the unmutated snapshot (so killing nothing): "
             f"{', '.join(meta.get('new_failing_unmutated', [])) or 'none'}.", "",
             "| killed by | mutants |", "|---|---|",
             *(f"| {name} | {counts[name]} |" for name in counts), "",
             f"Score over the whole CI (equivalent mutants left out): {killed} of {scored}"
             f" = {summary['score']:.1%}" if scored else "", "",
             f"Before the new tests: {killed - counts['new test']} of {scored}"
             f" = {summary['score_without_new_tests']:.1%}." if scored else "", "",
             "## Every mutant that survived the selected tests", "",
             "| mutant | line | fate | by / why |", "|---|---|---|---|"]
    for k, line, fate, by, diff in table:
        if fate != "selected tests":
            lines.append(f"| `{k}` | {line} | {fate} | {by.replace('|', '/')} |")
    lines += ["", "## Every mutant run, and what killed it", "",
              "Tests selected per module: `scripts/mutation_tool/targets.py`.", "",
              "| mutant | line | fate | by |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {line} | {fate} | {by.replace('|', '/')} |" for k, line, fate, by, _ in table]
    lines += ["", "## Diffs of the survivors", ""]
    for k, line, fate, by, diff in table:
        if fate != "selected tests":
            lines += [f"`{k}` ({fate})", "", "```diff", diff.strip(), "```", ""]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    summary["mutants"] = {k: {"line": line, "fate": fate, "by": by} for k, line, fate, by, _ in table}
    (out / "score.json").write_text(json.dumps(summary, indent=2) + "\n")
    return lines


def killer(output: str) -> str:
    if output == "timeout":
        return "(hang: past the timeout)"
    failed = [line.split(" - ")[0][len("FAILED "):] for line in (output or "").splitlines() if line.startswith("FAILED ")]
    return failed[0] if failed else "(collection or import error)"
