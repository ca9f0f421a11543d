"""Seeded random weights for the tiny model (no weight files ship with the repo).

vLLM's dummy loader draws every weight uniformly from [-1e-3, 1e-3]
(``initialize_single_dummy_weight``, ``vllm/model_executor/model_loader/weight_utils.py``): the
logits then hardly depend on the context, so a wrong KV position could not show in what the
model says. These weights follow the usual transformer initialisation, scaled up so that
attention is peaked: every position's KV moves the next token's logits by more than the oracle's
log-probability tolerance. Norm weights stay 1. Drawn on the CPU from one seed, then copied to
the model's device and dtype: the same weights on every machine.
"""

from __future__ import annotations

import torch

EMBEDDING_STD = 1.0
LINEAR_STD = 0.1


def seeded_weights(seed: int):
    """A function for ``LLMEngine.apply_model`` that overwrites the model's weights."""

    def initialise(model: torch.nn.Module) -> int:
        generator = torch.Generator(device="cpu").manual_seed(seed)
        count = 0
        with torch.no_grad():
            for name, parameter in sorted(model.named_parameters()):
                if "norm" in name:
                    parameter.fill_(1.0)
                    continue
                std = EMBEDDING_STD if "embed_tokens" in name else LINEAR_STD
                values = torch.randn(parameter.shape, generator=generator, dtype=torch.float32) * std
                parameter.copy_(values.to(parameter.dtype))
                count += parameter.numel()
        return count

    return initialise
