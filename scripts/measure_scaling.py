"""Wall time and peak RSS of replays of the first N requests of Mooncake traces (issue 14).

    .venv/bin/python scripts/measure_scaling.py --trace conversation=/path/conversation_trace.jsonl \
        --sizes 250,500,1000 --scheduling sync --out results/scaling/scaling.json

Each replay runs in its own ``kvoffload run`` process (``--set gpu_blocks=auto``), so its peak
RSS is its own (``getrusage`` of the finished child). Points are appended to the JSON file as
they finish; the chart (``kvoffload.report.scaling``) is drawn next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

from kvoffload.report.scaling import ScalingPoint, draw_scaling


def replay(trace: Path, size: int, scheduling: str) -> tuple[float, int, dict]:
    with tempfile.TemporaryDirectory(prefix="kvoffload-scaling-") as folder:
        head = Path(folder) / f"first-{size}.jsonl"
        with trace.open() as source, head.open("w") as sink:
            sink.writelines(islice(source, size))
        result = Path(folder) / "result.json"
        command = [sys.executable, "-m", "kvoffload.cli", "run", "--workload", f"mooncake:{head}",
                   "--set", "gpu_blocks=auto", "--set", f"scheduling={scheduling}", "--quiet", "--out", str(result)]
        pid = os.fork()
        if pid == 0:  # the child: exec the replay; its rusage is ours alone once it exits
            os.execv(sys.executable, command)
        started = time.perf_counter()
        _, status, usage = os.wait4(pid, 0)
        wall = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"replay of {size} requests failed (exit {os.waitstatus_to_exitcode(status)})")
        metrics = json.loads(result.read_text())["metrics"]
    return wall, usage.ru_maxrss * 1024, metrics


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--sizes", default="250,500,1000")
    parser.add_argument("--scheduling", default="sync")
    parser.add_argument("--out", type=Path, default=Path("results/scaling/scaling.json"))
    args = parser.parse_args()
    points = json.loads(args.out.read_text()) if args.out.exists() else []
    for spec in args.trace:
        name, _, path = spec.partition("=")
        for size in (int(s) for s in args.sizes.split(",")):
            wall, rss, metrics = replay(Path(path), size, args.scheduling)
            point = {"series": f"{name} {args.scheduling}", "requests": metrics["requests"], "wall_seconds": wall,
                     "peak_rss_bytes": rss, "load": os.getloadavg()[0],
                     "sim_requests_per_s": metrics["sim_requests_per_s"]}
            print(json.dumps(point), flush=True)
            points.append(point)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(points, indent=1) + "\n")
    chart = draw_scaling([ScalingPoint(p["series"], p["requests"], p["wall_seconds"], p["peak_rss_bytes"])
                          for p in points], args.out.with_suffix(".png"))
    print(f"chart: {chart}")


if __name__ == "__main__":
    main()
