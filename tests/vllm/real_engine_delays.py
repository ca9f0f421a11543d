"""Store submission delays on vLLM's real engine, on a case computed by hand (test_real_engine_delays.py).

Run as a script (vLLM's CPU worker patches torch for the whole process): ``slow`` slows every
store copy of the threaded handler down to half a second, ``plain`` does not. Prints one line,
``DELAYS {json}``, among vLLM's own output.

Two requests, sync scheduling, 32-token blocks, one block per chunk, everything offloaded:
- A (step 0): a 64-token prompt, 40 output tokens. Step 0 computes positions 0-63 (chunks 0
  and 1); step s >= 1 computes position 63 + s, so chunk 2 (64-95) is full at step 32. Its last
  step, 39, computes up to 102: chunk 3 stays partial.
- B (step 10): a 32-token prompt, 33 output tokens. Step 10 computes chunk 0; step t >= 11
  computes position t + 21, so chunk 1 (32-63) is full at step 42, the step B finishes on.
The reference plans a chunk's store on the step that computes its last position and submits it at
the next step's start (docs/engine.md): five stores, each one step after its chunk was full. B's
last store is submitted in the run's drain, after both requests finished.
"""

import json
import sys
import time

from kvoffload.engine.config import EngineConfig
from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads.definition import Workload

ENGINE = EngineConfig(gpu_blocks=16, cpu_chunks=16, block_size=32, blocks_per_chunk=1, offload_prompt_only=False,
                      max_num_seqs=4, max_num_batched_tokens=256, scheduling="sync")
REQUESTS = (RequestSpec("A", tuple(range(100, 164)), tuple(range(1000, 1040))),
            RequestSpec("B", tuple(range(300, 332)), tuple(range(2000, 2033)), arrival_step=10))
WORKLOAD = Workload("hand-delays", "two requests whose store delays are computed by hand", 0, ENGINE, REQUESTS,
                    "hand-delays")

if __name__ == "__main__":
    from kvoffload.choice import ConnectorChoice
    from kvoffload.runner import replay_workload

    if sys.argv[1] == "slow":
        from kvoffload.worker.copy import CpuBlockCopier

        copy = CpuBlockCopier.copy

        def slow_store(self, plan):
            if plan.is_store:
                time.sleep(0.5)  # far longer than the drain's 200 empty engine steps take
            copy(self, plan)

        CpuBlockCopier.copy = slow_store
    outcome = replay_workload(WORKLOAD, ConnectorChoice.build(), engine="vllm", engine_options={"oracle": False})
    result = outcome.result
    sys.stdout.write("DELAYS ")
    json.dump({"error": result["error"], "metrics": result["metrics"], "config": result["config"],
               "settings": result["engine_settings"], "distributions": result["distributions"]}, sys.stdout)
    print()
