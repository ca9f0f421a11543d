"""Building the pieces of a vLLM replay: config, scheduler, KV caches, the worker connector.

Everything is vLLM 0.32's own code: ``VllmConfig`` over the tiny model config shipped next to
this file (``tiny_llama/config.json``: a 2-layer Llama shape, no weights, no hub), the real
``Scheduler`` or ``AsyncScheduler`` (``vllm/v1/core/sched/``), the KV cache config and tensors
laid out by vLLM's allocator (``get_kv_cache_config_from_groups``, ``allocate_kv_cache``), and
the connector built for both roles by vLLM's ``KVConnectorFactory``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.kv_cache_utils import (
    create_kv_cache_group_specs,
    get_kv_cache_config_from_groups,
    is_kv_cache_spec_uniform,
    unify_hybrid_kv_cache_specs,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MambaSpec, SlidingWindowSpec
from vllm.v1.structured_output import StructuredOutputManager

from kvoffload.choice import REFERENCE, STOCK, WITH_STORAGE, check_source
from kvoffload.core.model import GroupKind
from kvoffload.core.types import ConfigError
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.drafter import speculative_tokens
from kvoffload.vllm.compat import allocate_kv_caches, for_connector, own_storage_per_layer, use_kv_cache_layout
from kvoffload.vllm.drafter_group import check_layers, hybrid_groups
from kvoffload.vllm.group_blocks import own_shape, page_tokens, scheduler_block_sizes, stock_chunking
from kvoffload.vllm.settings import refuse_unhonoured
from kvoffload.vllm.tiny_kv import HEAD_SIZE, KV_DTYPE, LAYER_NAMES, NUM_KV_HEADS, NUM_LAYERS, block_bytes

TINY_MODEL_DIR = Path(__file__).with_name("tiny_llama")
# vLLM's default layout for its stock connector (OffloadingConnector.get_required_kvcache_layout).
DEFAULT_LAYOUT = "LBHNC"
# CPUOffloadingSpec rounds each chunk up to a page (BLOCK_SIZE_ALIGNMENT, vllm/v1/kv_offload/cpu/spec.py).
HOST_PAGE = 4096

STOCK_CLASS = "OffloadingConnector"
# tiny_llama/config.json's max_position_embeddings. vLLM's ModelConfig refuses a longer
# max_model_len; the fake model computes no positions, so a workload of longer requests (the
# Mooncake slice's 121k-token prompts) gets a model whose context is raised to fit it.
TINY_CONTEXT = 65536
@dataclass(frozen=True)
class ConnectorLoad:
    """How vLLM loads the connector under test: ``stock`` (vLLM's OffloadingConnector with the
    torch-copy spec), ``reference`` (``kvoffload.vllm.connector``), a foreign connector's name or
    class path (``foreign.py``: its own options, CPU stand-ins for its GPU calls), ``MODULE:CLASS``
    (any connector class; it receives the reference connector's options), or ``A+B``: vLLM's
    ``MultiConnector`` of each part, in that order. ``storage_dir``: the folder a disk connector
    keeps its files in."""

    source: str
    preset: str | None = None
    disabled: tuple[str, ...] = ()
    storage_dir: str | None = None

    def __post_init__(self) -> None:
        check_source(self.source, self.preset, self.disabled)

    @property
    def parts(self) -> tuple["ConnectorLoad", ...]:
        """The composed connector's parts (one: this connector itself)."""
        if "+" not in self.source:
            return (self,)
        return tuple(ConnectorLoad(part, self.preset if part == REFERENCE else None,
                                   self.disabled if part == REFERENCE else (), self.storage_dir)
                     for part in self.source.split("+"))

    def transfer_config(self, engine: EngineConfig, transfer: str) -> KVTransferConfig:
        if len(self.parts) > 1:
            children = [{"kv_connector": c.kv_connector, "kv_role": c.kv_role,
                         "kv_connector_extra_config": c.kv_connector_extra_config,
                         **({"kv_connector_module_path": c.kv_connector_module_path}
                            if c.kv_connector_module_path else {})}
                        for c in (part.transfer_config(engine, transfer) for part in self.parts)]
            return KVTransferConfig(kv_connector="MultiConnector", kv_role="kv_both",
                                    kv_connector_extra_config={"connectors": children})
        family = self.family
        if family is not None:
            module, _, name = (self.source if ":" in self.source else family.class_path).partition(":")
            return KVTransferConfig(kv_connector=name, kv_connector_module_path=module, kv_role="kv_both",
                                    kv_connector_extra_config=family.extra_config(engine, self.storage_dir))
        common = {"blocks_per_chunk": engine.blocks_per_chunk, "offload_prompt_only": engine.offload_prompt_only,
                  "transfer": transfer, "completion_steps": engine.store_completion_steps}
        if not engine.kv_model.is_dense:  # the reference connector checks it against vLLM's groups
            common["model"] = engine.model
        if self.source == STOCK:
            from kvoffload.vllm.stock import SPEC_MODULE, SPEC_NAME

            # The chunk size in tokens (``block_size``): every release since 0.25 reads it, while
            # ``blocks_per_chunk`` arrived in 0.26 (compat/v0_26.py).
            common = stock_chunking(engine, common)  # groups of their own block sizes: none
            del common["blocks_per_chunk"]
            extra = {**common, "cpu_bytes_to_use": engine.cpu_chunks * chunk_bytes_on_host(engine),
                     "spec_name": SPEC_NAME, "spec_module_path": SPEC_MODULE}
            return KVTransferConfig(kv_connector=STOCK_CLASS, kv_role="kv_both",
                                    kv_connector_extra_config=extra)
        extra = {**common, "cpu_chunks": engine.cpu_chunks, "strict_lifecycle": engine.strict_lifecycle}
        if self.preset:
            extra["preset"] = self.preset
        if self.disabled:
            extra["disable_fixes"] = list(self.disabled)
        if self.source == REFERENCE:
            module, name = "kvoffload.vllm.connector", "KVOffloadConnector"
        else:
            module, _, name = self.source.partition(":")
        return KVTransferConfig(kv_connector=name, kv_connector_module_path=module, kv_role="kv_both",
                                kv_connector_extra_config=extra)

    @property
    def family(self):
        """The foreign connector family this (single) source names (``foreign.py``), or None."""
        from kvoffload.vllm.foreign import family_of

        return None if "+" in self.source else family_of(self.source)

    @property
    def refused(self) -> dict[str, str]:
        """Engine settings this connector (any of its parts) cannot honour, beyond the engine's."""
        from kvoffload.vllm.settings import REFUSED_FOR_STOCK

        refused: dict[str, str] = {}
        for part in self.parts:
            family = part.family
            refused.update(family.refused if family is not None else REFUSED_FOR_STOCK if part.source == STOCK else {})
        return refused

    @property
    def standins(self):
        """What puts the CPU stand-ins in place for every part that needs them, or None."""
        installers = [part.family.standins for part in self.parts
                      if part.family is not None and part.family.standins is not None]
        if not installers:
            return None
        return lambda: combined_patches(installers)

    @property
    def needs_storage(self) -> bool:
        return any(part.family is not None and part.family.name in WITH_STORAGE for part in self.parts)


def combined_patches(installers):
    from kvoffload.vllm.standins import Patches

    combined = Patches()
    for install in dict.fromkeys(installers):  # the same family twice: its names once
        combined.merge(install())
    return combined


def chunk_bytes_on_host(engine: EngineConfig) -> int:
    """Host bytes of one chunk of one KV cache group (a hybrid model's chunk holds one group's
    blocks: one layer of the tiny model; the dense model's both)."""
    layers = NUM_LAYERS if engine.kv_model.is_dense else 1
    raw = block_bytes(page_tokens(engine), layers) * engine.blocks_per_chunk
    return -(-raw // HOST_PAGE) * HOST_PAGE


def build_vllm_config(engine: EngineConfig, transfer_config: KVTransferConfig, max_model_len: int,
                      load: ConnectorLoad | None = None) -> VllmConfig:
    """vLLM's config for a replay: every engine setting reaches it (or the connector's options,
    or the replay's model and copies), or is refused here (``settings.py`` says which, and
    ``load.refused`` what the connector cannot honour; without ``load``, stock's when the
    transfer config is stock's)."""
    if load is None:
        load = ConnectorLoad(STOCK if transfer_config.kv_connector == STOCK_CLASS else REFERENCE)
    refuse_unhonoured(engine, load.refused, f"--connector {load.source}")
    try:
        connector_class = KVConnectorFactory.get_connector_class(transfer_config)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"cannot load connector {transfer_config.kv_connector!r} from "
                          f"{transfer_config.kv_connector_module_path or 'vLLM'}: {error}") from None
    with vllm_refusals_in_one_line():
        return _vllm_config(engine, transfer_config, max_model_len, connector_class)


def _vllm_config(engine: EngineConfig, transfer_config: KVTransferConfig, max_model_len: int,
                 connector_class) -> VllmConfig:
    scheduler_config = SchedulerConfig(
        max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True, is_encoder_decoder=False,
        scheduler_reserve_full_isl=engine.reserve_full_isl)
    context = {"max_position_embeddings": max_model_len} if max_model_len > TINY_CONTEXT else {}
    model_config = ModelConfig(model=str(TINY_MODEL_DIR), dtype="bfloat16", seed=engine.seed,
                               skip_tokenizer_init=True, max_model_len=max_model_len, hf_overrides=context)
    speculative = None
    if engine.spec_tokens:
        # n-gram drafting needs no draft model, and the harness supplies the drafts itself. vLLM
        # runs the CPU n-gram proposer under sync scheduling only; under async it is ngram_gpu
        # (VllmConfig.__post_init__). Both reserve no lookahead slots and no extra draft slots,
        # so the scheduler treats them alike.
        method = "ngram_gpu" if engine.scheduling == "async" else "ngram"
        speculative = SpeculativeConfig(method=method, num_speculative_tokens=engine.spec_tokens,
                                        prompt_lookup_max=2, prompt_lookup_min=1)
    if engine.eagle_drafts:
        # An EAGLE drafter (engine/drafter.py): the tiny model's config stands in as the draft
        # model's (no weights are read; vLLM refuses ``mtp`` for a Llama target, and the scheduler
        # and the connector read only use_eagle()), its KV in the target's groups, none flagged
        # is_eagle_group: what vLLM builds of a shared-group MTP model (vLLM #52735). The replay
        # proposes none of its drafts.
        speculative = SpeculativeConfig(method="eagle", model=str(TINY_MODEL_DIR),
                                        num_speculative_tokens=engine.eagle_drafts,
                                        target_model_config=model_config, target_parallel_config=ParallelConfig())
    cache_config = CacheConfig(block_size=engine.block_size, enable_prefix_caching=True)
    if engine.kv_model.has_mamba:
        # A Mamba model's own config hook sets align mode when prefix caching is on; the tiny
        # model has no such hook, so the replay sets it (vLLM 0.32 config/cache.py, MambaCacheMode).
        cache_config.mamba_cache_mode = "align"
    if hasattr(cache_config, "prefix_cache_retention_interval"):  # a sliding window's (vLLM 0.29+)
        cache_config.prefix_cache_retention_interval = engine.prefix_cache_retention_interval
    config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                        cache_config=cache_config,
                        device_config=DeviceConfig("cpu"), kv_transfer_config=transfer_config,
                        speculative_config=speculative)
    config.scheduler_config.async_scheduling = engine.scheduling == "async"
    config.cache_config.num_gpu_blocks = engine.gpu_blocks
    config.cache_config.num_gpu_blocks_override = engine.gpu_blocks
    use_kv_cache_layout(config, connector_class.get_required_kvcache_layout(config) or DEFAULT_LAYOUT)
    return config


