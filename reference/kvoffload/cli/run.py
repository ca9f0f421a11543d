"""``kvoffload run``: replay one workload through one connector configuration."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Sequence

from kvoffload.cli.findings import finding_lines, strict_failures
from kvoffload.cli.flags import BAD_INPUT, Each, Once, OnceTrue, UsageError
from kvoffload.cli.outputs import DEFAULT_ROOT, TRACE, check_distinct, check_output_file
from kvoffload.core.fixes import PRESETS, Fixes
from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S
from kvoffload.engines import ENGINES, SIMULATOR, VLLM
from kvoffload.metrics import GLOSSARY, METRIC_NAMES, format_value
from kvoffload.results import SCHEMA as RUN_SCHEMA, write_atomic
from kvoffload.choice import SOURCES_HELP, ConnectorChoice, check_module_found, check_source, needs_storage
from kvoffload.runner import RunOutcome, chrome_trace, replay_workload
from kvoffload.workloads import DEFAULT_WORKLOAD, load_workload


REFERENCE = "reference"  # --preset reference: no preset, every fix on (sweep takes it the same way)


def register(sub) -> None:
    run = sub.add_parser("run", help="replay one workload through one connector configuration")
    run.add_argument("--workload", action=Once, default=DEFAULT_WORKLOAD,
                     help="NAME | PATH.toml | mooncake:FILE | sharegpt:FILE")
    run.add_argument("--scheduling", action=Once, choices=("sync", "async"),
                     help="sync or async scheduling (default: the workload's; same as --set scheduling=...)")
    run.add_argument("--disable-fix", action=Each, default=[], metavar="NAME",
                     help="replay with this fix flag off (repeatable; kvoffload fixes lists them)")
    run.add_argument("--preset", action=Once, metavar="NAME",
                     help=f"a vLLM release: one of {', '.join(PRESETS)}; 'reference' (the default) for all fixes on")
    run.add_argument("--set", action=Each, default=[], metavar="KEY=VALUE", dest="settings",
                     help="an engine setting for this run (repeatable; e.g. cpu_chunks=64GiB, gpu_blocks=auto)")
    run.add_argument("--out", action=Once, type=Path,
                     help=f"result JSON (default {DEFAULT_ROOT / 'runs'}/<workload>-<label>.json); missing "
                          "folders are created")
    run.add_argument("--quiet", action=OnceTrue, help="no progress bar")
    run.add_argument("--max-steps", action=Once, type=_positive_int, metavar="N",
                     help="stop after N engine steps (the run then fails, exit 1, its result says so)")
    run.add_argument("--trace", action=Once, type=Path, metavar="FILE",
                     help="also write the jobs as a Chrome trace (JSON; missing folders are created)")
    run.add_argument("--engine", action=Once, choices=ENGINES, default=SIMULATOR,
                     help="simulator (default), vLLM's own scheduler, or vLLM's real engine on a real model "
                          "(vllm; both need the vllm extra)")
    run.add_argument("--connector", action=Once, default="reference", metavar="NAME|MODULE:CLASS",
                     help=f"vLLM engines: {SOURCES_HELP} (vLLM's stock OffloadingConnector, the reference, "
                          "vLLM's SimpleCPUOffloadConnector eager or lazy, any class); "
                          "--engine vllm also off (no connector, no prefix caching)")
    run.add_argument("--model", action=Once, type=Path, metavar="PATH",
                     help="--engine vllm: a local model directory (default: the tiny Llama, seeded weights)")
    run.add_argument("--no-oracle", action=OnceTrue,
                     help="--engine vllm: skip the output oracle (its offload-off second run)")
    add_step_timeout(run)
    run.add_argument("--strict", action=OnceTrue,
                     help="exit 1 when any zero-metric (poisoned_loads, leaked_requests, crashes, ...) is above 0, "
                          "or the connector served nothing where the reference serves some")
    run.set_defaults(handler=_cmd_run)


def parse_settings(settings: Sequence[str], scheduling: str | None = None) -> dict[str, str]:
    """``--set KEY=VALUE`` strings (and ``--scheduling``) as a dict; a key set twice is an error."""
    parsed: dict[str, str] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        if key in parsed:
            raise UsageError(f"--set {key} given twice ({parsed[key]!r} and {value.strip()!r}): give it once")
        parsed[key] = value.strip()
    if scheduling is not None:
        if "scheduling" in parsed:
            raise UsageError(f"--scheduling {scheduling} and --set scheduling={parsed['scheduling']}: "
                             f"give the scheduling once")
        parsed["scheduling"] = scheduling
    return parsed


def connector_choice(preset: str | None, disabled: Sequence[str], source: str = "reference") -> ConnectorChoice:
    """The connector of ``--preset``/``--disable-fix``; disabling a fix the preset already lacks is
    an error (the label would name a change that is not one)."""
    if preset == REFERENCE:  # as sweep --preset reference: the reference connector, every fix on
        preset = None
    if source != "reference" and ":" not in source and (preset or disabled):
        flag = "--preset" if preset else "--disable-fix"
        raise UsageError(f"{flag} changes the reference connector, not --connector {source}")
    choice = ConnectorChoice.build(preset, tuple(disabled), source)  # unknown names: ConfigError
    if preset is not None:
        lacking = set(Fixes.preset(preset).disabled())
        for name in disabled:
            if name in lacking:
                raise UsageError(f"--disable-fix {name}: preset {preset} already lacks this fix")
    return choice


def _cmd_run(args: argparse.Namespace) -> int:
    overrides = parse_settings(args.settings, args.scheduling)
    if args.engine == SIMULATOR and args.connector != "reference":
        raise UsageError(f"--connector {args.connector} needs --engine vllm-scheduler (the simulator runs the reference)")
    if args.engine != VLLM and (args.model is not None or args.no_oracle):
        raise UsageError(f"--{'model' if args.model is not None else 'no-oracle'} needs --engine vllm")
    if args.connector == "off" and args.engine != VLLM:
        raise UsageError("--connector off needs --engine vllm")
    if args.engine != SIMULATOR and args.trace is not None:
        raise UsageError(f"--trace needs the simulator: the {args.engine} engine does not record jobs")
    choice = connector_choice(args.preset, args.disable_fix, args.connector)
    check_connector_source(args.connector, args.preset, args.disable_fix)
    outputs = [(flag, path) for flag, path in (("--out", args.out), ("--trace", args.trace)) if path is not None]
    check_distinct(outputs)  # first: "the same file" says more than what the other one holds
    for flag, path in outputs:  # a missing folder is made when the file is written (write_atomic)
        check_output_file(flag, path, create_parents=True, kind={"--out": RUN_SCHEMA, "--trace": TRACE}[flag])
    workload = load_workload(args.workload, overrides)
    out = args.out
    if out is None:
        engine_part = "" if args.engine == SIMULATOR else f"-{args.engine}"
        out = check_output_file("--out", DEFAULT_ROOT / "runs" / f"{slug(workload.name)}-{slug(choice.label)}"
                                f"{engine_part}.json", create_parents=True, kind=RUN_SCHEMA)
        check_distinct(outputs + [("--out", out)])
    if needs_storage(choice.source):  # a disk connector's files, beside the result, fresh for each run
        choice = dataclasses.replace(choice, storage_dir=str(fresh_storage(out)))
    options = engine_options(args.engine, args.model, not args.no_oracle and args.connector != "off")
    outcome = replay(workload, choice, quiet=args.quiet, trace=args.trace is not None, max_steps=args.max_steps,
                     engine=args.engine, engine_options=options, step_bound_s=args.step_timeout)
    write_atomic(out, outcome.result)
    if args.trace is not None:
        write_atomic(args.trace, chrome_trace(outcome.record))
    print(_run_table(outcome))
    findings = finding_lines(outcome.result)
    if findings:
        print("\n" + "\n".join(findings))
    print(f"\nresult: {out}")
    if outcome.failed:
        error = outcome.result["error"]
        where = "before its first step" if error["step"] is None else f"at step {error['step']}"
        print(f"kvoffload: run failed {where}: {error['message']}", file=sys.stderr)
        return 1
    oracle = outcome.result.get("oracle")
    if oracle is not None and oracle["mismatches"]:
        print(f"kvoffload: outputs differ from the offload-off run: {oracle['mismatches'][0]}", file=sys.stderr)
        return 1
    failures = strict_failures(outcome.result) if args.strict else []
    if failures:
        print(f"kvoffload: --strict: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


STORE_MARK = ".kvoffload-kv-store"  # the folder is a store this command made (and may empty)


def fresh_storage(out: Path) -> Path:
    """``<result>.kv-store/`` beside the result file, empty: a store an earlier run left is
    emptied (its mark says it is one); any other folder of that name is refused."""
    folder = out.with_name(out.stem + ".kv-store")
    if folder.exists():
        if not (folder / STORE_MARK).is_file():
            raise UsageError(f"{folder} exists and is not a connector store of an earlier run: move it away")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / STORE_MARK).write_text("files of a disk connector, written by kvoffload run\n")
    return folder


def check_connector_source(source: str, preset: str | None, disabled: Sequence[str]) -> None:
    """What can be said of ``--connector`` without vLLM, said before vLLM's import (seconds, and
    its import-time warnings on stderr): its shape (``mod:``, ``a:b:c``) and whether its module
    is there at all (``choice.check_module_found``)."""
    if source == "off":
        return
    check_source(source, None if preset == REFERENCE else preset, tuple(disabled))
    check_module_found(source)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def engine_options(engine: str, model: Path | None, oracle: bool) -> dict | None:
    """The vllm engine's constructor options; the model directory is checked before any replay."""
    if engine != VLLM:
        return None
    if model is not None:  # its config.json read and its weights found, without vLLM (no torch either)
        from kvoffload.vllm.geometry import ModelChoice

        ModelChoice.named(model)
    return {"model": None if model is None else str(model), "oracle": oracle}


