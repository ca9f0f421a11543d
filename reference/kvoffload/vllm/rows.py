"""One vLLM release's rows for ``kvoffload releases``, run inside that release's venv (one
process can import only one vLLM)::

    python -m kvoffload.vllm.rows [--preset NAME|reference] [--control NAME] WORKLOAD:SCHEDULING [...]

Each replay runs the workload through the installed release's own scheduler and its stock
``OffloadingConnector`` (``--engine vllm-scheduler --connector stock``) and prints one JSON
object per line: the release, the workload, the measured metrics, the release's own exception
and step if its connector died, and per request the first admission's GPU-hit and connector-hit
tokens, and the steps of that admission and of its finish. A replay that cannot even be built (an API this package does not bridge) is a row with
``setup_error``: the other rows still run. ``--preset`` runs the reference connector with that
preset in the same release's scheduler instead: where a release and the simulator disagree, it
tells a connector difference (the preset is wrong) from a scheduler one (the release's scheduler
is not the one the simulator models). ``--control`` switches one rule of the release's scheduler
first (``controls.py``): the check of a row's stated cause.
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

from kvoffload.metrics import MODEL_METRICS, compute_metrics
from kvoffload.vllm.build import REFERENCE, STOCK, ConnectorLoad
from kvoffload.vllm.replay import VllmSchedulerReplay
from kvoffload.workloads import load_workload


def release_row(workload_name: str, scheduling: str, preset: str | None = None) -> dict:
    """The stock connector's row; with ``preset``, the reference connector's with that preset
    instead (the same release's scheduler around it)."""
    row = {"release": vllm.__version__, "workload": workload_name, "scheduling": scheduling,
           "hash_seed": os.environ.get("PYTHONHASHSEED")}
    workload = load_workload(workload_name, {"scheduling": scheduling})
    started = time.perf_counter()
    load = ConnectorLoad(STOCK) if preset is None else ConnectorLoad(REFERENCE, None if preset == REFERENCE else preset)
    try:
        replay = VllmSchedulerReplay(workload.requests, workload.engine, load, reset_cache_at=workload.reset_cache_at)
    except Exception as error:  # noqa: BLE001 - reported as the row's result, one line
        row["setup_error"] = f"{type(error).__name__}: {error}".splitlines()[0]
        row["traceback"] = traceback.format_exc(limit=-3)
        return row
    steps = _observe_steps(replay)
    record = replay.run()
    unmeasured = set(replay.unmeasured()) | MODEL_METRICS  # no real model ran
    row["metrics"] = {name: value for name, value in compute_metrics(record).items() if name not in unmeasured}
    row["error"] = None if record.crash is None else {"message": record.crash, "step": record.crash_step}
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
    while argv[:1] in (["--preset"], ["--control"]) and len(argv) > 1:
        if argv[0] == "--preset":
            preset = argv[1]
        else:
            control = argv[1]
        argv = argv[2:]
    if not argv:
        print("usage: python -m kvoffload.vllm.rows [--preset NAME|reference] [--control NAME] "
              "WORKLOAD:SCHEDULING ...", file=sys.stderr)
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
        row = release_row(name, scheduling, preset)
        print(json.dumps({**row, "control": control} if control else row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
