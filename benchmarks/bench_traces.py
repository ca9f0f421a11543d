"""Replay of a real production trace slice: the first 200 requests of Mooncake's FAST'25
conversation trace (``workloads/samples/mooncake/``, Apache-2.0, see its NOTICE.md).

Long prompts (about 12k tokens, 512-token blocks shared across requests) and real arrival times:
the shape of a user's own trace, at a size asv can repeat. ``gpu_blocks=auto`` sizes the GPU pool
to the longest request. Tracked, per scheduling mode:

- ``time_replay`` / ``peakmem_replay``: one replay with the reference connector, oracle on;
- ``track_first_admission_reuse_gap``: the infinite-cache reuse bound minus the share of prompt
  tokens served at first admission (GPU prefix cache + connector); lower is better, 0 = the bound.
"""

from __future__ import annotations

from pathlib import Path

TRACE = Path(__file__).resolve().parents[1] / "workloads" / "samples" / "mooncake" / "conversation-first200.jsonl"


def _load(scheduling: str):
    from kvoffload.workloads import load_workload

    return load_workload(f"mooncake:{TRACE}", {"gpu_blocks": "auto", "scheduling": scheduling})


def _replay(workload):
    from kvoffload.runner import ConnectorChoice, replay_workload

    return replay_workload(workload, ConnectorChoice.build())


class MooncakeConversationSlice:
    params = ["sync", "async"]
    param_names = ["scheduling"]
    timeout = 900
    number = 1
    repeat = (1, 3, 120.0)
    version = "1"

    def setup(self, scheduling: str) -> None:
        self.workload = _load(scheduling)

    def time_replay(self, scheduling: str) -> None:
        _replay(self.workload)

    def peakmem_replay(self, scheduling: str) -> None:
        _replay(self.workload)

    def track_first_admission_reuse_gap(self, scheduling: str) -> float:
        from kvoffload.workloads import reusable_prompt_share

        record = _replay(self.workload).record
        served = (record.gpu_hit_tokens + record.connector_hit_tokens_admitted) / record.admitted_prompt_tokens
        return reusable_prompt_share(self.workload) - served

    track_first_admission_reuse_gap.unit = "share of prompt tokens"
