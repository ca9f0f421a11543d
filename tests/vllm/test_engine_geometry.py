"""The vllm engine's KV geometry and model choice (no vLLM needed)."""

from __future__ import annotations

import json

import pytest

from kvoffload.core.types import ConfigError
from kvoffload.engine.config import EngineConfig
from kvoffload.vllm.geometry import ModelChoice, engine_geometry


def test_cpu_attention_gets_32_token_blocks_with_the_same_chunks_and_pool():
    workload = EngineConfig(gpu_blocks=80, block_size=16, blocks_per_chunk=2)
    mapped = engine_geometry(workload, 32)
    assert (mapped.block_size, mapped.blocks_per_chunk, mapped.gpu_blocks) == (32, 1, 40)
    assert mapped.tokens_per_chunk == workload.tokens_per_chunk == 32
    assert engine_geometry(workload, 16) is workload  # a backend that takes 16: unchanged


def test_a_chunk_the_backend_cannot_hold_is_refused():
    with pytest.raises(ConfigError, match="multiple of 32 tokens; a chunk of 16 tokens"):
        engine_geometry(EngineConfig(block_size=16, blocks_per_chunk=1), 32)


def test_a_hybrid_model_is_refused_by_a_real_model():
    """A real model's KV cache groups come from its config.json; a hybrid workload replays on
    vLLM's scheduler (--engine vllm-scheduler) instead."""
    with pytest.raises(ConfigError, match="model='gpt-oss' is not honoured by --engine vllm"):
        engine_geometry(EngineConfig(model="gpt-oss", block_size=32), 32)


def test_the_tiny_model_and_a_model_directory(tmp_path):
    tiny = ModelChoice.named(None)
    assert (tiny.dummy, tiny.dtype, tiny.num_layers, tiny.num_kv_heads, tiny.head_dim) == (True, "float32", 2, 2, 64)
    assert tiny.block_bytes(32) == 2 * 2 * 2 * 64 * 4 * 32
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 32, "hidden_size": 4096,
                                                      "num_hidden_layers": 32, "num_key_value_heads": 8,
                                                      "torch_dtype": "bfloat16"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    model = ModelChoice.named(tmp_path)
    assert (model.dummy, model.dtype, model.head_dim, model.logprob_tolerance) == (False, "bfloat16", 128, 0.15)
    with pytest.raises(ConfigError, match="no config.json"):
        ModelChoice.named(tmp_path / "missing")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="no weights there"):
        ModelChoice.named(tmp_path)


def test_the_seeded_checkpoint_has_every_llama_weight_and_depends_on_the_seed():
    from kvoffload.vllm.geometry import TINY_MODEL_DIR
    from kvoffload.vllm.weights import llama_shapes, seeded_weights

    config = json.loads((TINY_MODEL_DIR / "config.json").read_text())
    shapes = llama_shapes(config)
    assert len(shapes) == 3 + 9 * 2  # embeddings, final norm, lm head; 9 tensors per layer
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (2 * 64, 256)
    small = {**config, "vocab_size": 64}  # the same draws cost less with a small vocabulary
    first, again, other = seeded_weights(small, 20), seeded_weights(small, 20), seeded_weights(small, 21)
    assert all((first[name] == again[name]).all() for name in first)
    assert not (first["lm_head.weight"] == other["lm_head.weight"]).all()
    assert (first["model.norm.weight"] == 1).all()
