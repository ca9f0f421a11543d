"""Engine settings: the ``--set`` keys of the command line and the [engine] table of a workload."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from kvoffload import long_numbers
from kvoffload.core.model import ModelDescription, model_named
from kvoffload.core.types import ConfigError, ConnectorConfig, KVGeometry
from kvoffload.engine.block_grids import BlockGrids
from kvoffload.engine.cost import profile as hardware_profile


_SHARED = KVGeometry()  # the connector's geometry: its defaults are the engine's


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings. The geometry it shares with the connector (``KVGeometry``) keeps its
    names and defaults from there; ``connector_config()`` hands it over field by field."""

    gpu_blocks: int = 2048  # GPU KV blocks, null block 0 included
    cpu_chunks: int = _SHARED.cpu_chunks  # offload-tier capacity in chunks
    block_size: int = _SHARED.block_size  # tokens per GPU block
    blocks_per_chunk: int = _SHARED.blocks_per_chunk  # GPU blocks per offloaded chunk
    offload_prompt_only: bool = _SHARED.offload_prompt_only
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # chunked-prefill token budget per step
    spec_tokens: int = 0  # k draft tokens per decode step (0: no speculative decoding)
    spec_acceptance: float = 0.7  # per-draft acceptance probability of the seeded model
    workers: int = 1  # every job must be acknowledged by this many workers
    store_completion_steps: int = 1  # steps between a copy running and its completion report
    slot_bytes: int = 16  # bytes per token slot (>= 8: the first 8 hold the fingerprint)
    seed: int = 0
    strict_lifecycle: bool = _SHARED.strict_lifecycle
    scheduling: Literal["sync", "async"] = "sync"
    # vLLM's scheduler_reserve_full_isl (SchedulerConfig, default on): a waiting request is
    # admitted only if blocks for its whole prompt are free, not just for its first chunk.
    reserve_full_isl: bool = True
    profile: str = "h100-llama3-8b"
    # The model's KV cache groups (core/model.py); a hybrid model's engine follows vLLM's hybrid
    # rules (docs/engine.md, "Hybrid models"). The retention interval is vLLM's (CacheConfig).
    model: str = _SHARED.model
    prefix_cache_retention_interval: int | None = _SHARED.prefix_cache_retention_interval
    # An EAGLE drafter of this many speculative tokens (engine/drafter.py): its cache rules, no
    # drafts proposed. spec_tokens (n-gram) stays the engines' drafter otherwise.
    eagle_drafts: int = _SHARED.eagle_drafts

    def __post_init__(self) -> None:
        positive = ("gpu_blocks", "cpu_chunks", "block_size", "blocks_per_chunk", "max_num_seqs",
                    "max_num_batched_tokens", "workers")
        for name in positive:
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("spec_tokens", self.spec_tokens, minimum=0)
        _check_int("eagle_drafts", self.eagle_drafts, minimum=0)
        _check_int("store_completion_steps", self.store_completion_steps, minimum=0)
        _check_int("slot_bytes", self.slot_bytes, minimum=8)
        if self.slot_bytes % 8:
            raise ConfigError(f"slot_bytes must be a multiple of 8, got {self.slot_bytes}")
        _check_int("seed", self.seed, minimum=0)
        if self.gpu_blocks < 2:
            raise ConfigError(f"gpu_blocks must be at least 2 (block 0 is the null block), got {self.gpu_blocks}")
        if not 0.0 <= float(self.spec_acceptance) <= 1.0:
            raise ConfigError(f"spec_acceptance must be within [0, 1], got {self.spec_acceptance!r}")
        if self.scheduling not in ("sync", "async"):
            raise ConfigError(f"scheduling must be 'sync' or 'async', got {self.scheduling!r}")
        hardware_profile(self.profile)  # ConfigError naming an unknown profile
        for name in ("offload_prompt_only", "strict_lifecycle", "reserve_full_isl"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        self._check_model()

    def _check_model(self) -> None:
        """vLLM's checks of a model and its retention interval (``_validate_prefix_cache_retention_interval``)."""
        model = self.kv_model
        retention = self.prefix_cache_retention_interval
        if self.eagle_drafts:
            if self.spec_tokens:
                raise ConfigError("eagle_drafts and spec_tokens (n-gram drafts): one drafter at most")
            if not model.has_mamba or model.has_sliding_window:
                # the dense scheduler's inlined hit and a window's EAGLE-shifted masks are not modelled
                raise ConfigError(f"eagle_drafts is modelled on a model of full attention and Mamba only, "
                                  f"not {model.name!r}")
        elif model.has_drafter_group:
            # vLLM flags a drafter's group only under an EAGLE/MTP SpeculativeConfig (_annotate_eagle_groups)
            raise ConfigError(f"model {model.name!r} has a drafter (MTP) group: it needs eagle_drafts >= 1")
        # The scheduler's block: the groups' lcm where they have block sizes of their own.
        block = BlockGrids(model.groups, self.block_size).scheduler
        if retention is not None:
            _check_int("prefix_cache_retention_interval", retention, minimum=0)
            if retention % block:
                raise ConfigError(f"prefix_cache_retention_interval must be a multiple of the scheduler's block "
                                  f"size {block}, got {retention}")
            if retention and not (model.has_sliding_window or model.has_mamba):
                raise ConfigError(f"prefix_cache_retention_interval={retention} has no effect on model "
                                  f"{model.name!r}: it has no sliding-window or Mamba group")

    @property
    def kv_model(self) -> ModelDescription:
        return model_named(self.model)

    @property
    def tokens_per_chunk(self) -> int:
        return self.block_size * self.blocks_per_chunk

    def connector_config(self) -> ConnectorConfig:
        shared = {field.name: getattr(self, field.name) for field in dataclasses.fields(KVGeometry)}
        return ConnectorConfig(**shared, num_workers=self.workers)

    def replace(self, **changes: Any) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def parse_value(cls, key: str, text: str) -> Any:
        """Turn the text of ``--set key=text`` into the field's type, or raise ConfigError."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if key not in fields:
            raise ConfigError(f"unknown setting {key!r} (known: {', '.join(fields)})")
        default = fields[key].default
        if "None" in str(fields[key].type) and text.strip().lower() in ("none", "dense"):
            return None  # an optional number: "dense" names vLLM's None
        if isinstance(default, bool):
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"{key} expects true or false, got {text!r}")
        if isinstance(default, int):
            try:
                return int(text)
            except ValueError as error:
                if long_numbers.is_too_long(error):  # a number, but one too long to read
                    raise ConfigError(f"{key} expects {long_numbers.digits_message(text)}") from None
                raise ConfigError(f"{key} expects an integer, got {text!r}") from None
        if isinstance(default, float):
            try:
                return float(text)
            except ValueError:
                raise ConfigError(f"{key} expects a number, got {text!r}") from None
        return text


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
