"""``mooncake``: replay a Mooncake-style JSONL trace (kvcache-ai/Mooncake, FAST'25 release).

One request per line::

    {"timestamp": 1200, "input_length": 1300, "output_length": 90, "hash_ids": [7, 8, 31]}

- ``timestamp``: milliseconds; ``arrival_step = round((timestamp - first) / ms_per_step)`` where
  ``first`` is the smallest timestamp of the trace and ``ms_per_step`` (default 20 ms: one decode
  step of an 8B model at moderate batch on an H100) converts wall time to engine steps. Both the
  timestamp and the arrival step are finite and at most 2**53 (``limits.py``).
- ``hash_ids``: one id per 512-token block of the prompt, ``ceil(input_length / 512)`` of them.
  Each id stands for 512 fixed token ids (drawn from a generator seeded by the workload seed and
  the id), so equal ids give equal token blocks and shared prefixes really repeat. The last block
  is cut to what ``input_length`` leaves.
- ``output_length``: the answer length; answers are random tokens (seeded by the workload seed
  and the line number), length-capped.

Token ids are held in ``array("i")`` buffers (4 bytes a token), not tuples.

The trace is read as a stream: a first pass checks every line and keeps only lengths,
timestamps and byte offsets; the replay's pass reads each line again when its request arrives
and builds its tokens then (``stream.py``), so a trace larger than memory replays.

Extra keys on a line are ignored (other tools add session ids and the like), as long as no line
nests deeper than 64 levels. Blank lines are skipped. Everything else that is off is an error
naming the file and line, found before any token is generated: a length that does not fit
``max_model_len`` fails at once whatever its size.
"""

from __future__ import annotations

import json
import random
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, NamedTuple

from kvoffload import long_numbers
from kvoffload.core.types import TOKEN_TYPECODE
from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads.limits import MAX_JSON_DEPTH, MAX_REQUESTS, MAX_STEP, json_depth_at_most
from kvoffload.workloads.registry import GenerateContext, register
from kvoffload.workloads.schema import (
    TableReader,
    WorkloadError,
    fail,
    is_int,
    is_number,
    json_problem,
    require_regular_file,
)
from kvoffload.workloads.stream import Longest, RequestStream
from kvoffload.workloads.tokens import random_tokens

MOONCAKE_BLOCK_TOKENS = 512
DEFAULT_MS_PER_STEP = 20.0


@dataclass(frozen=True)
class TraceLine:
    line: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


class TraceIndex(NamedTuple):
    """The first pass over a trace: per request, everything but its hash ids (file order)."""

    lines: list[int]
    timestamps_ms: list[float]
    input_lengths: list[int]
    output_lengths: list[int]
    offsets: list[int]  # byte offset of the line, for the second pass


