"""Stand-ins for CUDA streams and events (``torch.cuda.Stream`` with ``priority_range``,
``torch.cuda.current_stream``, ``torch.Event``) on a machine without a GPU.

A stand-in stream is a FIFO queue of copies on the worker's :class:`CopyTimeline`; an event
recorded on it completes when the copies queued before it have completed (``timeline.py``).
The current (compute) stream holds no copies: the replay's forward has written its KV before
the worker's calls that record on it, so an event recorded there is complete at once.

:func:`torch_facade` is what a connector module sees as ``torch``: torch itself, but for those
three names.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from kvoffload.vllm.standins import timeline as timelines


class Stream:
    """``torch.cuda.Stream``: a FIFO copy queue; ``priority`` is kept, not used (one CPU queue
    cannot yield to another)."""

    def __init__(self, device=None, priority: int = 0, **kwargs: Any) -> None:
        self.timeline = timelines.current()
        self.priority = priority
        self.queue = self.timeline.new_stream()
        self._waits: list[tuple[Any, int]] = []  # events this stream was told to wait for, not yet used

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(lowest, highest) priority: a CPU has one."""
        return 0, 0

    @property
    def cuda_stream(self) -> int:
        return id(self.queue)  # a stable handle; nothing dereferences it

    def wait_event(self, event: "Event") -> None:
        """Copies queued from now on land after the copies ``event`` covers."""
        if event.recorded is not None and event.recorded[0] is not None:
            self._waits.append(event.recorded)

    def wait_stream(self, stream: "Stream") -> None:
        if isinstance(stream, Stream):
            self._waits.append((stream.queue, stream.queue.last_seq))

    def submit(self, copy) -> int:
        waits, self._waits = tuple(self._waits), []
        return self.timeline.submit(self.queue, copy, waits)

    def synchronize(self) -> None:
        self.timeline.synchronize(self.queue, self.queue.last_seq)

    def query(self) -> bool:
        return self.timeline.is_complete(self.queue, self.queue.last_seq)


class ComputeStream:
    """``torch.cuda.current_stream()``: the forward's stream, which queues no copy."""

    cuda_stream = 0

    def wait_event(self, event: "Event") -> None:
        if event.recorded is not None and event.recorded[0] is not None:
            event.synchronize()  # the forward cannot start before the copies it waits for

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


COMPUTE_STREAM = ComputeStream()


class Event:
    """``torch.Event`` / ``torch.cuda.Event``: complete when the copies queued on its stream
    before ``record`` have completed; an event never recorded is complete (as CUDA's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.recorded: tuple[Any, int] | None = None  # (stream queue or None for compute, seq)
        self._timeline = None

    def record(self, stream=None) -> None:
        if isinstance(stream, Stream):
            self.recorded, self._timeline = (stream.queue, stream.queue.last_seq), stream.timeline
        else:  # the compute stream, or none given (the current stream)
            self.recorded, self._timeline = (None, 0), None

    def query(self) -> bool:
        if self._timeline is None:
            return True
        return self._timeline.is_complete(*self.recorded)

    def synchronize(self) -> None:
        if self._timeline is not None:
            self._timeline.synchronize(*self.recorded)

    def wait(self, stream=None) -> None:
        (stream or COMPUTE_STREAM).wait_event(self)


def current_stream(device=None) -> ComputeStream:
    return COMPUTE_STREAM


class _Facade(types.ModuleType):
    """A module that is ``real`` except for the names given to it."""

    def __init__(self, real: types.ModuleType, **overrides: Any) -> None:
        super().__init__(real.__name__)
        self.__dict__.update(overrides)
        self._real = real

    def __getattr__(self, name: str) -> Any:  # only called for names not overridden
        return getattr(self._real, name)


def torch_facade() -> types.ModuleType:
    """``torch`` as a connector module sees it: streams and events are the stand-ins."""
    cuda = _Facade(torch.cuda, Stream=Stream, Event=Event, current_stream=current_stream)
    return _Facade(torch, cuda=cuda, Event=Event)
