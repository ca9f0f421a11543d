"""Costs as instruction counts: what the connector and the simulator cost, in a unit load cannot move.

Wall time on a shared runner says as much about the other jobs as about the code (the history's
``BuildConnectorMeta`` swung between about 250 and 7,700 µs per step). Under valgrind's callgrind
the CPU instructions a piece of code executes are counted exactly, whatever else runs (CodSpeed's
approach to noisy CI). Two counts:

- ``connector``: instructions inside ``build_connector_meta`` (the scheduler side's hot path),
  per decode step of ``benchmarks/bench_connector.py``'s batch (256 decoding requests, the batch
  ``BuildConnectorMeta`` times; its owner is the suite, so this mode needs the checkout);
- ``replay``: instructions of a whole replay of a workload through the reference, per request.

How only that code is counted: callgrind starts with collection off and toggles it on entering
and leaving one C function, ``_operator_call`` (CPython's ``operator.call``, which nothing else
here calls); the counted code is called through it. Warm-up steps (or a short replay) first do
the imports and first-call work outside the count. ``PYTHONHASHSEED`` is pinned, so dict and set
layouts, and with them the instructions, repeat from run to run. The count depends on the
interpreter, the libraries and valgrind itself, not on the load: ``environment()`` names what it
depends on, and counts are compared only within one environment (``kvoffload gate``,
``benchmarks/bench_counts.py``). Measured repeatability: ``docs/performance.md``.

    KVOFFLOAD_COUNT_MODE=replay python -m kvoffload.counts -- WORKLOAD     # the child valgrind runs
    KVOFFLOAD_COUNT_MODE=connector python -m kvoffload.counts -- BLOCKS_PER_CHUNK
"""

from __future__ import annotations

import json
import operator
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TOGGLE = "--toggle-collect=_operator_call"  # operator.call's C function: collection is on inside it only
WARM_STEPS = 30
DECODE_STEPS = 128  # counted steps of the decode batch: two chunk cycles at blocks_per_chunk 4
MODES = ("connector", "replay")
TIMEOUT_S = 1800
SUITE = Path(__file__).resolve().parents[2] / "benchmarks"  # the checkout's asv suite (DecodeBatch)


def available() -> bool:
    return shutil.which("valgrind") is not None


def environment() -> dict[str, str]:
    """What an instruction count depends on besides the code: counts are compared within one."""
    done = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, timeout=60)
    return {"valgrind": done.stdout.strip(), "python": platform.python_version(),
            "implementation": f"{platform.python_implementation()} {platform.python_compiler()}",
            "machine": platform.machine()}


def count(mode: str, subject: str, suite: Path = SUITE) -> float:
    """Instructions per ``build_connector_meta`` call of the decode batch at blocks_per_chunk
    ``subject`` (mode "connector"; ``suite``: the asv suite's folder, whose bench_connector owns
    the batch), or per request of a whole replay of workload ``subject`` (mode "replay"), under
    callgrind."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    if mode == "connector" and not (suite / "bench_connector.py").is_file():
        raise RuntimeError(f"counting the connector needs the checkout's {suite / 'bench_connector.py'}")
    if os.path.exists(subject):  # a workload file: the child runs in the scratch folder
        subject = os.path.abspath(subject)
    with tempfile.TemporaryDirectory(prefix="kvoffload-callgrind-") as scratch:
        out = Path(scratch) / "callgrind.out"
        env = {**os.environ, "PYTHONHASHSEED": "0", "KVOFFLOAD_COUNT_MODE": mode, "KVOFFLOAD_COUNT_SUITE": str(suite)}
        # Every element a literal but the interpreter and the subject, which follow "--" (valgrind's
        # end of options, then the child's): no computed string is read as an option.
        done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=callgrind.out",
                               "--collect-atstart=no", TOGGLE, "--", sys.executable, "-m",
                               "kvoffload.counts", "--", subject],
                              capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=scratch)
        if done.returncode != 0:
            raise RuntimeError(f"callgrind of {subject} ({mode}) exited {done.returncode}: {done.stderr[-500:]}")
        per = json.loads(done.stdout.strip().splitlines()[-1])["per"]
        instructions = total_instructions(out.read_text())
    if not per:
        raise RuntimeError(f"callgrind of {subject} ({mode}): nothing was counted")
    return instructions / per


def total_instructions(report: str) -> int:
    """The instruction total of a callgrind output file (its ``summary:`` or ``totals:`` line)."""
    for line in report.splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError("callgrind wrote no total")


def _child(mode: str, subject: str) -> dict:
    """Under callgrind: warm up, then run the counted code through operator.call; {"per": the
    calls (connector) or requests (replay) the count is divided by}."""
    if mode == "connector":
        sys.path.insert(0, os.environ.get("KVOFFLOAD_COUNT_SUITE", str(SUITE)))
        from bench_connector import DecodeBatch

        batch = DecodeBatch(256, int(subject))
        for _ in range(WARM_STEPS):
            batch.step()
        for _ in range(DECODE_STEPS):
            out = batch.prepare_step()
            batch.finish_step(operator.call(batch.connector.build_connector_meta, out), out)
        return {"per": DECODE_STEPS}
    from kvoffload.choice import ConnectorChoice
    from kvoffload.runner import replay_workload
    from kvoffload.workloads import load_workload

    workload = load_workload(subject)
    replay_workload(workload, ConnectorChoice.build(), max_steps=WARM_STEPS)  # imports, first calls
    operator.call(replay_workload, workload, ConnectorChoice.build())
    return {"per": len(workload.requests)}


if __name__ == "__main__":
    if sys.argv[1:2] != ["--"] or len(sys.argv) != 3 or os.environ.get("KVOFFLOAD_COUNT_MODE") not in MODES:
        print("usage: KVOFFLOAD_COUNT_MODE=connector|replay python -m kvoffload.counts -- BLOCKS_PER_CHUNK|WORKLOAD "
              "(valgrind runs it: kvoffload.counts.count)", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(_child(os.environ["KVOFFLOAD_COUNT_MODE"], sys.argv[2])))
