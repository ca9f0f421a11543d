"""One vLLM release's rows for ``kvoffload releases``, run inside that release's venv (one
process can import only one vLLM)::

    python -m kvoffload.vllm.rows [--preset NAME|reference | --connector NAME] [--control NAME] \
        WORKLOAD:SCHEDULING [...]

Each replay runs the workload through the installed release's own scheduler and its stock
``OffloadingConnector`` (``--engine vllm-scheduler --connector stock``) and prints one JSON
object per line: the release, the workload, the measured metrics, the release's own exception
and step if its connector died, and per request the first admission's GPU-hit and connector-hit
tokens, and the steps of that admission and of its finish. A replay that cannot even be built (an API this package does not bridge) is a row with
``setup_error``: the other rows still run. ``--preset`` runs the reference connector with that
preset in the same release's scheduler instead: where a release and the simulator disagree, it
tells a connector difference (the preset is wrong) from a scheduler one (the release's scheduler
is not the one the simulator models). ``--control`` switches one rule of the release's scheduler
first (``controls.py``): the check of a row's stated cause. ``--connector`` runs another connector
family instead of stock (``simple-cpu``: vLLM's SimpleCPUOffloadConnector,
``kvoffload.vllm.foreign``), for the connector x release matrix; a setting the family cannot
honour is set to what it can (the workload's ``offload_prompt_only`` to false: SimpleCPU
offloads every block), and the row says so.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from kvoffload.release_io import die_with_parent, split_job

if __name__ == "__main__":  # before vLLM's import: this process tree dies with `kvoffload releases`
    die_with_parent()

import vllm  # noqa: E402 - after the guard above

from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S
from kvoffload.metrics import MODEL_METRICS, compute_metrics
from kvoffload.vllm.build import REFERENCE, STOCK, ConnectorLoad
from kvoffload.vllm.replay import VllmSchedulerReplay
from kvoffload.workloads import load_workload


def release_row(workload_name: str, scheduling: str, preset: str | None = None, source: str = STOCK,
                step_bound_s: float | None = DEFAULT_STEP_BOUND_S) -> dict:
    """The stock connector's row; with ``preset``, the reference connector's with that preset
    instead (the same release's scheduler around it); with ``source``, that connector's."""
    row = {"release": vllm.__version__, "workload": workload_name, "scheduling": scheduling,
           "hash_seed": os.environ.get("PYTHONHASHSEED"), "connector": source if preset is None else REFERENCE}
    load = ConnectorLoad(source) if preset is None else ConnectorLoad(REFERENCE, None if preset == REFERENCE else preset)
    overrides = {"scheduling": scheduling}
    workload = load_workload(workload_name, overrides)
    family = load.family
    if family is not None and workload.engine.offload_prompt_only and "offload_prompt_only" in family.refused:
        workload = load_workload(workload_name, {**overrides, "offload_prompt_only": "false"})
        row["overrides"] = {"offload_prompt_only": False}
    started = time.perf_counter()
    try:
        replay = VllmSchedulerReplay(workload.requests, workload.engine, load, reset_cache_at=workload.reset_cache_at,
                                     step_bound_s=step_bound_s)
    except Exception as error:  # noqa: BLE001 - reported as the row's result, one line
        row["setup_error"] = f"{type(error).__name__}: {error}".splitlines()[0]
        row["traceback"] = traceback.format_exc(limit=-3)
        return row
    steps = _observe_steps(replay)
    record = replay.run()
    row["poisoned"] = [[p.req_id, p.step, p.chunk, p.bad_slots] for p in record.poisoned[:5]]
    unmeasured = set(replay.unmeasured()) | MODEL_METRICS  # no real model ran
    row["metrics"] = {name: value for name, value in compute_metrics(record).items() if name not in unmeasured}
    row["error"] = None if record.crash is None else {"message": record.crash, "step": record.crash_step,
                                                      "frames": record.crash_frames[-3:]}
    row["livelock"] = record.livelock_message  # the watchdog's verdict: the release went round in circles
    row["leaked"] = list(record.leaked_requests)
    row["stuck"] = list(record.stuck_requests)
    row["first_admission"] = {req_id: list(hits) for req_id, hits in replay.ledger.first_admission.items()}
    row["steps"] = steps
    row["seconds"] = round(time.perf_counter() - started, 2)
    return row


def _observe_steps(replay: VllmSchedulerReplay) -> dict[str, list[int | None]]:
    """request -> [the step of its first admission, the step it finished], filled as the replay
    runs: an admission is the ledger's first record of the request (``AdmissionLedger``), made
    during the step the replay is in; a finish is the replay's own hand-over to follow-ups."""
    steps: dict[str, list[int | None]] = {}
    admitted, finished = replay.ledger._admitted, replay._on_finished

    def observed_admission(request, num_external: int) -> None:
        known = request.request_id in replay.ledger.first_admission
        admitted(request, num_external)
        if not known and request.request_id in replay.ledger.first_admission:
            steps.setdefault(request.request_id, [None, None])[0] = replay._step

    def observed_finish(req_id: str, step: int, loading: bool = False) -> None:
        steps.setdefault(req_id, [None, None])[1] = step
        finished(req_id, step, loading)

    replay.ledger._admitted, replay._on_finished = observed_admission, observed_finish
    return steps


def main(argv: list[str]) -> int:
    preset = control = None
    source = STOCK
    step_bound_s = DEFAULT_STEP_BOUND_S
    while argv[:1] in (["--preset"], ["--control"], ["--connector"], ["--step-timeout"]) and len(argv) > 1:
        if argv[0] == "--preset":
            preset = argv[1]
        elif argv[0] == "--connector":
            source = argv[1]
        elif argv[0] == "--step-timeout":  # releases checked it: seconds above 0
            step_bound_s = float(argv[1])
        else:
            control = argv[1]
        argv = argv[2:]
    if not argv:
        print("usage: python -m kvoffload.vllm.rows [--preset NAME|reference | --connector NAME] [--control NAME] "
              "[--step-timeout S] WORKLOAD:SCHEDULING ...", file=sys.stderr)
        return 2
    if control is not None:
        from kvoffload.core.types import ConfigError
        from kvoffload.vllm.controls import apply_control

        try:
            apply_control(control)
        except ConfigError as error:
            print(f"kvoffload.vllm.rows: {error}", file=sys.stderr)
            return 2
    for job in argv:
        name, scheduling = split_job(job)  # mooncake:FILE:sync: the workload keeps its colon
        row = release_row(name, scheduling, preset, source, step_bound_s)
        print(json.dumps({**row, "control": control} if control else row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
