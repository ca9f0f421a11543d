"""The ``vllm-scheduler`` engine as ``kvoffload.engines`` sees it (registered there by import
path, so that module never imports this package)."""

from __future__ import annotations

from kvoffload.engine.record import RunRecord
from kvoffload.vllm.build import ConnectorLoad
from kvoffload.vllm.replay import UNMEASURED, VllmSchedulerReplay


class VllmSchedulerEngine:
    unmeasured = UNMEASURED

    def replay(self, workload, choice, on_step, trace, max_steps) -> RunRecord:
        # trace: the jobs live inside each connector; this engine records none (absent, not empty)
        load = ConnectorLoad(choice.source, choice.preset, choice.disabled)
        replay = VllmSchedulerReplay(workload.requests, workload.engine, load, on_step=on_step, max_steps=max_steps)
        self.unmeasured = replay.unmeasured()  # this instance serves one replay (engines.engine_named)
        return replay.run()
