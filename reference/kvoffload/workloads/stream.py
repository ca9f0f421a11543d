"""A workload whose requests are built one at a time, when the replay reaches them.

A trace file can hold more tokens than memory (the 12,031-request Mooncake conversation trace is
about 150M prompt tokens). A :class:`RequestStream` knows, from a first pass over the lengths,
how many requests there are, their arrival order and the longest one; each later pass builds a
request's tokens only when that request is reached. The engine's feed
(``engine/feed.py``) pulls arrivals from :meth:`RequestStream.arrivals` and builds a request at
its arrival step, so memory follows the requests that are live (``docs/performance.md``, "Memory
and work that follow what is live").

It is also a ``Sequence[RequestSpec]`` for callers that iterate a workload's requests (summaries,
the vLLM scheduler engine): iterating is one streaming pass; ``len`` is free; indexing builds
every request once and keeps them (``materialised``), the price of random access.

Only streams of first turns are supported: a follow-up's arrival depends on when its parent
finished, so a feed could not know when to build it without reading the whole stream ahead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, overload

from kvoffload.engine.requests import RequestSpec

# One pass over the stream: (arrival step, build) pairs in arrival order; build() makes the spec.
Arrival = tuple[int, Callable[[], RequestSpec]]


@dataclass(frozen=True)
class Longest:
    """The longest request, known from the lengths alone: what the fit check names."""

    what: str
    num_prompt_tokens: int
    num_output_tokens: int


class RequestStream(Sequence[RequestSpec]):
    """``count`` first-turn requests in arrival order; ``open_pass()`` starts one streaming pass."""

    roots_only = True  # every request is a first turn (the feed may pull it lazily)

    def __init__(self, count: int, longest: Longest, open_pass: Callable[[], Iterator[Arrival]],
                 make_map: Callable[[], Callable[[RequestSpec], RequestSpec]] | None = None):
        self._count = count
        self.longest = longest
        self._open_pass = open_pass
        self._make_map = make_map
        self._materialised: tuple[RequestSpec, ...] | None = None

    def mapped(self, make_map: Callable[[], Callable[[RequestSpec], RequestSpec]]) -> "RequestStream":
        """The same stream with a per-pass map applied to each request as it is built, in order
        (scripted aborts: ``make_map()`` seeds the pass's draws). The map must keep arrival steps."""
        return RequestStream(self._count, self.longest, self._open_pass, make_map)

    def arrivals(self) -> Iterator[Arrival]:
        """One pass of (arrival step, build) pairs in arrival order: nothing is built until
        build() is called, and build() must be called in order (a pass's map draws in order)."""
        if self._make_map is None:
            return self._open_pass()
        return self._mapped_arrivals(self._make_map())

    def _mapped_arrivals(self, apply: Callable[[RequestSpec], RequestSpec]) -> Iterator[Arrival]:
        for step, build in self._open_pass():
            yield step, lambda build=build: apply(build())

    def __iter__(self) -> Iterator[RequestSpec]:
        if self._materialised is not None:
            return iter(self._materialised)
        return (build() for _, build in self.arrivals())

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> RequestSpec: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[RequestSpec, ...]: ...

    def __getitem__(self, index):
        return self.materialised()[index]

    def materialised(self) -> tuple[RequestSpec, ...]:
        """Every request built and kept (random access; memory grows with the trace)."""
        if self._materialised is None:
            self._materialised = tuple(iter(self))
        return self._materialised

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (RequestStream, tuple, list)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RequestStream({self._count} requests)"
