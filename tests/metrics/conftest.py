"""The fence story both metric files replay (test_glossary's fence_violations and test_metrics'
last_chunk_offloaded_rate): one workload, written once."""

import pytest

from kvoffload.engine.config import EngineConfig
from kvoffload.engine.requests import RequestSpec


@pytest.fixture
def fence_story():
    """A's freed final block goes to B (a 30-block prompt, admitted as A finishes) in the schedule
    that builds A's final store; C continues A. Returns (requests, config)."""
    config = EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, max_num_seqs=8,
                          max_num_batched_tokens=128, scheduling="async")
    a = RequestSpec("A", tuple(range(10, 16)), (20, 21, 22))
    c = RequestSpec("C", a.prompt_token_ids + a.output_token_ids + (30, 31, 32, 33), (40, 41),
                    parent="A", think_steps=3)
    b = RequestSpec("B", tuple(range(100, 220)), (54, 55), parent="A", think_steps=0)
    return [a, c, b], config
