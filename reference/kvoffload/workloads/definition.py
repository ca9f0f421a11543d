"""Workload definitions: read a TOML file (or a trace spec), apply ``--set`` overrides, generate.

A definition (format documented in ``workloads/README.md``)::

    name = "multi-turn"
    description = "..."
    seed = 7
    [engine]            # any EngineConfig key except seed (the top-level seed is the one seed)
    gpu_blocks = 4096
    [generator]
    kind = "multi-turn"  # a registered generator; the rest of the table is its parameters
    conversations = 250

``load_workload`` accepts a bundled NAME (``workloads/NAME.toml`` of this repository), a PATH to a
``.toml``, ``mooncake:FILE`` or ``sharegpt:FILE``. The two trace specs take their seed and engine
settings from the default workload (``multi-turn``).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from functools import partial
from typing import Any, Callable, Sequence

from kvoffload import long_numbers
from kvoffload.core.types import ConfigError
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads import mooncake, multi_turn, shared_prefix, sharegpt, spec_decode  # noqa: F401  (register)
from kvoffload.workloads.distributions import Distribution, parse_distribution
from kvoffload.workloads.limits import MAX_STEP, Budget, check_engine
from kvoffload.workloads.registry import (
    GENERATORS,
    GenerateContext,
    Generator,
    estimated_arrival_steps,
    in_arrival_order,
)
from kvoffload.workloads.schema import TableReader, WorkloadError, fail, require_regular_file
from kvoffload.workloads.sizing import check_fit, longest, split_sizing, unbounded_lengths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

def _bundled_dir() -> Path:
    """Bundled definitions live at the top of the repository (reference/kvoffload/workloads/ ->
    ../../..). An installed wheel has no checkout around it: KVOFFLOAD_WORKLOADS_DIR names the
    folder then, else ./workloads of the current directory is used."""
    override = os.environ.get("KVOFFLOAD_WORKLOADS_DIR")
    if override:
        return Path(override)
    checkout = Path(__file__).resolve().parents[3] / "workloads"
    return checkout if checkout.is_dir() else Path.cwd() / "workloads"


BUNDLED_DIR = _bundled_dir()
DEFAULT_WORKLOAD = "multi-turn"
TRACE_KINDS = ("mooncake", "sharegpt")

_BUNDLED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_TOML_POSITION = re.compile(r"\s*\((?:at line (\d+), column (\d+)|at end of document)\)\s*$")


@dataclass(frozen=True)
class Workload:
    """A generated workload: the engine settings and the requests, in estimated arrival order
    (a tuple, or for a trace a :class:`RequestStream` that builds each request when reached)."""

    name: str
    description: str
    seed: int
    engine: EngineConfig
    requests: Sequence[RequestSpec]
    source: str  # the bundled name, the path as given, or the trace spec
    # ``[resets] at_steps``: vLLM's reset_prefix_cache(reset_connector=True) between two engine
    # steps, at the start of each of these (docs/engine.md, "Resetting the caches").
    reset_cache_at: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Definition:
    name: str
    description: str
    seed: int
    engine: EngineConfig  # the file's settings, seed included
    generator: Generator
    display: str  # the file named in messages
    base_dir: Path
    aborts: "AbortPlan | None" = None
    reset_cache_at: tuple[int, ...] = ()


MAX_RESETS = 10_000  # scripted cache resets per workload: a list, written by hand


@dataclass(frozen=True)
class AbortPlan:
    """``[aborts]``: each request is aborted with probability ``share``, ``after_steps`` steps
    after it arrives (0: while still queued). Drawn from its own seeded stream, so adding aborts
    leaves the request stream itself unchanged."""

    share: float
    after_steps: Distribution

    def apply(self, requests: tuple[RequestSpec, ...], seed: int) -> tuple[RequestSpec, ...]:
        return tuple(map(self.per_request(seed), requests))

    def per_request(self, seed: int) -> Callable[[RequestSpec], RequestSpec]:
        """The plan as a map over the requests in order (one seeded stream of draws)."""
        rng = random.Random(f"{seed}/aborts")

        def apply_one(spec: RequestSpec) -> RequestSpec:
            if rng.random() < self.share:
                return dataclasses.replace(spec, abort_after_steps=self.after_steps.sample(rng))
            return spec

        return apply_one


def load_workload(spec: str, overrides: dict[str, str] | None = None) -> Workload:
    """Read, override (``--set KEY=VALUE`` strings; ``seed`` reseeds the generator too), generate."""
    definition, source = _resolve(spec)
    given = overrides or {}
    overrides, sizing = split_sizing(given)  # gpu_blocks=auto, cpu_chunks=64GiB / 50%: need the requests
    seed, engine = _apply_overrides(definition, overrides)
    where = _settings_source(definition.display, given)
    check_engine(engine, where)
    ctx = GenerateContext(seed=seed, engine=engine, source=definition.display, base_dir=definition.base_dir,
                          budget=Budget(engine, definition.display))
    early = getattr(definition.generator, "longest_request", None)
    if early is not None:  # a trace's lengths alone: size or reject it before building its tokens
        engine = sizing.resolve_gpu_blocks(engine, *early(ctx), definition.display)
        check_engine(engine, where)
    # gpu_blocks=auto without a cheap longest request: lengths are bounded once generated
    budget_engine = unbounded_lengths(engine) if sizing.gpu_auto and early is None else engine
    ctx = dataclasses.replace(ctx, engine=engine, budget=Budget(budget_engine, definition.display))
    stream = getattr(definition.generator, "stream", None)
    if stream is not None:  # a trace: checked whole by its first pass, built request by request later
        requests: Sequence[RequestSpec] = stream(ctx)
        if definition.aborts is not None:
            requests = requests.mapped(partial(definition.aborts.per_request, seed))
    else:
        generated = definition.generator.generate(ctx)
        if not generated:
            raise WorkloadError(f"{definition.display}: key generator: expected at least one request, got none")
        _check_arrivals(generated, definition.display)
        requests = in_arrival_order(generated)
        if definition.aborts is not None:
            requests = definition.aborts.apply(requests, seed)
    resolved = sizing.resolve(engine, requests)
    if resolved != engine:
        check_engine(resolved, where)
    engine = resolved
    check_fit(*longest(requests), engine, definition.display)
    return Workload(name=definition.name, description=definition.description, seed=seed, engine=engine,
                    requests=requests, source=source, reset_cache_at=definition.reset_cache_at)


def _settings_source(display: str, overrides: dict[str, str]) -> str:
    """Where engine settings came from, for messages: the file, and the --set flags if any."""
    if not overrides:
        return f"{display}: key engine"
    return f"{display} with --set " + " ".join(f"{key}={text}" for key, text in overrides.items())


def _check_arrivals(requests: list[RequestSpec], display: str) -> None:
    """Arrival steps (a follow-up's estimated from its parent's) must stay step numbers (limits.py)."""
    for step, spec in zip(estimated_arrival_steps(requests), requests):
        if step > MAX_STEP:
            raise WorkloadError(f"{display}: request {spec.req_id}: expected an arrival step of at most 2**53 "
                                f"(gaps and think times add up), got {step:,}")


def list_workloads() -> list[tuple[str, str]]:
    """(name, description) of every bundled definition, by name."""
    found = []
    for path in sorted(BUNDLED_DIR.glob("*.toml"), key=lambda path: path.stem):
        definition = _read_definition(path, display=f"workloads/{path.name}")
        found.append((definition.name, definition.description))
    return found


def _resolve(spec: str) -> tuple[_Definition, str]:
    kind, colon, file = spec.partition(":")
    if kind in TRACE_KINDS and colon:
        if not file:
            raise WorkloadError(f"{spec}: expected {kind}:FILE, got no file name")
        return _trace_definition(kind, file), spec
    if _BUNDLED_NAME.fullmatch(spec) and not spec.endswith(".toml"):
        path = BUNDLED_DIR / f"{spec}.toml"
        if not path.is_file():
            known = ", ".join(name for name, _ in list_workloads())
            raise WorkloadError(f"{spec}: unknown workload (expected a bundled name ({known}), a path to a "
                                f".toml file, mooncake:FILE or sharegpt:FILE)")
        return _read_definition(path, display=f"workloads/{path.name}"), spec
    return _read_definition(Path(spec), display=spec), spec


def _trace_definition(kind: str, file: str) -> _Definition:
    default = _read_definition(BUNDLED_DIR / f"{DEFAULT_WORKLOAD}.toml", display=f"workloads/{DEFAULT_WORKLOAD}.toml")
    table = TableReader({"kind": kind, "path": file}, source=f"{kind}:{file}", prefix="generator.")
    table.string("kind")
    generator = GENERATORS[kind](table)
    return _Definition(name=f"{kind}:{Path(file).name}", description=f"{kind} trace {file}", seed=default.seed,
                       engine=default.engine, generator=generator, display=file, base_dir=Path("."))


def _read_definition(path: Path, *, display: str) -> _Definition:
    require_regular_file(path, display, "a workload definition .toml")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise WorkloadError(f"{display}: expected UTF-8 TOML text, got undecodable bytes") from None
    except OSError as exc:
        raise WorkloadError(f"{display}: cannot read the file ({exc.strerror})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise WorkloadError(f"{display}: {_toml_problem(exc)}") from None
    except ValueError as exc:  # not a TOMLDecodeError: an integer too long to convert
        if not long_numbers.is_too_long(exc):
            raise
        raise WorkloadError(f"{display}: expected {long_numbers.EXPECTED}, got {long_numbers.describe(text)}") \
            from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise WorkloadError(f"{display}: expected a workload definition, got arrays or tables nested too "
                            f"deeply to read") from None
    top = TableReader(data, source=display)
    name = top.string("name")
    if not name.strip():
        top.fail("name", "a non-empty string", name)
    description = top.string("description")
    seed = top.integer("seed", minimum=0)
    engine = _read_engine(top.table("engine", default={}), seed=seed)
    generator_table = top.table("generator")
    kind = generator_table.string("kind", choices=sorted(GENERATORS))
    generator = GENERATORS[kind](generator_table)
    generator_table.finish()
    aborts = None
    if top.has("aborts"):
        abort_table = top.table("aborts")
        aborts = AbortPlan(share=abort_table.number("share", minimum=0.0, maximum=1.0),
                           after_steps=parse_distribution(abort_table, "after_steps", floor=0, ceiling=MAX_STEP))
        abort_table.finish()
    reset_cache_at: tuple[int, ...] = ()
    if top.has("resets"):
        reset_table = top.table("resets")
        reset_cache_at = _reset_steps(reset_table)
        reset_table.finish()
    top.finish()
    return _Definition(name=name, description=description, seed=seed, engine=engine, generator=generator,
                       display=display, base_dir=path.parent, aborts=aborts, reset_cache_at=reset_cache_at)


def _reset_steps(table: TableReader) -> tuple[int, ...]:
    """``[resets] at_steps = [...]``: increasing engine steps in [1, MAX_STEP]."""
    steps = table.raw("at_steps")
    expected = f"an increasing list of at most {MAX_RESETS:,} engine steps in [1, 2**53]"
    if (not isinstance(steps, list) or not steps or len(steps) > MAX_RESETS
            or any(type(step) is not int or not 1 <= step <= MAX_STEP for step in steps)
            or any(later <= earlier for earlier, later in zip(steps, steps[1:]))):
        table.fail("at_steps", expected, steps if not isinstance(steps, list) or len(steps) <= 8
                   else f"a list of {len(steps):,} values")
    return tuple(steps)


def _toml_problem(exc: Exception) -> str:
    """``line 3, column 7: expected valid TOML, got: Expected ...`` from tomllib's message."""
    message = str(exc).strip()
    match = _TOML_POSITION.search(message)
    reason = message[: match.start()] if match else message
    if match and match.group(1):
        return f"line {match.group(1)}, column {match.group(2)}: expected valid TOML, got: {reason}"
    return f"end of file: expected valid TOML, got: {reason}"


