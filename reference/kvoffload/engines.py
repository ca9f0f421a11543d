"""The engines a run can replay a workload on, behind one small interface.

- ``simulator``       the project's deterministic engine (``kvoffload.engine``), reference
                      connector only;
- ``vllm-scheduler``  vLLM's own Scheduler / AsyncScheduler with a fake model runner
                      (``kvoffload.vllm``, needs the optional ``vllm`` extra); connector
                      ``reference``, ``stock`` (vLLM's OffloadingConnector) or ``MODULE:CLASS``;
- ``vllm``            vLLM's real engine (``LLMEngine``) on a real model, measured (the same
                      connectors, and ``off``); checks outputs against an offload-off run.

Every engine yields a :class:`~kvoffload.engine.record.RunRecord`, so metrics, result files,
charts and benchmarks read them alike. ``unmeasured`` names the glossary metrics an engine cannot
observe: they are left out of its results rather than reported as zero.

Dependencies point one way: an engine package (``kvoffload.vllm``) may import this module for the
interface; this module names the optional engines only by their import path (``OPTIONAL``), so it
never imports them at module level and a machine without vLLM still runs the simulator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable, Protocol

from kvoffload.core.types import ConfigError
from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S
from kvoffload.engine.record import RunRecord

if TYPE_CHECKING:
    from kvoffload.choice import ConnectorChoice
    from kvoffload.workloads import Workload

SIMULATOR = "simulator"
VLLM_SCHEDULER = "vllm-scheduler"
VLLM = "vllm"  # vLLM's real engine on a real model (kvoffload.vllm.llm_engine)

# Optional engines: name -> "module:class", imported on first use (one row per engine).
OPTIONAL = {
    VLLM_SCHEDULER: "kvoffload.vllm.engine:VllmSchedulerEngine",
    VLLM: "kvoffload.vllm.llm_engine:VllmEngine",
}
ENGINES = (SIMULATOR, *OPTIONAL)


class ReplayEngine(Protocol):
    unmeasured: tuple[str, ...]
    recorded: dict  # optional: what else the result's config records (vllm-scheduler: the hash seed)
    step_bound_s: float | None  # a step running longer stops the run (engine/bounded.py; None: unbounded)

    def replay(self, workload: "Workload", choice: "ConnectorChoice", on_step: Callable[[int, int], None] | None,
               trace: bool, max_steps: int | None) -> RunRecord: ...


class Simulator:
    unmeasured: tuple[str, ...] = ()
    recorded: dict = {}
    step_bound_s: float | None = DEFAULT_STEP_BOUND_S

    def replay(self, workload, choice, on_step, trace, max_steps) -> RunRecord:
        from kvoffload.engine.engine import Engine

        if choice.source != "reference":
            raise ConfigError(f"the simulator runs the reference connector only, not {choice.source!r} "
                              f"(use --engine {VLLM_SCHEDULER})")
        return Engine(workload.requests, workload.engine, choice.fixes, on_step=on_step, trace=trace,
                      max_steps=max_steps, reset_cache_at=workload.reset_cache_at,
                      step_bound_s=self.step_bound_s).run()


def engine_named(name: str, **options) -> ReplayEngine:
    """A fresh engine for one replay (an engine may keep what it learnt about that replay);
    ``options`` go to its constructor (the vllm engine's ``model``, ``oracle``)."""
    if name == SIMULATOR and not options:
        return Simulator()
    if name != VLLM and options:
        raise ConfigError(f"the {name} engine takes no options ({', '.join(sorted(options))})")
    if name not in OPTIONAL:
        raise ConfigError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})")
    module_name, class_name = OPTIONAL[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"--engine {name} needs vLLM (the optional extra: "
                          f"pip install 'kvoffload-bench[vllm]'): {error}") from None
    return getattr(module, class_name)(**options)
