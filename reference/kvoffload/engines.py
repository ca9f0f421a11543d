"""The engines a run can replay a workload on, behind one small interface.

- ``simulator``       the project's deterministic engine (``kvoffload.engine``), reference
                      connector only;
- ``vllm-scheduler``  vLLM's own Scheduler / AsyncScheduler with a fake model runner
                      (``kvoffload.vllm``, needs the optional ``vllm`` extra); connector
                      ``reference``, ``stock`` (vLLM's OffloadingConnector) or ``MODULE:CLASS``.

Both yield a :class:`~kvoffload.engine.record.RunRecord`, so metrics, result files, charts and
benchmarks read them alike. ``unmeasured`` names the glossary metrics an engine cannot observe:
they are left out of its results rather than reported as zero.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

from kvoffload.core.types import ConfigError
from kvoffload.engine.record import RunRecord

if TYPE_CHECKING:
    from kvoffload.runner import ConnectorChoice
    from kvoffload.workloads import Workload

SIMULATOR = "simulator"
VLLM_SCHEDULER = "vllm-scheduler"
ENGINES = (SIMULATOR, VLLM_SCHEDULER)


class ReplayEngine(Protocol):
    name: str
    unmeasured: tuple[str, ...]

    def replay(self, workload: "Workload", choice: "ConnectorChoice", on_step: Callable[[int, int], None] | None,
               trace: bool, max_steps: int | None) -> RunRecord: ...


class Simulator:
    name = SIMULATOR
    unmeasured: tuple[str, ...] = ()

    def replay(self, workload, choice, on_step, trace, max_steps) -> RunRecord:
        from kvoffload.engine.engine import Engine

        if choice.source != "reference":
            raise ConfigError(f"the simulator runs the reference connector only, not {choice.source!r} "
                              f"(use --engine {VLLM_SCHEDULER})")
        return Engine(workload.requests, workload.engine, choice.fixes, on_step=on_step, trace=trace,
                      max_steps=max_steps).run()


def engine_named(name: str) -> ReplayEngine:
    if name == SIMULATOR:
        return Simulator()
    if name == VLLM_SCHEDULER:
        try:
            from kvoffload.vllm.engine import VllmSchedulerEngine
        except ImportError as error:
            raise ConfigError(f"--engine {VLLM_SCHEDULER} needs vLLM (the optional extra: "
                              f"pip install 'kvoffload-bench[vllm]'): {error}") from None
        return VllmSchedulerEngine()
    raise ConfigError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})")
