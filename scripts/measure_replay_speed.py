#!/usr/bin/env python
"""Replay speed of two engine versions side by side (issue 9: no slower than 1.1x).

Each source tree (a ``reference/`` folder, e.g. from ``git archive <commit>``) replays the same
workload in its own fresh interpreter with ``PYTHONPATH`` pointing at it; the figure is the CPU
seconds (``time.process_time()``) around ``replay_workload`` alone: loading the workload and
importing torch are outside it. The trees alternate (A B A B ...) so that load on a shared machine
hits both alike; the medians and their ratio are printed with the load average.

    python scripts/measure_replay_speed.py --tree old=/tmp/old/reference --tree new=reference \\
        --workload multi-turn --set scheduling=async --pairs 3

Every replay runs with the oracle and the invariant checks on (the engine's defaults) and is
bounded by ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from script_args import StrictParser, positive_int  # noqa: E402

CHILD = r"""
import json, sys, time
from kvoffload.choice import ConnectorChoice
from kvoffload.runner import replay_workload
from kvoffload.workloads import load_workload
workload = load_workload(sys.argv[1], json.loads(sys.argv[2]))
choice = ConnectorChoice.build()
started = time.process_time()
outcome = replay_workload(workload, choice)
seconds = time.process_time() - started
record = outcome.record
print(json.dumps({"seconds": seconds, "steps": record.steps, "crash": record.crash,
                  "finished": record.finished_requests}))
"""


def replay_once(tree: str, workload: str, settings: dict[str, str], timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    done = subprocess.run([sys.executable, "-c", CHILD, workload, json.dumps(settings)], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise SystemExit(f"replay with {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = StrictParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=PATH",
                        help="a reference/ folder to replay with (give two)")
    parser.add_argument("--workload", default="multi-turn")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings")
    parser.add_argument("--pairs", type=positive_int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per replay")
    args = parser.parse_args(argv)
    trees = [item.partition("=")[::2] for item in args.tree]
    settings = dict(item.partition("=")[::2] for item in args.settings)
    seconds: dict[str, list[float]] = {label: [] for label, _ in trees}
    for pair in range(args.pairs):
        for label, path in trees:
            result = replay_once(path, args.workload, settings, args.timeout)
            seconds[label].append(result["seconds"])
            print(f"pair {pair + 1} {label:>8}: {result['seconds']:7.2f} s CPU, {result['steps']} steps """
                  f"({1000 * result['seconds'] / max(result['steps'], 1):.3f} ms/step), "
                  f"{result['finished']} finished, crash {result['crash']}  (load {os.getloadavg()[0]:.2f})",
                  flush=True)
    medians = {label: statistics.median(values) for label, values in seconds.items()}
    for label, value in medians.items():
        print(f"median {label:>8}: {value:.2f} s")
    if len(trees) == 2:
        (first, _), (second, _) = trees
        print(f"ratio {second}/{first}: {medians[second] / medians[first]:.3f} (medians)")
        # On a shared machine a slow spell lengthens whole runs of either tree; the fastest run of
        # each (noise only adds time) and the median of the per-pair ratios are steadier figures.
        print(f"ratio {second}/{first}: {min(seconds[second]) / min(seconds[first]):.3f} (fastest runs)")
        pair_ratios = [b / a for a, b in zip(seconds[first], seconds[second])]
        print(f"ratio {second}/{first}: {statistics.median(pair_ratios):.3f} (median of the pairs' ratios; "
              f"range {min(pair_ratios):.2f}-{max(pair_ratios):.2f})")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
