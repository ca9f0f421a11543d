"""A drafter (MTP) KV cache group of its own in vLLM's terms (the model ``qwen3-next-mtp``,
docs/engine.md, "Hybrid models"): vLLM 0.32 flags the group holding the layers an MTP drafter
registers after the target's (``_annotate_eagle_groups``, ``kv_cache_utils.py``), so the
drafter's group holds a layer past the tiny model's (``model.layers.N``, N the group's index) and
its ``KVCacheGroupSpec.is_eagle_group`` is set. The replay's fake worker writes that group's slots
one token ahead (``model.py``, ``DrafterCells``; engine/drafter_kv.py).
"""

from __future__ import annotations

from vllm.v1.kv_cache_interface import KVCacheGroupSpec

from kvoffload.core.types import ConfigError
from kvoffload.vllm.tiny_kv import NUM_LAYERS


def layer_name(group: int) -> str:
    """A hybrid model's group ``group`` holds this one layer (``LAYER_NAMES[group]`` for the
    target's)."""
    return f"model.layers.{group}.self_attn.attn"


def check_layers(model) -> None:
    """Groups past the tiny model's layers are a drafter's trailing layers only."""
    extra = model.groups[NUM_LAYERS:]
    if any(not group.drafter for group in extra):
        raise ConfigError(f"model {model.name!r} has {len(model.groups)} KV cache groups, the tiny model "
                          f"{NUM_LAYERS} layers")
    if model.has_drafter_group and "is_eagle_group" not in getattr(KVCacheGroupSpec, "__dataclass_fields__", {}):
        raise ConfigError(f"model {model.name!r}: this vLLM's KV cache groups carry no is_eagle_group flag "
                          "(vLLM 0.30+ flags a drafter's group)")


def hybrid_groups(model, specs) -> list[KVCacheGroupSpec]:
    """One layer per group, a drafter's group flagged."""
    return [KVCacheGroupSpec([layer_name(i)], spec, **({"is_eagle_group": True} if group.drafter else {}))
            for i, (group, spec) in enumerate(zip(model.groups, specs))]
