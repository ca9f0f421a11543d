"""Every copy a connector submitted through the stand-ins, from submission to completion.

The rule is the stock connector's replay rule (``worker/stepped.py``, docs/design.md, "Models and
connectors from outside"): a copy submitted and not yet waited on lands when the replay calls
:meth:`CopyTimeline.after_forward`, right after the step's forward, so a copy whose source the
forward rewrote reads the rewritten KV every time; a copy completes ``completion_steps`` such
calls after it landed (0: in the same one); a wait (an event's or a stream's ``synchronize``)
lands its stream's copies up to that point at once and completes them. Nothing here reads a
clock or depends on a thread: the same step sequence gives the same verdict.

Streams are FIFO queues, as CUDA streams are: a wait on one stream lands none of another's
copies, unless a copy was ordered after the other stream's event (``Stream.wait_event``).
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

from kvoffload.core.types import ConfigError


@dataclass
class StreamQueue:
    """One stream's copies: queued (not landed), landed (not complete), and how far it completed."""

    name: str
    queued: deque = field(default_factory=deque)  # (seq, copy, waits): submitted, not landed
    landed: deque = field(default_factory=deque)  # (seq, step it landed in)
    last_seq: int = 0  # the seq of the newest copy submitted on this stream (0: none yet)
    completed_through: int = 0  # every copy with seq <= this has completed


class CopyTimeline:
    """The owner of every stand-in stream's copies for one worker (one per replay)."""

    def __init__(self, completion_steps: int = 1) -> None:
        if type(completion_steps) is not int or completion_steps < 0:
            raise ConfigError(f"completion_steps must be an integer >= 0, got {completion_steps!r}")
        self.completion_steps = completion_steps
        self.step = 0  # after_forward calls so far
        self._next_seq = 1  # one sequence over every stream: submission order
        self._streams: list[StreamQueue] = []
        self.copies_landed = 0
        self.pinned_bytes = 0  # host memory the connector pinned (the pinning stand-in)
        self._finished_unpolled = False  # finish_all completed copies no step has polled yet

    def new_stream(self) -> StreamQueue:
        queue = StreamQueue(f"stream {len(self._streams)}")
        self._streams.append(queue)
        return queue

    def submit(self, stream: StreamQueue, copy: Callable[[], None],
               waits: tuple[tuple[StreamQueue, int], ...] = ()) -> int:
        """Queue ``copy`` on ``stream``, after the copies ``waits`` names ((stream, seq) pairs of
        events the stream was told to wait for); returns its sequence number."""
        seq = self._next_seq
        self._next_seq += 1
        stream.queued.append((seq, copy, waits))
        stream.last_seq = seq
        return seq

    def after_forward(self) -> None:
        """The step's forward has written its KV: every queued copy lands now, in submission
        order, and the copies whose completion falls due complete."""
        self.step += 1
        self._finished_unpolled = False  # this step's poll sees them
        pending = sorted((entry[0], stream) for stream in self._streams for entry in stream.queued)
        for seq, stream in pending:
            self._land_through(stream, seq)
        for stream in self._streams:
            while stream.landed and stream.landed[0][1] + self.completion_steps <= self.step:
                stream.completed_through = stream.landed.popleft()[0]

    def synchronize(self, stream: StreamQueue, seq: int) -> None:
        """A host wait on ``stream`` up to ``seq``: those copies land now and complete."""
        self._land_through(stream, seq)
        while stream.landed and stream.landed[0][0] <= seq:
            stream.landed.popleft()
        stream.completed_through = max(stream.completed_through, seq)

    def is_complete(self, stream: StreamQueue, seq: int) -> bool:
        return seq <= stream.completed_through

    def unfinished(self) -> bool:
        return any(stream.queued or stream.landed for stream in self._streams)

    def finish_all(self) -> bool:
        """Land and complete every copy (the replay has nothing else to do but wait for them).
        True when there was something to wait for, and once more on the next call: the connector
        learns of a completion only when it next polls its events, in the replay's next step."""
        if not self.unfinished():
            reported, self._finished_unpolled = self._finished_unpolled, False
            return reported
        for stream in self._streams:
            self.synchronize(stream, stream.last_seq)
        self._finished_unpolled = True
        return True

    def _land_through(self, stream: StreamQueue, seq: int) -> None:
        while stream.queued and stream.queued[0][0] <= seq:
            own_seq, copy, waits = stream.queued.popleft()
            for other, other_seq in waits:  # ordered after another stream's event
                self._land_through(other, other_seq)
            copy()
            self.copies_landed += 1
            stream.landed.append((own_seq, self.step))


# The timeline that stand-in streams made now belong to: set by whoever builds the worker (the
# replay around its connector's register_kv_caches; the vllm engine around the engine's start).
_ACTIVE: list[CopyTimeline] = []


@contextlib.contextmanager
def active(timeline: CopyTimeline) -> Iterator[CopyTimeline]:
    _ACTIVE.append(timeline)
    try:
        yield timeline
    finally:
        _ACTIVE.remove(timeline)


def current() -> CopyTimeline:
    if not _ACTIVE:
        raise RuntimeError("a stand-in stream was made outside a replay's worker build (no active CopyTimeline)")
    return _ACTIVE[-1]
