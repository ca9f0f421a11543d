"""Connectors the suite was not built from, as vLLM loads them: their transfer config, the CPU
stand-ins their worker needs (``standins/``), and the engine settings they cannot honour.

- ``example``  vLLM's ``ExampleConnector``: every new request's prompt KV to safetensors files,
  loaded back synchronously; its files go to the run's storage folder (``storage_dir``)
- ``peer``  a remote-prefill peer for composed connectors (``peer.py``)
- ``A+B``  vLLM's ``MultiConnector`` of A and B (``ConnectorLoad``): ``stock+example``, and in gate
  K13 ``X+peer`` for the connector under test X
- ``simple-cpu``, ``simple-cpu-lazy``  vLLM's ``SimpleCPUOffloadConnector``
  (``vllm/v1/simple_kv_offload/``): its own manager on a CPU ``BlockPool``, eager (stores every
  confirmed block) or lazy (stores GPU blocks near eviction). Its worker calls CUDA streams and
  events, ``cudaHostRegister`` and ``cuMemcpyBatchAsync`` from a copy thread; those names, and
  only those, are replaced in ``worker.py`` and ``copy_backend.py`` (the same names in every
  release 0.25.0-0.32.0: :meth:`Patches.replace` refuses a release that lacks one).

A family is named by its short name or by its class's ``MODULE:CLASS`` path (``family_of``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

from kvoffload.choice import FOREIGN
from kvoffload.engine.config import EngineConfig
from kvoffload.vllm.standins import Patches

SIMPLE_CPU_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector"
SIMPLE_CPU_WORKER = "vllm.v1.simple_kv_offload.worker"
SIMPLE_CPU_COPIES = "vllm.v1.simple_kv_offload.copy_backend"


@dataclass(frozen=True)
class Family:
    name: str
    class_path: str  # MODULE:CLASS
    extra_config: Callable[[EngineConfig, str | None], dict]  # (engine, storage folder) -> options
    standins: Callable[[], Patches] | None = None  # the worker's GPU calls replaced (None: it makes none)
    # engine setting -> why this connector cannot honour a value other than the default
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def class_name(self) -> str:
        return self.class_path.partition(":")[2]


def simple_cpu_standins() -> Patches:
    """SimpleCPU's worker as it would run on a GPU, but for its GPU calls (``standins/``)."""
    from kvoffload.vllm.standins import dma, streams, threads

    patches = Patches()
    torch = streams.torch_facade()
    patches.replace(SIMPLE_CPU_WORKER, torch=torch, PIN_MEMORY=True, pin_tensor=dma.pin_tensor)
    patches.replace(SIMPLE_CPU_COPIES, torch=torch, build_params=dma.build_params, copy_blocks=dma.copy_blocks,
                    threading=SimpleNamespace(Thread=threads.InlineThread),
                    queue=SimpleNamespace(SimpleQueue=threads.InlineQueue))
    return patches


def _simple_cpu_extra(lazy: bool) -> Callable[[EngineConfig, str | None], dict]:
    def extra(engine: EngineConfig, storage_dir: str | None) -> dict:
        from kvoffload.vllm.tiny_kv import block_bytes

        # Capacity in bytes (cpu_bytes_to_use): cpu_chunks chunks of blocks_per_chunk blocks. The
        # connector offloads single blocks; blocks_per_chunk is only the unit the metrics count in.
        capacity = engine.cpu_chunks * engine.blocks_per_chunk * block_bytes(engine.block_size)
        return {"cpu_bytes_to_use": capacity, "lazy_offload": lazy}
    return extra


SIMPLE_CPU_REFUSED = {
    "offload_prompt_only": "SimpleCPUOffloadConnector stores every confirmed block (it has no prompt-only mode)",
    "strict_lifecycle": "SimpleCPUOffloadConnector's manager has no lifecycle mode to relax",
}

FAMILIES: dict[str, Family] = {
    name: Family(name, f"{SIMPLE_CPU_MODULE}:SimpleCPUOffloadConnector", _simple_cpu_extra(name.endswith("lazy")),
                 simple_cpu_standins, SIMPLE_CPU_REFUSED)
    for name in ("simple-cpu", "simple-cpu-lazy")
}
FAMILIES["example"] = Family(
    "example", "vllm.distributed.kv_transfer.kv_connector.v1.example_connector:ExampleConnector",
    lambda engine, storage_dir: {"shared_storage_path": storage_dir},
    refused={"strict_lifecycle": "ExampleConnector keeps no lifecycle record to relax"})
FAMILIES["peer"] = Family("peer", "kvoffload.vllm.peer:AsyncPeerConnector", lambda engine, storage_dir: {})


def family_of(source: str) -> Family | None:
    """The family ``source`` names: its short name, its class path (the first variant), or a
    subclass of its class (a patched copy of the connector; a class attribute
    ``kvoffload_family`` picks the variant); else None."""
    if source in FAMILIES:
        return FAMILIES[source]
    for family in FAMILIES.values():
        if family.class_path == source:
            return family
    module_name, sep, class_name = source.partition(":")
    if not sep or module_name.split(".")[0] == "vllm":
        return None
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):
        return None  # build.py reports a connector that does not load, in one line
    for family in FAMILIES.values():
        family_module, _, family_class = family.class_path.partition(":")
        base = getattr(importlib.import_module(family_module), family_class)
        if isinstance(cls, type) and issubclass(cls, base):
            return FAMILIES[getattr(cls, "kvoffload_family", family.name)]
    return None


class CannotRunHere(RuntimeError):
    """A connector known to need a GPU for its KV path: its run here is one "could not start"
    line, not a silent degradation."""


# Connectors whose worker needs CUDA for the KV path itself (no stand-in can replace it without
# replacing the connector): part of the module path or class name -> why, in one line.
NEEDS_A_GPU = {
    "lmcache": "LMCache has no CPU KV path for vLLM (its worker needs CUDA ops); on a CPU it degrades to "
               "recompute and serves nothing",
}


def check_runs_here(source: str) -> None:
    """CannotRunHere for a known GPU-only connector on a machine without CUDA."""
    import torch

    if torch.cuda.is_available():
        return
    for part in source.split("+"):
        lowered = part.lower()
        for marker, why in NEEDS_A_GPU.items():
            if marker in lowered:
                raise CannotRunHere(f"{part}: {why}")