@register("mooncake")
@dataclass(frozen=True)
class MooncakeTrace:
    path: str  # relative to the definition's folder (or the working directory for mooncake:FILE)
    ms_per_step: float
    max_requests: int | None

    @classmethod
    def from_table(cls, table: TableReader) -> "MooncakeTrace":
        return cls(
            path=table.string("path"),
            ms_per_step=table.number("ms_per_step", above=0.0, default=DEFAULT_MS_PER_STEP),
            max_requests=table.optional_integer("max_requests", minimum=1),
        )

    def longest_request(self, ctx: GenerateContext) -> tuple[str, int, int]:
        """("line N", prompt tokens, output tokens) of the longest request, from the lengths alone."""
        path = ctx.base_dir / self.path
        index = index_mooncake_trace(path, display=str(path), limit=self.max_requests)
        longest = _longest(index)
        return longest.what, longest.num_prompt_tokens, longest.num_output_tokens

    def generate(self, ctx: GenerateContext) -> list[RequestSpec]:
        """Every request, built now (``stream`` builds them one at a time)."""
        return list(self.stream(ctx))

    def stream(self, ctx: GenerateContext) -> RequestStream:
        """The trace's requests in arrival order (stable: equal steps keep file order), checked
        whole by a first pass over the lengths; each pass after it reads the file again and
        builds a request's tokens only when that request is reached."""
        path = ctx.base_dir / self.path
        index = index_mooncake_trace(path, display=str(path), limit=self.max_requests)
        first_ms = min(index.timestamps_ms)
        arrivals = []
        for line, timestamp_ms, num_in, num_out in zip(index.lines, index.timestamps_ms, index.input_lengths,
                                                      index.output_lengths):
            arrival = (timestamp_ms - first_ms) / self.ms_per_step
            if not arrival <= MAX_STEP:  # also inf, from a tiny ms_per_step
                raise WorkloadError(f"{path}: line {line}: key timestamp: expected an arrival step "
                                    f"(timestamp - first) / ms_per_step of at most 2**53, got {arrival:.3g} "
                                    f"(ms_per_step {self.ms_per_step:g})")
            arrivals.append(round(arrival))
            ctx.budget.add(f"line {line}", num_in, num_out)
        order = sorted(range(len(arrivals)), key=arrivals.__getitem__)
        width = len(str(index.lines[-1]))

        def open_pass() -> Iterator[tuple[int, Callable[[], RequestSpec]]]:
            blocks = _BlockTokens(ctx.seed)
            with path.open("rb") as handle:
                for i in order:
                    yield arrivals[i], partial(_build, handle, blocks, index, i, arrivals[i], width, ctx.seed, path)

        return RequestStream(len(order), _longest(index), open_pass)


def _longest(index: TraceIndex) -> Longest:
    i = max(range(len(index.lines)), key=lambda i: index.input_lengths[i] + index.output_lengths[i])
    return Longest(f"line {index.lines[i]}", index.input_lengths[i], index.output_lengths[i])


def _build(handle: BinaryIO, blocks: "_BlockTokens", index: TraceIndex, i: int, arrival_step: int, width: int,
           seed: int, path: Path) -> RequestSpec:
    """Request i of the index: its line read again, its prompt made of its blocks' tokens."""
    number = index.lines[i]
    handle.seek(index.offsets[i])
    try:
        line = _parse_line(handle.readline().decode("utf-8"), display=str(path), number=number)
    except (UnicodeDecodeError, WorkloadError):
        line = None
    if line is None or (line.input_length, line.output_length) != (index.input_lengths[i], index.output_lengths[i]):
        raise WorkloadError(f"{path}: line {number}: expected the line read before the replay, got a "
                            f"different one (the file changed during the replay)")
    prompt = array(TOKEN_TYPECODE)
    prompt.frombytes(b"".join(blocks.get(hash_id) for hash_id in line.hash_ids)[: line.input_length * prompt.itemsize])
    # Outputs seeded per line: a request's tokens do not depend on which requests were built before it.
    output_rng = random.Random(f"mooncake-output/{seed}/{number}")
    return RequestSpec(req_id=f"mc-{number:0{width}d}", prompt_token_ids=prompt,
                       output_token_ids=random_tokens(output_rng, line.output_length), stop="length",
                       arrival_step=arrival_step)


class _BlockTokens:
    """The int32 bytes of each hash id's 512-token block, the most recently used ones kept
    (shared prefixes repeat in nearby requests); a block dropped is drawn again from its seed."""

    CAPACITY = 8192  # blocks kept: 8192 x 2 KiB = 16 MiB

    def __init__(self, seed: int):
        self._seed = seed
        self._cache: OrderedDict[int, bytes] = OrderedDict()

    def get(self, hash_id: int) -> bytes:
        cache = self._cache
        tokens = cache.get(hash_id)
        if tokens is None:
            rng = random.Random(f"mooncake-block/{self._seed}/{hash_id}")
            tokens = random_tokens(rng, MOONCAKE_BLOCK_TOKENS).tobytes()
            cache[hash_id] = tokens
            if len(cache) > self.CAPACITY:
                cache.popitem(last=False)
        else:
            cache.move_to_end(hash_id)
        return tokens


