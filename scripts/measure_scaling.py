"""Wall time and peak RSS of replays of the first N requests of Mooncake traces (issue 14).

    .venv/bin/python scripts/measure_scaling.py --trace conversation=/path/conversation_trace.jsonl \
        --sizes 1000,4000,all --scheduling sync --timeout 900 --out results/scaling/scaling.json
    .venv/bin/python scripts/measure_scaling.py --redraw --out results/scaling/scaling.json   # the chart only

Each replay runs in its own process (this script with ``--replay``: ``load_workload`` with
``gpu_blocks=auto``, then ``replay_workload`` with the reference connector, as ``kvoffload run``
does), so its peak RSS is its own: ``ru_maxrss`` of the finished child from ``wait4``. A replay
still running after ``--timeout`` seconds is killed and recorded as such (``finished: false``),
so every measurement is bounded; how far it got (step, finished requests, CPU seconds, written
every 5 s) is kept with the point. ``all`` replays the whole trace file. CPU seconds (user +
system of the child) are recorded next to wall seconds: on a shared machine they are the better
estimate of an idle machine's wall time.

Each point also carries the first-admission reuse (prompt tokens served at a request's first
admission by the GPU prefix cache or the connector / prompt tokens) and, with ``--bound``, the
infinite-cache reuse bound of the same requests (``reusable_prompt_share``, computed in a child of
its own so its memory stays out of the replay's). Points are appended to the JSON file as they
finish, with the load average before and after; the chart (``kvoffload.report.scaling``) is
drawn next to it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from script_args import StrictParser  # noqa: E402

from kvoffload.report.scaling import ScalingPoint, draw_scaling


def run_child(args: list[str], timeout: float) -> tuple[float, int, bool, float]:
    """Run this script with ``args`` in a child; (wall seconds, peak RSS bytes, finished, CPU seconds)."""
    pid = os.fork()
    if pid == 0:  # the child: exec; its rusage is its own once it exits
        os.execv(sys.executable, [sys.executable, __file__, *args])
    started = time.perf_counter()
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() - started > timeout:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            return time.perf_counter() - started, usage.ru_maxrss * 1024, False, usage.ru_utime + usage.ru_stime
        time.sleep(0.2)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child {args} failed (exit {os.waitstatus_to_exitcode(status)})")
    return wall, usage.ru_maxrss * 1024, True, usage.ru_utime + usage.ru_stime


def child_replay(trace: str, scheduling: str, out: str) -> None:
    from kvoffload.choice import ConnectorChoice
    from kvoffload.runner import replay_workload
    from kvoffload.workloads import load_workload

    workload = load_workload(f"mooncake:{trace}", {"gpu_blocks": "auto", "scheduling": scheduling})
    progress = Path(out).with_suffix(".progress")
    last = [time.perf_counter()]

    def on_step(step: int, finished: int) -> None:  # how far a replay got, should it be killed
        if time.perf_counter() - last[0] > 5:
            last[0] = time.perf_counter()
            progress.write_text(json.dumps({"step": step, "finished_requests": finished,
                                            "cpu_seconds": time.process_time()}))

    outcome = replay_workload(workload, ConnectorChoice.build(), on_step=on_step)
    record = outcome.record
    served = (record.gpu_hit_tokens + record.connector_hit_tokens_admitted) / record.admitted_prompt_tokens
    Path(out).write_text(json.dumps({"metrics": outcome.result["metrics"], "first_admission_reuse": served,
                                     "gpu_blocks": workload.engine.gpu_blocks,
                                     "cpu_chunks": workload.engine.cpu_chunks}))


def child_bound(trace: str, out: str) -> None:
    from kvoffload.workloads import load_workload, reusable_prompt_share

    Path(out).write_text(json.dumps(reusable_prompt_share(load_workload(f"mooncake:{trace}", {"gpu_blocks": "auto"}))))


def measure(trace: Path, size: str, scheduling: str, timeout: float, bound: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="kvoffload-scaling-") as folder:
        head = trace
        if size != "all":
            head = Path(folder) / f"first-{size}.jsonl"
            with trace.open() as source, head.open("w") as sink:
                sink.writelines(islice(source, int(size)))
        result = Path(folder) / "result.json"
        load_before = os.getloadavg()[0]
        wall, rss, finished, cpu = run_child(["--replay", str(head), scheduling, str(result)], timeout)
        point = {"requests": sum(1 for line in head.open() if line.strip()), "finished": finished,
                 "wall_seconds": wall, "cpu_seconds": cpu, "peak_rss_bytes": rss, "load_before": load_before,
                 "load_after": os.getloadavg()[0]}
        if not finished and result.with_suffix(".progress").exists():
            point["progress_at_kill"] = json.loads(result.with_suffix(".progress").read_text())
        if finished:
            data = json.loads(result.read_text())
            point.update(sim_requests_per_s=data["metrics"]["sim_requests_per_s"],
                         first_admission_reuse=data["first_admission_reuse"], gpu_blocks=data["gpu_blocks"],
                         cpu_chunks=data["cpu_chunks"])
        if bound:
            bound_file = Path(folder) / "bound.json"
            bound_wall, bound_rss, bound_done, _ = run_child(["--bound", str(head), str(bound_file)], timeout)
            if bound_done:
                point.update(reuse_bound=json.loads(bound_file.read_text()), bound_seconds=bound_wall,
                             bound_peak_rss_bytes=bound_rss)
    return point


def main() -> None:
    if sys.argv[1:2] == ["--replay"]:
        return child_replay(*sys.argv[2:5])
    if sys.argv[1:2] == ["--bound"]:
        return child_bound(*sys.argv[2:4])
    parser = StrictParser()
    parser.add_argument("--trace", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--sizes", default="250,500,1000", help="request counts, or all")
    parser.add_argument("--scheduling", default="sync")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per replay before it is killed")
    parser.add_argument("--bound", action="store_true", help="also the infinite-cache reuse bound")
    parser.add_argument("--out", type=Path, default=Path("results/scaling/scaling.json"))
    parser.add_argument("--redraw", action="store_true", help="only draw the chart of the points in --out")
    args = parser.parse_args()
    if not args.trace and not args.redraw:
        parser.error("give --trace NAME=PATH (to measure) or --redraw (to draw the points in --out)")
    if args.trace and args.redraw:
        parser.error("--redraw measures nothing: give it without --trace")
    points = json.loads(args.out.read_text()) if args.out.exists() else []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    for spec in args.trace:
        name, _, path = spec.partition("=")
        for size in args.sizes.split(","):
            point = {"series": f"{name} {args.scheduling}", "commit": commit,
                     **measure(Path(path), size, args.scheduling, args.timeout, args.bound)}
            print(json.dumps(point), flush=True)
            points.append(point)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(points, indent=1) + "\n")
    finished = [ScalingPoint(p["series"], p["requests"], p["wall_seconds"], p["peak_rss_bytes"], p.get("cpu_seconds"))
                for p in points if p.get("finished", True)]
    if finished:
        print(f"chart: {draw_scaling(finished, args.out.with_suffix('.png'))}")


if __name__ == "__main__":
    main()