def add_step_timeout(parser) -> None:
    parser.add_argument("--step-timeout", action=Once, type=_positive_seconds, default=DEFAULT_STEP_BOUND_S,
                        metavar="SECONDS",
                        help=f"an engine step (a connector call in it) running longer stops the run, naming the call "
                             f"and its request (default {DEFAULT_STEP_BOUND_S:g})")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {text!r}")
    return value


def replay(workload, choice: ConnectorChoice, quiet: bool, position: str = "", trace: bool = False,
           max_steps: int | None = None, engine: str = SIMULATOR, engine_options: dict | None = None,
           step_bound_s: float | None = DEFAULT_STEP_BOUND_S) -> RunOutcome:
    choice.fixes.check_model(workload.engine.kv_model)  # bad input before any progress bar or import
    if engine != SIMULATOR:  # vLLM's import and build warnings held until its first step (cli/stderr_hold.py)
        from kvoffload.cli.stderr_hold import StderrHold

        with StderrHold(drop_on=BAD_INPUT) as hold:
            return _replay(workload, choice, quiet, position, trace, max_steps, engine, engine_options,
                           step_bound_s, first_step=hold.release)
    return _replay(workload, choice, quiet, position, trace, max_steps, engine, engine_options, step_bound_s)


def _replay(workload, choice, quiet, position, trace, max_steps, engine, engine_options, step_bound_s,
            first_step=None) -> RunOutcome:
    if quiet:
        return replay_workload(workload, choice, on_step=first_step and (lambda step, finished: first_step()),
                               trace=trace, max_steps=max_steps, engine=engine, engine_options=engine_options,
                               step_bound_s=step_bound_s)
    from tqdm import tqdm

    with tqdm(total=len(workload.requests), desc=f"{position}{workload.name} [{choice.label}]", unit="req",
              file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
        def on_step(step: int, finished: int) -> None:
            if first_step is not None:
                first_step()
            if finished > bar.n:
                bar.update(finished - bar.n)
        return replay_workload(workload, choice, on_step=on_step, trace=trace, max_steps=max_steps,
                               engine=engine, engine_options=engine_options, step_bound_s=step_bound_s)


def _run_table(outcome: RunOutcome) -> str:
    result = outcome.result
    metrics = result["metrics"]
    config = result["config"]
    head = (f"workload {result['workload']['name']} ({result['workload']['requests']} requests, "
            f"{config['scheduling']} scheduling)   connector {result['connector']['label']}"
            f"   engine {config.get('engine', SIMULATOR)}")
    width = max(len(name) for name in METRIC_NAMES)
    lines = [head, "-" * len(head)]
    for name, _, meaning in GLOSSARY:
        lines.append(f"{name:<{width}}  {format_value(name, metrics.get(name)):>12}   {meaning}".rstrip())
    oracle = result.get("oracle")
    if oracle is not None:
        lines.append("")
        lines.append(oracle_line(oracle))
    return "\n".join(lines)


def oracle_line(oracle: dict) -> str:
    """The output oracle's verdict in one line (run and bench tables)."""
    head = (f"output oracle: {oracle['identical']} of {oracle['compared']} requests identical to the offload-off "
            f"run (greedy tokens; first {oracle['first_n_logprobs']} logprobs within {oracle['logprob_tolerance']:g}, "
            f"largest delta {oracle['max_logprob_delta']:.2g})")
    if oracle["not_compared"]:
        head += f"; {len(oracle['not_compared'])} not compared"
    if oracle["mismatches"]:
        head += f"\nfirst mismatch: {oracle['mismatches'][0]}"
    return head


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in text.replace(" -", "-no-")).strip("_")
