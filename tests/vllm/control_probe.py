"""Run as a script by tests/vllm/test_controls.py: what a scheduler of this release answers to
the questions the controls change (kvoffload.vllm.controls), before and after the controls named
on the command line are applied. A control patches vLLM's classes for the rest of the process,
hence a process of its own. Prints one JSON line."""

from __future__ import annotations

import json
import sys

from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request

from kvoffload.engine.config import EngineConfig
from kvoffload.vllm import build
from kvoffload.vllm.build import ConnectorLoad
from kvoffload.vllm.controls import apply_control

# k = 2 drafts of 16-token blocks: a spec step takes 1 + 2 tokens, one block; a 46-token request
# needs 3 blocks for itself and a 4th for the step (49 tokens)
ENGINE = EngineConfig(gpu_blocks=40, cpu_chunks=24, block_size=16, spec_tokens=2)
PROMPT_TOKENS = 46


def answers() -> dict:
    config = build.build_vllm_config(ENGINE, ConnectorLoad("reference").transfer_config(ENGINE, "stepped"), 512)
    scheduler = build.build_scheduler(config, build.build_kv_cache_config(config, ENGINE))
    request = Request(request_id="r", prompt_token_ids=list(range(PROMPT_TOKENS)),
                      sampling_params=SamplingParams(max_tokens=8), pooling_params=None)
    found = {}
    if hasattr(scheduler, "_spec_decode_step_blocks"):  # 0.31+: a method in 0.31, a value in 0.32
        step = scheduler._spec_decode_step_blocks
        found["spec_step_blocks"] = step() if callable(step) else step
        found["remaining_blocks"] = scheduler._request_remaining_blocks(request)
    if hasattr(scheduler, "_request_blocks_can_be_freed"):  # 0.30+
        scheduler.defer_block_free = True  # the request's step is still in flight
        request.last_sched_seq = scheduler.processed_step_seq + 1

        def schedule() -> bool:  # asked as schedule() asks it before taking a victim
            return scheduler._request_blocks_can_be_freed(request)

        found["victim_allowed"] = schedule()
        found["blocks_freed_now"] = scheduler._request_blocks_can_be_freed(request)
    return found


if __name__ == "__main__":
    before = answers()
    for name in sys.argv[1:]:
        apply_control(name)
    print(json.dumps({"before": before, "after": answers()}))
