"""One vLLM release's rows for ``kvoffload releases``, run inside that release's venv (one
process can import only one vLLM)::

    python -m kvoffload.vllm.rows [--preset NAME|reference] WORKLOAD:SCHEDULING [...]

Each replay runs the workload through the installed release's own scheduler and its stock
``OffloadingConnector`` (``--engine vllm-scheduler --connector stock``) and prints one JSON
object per line: the release, the workload, the measured metrics, the release's own exception
and step if its connector died, and per request the first admission's GPU-hit and connector-hit
tokens. A replay that cannot even be built (an API this package does not bridge) is a row with
``setup_error``: the other rows still run. ``--preset`` runs the reference connector with that
preset in the same release's scheduler instead: where a release and the simulator disagree, it
tells a connector difference (the preset is wrong) from a scheduler one (the release's scheduler
is not the one the simulator models).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import vllm

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
    record = replay.run()
    unmeasured = set(replay.unmeasured()) | MODEL_METRICS  # no real model ran
    row["metrics"] = {name: value for name, value in compute_metrics(record).items() if name not in unmeasured}
    row["error"] = None if record.crash is None else {"message": record.crash, "step": record.crash_step}
    row["livelock"] = record.livelock_message  # the watchdog's verdict: the release went round in circles
    row["leaked"] = list(record.leaked_requests)
    row["stuck"] = list(record.stuck_requests)
    row["first_admission"] = {req_id: list(hits) for req_id, hits in replay.ledger.first_admission.items()}
    row["seconds"] = round(time.perf_counter() - started, 2)
    return row


def main(argv: list[str]) -> int:
    preset = None
    if argv[:1] == ["--preset"] and len(argv) > 1:
        preset, argv = argv[1], argv[2:]
    if not argv:
        print("usage: python -m kvoffload.vllm.rows [--preset NAME|reference] WORKLOAD:SCHEDULING ...",
              file=sys.stderr)
        return 2
    for job in argv:
        name, _, scheduling = job.partition(":")
        print(json.dumps(release_row(name, scheduling or "sync", preset)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
