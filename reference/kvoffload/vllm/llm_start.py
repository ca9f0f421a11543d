"""Starting and stopping vLLM's offline engine for ``--engine vllm`` (``llm_engine.py``): the
connector's transfer config, ``LLMEngine`` with its core in this process, and its shutdown."""

from __future__ import annotations

import os
import time
from pathlib import Path

from vllm import EngineArgs, LLMEngine
from vllm.distributed.kv_transfer import kv_transfer_state
from vllm.platforms import current_platform

from kvoffload.engine.config import EngineConfig
from kvoffload.vllm.build import HOST_PAGE, STOCK_CLASS, ConnectorLoad
from kvoffload.vllm.geometry import ModelChoice
from kvoffload.vllm.weights import write_seeded_checkpoint

OFF = "off"  # no connector and no prefix caching: the oracle's second run


def transfer_config(source: str, engine: EngineConfig, model: ModelChoice, preset=None, disabled=(),
                    storage_dir: str | None = None):
    """vLLM's KVTransferConfig for a connector (None for ``off``), as ``build.ConnectorLoad``
    writes it, with real copies and each CPU tier's capacity sized for this model's blocks (the
    parts of a composed connector each)."""
    if source == OFF:
        return None
    config = ConnectorLoad(source, preset, tuple(disabled), storage_dir).transfer_config(engine, "auto")
    for extra, name in [(config.kv_connector_extra_config, config.kv_connector),
                        *((child["kv_connector_extra_config"], child["kv_connector"])
                          for child in config.kv_connector_extra_config.get("connectors", ()))]:
        if name == STOCK_CLASS:
            chunk = model.block_bytes(engine.block_size) * engine.blocks_per_chunk
            extra["cpu_bytes_to_use"] = engine.cpu_chunks * (-(-chunk // HOST_PAGE) * HOST_PAGE)
        elif "cpu_bytes_to_use" in extra:  # SimpleCPU: cpu_chunks x blocks_per_chunk blocks
            extra["cpu_bytes_to_use"] = engine.cpu_chunks * engine.blocks_per_chunk * model.block_bytes(engine.block_size)
    return config


def start_engine(engine: EngineConfig, model: ModelChoice, transfer, max_model_len: int, weights_dir: Path,
                 standins=None):
    """vLLM's LLMEngine with the engine core in this process (the driver reads its scheduler).
    The tiny model's seeded checkpoint is written to ``weights_dir`` first. ``standins`` (a
    foreign family's, ``foreign.py``; only where the platform has no GPU): the worker's GPU calls
    run on the CPU stand-ins, whose copies land when the model runner asks for finished
    transfers (after the forward), as the vllm-scheduler replay lands them."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # Our request ids are unique in a run: keep them, so the scheduler's requests carry them.
    os.environ["VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"] = "1"

    speculative = None
    if engine.spec_tokens:
        # No draft model runs here: n-gram prompt lookup, vLLM's draft-free method (on the CPU
        # too), proposes the k drafts.
        speculative = {"method": "ngram", "num_speculative_tokens": engine.spec_tokens,
                       "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    started = time.perf_counter()
    path = write_seeded_checkpoint(model.path, model.weight_seed, weights_dir) if model.dummy else model.path
    args = EngineArgs(
        model=str(path), skip_tokenizer_init=True,
        dtype=model.dtype, seed=engine.seed, block_size=engine.block_size, enforce_eager=True,
        enable_prefix_caching=transfer is not None, kv_transfer_config=transfer, max_model_len=max_model_len,
        num_gpu_blocks_override=engine.gpu_blocks, max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens, enable_chunked_prefill=True,
        speculative_config=speculative, async_scheduling=engine.scheduling == "async", disable_log_stats=False,
        # The pool's exact size: vLLM's CPU worker would otherwise reserve a share of the machine's
        # memory (gpu_memory_utilization of RAM) and warm the model up to measure it.
        kv_cache_memory_bytes=model.block_bytes(engine.block_size) * (engine.gpu_blocks + 1))
    if standins is None or current_platform.is_cuda_alike():
        llm = LLMEngine.from_engine_args(args)
    else:
        llm = _start_on_standins(args, standins, engine.store_completion_steps)
    _register_kernels_once()
    return llm, time.perf_counter() - started


def _start_on_standins(args, standins, completion_steps: int):
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    from kvoffload.vllm.standins.timeline import CopyTimeline, active

    timeline, patches = CopyTimeline(completion_steps), standins()
    try:
        with active(timeline):
            llm = LLMEngine.from_engine_args(args)
    except BaseException:
        patches.undo()
        raise
    worker = get_kv_transfer_group()
    worker.kvoffload_timeline, worker.kvoffload_patches = timeline, patches
    get_finished = worker.get_finished

    def landed_then_finished(*args, **kwargs):  # the model runner asks after the forward
        timeline.after_forward()
        return get_finished(*args, **kwargs)

    worker.get_finished = landed_then_finished
    return llm


def _register_kernels_once() -> None:
    """vLLM's CPU platform rebinds Triton kernels to C++ fallbacks when a worker starts, by scanning
    every loaded module (``register_triton_kernel_overrides``, vllm/platforms/cpu.py); in a second
    engine of the same process the scan trips over objects the first left behind
    (``_rebind_kernels``, vllm/triton_utils/dispatcher.py: AttributeError). The fallbacks stay
    bound for the process, so later engines skip the registration."""
    current_platform.register_triton_kernel_overrides = lambda: None


def shut_down(llm) -> None:
    """Stop the engine (None: one that failed to start), drop its worker connector and take the
    stand-ins out again."""
    patches = None
    try:
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

        if has_kv_transfer_group():
            patches = getattr(get_kv_transfer_group(), "kvoffload_patches", None)
        if llm is not None:
            llm.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - a connector that fails to stop must not hide the run's result
        pass
    if patches is not None:
        patches.undo()
    kv_transfer_state.ensure_kv_transfer_shutdown()  # the worker connector is a process global


