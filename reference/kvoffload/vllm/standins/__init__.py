"""CPU stand-ins for the GPU-only APIs a connector calls, one per API, shared by every connector
(docs/design.md, "Models and connectors from outside"):

- ``streams``   CUDA streams (``torch.cuda.Stream``, ``priority_range``, ``current_stream``) and
                events (``torch.Event``): FIFO copy queues on the worker's timeline
- ``dma``       the batched DMA copy (``cuMemcpyBatchAsync``: ``build_params``, ``copy_blocks``)
                and host pinning (``cudaHostRegister``: ``pin_tensor``)
- ``threads``   a connector's copy thread (``threading.Thread`` + ``queue.SimpleQueue``)
- ``timeline``  the one owner of the copies: they land after the step's forward, complete
                ``completion_steps`` steps later, and a wait lands and completes them at once

:class:`Patches` puts stand-ins in place of the names a connector's modules imported, and takes
them out again; the connector's own code (its scheduler-side manager, its worker's
bookkeeping) runs unchanged. Which names of which modules, per connector and release, is the
connector family's business (``kvoffload.vllm.foreign``).
"""

from __future__ import annotations

import importlib
from typing import Any

class StandInsMissing(RuntimeError):
    """A connector module lacks a name the stand-ins replace: a release whose worker calls other
    GPU APIs than the stand-ins cover (the connector could not start here)."""


class Patches:
    """Module attributes replaced for one replay, restored by :meth:`undo` (newest first)."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def replace(self, module_name: str, **names: Any) -> None:
        """Replace each name of the module; a name it lacks means the stand-ins do not cover this
        release of the connector: :class:`StandInsMissing` saying which."""
        module = importlib.import_module(module_name)
        for name, value in names.items():
            if not hasattr(module, name):
                raise StandInsMissing(f"the CPU stand-ins do not cover {module_name}: it has no {name!r} "
                                  "(a vLLM release whose connector calls another GPU API)")
            self._saved.append((module, name, getattr(module, name)))
            setattr(module, name, value)

    def merge(self, other: "Patches") -> None:
        """Take over ``other``'s replacements (undone with this one's, newest first)."""
        self._saved += other._saved
        other._saved = []

    def undo(self) -> None:
        while self._saved:
            module, name, value = self._saved.pop()
            setattr(module, name, value)