def _read_engine(table: TableReader, *, seed: int) -> EngineConfig:
    """The [engine] table, type-checked per EngineConfig field, then validated by EngineConfig."""
    defaults = {field.name: field.default for field in dataclasses.fields(EngineConfig)}
    values: dict[str, Any] = {}
    for key in table.keys():
        if key == "seed":
            table.fail(key, "no seed here (the top-level seed seeds both generator and engine)", table.raw(key))
        if key not in defaults:
            known = ", ".join(name for name in defaults if name != "seed")
            table.raw(key)
            fail(table.source, table.where(key), f"an engine setting ({known})", key)
        default = defaults[key]
        if isinstance(default, bool):
            values[key] = table.boolean(key)
        elif isinstance(default, int):
            values[key] = table.integer(key)
        elif isinstance(default, float):
            values[key] = table.number(key)
        elif key == "scheduling":
            values[key] = table.string(key, choices=("sync", "async"))
        else:
            values[key] = table.string(key)
    try:
        return EngineConfig(**values, seed=seed)
    except ConfigError as exc:
        raise WorkloadError(f"{table.source}: key engine: {exc}") from None


def _apply_overrides(definition: _Definition, overrides: dict[str, str]) -> tuple[int, EngineConfig]:
    changes: dict[str, Any] = {}
    for key, text in overrides.items():
        try:
            changes[key] = EngineConfig.parse_value(key, text)
        except ConfigError as exc:
            raise WorkloadError(f"--set {key}={text}: {exc}") from None
    try:
        engine = definition.engine.replace(**changes)
    except ConfigError as exc:
        keys = " ".join(f"{key}={text}" for key, text in overrides.items())
        raise WorkloadError(f"--set {keys}: {exc}") from None
    return engine.seed, engine
