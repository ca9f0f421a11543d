"""The reference connector as a vLLM V1 KV connector (scheduler and worker roles).

Load it into vLLM 0.32 with::

    KVTransferConfig(kv_connector="KVOffloadConnector",
                     kv_connector_module_path="kvoffload.vllm.connector",
                     kv_role="kv_both",
                     kv_connector_extra_config={"cpu_bytes_to_use": 1 << 30, "blocks_per_chunk": 2})

vLLM's ``KVConnectorFactory`` imports the module and builds the class once per role
(``vllm/distributed/kv_transfer/kv_connector/factory.py``). The scheduler role runs
``kvoffload.core``'s ``ReferenceConnectorScheduler``; the worker role runs
``kvoffload.worker``'s ``WorkerConnector`` over vLLM's own KV cache tensors, copying with the
project's CUDA handler on CUDA and its threaded torch handler on the CPU. Options
(``kv_connector_extra_config``, see :class:`ConnectorOptions`) follow vLLM's
``OffloadingConnector`` where both have them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole, SupportsHMA

from kvoffload.core.fixes import Fixes, MambaStores
from kvoffload.core.hybrid import connector_scheduler
from kvoffload.core.model import GroupKind, model_named
from kvoffload.core.scheduler import ReferenceConnectorScheduler
from kvoffload.core.types import ConfigError, ConnectorConfig, TransferResult
from kvoffload.vllm.adapters import (
    CompletedJobsMetadata,
    StepPlanMetadata,
    VllmRequestView,
    project_scheduler_output,
)
from kvoffload.vllm.compat import RELEASE
from kvoffload.vllm.regions import TRANSFER_KINDS, block_regions, make_handler
from kvoffload.worker.connector import WorkerConnector

_KNOWN_OPTIONS = ("cpu_bytes_to_use", "cpu_chunks", "block_size", "blocks_per_chunk", "offload_prompt_only",
                  "strict_lifecycle", "preset", "disable_fixes", "transfer", "completion_steps", "model")


@dataclass(frozen=True)
class ConnectorOptions:
    """``kv_connector_extra_config``, checked.

    - capacity: ``cpu_bytes_to_use`` (bytes, as vLLM's OffloadingConnector) or ``cpu_chunks``;
    - chunk size: ``block_size`` (tokens, a multiple of the GPU block size) or
      ``blocks_per_chunk`` (default 1), not both;
    - ``offload_prompt_only``: default True, as vLLM's;
    - ``strict_lifecycle``: default True: the manager counts calls out of lifecycle order
      (``lifecycle_violations``);
    - ``preset`` (a vLLM release the reference imitates) and ``disable_fixes`` (fix names);
    - ``transfer``: ``auto`` (CUDA handler on CUDA, threaded on CPU), ``threaded``, ``cuda``, or
      ``stepped`` (deterministic; copies when the driver calls ``copy_submitted``) with
      ``completion_steps``;
    - ``model``: the suite's model description (``core/model.py``, default ``dense``), checked
      against vLLM's KV cache groups.
    """

    cpu_bytes_to_use: int | None
    cpu_chunks: int | None
    blocks_per_chunk: int
    offload_prompt_only: bool
    strict_lifecycle: bool
    fixes: Fixes
    transfer: str
    completion_steps: int
    model: str = "dense"

    @classmethod
    def parse(cls, extra: Mapping[str, Any], gpu_block_size: int) -> "ConnectorOptions":
        unknown = sorted(set(extra) - set(_KNOWN_OPTIONS))
        if unknown:
            raise ConfigError(f"unknown KVOffloadConnector option {unknown[0]!r} (known: {', '.join(_KNOWN_OPTIONS)})")
        cpu_bytes, cpu_chunks = extra.get("cpu_bytes_to_use"), extra.get("cpu_chunks")
        if (cpu_bytes is None) == (cpu_chunks is None):
            raise ConfigError("give exactly one of cpu_bytes_to_use and cpu_chunks")
        for name, value in (("cpu_bytes_to_use", cpu_bytes), ("cpu_chunks", cpu_chunks)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if "block_size" in extra and "blocks_per_chunk" in extra:
            raise ConfigError("give block_size or blocks_per_chunk, not both")
        if "block_size" in extra:
            tokens = extra["block_size"]
            if not isinstance(tokens, int) or tokens < 1 or tokens % gpu_block_size:
                raise ConfigError(f"block_size must be a multiple of the GPU block size {gpu_block_size}, "
                                  f"got {tokens!r}")
            bpc = tokens // gpu_block_size
        else:
            bpc = extra.get("blocks_per_chunk", 1)
            if not isinstance(bpc, int) or isinstance(bpc, bool) or bpc < 1:
                raise ConfigError(f"blocks_per_chunk must be a positive integer, got {bpc!r}")
        prompt_only, strict = extra.get("offload_prompt_only", True), extra.get("strict_lifecycle", True)
        for name, value in (("offload_prompt_only", prompt_only), ("strict_lifecycle", strict)):
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be true or false, got {value!r}")
        preset = extra.get("preset")
        fixes = Fixes.preset(preset) if preset else Fixes()
        disabled = extra.get("disable_fixes", ())
        if isinstance(disabled, str):
            disabled = (disabled,)
        fixes = fixes.without(*disabled)
        transfer = extra.get("transfer", "auto")
        if transfer not in TRANSFER_KINDS:
            raise ConfigError(f"transfer must be one of {', '.join(TRANSFER_KINDS)}, got {transfer!r}")
        steps = extra.get("completion_steps", 1)
        if not isinstance(steps, int) or steps < 0:
            raise ConfigError(f"completion_steps must be an integer >= 0, got {steps!r}")
        model = extra.get("model", "dense")
        model_named(model)  # ConfigError for an unknown one
        return cls(cpu_bytes, cpu_chunks, bpc, prompt_only, strict, fixes, transfer, steps, model)

    def num_chunks(self, bytes_per_block: int) -> int:
        if self.cpu_chunks is not None:
            return self.cpu_chunks
        chunks = self.cpu_bytes_to_use // (bytes_per_block * self.blocks_per_chunk)
        if chunks < 1:
            raise ConfigError(f"cpu_bytes_to_use={self.cpu_bytes_to_use} holds no chunk of "
                              f"{bytes_per_block * self.blocks_per_chunk} bytes")
        return chunks


_SPEC_KIND = {"FullAttentionSpec": GroupKind.FULL_ATTENTION, "SlidingWindowSpec": GroupKind.SLIDING_WINDOW,
              "MambaSpec": GroupKind.MAMBA}


def _engine_block_size(kv_cache_config, model_name: str) -> int:
    """The engine's block size: a group's without a block size of its own in the model
    description (``KVCacheGroup.block_size``), else the first group's."""
    own = [group.block_size for group in model_named(model_name).groups]
    groups = kv_cache_config.kv_cache_groups
    plain = [g.kv_cache_spec.block_size for g, size in zip(groups, own) if not size]
    return plain[0] if plain else groups[0].kv_cache_spec.block_size


def _check_groups(kv_cache_config, model_name: str, block_size: int, blocks_per_chunk: int):
    """vLLM's KV cache groups must be the model description's (kind, window and block size, in
    order). Groups of different block sizes are chunked one block each, as vLLM's
    OffloadingConnector chunks them (0.32 ``build_offloading_config`` asserts one block size
    where a chunk holds several), and run in vLLM's scheduler only (``group_blocks.py``)."""
    model, groups = model_named(model_name), kv_cache_config.kv_cache_groups
    seen = [(_SPEC_KIND.get(type(g.kv_cache_spec).__name__), getattr(g.kv_cache_spec, "sliding_window", None) or 0)
            for g in groups]
    wanted = [(group.kind, group.sliding_window) for group in model.groups]
    if seen != wanted:
        raise ConfigError(f"KVOffloadConnector: vLLM's KV cache groups {[type(g.kv_cache_spec).__name__ for g in groups]} "
                          f"are not model {model.name!r}'s (option model)")
    sizes = [g.kv_cache_spec.block_size for g in groups]
    if sizes != [group.tokens_per_block(block_size) for group in model.groups]:
        raise ConfigError(f"KVOffloadConnector: vLLM's KV cache groups' block sizes {sizes} are not model "
                          f"{model.name!r}'s (option model)")
    if len(set(sizes)) > 1 and blocks_per_chunk != 1:
        raise ConfigError(f"KVOffloadConnector: the KV cache groups' block sizes differ ({sorted(set(sizes))}): "
                          f"a chunk is one block each, got blocks_per_chunk={blocks_per_chunk}")
    return groups[0]


def _check_mamba_stores(model_name: str, fixes: Fixes) -> None:
    """Release rules that store a Mamba state only from the scheduler's boundary-state hand-off,
    which vLLM 0.29 added, would store none in an older scheduler and serve nothing (docs/hybrid.md,
    "The reference connector and Mamba"); the presets of vLLM 0.25, 0.26 and 0.28 store it from
    the block table (``MambaStores.BLOCK_TABLE``) and run there."""
    if (model_named(model_name).has_mamba and RELEASE < (0, 29, 0)
            and fixes.rules.mamba_stores is MambaStores.BOUNDARY_HAND_OFF):
        raise ConfigError(f"KVOffloadConnector: model {model_name!r}: vLLM {'.'.join(map(str, RELEASE))}'s scheduler "
                          "hands a connector no Mamba boundary states (vLLM 0.29+), and these release rules store a "
                          "Mamba state only from them (the presets of vLLM 0.25, 0.26 and 0.28 store it from the block "
                          "table)")


def eagle_drafts(vllm_config) -> int:
    """The EAGLE/MTP drafter's speculative tokens, 0 without one: what the connector reads of
    vLLM's drafter (``SpeculativeConfig.use_eagle()``, as ``SchedulerOffloadConfig.from_spec``)."""
    speculative = vllm_config.speculative_config
    return speculative.num_speculative_tokens if speculative is not None and speculative.use_eagle() else 0


class KVOffloadConnector(KVConnectorBase_V1, SupportsHMA):
    """The reference connector behind vLLM's V1 connector API (``kv_connector/v1/base.py``)."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        if kv_cache_config is None:
            raise ConfigError("KVOffloadConnector needs vLLM's kv_cache_config")
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        gpu_block_size = _engine_block_size(kv_cache_config, extra.get("model", "dense"))
        self.options = ConnectorOptions.parse(extra, gpu_block_size)
        group = _check_groups(kv_cache_config, self.options.model, gpu_block_size, self.options.blocks_per_chunk)
        bytes_per_block = group.kv_cache_spec.page_size_bytes * len(group.layer_names)
        retention = getattr(vllm_config.cache_config, "prefix_cache_retention_interval", 0)
        self.config = ConnectorConfig(
            block_size=gpu_block_size, blocks_per_chunk=self.options.blocks_per_chunk,
            cpu_chunks=self.options.num_chunks(bytes_per_block),
            offload_prompt_only=self.options.offload_prompt_only, strict_lifecycle=self.options.strict_lifecycle,
            model=self.options.model, prefix_cache_retention_interval=retention if retention is None else int(retention),
            eagle_drafts=eagle_drafts(vllm_config), num_workers=vllm_config.parallel_config.world_size)
        self._hybrid = len(kv_cache_config.kv_cache_groups) > 1
        self._num_blocks = kv_cache_config.num_blocks
        self.core: ReferenceConnectorScheduler | None = None
        self.worker: WorkerConnector | None = None
        self.fixes = self.choose_fixes(self.options.fixes)
        _check_mamba_stores(self.options.model, self.fixes)
        if role == KVConnectorRole.SCHEDULER:
            self.core = self.scheduler_side(self.config, self.fixes)
        self._views: dict[str, VllmRequestView] = {}
        self._step = 0
        self._load_owner: dict[int, str] = {}  # load job id -> request, until reported
        self._completed: list[TransferResult] = []

    @property
    def requires_kv_delivery(self) -> bool:
        # A best-effort cache, like vLLM's OffloadingConnector (offloading_connector.py, 0.27+):
        # a dropped store is a later miss. The base class's default (True for kv_both) makes the
        # scheduler drop a preempted request's in-flight output, and under async scheduling
        # 0.27.0-0.29.0 then preempt and re-admit the same batch forever (docs/fidelity.md,
        # "A connector that asks for KV delivery").
        return False

    def choose_fixes(self, configured: Fixes) -> Fixes:
        """The fix flags both roles run with; a subclass may change them (tests plant bugs so)."""
        return configured

    def scheduler_side(self, config: ConnectorConfig, fixes: Fixes) -> ReferenceConnectorScheduler:
        """The scheduler role's core; a subclass may plant another (tests do, for bugs no flag plants)."""
        return connector_scheduler(config, fixes)

    # ---- scheduler role -------------------------------------------------------------------

    def _view(self, request) -> VllmRequestView:
        view = self._views.get(request.request_id)
        if view is None:
            view = self._views[request.request_id] = VllmRequestView(request)
        return view

    def on_new_request(self, request) -> None:
        self.core.on_new_request(self._view(request))

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self.core.get_num_new_matched_tokens(self._view(request), num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        # Every allocation reaches the fence, with external tokens or without (K13).
        block_ids = blocks.get_block_ids() if self._hybrid else blocks.get_block_ids()[0]
        self.core.update_state_after_alloc(self._view(request), block_ids, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> StepPlanMetadata:
        plan = self.core.build_connector_meta(project_scheduler_output(scheduler_output, self._step, self._hybrid))
        self._step += 1
        return StepPlanMetadata(plan)

    def update_connector_output(self, connector_output) -> None:
        meta = connector_output.kv_connector_worker_meta
        if meta is not None:
            self.core.update_connector_output(meta.results)

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        # Blocks are freed at once: a pending store that reads them is fenced, never delayed.
        self.core.request_finished(self._view(request), tuple(block_ids))
        self._views.pop(request.request_id, None)
        return False, None

    def request_finished_all_groups(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        """SupportsHMA: every group's blocks (vLLM calls this instead of request_finished)."""
        return self.request_finished(request, tuple(tuple(ids) for ids in block_ids) if self._hybrid
                                     else block_ids[0])

    def has_pending_push_work(self) -> bool:
        return self.core.has_pending_work()

    def reset_cache(self) -> bool:
        return self.core.reset_cache()

    def take_events(self):
        return ()

    # ---- worker role ----------------------------------------------------------------------

    def register_kv_caches(self, kv_caches) -> None:
        regions = block_regions(kv_caches, self._num_blocks)
        handler = make_handler(regions, self.config.block_size, self.config.cpu_chunks,
                               self.config.blocks_per_chunk, self.options.transfer, self.options.completion_steps)
        self.worker = WorkerConnector(handler, self.fixes)

    def handle_preemptions(self, kv_connector_metadata: StepPlanMetadata) -> None:
        self.worker.handle_preemptions(kv_connector_metadata.plan)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        plan = self._get_connector_metadata().plan
        for job in plan.load_jobs:
            self._load_owner[job.job_id] = job.req_id
        self.worker.start_loads(plan)

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass  # loads are asynchronous: a loading request is not in the batch

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        pass  # stores are whole-block copies planned by the scheduler side

    def wait_for_save(self) -> None:
        pass  # the plan's stores are queued by get_finished, submitted at the next step's start

    def copy_submitted(self) -> None:
        """Run the copies a ``stepped`` handler holds (a replay driver calls it after the forward)."""
        self.worker.handler.run_submitted()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.worker.get_finished()
        self._completed.extend(results)
        loaded = {self._load_owner.pop(r.job_id) for r in results if r.job_id in self._load_owner}
        return None, loaded or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """GPU blocks of loads that failed, each reported once, in the pass whose
        ``get_finished`` reports the load (vLLM calls this right after it,
        ``kv_connector_model_runner_mixin.py``): the base class's contract
        (``kv_connector/v1/base.py``). vLLM's scheduler then recomputes from the first of them
        or fails the request (``kv_load_failure_policy``) instead of reading garbage."""
        return set(self.worker.take_block_ids_with_load_errors())

    def build_connector_worker_meta(self) -> CompletedJobsMetadata | None:
        if not self._completed:
            return None
        meta, self._completed = CompletedJobsMetadata(self._completed), []
        return meta

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
