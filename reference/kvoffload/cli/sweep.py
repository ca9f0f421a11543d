"""``kvoffload sweep``: a grid of runs (workload x preset x ``--grid`` values) over local processes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvoffload.cli.flags import Each, Once, OnceTrue, UsageError
from kvoffload.cli.outputs import DEFAULT_ROOT, check_output_dir, check_output_file
from kvoffload.cli.run import REFERENCE
from kvoffload.engine.config import EngineConfig
from kvoffload.metrics import format_value
from kvoffload.results import SCHEMA as RUN_SCHEMA, read_result
from kvoffload.choice import ConnectorChoice
from kvoffload.sweep import check_cells, duplicates, plan_grid, run_grid, shard
from kvoffload.workloads import WorkloadError
from kvoffload.workloads.sizing import split_sizing

SHOWN_METRICS = ("offload_hit_rate", "gpu_hit_rate", "tokens_per_s_modeled")


def register(sub) -> None:
    sweep = sub.add_parser("sweep", help="a grid of runs over local processes, one result file each")
    sweep.add_argument("--workload", action=Each, required=True, metavar="SPEC",
                       help="repeatable: NAME | PATH.toml | mooncake:FILE | sharegpt:FILE")
    sweep.add_argument("--preset", action=Each, metavar="NAME", help="repeatable; 'reference' for all fixes on")
    sweep.add_argument("--grid", action=Each, default=[], metavar="KEY=V1,V2,...",
                       help="repeatable: an engine setting and its values (cpu_chunks=1024,4096,50%%)")
    sweep.add_argument("--set", action=Each, default=[], metavar="KEY=VALUE", dest="settings",
                       help="a setting every cell shares")
    sweep.add_argument("--jobs", action=Once, type=int, default=1, help="local processes (default 1)")
    sweep.add_argument("--shard", action=Once, metavar="K/N",
                       help="run only cells K, K+N, K+2N, ... (0-based), e.g. a job array's task")
    sweep.add_argument("--out-dir", action=Once, type=Path, default=DEFAULT_ROOT / "sweep", metavar="DIR",
                       help=f"folder for one result file per cell (default {DEFAULT_ROOT / 'sweep'}/)")
    sweep.add_argument("--quiet", action=OnceTrue, help="no progress bar")
    sweep.set_defaults(handler=_cmd_sweep)


def _pair(text: str, flag: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise UsageError(f"{flag} expects KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _check_setting(key: str, value: str, flag: str) -> None:
    rest, _ = split_sizing({key: value})  # auto, sizes and shares are checked there
    for name, text in rest.items():
        try:
            EngineConfig.parse_value(name, text)
        except Exception as error:
            raise WorkloadError(f"{flag} {key}={value}: {error}") from None


def _cmd_sweep(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise UsageError(f"--jobs expects at least 1, got {args.jobs}")
    presets = [None if name == REFERENCE else name for name in (args.preset or [REFERENCE])]
    for preset in presets:
        ConnectorChoice.build(preset)  # ConfigError naming an unknown preset
    fixed = [_pair(text, "--set") for text in args.settings]
    grid = []
    for text in args.grid:
        key, values = _pair(text, "--grid")
        grid.append((key, [value.strip() for value in values.split(",")]))
    keys = [key for key, _ in fixed] + [key for key, _ in grid]
    if len(set(keys)) != len(keys):
        raise UsageError(f"a setting is given twice across --set and --grid: {', '.join(keys)}")
    for key, value in fixed:
        _check_setting(key, value, "--set")
    for key, values in grid:
        for value in values:
            _check_setting(key, value, "--grid")
    cells = plan_grid(args.workload, presets, grid, fixed)
    if twice := duplicates(cells):
        raise UsageError(f"two cells would write {twice[0]} (a value listed twice?)")
    share = _parse_shard(args.shard) if args.shard is not None else None
    out_dir = check_output_dir("--out-dir", args.out_dir)
    for cell in cells:  # the whole grid's names, whichever share this job runs
        check_output_file("--out-dir", out_dir / cell.file_name(), create_parents=True, kind=RUN_SCHEMA)
    if share is not None:
        cells = shard(cells, *share)
    check_cells(cells)  # every workload with every value, before the first replay

    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=len(cells), desc=f"sweep ({args.jobs} jobs)", unit="run", file=sys.stderr,
                   leave=False, dynamic_ncols=True)

    def on_done(cell, path, failed) -> None:
        if bar is not None:
            bar.set_postfix_str(cell.describe(), refresh=False)
            bar.update(1)

    try:
        done = run_grid(cells, out_dir, args.jobs, on_done)
    finally:
        if bar is not None:
            bar.close()
    for cell, path, failed in done:
        metrics = read_result(path)["metrics"]
        shown = "  ".join(f"{name} {format_value(name, metrics[name])}" for name in SHOWN_METRICS)
        print(f"{'FAILED ' if failed else ''}{cell.describe()}  {shown}  -> {path}")
    print(f"\n{len(done)} runs; results in {out_dir}/")
    return 1 if any(failed for _, _, failed in done) else 0


def _parse_shard(text: str) -> tuple[int, int]:
    index, sep, count = text.partition("/")
    if not (sep and index.isdigit() and count.isdigit() and len(index) < 20 and len(count) < 20
            and int(count) >= 1 and int(index) < int(count)):
        raise UsageError(f"--shard expects K/N with 0 <= K < N, got {text!r}")
    return int(index), int(count)
