"""The generator registry and what every generator is handed.

A generator is a frozen dataclass of its parameters with two methods:

- ``from_table(table: TableReader) -> Self``: read and validate the ``[generator]`` table (the
  caller rejects leftover keys afterwards);
- ``generate(ctx: GenerateContext) -> list[RequestSpec]``: the request stream, parents before
  their follow-ups, drawn only from ``random.Random`` instances seeded from ``ctx.seed``. Every
  length goes through ``ctx.budget`` before its tokens are generated (``limits.py``), so an
  oversized request fails at once, not after minutes of token generation.

Generation runs after ``--set`` overrides are applied, so a generator that shapes requests around
engine settings (spec-decode aligns outputs to chunks) follows the effective configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, TypeVar

from kvoffload.engine.config import EngineConfig
from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads.limits import Budget
from kvoffload.workloads.schema import TableReader


@dataclass(frozen=True)
class GenerateContext:
    seed: int
    engine: EngineConfig
    source: str  # the definition named in error messages
    base_dir: Path  # relative trace paths resolve against this folder
    budget: Budget  # check each request's lengths with it before generating its tokens


class Generator(Protocol):
    def generate(self, ctx: GenerateContext) -> list[RequestSpec]: ...


GeneratorFactory = Callable[[TableReader], Generator]
GENERATORS: dict[str, GeneratorFactory] = {}

_T = TypeVar("_T")


def register(kind: str) -> Callable[[_T], _T]:
    """Class decorator: make ``cls.from_table`` the factory of generator ``kind``."""

    def add(cls: _T) -> _T:
        if kind in GENERATORS:
            raise RuntimeError(f"generator kind {kind!r} registered twice")
        GENERATORS[kind] = cls.from_table  # type: ignore[attr-defined]
        return cls

    return add


def estimated_arrival_steps(requests: list[RequestSpec] | tuple[RequestSpec, ...]) -> list[int]:
    """A static estimate of each request's arrival step, in list order.

    A root arrives at ``arrival_step``; a follow-up at its parent's estimate plus one step per
    parent output token plus ``think_steps`` (no queueing, one token per step). The engine decides
    real arrivals; this estimate only orders requests for listing and for the reuse share.
    Parents must precede their follow-ups; a parent not in the list makes a root.
    """
    steps: dict[str, int] = {}
    lengths: dict[str, int] = {}
    out = []
    for spec in requests:
        if spec.parent is not None and spec.parent in steps:
            step = steps[spec.parent] + lengths[spec.parent] + spec.think_steps
        else:
            step = spec.arrival_step
        steps[spec.req_id] = step
        lengths[spec.req_id] = spec.max_tokens
        out.append(step)
    return out


def in_arrival_order(requests: list[RequestSpec]) -> tuple[RequestSpec, ...]:
    """``requests`` stably sorted by estimated arrival; a follow-up always after its parent."""
    steps = estimated_arrival_steps(requests)
    order = sorted(range(len(requests)), key=lambda i: (steps[i], i))
    return tuple(requests[i] for i in order)
