"""The model a ``vllm`` engine run serves, and the workload's KV geometry as that engine runs it.

No vLLM import at module level: the CLI checks ``--model`` and the tests check the mapping
without the optional extra.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from kvoffload.core.types import ConfigError
from kvoffload.engine.config import EngineConfig
from kvoffload.vllm.outputs import LOGPROB_TOLERANCE

TINY_MODEL_DIR = Path(__file__).with_name("tiny_llama")
# The tiny model runs in float32: its seeded random weights carry no trained margin between the
# top two logits, and float32 keeps both runs of the oracle far from a rounding tie.
TINY_DTYPE = "float32"
TINY_WEIGHT_SEED = 20  # the weights are part of the model, not of a run: one seed for every run
# vLLM's CPU attention backend takes KV blocks of a multiple of 32 tokens (CPU_ATTN: MultipleOf(32),
# vllm/v1/attention/backends/cpu_attn.py); CUDA backends take the workloads' 16.
CPU_BLOCK_MULTIPLE = 32
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelChoice:
    path: Path
    dummy: bool  # the tiny model: no weight files; seeded ones are written for each engine (weights.py)
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_model_len: int
    weight_seed: int = TINY_WEIGHT_SEED

    @classmethod
    def named(cls, path: str | Path | None) -> "ModelChoice":
        """The tiny model (None) or a local model directory (its ``config.json`` is read here)."""
        directory = TINY_MODEL_DIR if path is None else Path(path)
        config_file = directory / "config.json"
        try:
            config = json.loads(config_file.read_text())
        except FileNotFoundError:
            raise ConfigError(f"--model {directory}: no config.json there (a local model directory)") from None
        except (OSError, ValueError) as error:
            raise ConfigError(f"--model {directory}: cannot read config.json: {error}") from None
        try:
            heads = int(config["num_attention_heads"])
            head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
            layers, kv_heads = int(config["num_hidden_layers"]), int(config.get("num_key_value_heads", heads))
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"--model {directory}: config.json lacks the attention shape ({error})") from None
        if path is None:
            dtype, dummy = TINY_DTYPE, True
        else:
            dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
            dummy = False
            if not any(directory.glob("*.safetensors")) and not any(directory.glob("*.bin")):
                raise ConfigError(f"--model {directory}: no weights there (*.safetensors or *.bin)")
            if dtype not in _DTYPE_BYTES:
                raise ConfigError(f"--model {directory}: dtype {dtype!r} is not one of {', '.join(_DTYPE_BYTES)}")
        max_len = int(config.get("max_position_embeddings", 4096))
        return cls(directory, dummy, dtype, layers, kv_heads, head_dim, max_len)

    @property
    def label(self) -> str:
        return f"tiny_llama (seeded weights, seed {self.weight_seed})" if self.dummy else str(self.path)

    def block_bytes(self, block_size: int) -> int:
        """KV bytes of one block, all layers, K and V."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * _DTYPE_BYTES[self.dtype] * block_size

    @property
    def logprob_tolerance(self) -> float:
        return LOGPROB_TOLERANCE[self.dtype]


def engine_geometry(engine: EngineConfig, block_multiple: int | None = None) -> EngineConfig:
    """The workload's engine settings with KV blocks the attention backend accepts.

    A chunk (the offloading unit) keeps its tokens and the GPU pool its token capacity; only the
    GPU block grows to ``block_multiple`` and a chunk holds fewer of them. ``None``: the platform's
    (the CPU backend's 32, else the workload's own).
    """
    if not engine.kv_model.is_dense:
        raise ConfigError(f"model={engine.model!r} is not honoured by --engine vllm: a real model's KV cache groups "
                          "are its own (its config.json); replay a hybrid model with --engine vllm-scheduler")
    if block_multiple is None:
        block_multiple = _platform_block_multiple()
    if engine.block_size % block_multiple == 0:
        return engine
    tokens_per_chunk = engine.tokens_per_chunk
    if tokens_per_chunk % block_multiple:
        raise ConfigError(f"this platform's attention takes KV blocks of a multiple of {block_multiple} tokens; "
                          f"a chunk of {tokens_per_chunk} tokens (block_size {engine.block_size} x "
                          f"blocks_per_chunk {engine.blocks_per_chunk}) cannot be one: --set block_size=...")
    pool_tokens = engine.gpu_blocks * engine.block_size
    return replace(engine, block_size=block_multiple, blocks_per_chunk=tokens_per_chunk // block_multiple,
                   gpu_blocks=pool_tokens // block_multiple)


def _platform_block_multiple() -> int:
    from vllm.platforms import current_platform

    return CPU_BLOCK_MULTIPLE if current_platform.is_cpu() else 1
