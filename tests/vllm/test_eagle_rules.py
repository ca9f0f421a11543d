"""The engine's EAGLE rules (``eagle_drafts``, engine/drafter.py; docs/engine.md, "Hybrid
models") against vLLM 0.32's scheduler: the same requests through both, the reference connector,
and the GPU prefix hit a follow-up gets. ``qwen3-next``, block size 16; no GPU cache is forgotten,
so each hit is the scheduler's own (``find_longest_cache_hit``, the states it kept)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from kvoffload.engine.config import EngineConfig  # noqa: E402
from kvoffload.engine.engine import Engine  # noqa: E402
from kvoffload.engine.requests import RequestSpec  # noqa: E402
from kvoffload.vllm.build import REFERENCE, ConnectorLoad  # noqa: E402
from kvoffload.vllm.compat import RELEASE  # noqa: E402
from kvoffload.vllm.replay import VllmSchedulerReplay  # noqa: E402

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(RELEASE < (0, 32, 0), reason="the engine's rules are vLLM 0.32's")]

QWEN = EngineConfig(model="qwen3-next", block_size=16, gpu_blocks=64, cpu_chunks=64, max_num_seqs=8,
                    max_num_batched_tokens=16)
P = tuple(range(1000, 1064))


def gpu_hits(requests, config: EngineConfig) -> tuple[tuple[int, int], tuple[int, int]]:
    """(vLLM's, the engine's) GPU hit and connector hit of C's first admission."""
    replay = VllmSchedulerReplay(requests, config, ConnectorLoad(REFERENCE), max_steps=200)
    replay.run()
    record = Engine(requests, config, max_steps=200).run()
    return replay.ledger.first_admission["C"], (record.gpu_hit_tokens, record.connector_hit_tokens_admitted)


@pytest.mark.parametrize("eagle, hit, served", [(0, 64, 0), (1, 48, 16)])
def test_full_attention_drops_its_last_block(eagle, hit, served):
    """Dense retention, 16-token chunks: B (70 tokens) caches the states at 16-64; C (the 64 + 4)
    hits 64, under EAGLE 48 (full attention's last block dropped), and the reference connector
    (no group a drafter's) serves the dropped chunk and the state at 64 from the tier."""
    requests = [RequestSpec("B", P + tuple(range(5000, 5006)), tuple(range(2000, 2004))),
                RequestSpec("C", P + tuple(range(6000, 6004)), tuple(range(3000, 3004)), arrival_step=12)]
    config = QWEN.replace(eagle_drafts=eagle, prefix_cache_retention_interval=None)
    ours, simulated = gpu_hits(requests, config)
    assert (ours, simulated) == ((hit, served), (hit, served))


@pytest.mark.parametrize("eagle, hit, served", [(0, 48, 0), (1, 32, 16)])
def test_sparse_retention_keeps_the_eagle_replay_boundaries(eagle, hit, served):
    """Retention 0: B (64 tokens) keeps the state at 48 (63 rounded down), under EAGLE at 32 and
    48 (``replay_boundaries``); C (B's first 48 + 8) hits 48, under EAGLE 32 (full attention
    drops its third block, and the state at 32 was kept), the connector serving the state at 48."""
    requests = [RequestSpec("B", P, tuple(range(2000, 2004))),
                RequestSpec("C", P[:48] + tuple(range(6000, 6008)), tuple(range(3000, 3004)), arrival_step=12)]
    ours, simulated = gpu_hits(requests, QWEN.replace(eagle_drafts=eagle))
    assert (ours, simulated) == ((hit, served), (hit, served))
