"""How the ``vllm-scheduler`` engine honours each engine setting (``EngineConfig``'s fields):
it reaches vLLM's config (or the replay's own model and copies), or a value other than the
default is refused with one line. No vllm import here, so the main suite checks that every field
has a decision (tests/engine/test_vllm_settings_table.py); tests/vllm/test_engine_settings.py
checks each decision inside vLLM.
"""

from __future__ import annotations

import dataclasses

from kvoffload.core.types import ConfigError
from kvoffload.engine.config import EngineConfig

# setting -> where it goes (build.py forwards each)
HONOURED: dict[str, str] = {
    "gpu_blocks": "CacheConfig.num_gpu_blocks_override; the KV caches are laid out for that many blocks",
    "cpu_chunks": "the connector's capacity (cpu_chunks; stock: cpu_bytes_to_use of as many host chunks)",
    "block_size": "CacheConfig.block_size",
    "blocks_per_chunk": "the connector's chunk size (blocks_per_chunk; stock: block_size in tokens)",
    "offload_prompt_only": "the connector's offload_prompt_only",
    "max_num_seqs": "SchedulerConfig.max_num_seqs",
    "max_num_batched_tokens": "SchedulerConfig.max_num_batched_tokens",
    "spec_tokens": "SpeculativeConfig.num_speculative_tokens (n-gram drafts)",
    "eagle_drafts": "SpeculativeConfig(method='eagle').num_speculative_tokens (no drafts proposed)",
    "spec_acceptance": "the replay's model: how many drafts it accepts when the workload scripts none",
    "store_completion_steps": "the copy handler's completion_steps",
    "seed": "ModelConfig.seed and the replay's own random draws",
    "strict_lifecycle": "the reference connector's manager (option strict_lifecycle); stock: refused when false",
    "scheduling": "SchedulerConfig.async_scheduling: vLLM's Scheduler or AsyncScheduler",
    "reserve_full_isl": "SchedulerConfig.scheduler_reserve_full_isl",
    "model": "the KV cache groups of vLLM's KVCacheConfig (build.py: FullAttentionSpec, SlidingWindowSpec)",
    "prefix_cache_retention_interval": "CacheConfig.prefix_cache_retention_interval (a hybrid model's)",
}

# setting -> why this engine cannot honour a value other than the default
REFUSED: dict[str, str] = {
    "workers": "the replay runs one worker",
    "slot_bytes": "vLLM's KV slots have the model's shape (tiny_llama), not the simulator's slot size",
    "profile": "the hardware profile feeds only the cost model's tokens_per_s_modeled, which this engine "
               "does not report",
}

# setting -> why vLLM's stock connector cannot honour a value other than the default
REFUSED_FOR_STOCK: dict[str, str] = {
    "strict_lifecycle": "vLLM's stock manager has no lifecycle mode to relax",
}

_DEFAULTS = {field.name: field.default for field in dataclasses.fields(EngineConfig)}


def refuse_unhonoured(engine: EngineConfig, by_connector: dict[str, str] | None = None, connector: str = "") -> None:
    """ConfigError (one line) for the first setting this engine, or the connector ``connector``
    (``by_connector``: setting -> why, as REFUSED_FOR_STOCK), cannot honour."""
    by_connector = by_connector or {}
    for name, reason in {**REFUSED, **by_connector}.items():
        value = getattr(engine, name)
        if value != _DEFAULTS[name]:
            engine_name = f"vllm-scheduler with {connector}" if name in by_connector else "vllm-scheduler"
            raise ConfigError(f"{name}={value!r} is not honoured by --engine {engine_name}: {reason}")
