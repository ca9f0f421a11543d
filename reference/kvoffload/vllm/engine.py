"""The ``vllm-scheduler`` engine as ``kvoffload.engines`` sees it (registered there by import
path, so that module never imports this package).

Every replay runs under ``PYTHONHASHSEED=HASH_SEED`` (``pinned.py``; in a child interpreter when
this one hashes otherwise), and the result's config records the seed: vLLM walks finished
requests in a string set's order, which decides evictions (docs/fidelity.md, "finish order").
"""

from __future__ import annotations

import importlib.util

from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S
from kvoffload.engine.record import RunRecord
from kvoffload.engine.set_order import HASH_SEED
from kvoffload.vllm.pinned import call_pinned

if importlib.util.find_spec("vllm") is None:  # engines.engine_named turns this into its one-line error
    raise ImportError("No module named 'vllm'")


class VllmSchedulerEngine:
    unmeasured: tuple[str, ...] = ()  # set by replay (depends on the connector)
    recorded = {"python_hash_seed": HASH_SEED}  # goes into the result's config
    step_bound_s: float | None = DEFAULT_STEP_BOUND_S

    def replay(self, workload, choice, on_step, trace, max_steps) -> RunRecord:
        # trace: the jobs live inside each connector; this engine records none (absent, not empty)
        record, self.unmeasured = call_pinned(replay_unpinned, workload.requests, workload.engine,
                                              choice.load(), max_steps,
                                              workload.reset_cache_at, self.step_bound_s, on_step=on_step,
                                              bound_s=self.step_bound_s)
        return record  # this instance serves one replay (engines.engine_named)


def replay_unpinned(requests, engine, load, max_steps, reset_cache_at=(), step_bound_s=DEFAULT_STEP_BOUND_S, *,
                    on_step=None) -> tuple[RunRecord, tuple[str, ...]]:
    """One replay in this process, whatever its hash seed; the record and what it left unmeasured.
    A connector that fails while vLLM builds or registers it never runs: its record says "could
    not start" (engine/crashes.py); a bad setting or a class that does not load stays bad input."""
    from kvoffload.core.types import ConfigError
    from kvoffload.engine.crashes import record_crash
    from kvoffload.vllm.build import ConnectorLoad
    from kvoffload.vllm.replay import UNMEASURED, VllmSchedulerReplay

    try:
        replay = VllmSchedulerReplay(requests, engine, ConnectorLoad(*load), on_step=on_step, max_steps=max_steps,
                                     reset_cache_at=reset_cache_at, step_bound_s=step_bound_s)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - any exception while the connector starts is its verdict
        record = RunRecord()
        record_crash(record, error, None, starting=True)
        return record, UNMEASURED
    return replay.run(), replay.unmeasured()
