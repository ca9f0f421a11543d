"""Stand-in for a connector's copy thread (``threading.Thread`` fed by a ``queue.SimpleQueue``,
as ``DmaCopyBackend`` runs its ``_copy_loop``).

A real copy thread takes each item when the OS schedules it: whether a wait issued meanwhile
sees the item's event depends on thread timing. The stand-in runs the thread's own loop, the
connector's code, at once on every ``put``, in the caller's thread, until the queue is empty:
the fastest thread possible, every time. The loop submits copies to stand-in streams, so the
data still lands after the forward (``timeline.py``); only the hand-over is immediate.

An exception in the loop, which would kill a real thread silently and leave its events never
completing (a hang), reaches the caller of ``put`` instead: a connector crash with its frames.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable


class _Drained(Exception):
    """The stand-in queue is empty: the loop gives the caller back control."""


class InlineQueue:
    """``queue.SimpleQueue`` whose consumer (an :class:`InlineThread`) runs on each put."""

    def __init__(self) -> None:
        self._items: deque = deque()
        self.consumer: InlineThread | None = None

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        self._items.append(item)
        if self.consumer is not None:
            self.consumer.drain()

    put_nowait = put

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not self._items:
            raise _Drained
        return self._items.popleft()

    get_nowait = get

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)


class InlineThread:
    """``threading.Thread`` whose target runs whenever its queue (the first argument that is an
    :class:`InlineQueue`) is fed, until the queue is empty or the target returns."""

    def __init__(self, group=None, target: Callable[..., Any] | None = None, name: str | None = None,
                 args: tuple = (), kwargs: dict | None = None, *, daemon: bool | None = None) -> None:
        self._target, self._args, self._kwargs = target, args, kwargs or {}
        self.name, self.daemon = name or "stand-in copy thread", daemon
        self._started = self._finished = False
        self._running = False

    def start(self) -> None:
        self._started = True
        for arg in self._args:
            if isinstance(arg, InlineQueue):
                arg.consumer = self
        self.drain()

    def drain(self) -> None:
        if not self._started or self._finished or self._running or self._target is None:
            return
        self._running = True  # a put from inside the loop queues, the loop takes it next
        try:
            self._target(*self._args, **self._kwargs)
        except _Drained:
            return
        finally:
            self._running = False
        self._finished = True  # the loop returned (its shutdown item)

    def join(self, timeout: float | None = None) -> None:
        self.drain()

    def is_alive(self) -> bool:
        return self._started and not self._finished
