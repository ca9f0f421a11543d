"""Seeded random weights for the tiny model, written as a checkpoint vLLM loads.

No weight files ship with the repo. vLLM's dummy loader draws every weight uniformly from
[-1e-3, 1e-3] (``initialize_single_dummy_weight``, vllm/model_executor/model_loader/
weight_utils.py): the logits then hardly depend on the context, and a wrong KV position moves
a log-probability by less than float32 resolves. Overwriting the weights after loading does not
work either: vLLM's CPU backend repacks linear weights for its GEMM kernels when loading ends
(``process_weights_after_loading``). So the weights are written before vLLM starts, as a
safetensors checkpoint beside a copy of ``config.json``, and loaded like any model.

The weights follow the usual transformer initialisation, scaled so that attention is peaked
(query-key scores with a standard deviation of about 2.5): every position's KV moves the next
token's log-probabilities well past the oracle's tolerance. Norm weights are 1. Drawn on the CPU
from one seed in a fixed order: the same weights on every machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

EMBEDDING_STD = 1.0
LINEAR_STD = 0.1


def llama_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of a ``LlamaForCausalLM`` checkpoint (Hugging Face names)."""
    hidden, vocab, inter = int(config["hidden_size"]), int(config["vocab_size"]), int(config["intermediate_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv = int(config.get("num_key_value_heads", heads)) * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(int(config["num_hidden_layers"])):
        layer = f"model.layers.{i}"
        shapes.update({
            f"{layer}.input_layernorm.weight": (hidden,), f"{layer}.post_attention_layernorm.weight": (hidden,),
            f"{layer}.self_attn.q_proj.weight": (heads * head_dim, hidden),
            f"{layer}.self_attn.k_proj.weight": (kv, hidden), f"{layer}.self_attn.v_proj.weight": (kv, hidden),
            f"{layer}.self_attn.o_proj.weight": (hidden, heads * head_dim),
            f"{layer}.mlp.gate_proj.weight": (inter, hidden), f"{layer}.mlp.up_proj.weight": (inter, hidden),
            f"{layer}.mlp.down_proj.weight": (hidden, inter)})
    return shapes


def seeded_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    weights = {}
    for name, shape in sorted(llama_shapes(config).items()):
        if "norm" in name:
            weights[name] = torch.ones(shape, dtype=torch.float32)
        else:
            std = EMBEDDING_STD if "embed_tokens" in name else LINEAR_STD
            weights[name] = torch.randn(shape, generator=generator, dtype=torch.float32) * std
    return weights


def write_seeded_checkpoint(model_dir: Path, seed: int, into: Path) -> Path:
    """``into``, a model directory: ``model_dir``'s config.json and seeded weights."""
    from safetensors.torch import save_file  # a dependency of vLLM, which this engine needs anyway

    config = json.loads((model_dir / "config.json").read_text())
    into.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_dir / "config.json", into / "config.json")
    save_file(seeded_weights(config, seed), str(into / "model.safetensors"))
    return into