@contextmanager
def vllm_refusals_in_one_line():
    """A configuration vLLM's config classes refuse (pydantic's multi-line ValidationError, or a
    ValueError of their checks) becomes a ConfigError of one line: the class and vLLM's reason."""
    try:
        yield
    except ValidationError as error:
        first = error.errors()[0]
        reason = str(first.get("msg", error)).removeprefix("Value error, ")
        raise ConfigError(f"vLLM's {error.title} refuses this replay's settings: {_first_sentence(reason)}") from None
    except ValueError as error:
        raise ConfigError(f"vLLM refuses this replay's settings: {_first_sentence(str(error))}") from None


def _first_sentence(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "(no reason given)"
    end = line.find(". ")
    return line if end < 0 else line[:end + 1]


def kv_cache_groups(engine: EngineConfig, hybrid_manager: bool = True) -> list[KVCacheGroupSpec]:
    """The model description's KV cache groups (``core/model.py``) as vLLM's: the one
    translation of the suite's model into vLLM's terms. The dense model's one group holds both
    layers of the tiny model; a hybrid model's group ``i`` holds layer ``i``.

    ``hybrid_manager=False``: vLLM turned its hybrid KV cache manager off (``VllmConfig``
    does for a connector that is not ``SupportsHMA``: ExampleConnector, or a MultiConnector with
    such a child), and ``get_kv_cache_groups`` then promotes every sliding-window layer to full
    attention (``unify_hybrid_kv_cache_specs``, vLLM's own, called here): one group, nothing
    freed behind a window. vLLM's scheduler asserts that a non-HMA connector sees one group
    (``Scheduler._connector_finished``). A group's own block size: ``group_blocks.py``."""
    model = engine.kv_model
    check_layers(model)  # a drafter's group past the target's layers (drafter_group.py)
    shape = {"block_size": engine.block_size, "num_kv_heads": NUM_KV_HEADS, "head_size": HEAD_SIZE,
             "dtype": KV_DTYPE}
    if model.has_mamba:
        _check_mamba_runs_here(engine, hybrid_manager)
    specs = []
    for group in model.groups:
        own = own_shape(engine, group, shape,
                        lambda size: FullAttentionSpec(**{**shape, "block_size": size}).page_size_bytes)
        if group.kind is GroupKind.FULL_ATTENTION:
            specs.append(FullAttentionSpec(**own))
        elif group.kind is GroupKind.SLIDING_WINDOW:
            specs.append(SlidingWindowSpec(**own, sliding_window=group.sliding_window))
        else:
            # a state block per draft token, whatever the drafter (MambaBase.get_kv_cache_spec)
            specs.append(mamba_spec(FullAttentionSpec(**shape).page_size_bytes, engine.block_size,
                                    speculative_tokens(engine)))
    if model.is_dense:
        return [KVCacheGroupSpec(list(LAYER_NAMES), specs[0])]
    if not hybrid_manager:
        by_layer = dict(zip(LAYER_NAMES, specs))
        unify_hybrid_kv_cache_specs(by_layer)
        if is_kv_cache_spec_uniform(by_layer):  # as get_kv_cache_groups: one group of every layer
            return create_kv_cache_group_specs(by_layer, [list(LAYER_NAMES)])
        raise ConfigError(f"model {model.name!r} needs vLLM's hybrid KV cache manager, which vLLM turns off "
                          "for a connector that does not support it (SupportsHMA)")
    return hybrid_groups(model, specs)


def mamba_spec(page_bytes: int, block_size: int, speculative_blocks: int = 0) -> MambaSpec:
    """A Mamba group's spec in align mode: one state tensor whose page is one attention layer's
    page, so that ``get_kv_cache_config_from_groups`` lays both groups out with equal pages and
    the pool counts the same blocks (vLLM 0.32 pads a state to the attention page,
    ``MambaSpec.page_size_padded``; here it fits exactly). A request holds its running state and
    the previous one (``MambaSpec.max_memory_usage_bytes``: two pages, and ``speculative_blocks``
    more under a drafter: n-gram's ``spec_tokens`` or the EAGLE drafter's ``eagle_drafts``)."""
    return MambaSpec(block_size=block_size, shapes=((page_bytes // KV_DTYPE.itemsize,),), dtypes=(KV_DTYPE,),
                     mamba_cache_mode="align", num_speculative_blocks=speculative_blocks)


def _check_mamba_runs_here(engine: EngineConfig, hybrid_manager: bool) -> None:
    """What a Mamba group cannot be built with, refused in one line."""
    name = engine.kv_model.name
    if not hybrid_manager:
        raise ConfigError(f"model {name!r} needs vLLM's hybrid KV cache manager, which vLLM turns off for a "
                          "connector that does not support it (SupportsHMA): a Mamba group cannot be unified")


def build_kv_cache_config(config: VllmConfig, engine: EngineConfig):
    groups = kv_cache_groups(engine, not config.scheduler_config.disable_hybrid_kv_cache_manager)
    layers_per_block = max(len(group.layer_names) for group in groups)  # groups alias each block
    kv_cache_config = get_kv_cache_config_from_groups(
        config, groups, block_bytes(page_tokens(engine), layers_per_block) * engine.gpu_blocks)
    if kv_cache_config.num_blocks != engine.gpu_blocks:
        raise ConfigError(f"vLLM laid out {kv_cache_config.num_blocks} GPU blocks, wanted {engine.gpu_blocks}")
    return kv_cache_config


def build_scheduler(config: VllmConfig, kv_cache_config):
    cls = AsyncScheduler if config.scheduler_config.async_scheduling else Scheduler
    with set_current_vllm_config(config):
        return cls(vllm_config=config, kv_cache_config=kv_cache_config, log_stats=True,
                   structured_output_manager=StructuredOutputManager(config),
                   **scheduler_block_sizes(config, kv_cache_config))


def build_worker_side(config: VllmConfig, kv_cache_config, standins=None, completion_steps: int = 1):
    """vLLM's paged KV tensors (one buffer, a strided view per layer) and the connector's
    worker role registered on them, as ``GPUModelRunner.initialize_kv_cache`` does.

    ``standins`` (a foreign family's, ``foreign.py``) puts the CPU stand-ins in place of the
    worker's GPU calls first; the connector then carries its copy timeline
    (``kvoffload_timeline``, which ``connector_parts`` reads) and the replaced names
    (``kvoffload_patches``, undone by ``release_worker_side``)."""
    from kvoffload.vllm.standins.timeline import CopyTimeline, active

    kv_caches = allocate_kv_caches(config, kv_cache_config)
    timeline = CopyTimeline(completion_steps)
    patches = standins() if standins is not None else None
    try:
        with set_current_vllm_config(config), active(timeline):
            connector = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, kv_cache_config)
            # What the release's runner hands a connector: a Mamba layer as state tensors before
            # 0.27 (compat/v0_27.py), one allocation per layer for a patched foreign connector.
            handed = kv_caches if patches is None else own_storage_per_layer(kv_caches)
            connector.register_kv_caches(for_connector(handed, kv_cache_config))
    except BaseException:
        if patches is not None:
            patches.undo()
        raise
    if patches is not None:
        connector.kvoffload_timeline, connector.kvoffload_patches = timeline, patches
    return kv_caches, connector


def release_worker_side(connector) -> None:
    """Stop the worker connector and take its stand-ins out again."""
    try:
        connector.shutdown()
    finally:
        patches = getattr(connector, "kvoffload_patches", None)
        if patches is not None:
            patches.undo()