def read_mooncake_trace(path: Path, *, display: str, limit: int | None = None) -> list[TraceLine]:
    """Parse and validate a Mooncake JSONL trace whole; ``display`` names the file in messages."""
    return [line for line, _ in _read_lines(path, display=display, limit=limit)]


def index_mooncake_trace(path: Path, *, display: str, limit: int | None = None) -> TraceIndex:
    """Validate a trace and keep its lengths, timestamps and line offsets (no hash ids)."""
    index = TraceIndex([], [], [], [], [])
    for line, offset in _read_lines(path, display=display, limit=limit):
        index.lines.append(line.line)
        index.timestamps_ms.append(line.timestamp_ms)
        index.input_lengths.append(line.input_length)
        index.output_lengths.append(line.output_length)
        index.offsets.append(offset)
    return index


def _read_lines(path: Path, *, display: str, limit: int | None) -> Iterator[tuple[TraceLine, int]]:
    """Each non-blank line parsed and checked, with its byte offset, streamed from the file."""
    require_regular_file(path, display, "a Mooncake JSONL trace")
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise WorkloadError(f"{display}: cannot read the file ({exc.strerror})") from None
    count = offset = 0
    with handle:
        for number, raw in enumerate(handle, start=1):
            start, offset = offset, offset + len(raw)
            if limit is not None and count >= limit:
                break
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise WorkloadError(f"{display}: line {number}: expected UTF-8 text, got undecodable bytes") from None
            if text.strip():
                count += 1
                if count > MAX_REQUESTS:
                    raise WorkloadError(f"{display}: line {number}: expected at most {MAX_REQUESTS:,} requests "
                                        f"(10**7; the workload must fit memory; max_requests reads fewer)")
                yield _parse_line(text, display=display, number=number), start
    if not count:
        raise WorkloadError(f"{display}: expected at least one JSON line, got an empty trace")


def _parse_line(text: str, *, display: str, number: int) -> TraceLine:
    where = f"line {number}"
    if not json_depth_at_most(text.encode("utf-8")):
        raise WorkloadError(f"{display}: {where}: expected a JSON object, got JSON nested deeper than "
                            f"{MAX_JSON_DEPTH} levels")
    try:
        record: Any = json.loads(text.rstrip("\r\n"))
    except RecursionError:  # the depth check above should make this unreachable
        raise WorkloadError(f"{display}: {where}: expected a JSON object, got JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        problem = json_problem(exc)
        raise WorkloadError(f"{display}: {where}: expected a JSON object, got invalid JSON ({problem})") from None
    except ValueError as exc:  # not a JSONDecodeError: a number too long to convert
        if not long_numbers.is_too_long(exc):
            raise
        raise WorkloadError(f"{display}: {where}: expected {long_numbers.EXPECTED}, got "
                            f"{long_numbers.describe(text, line=False)}") from None
    if not isinstance(record, dict):
        fail(display, where, "a JSON object", record)
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in record:
            raise WorkloadError(f"{display}: {where}: expected keys timestamp, input_length, output_length "
                                f"and hash_ids, got no {key!r}")
    timestamp = record["timestamp"]
    if not is_number(timestamp) or not 0 <= timestamp <= MAX_STEP:
        fail(display, f"{where}: key timestamp", "finite milliseconds within [0, 2**53]", timestamp)
    for key in ("input_length", "output_length"):
        if not is_int(record[key]) or record[key] < 1:
            fail(display, f"{where}: key {key}", "an integer >= 1", record[key])
    hash_ids = record["hash_ids"]
    if not isinstance(hash_ids, list) or not all(is_int(h) for h in hash_ids):
        fail(display, f"{where}: key hash_ids", "a list of integers", hash_ids)
    num_blocks = -(-record["input_length"] // MOONCAKE_BLOCK_TOKENS)
    if len(hash_ids) != num_blocks:
        raise WorkloadError(f"{display}: {where}: key hash_ids: expected ceil(input_length / "
                            f"{MOONCAKE_BLOCK_TOKENS}) = {num_blocks} ids, got {len(hash_ids)}")
    return TraceLine(number, float(timestamp), record["input_length"], record["output_length"], tuple(hash_ids))
