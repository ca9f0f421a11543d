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
- ``output_length``: the answer length; answers are random tokens, length-capped.

Extra keys on a line are ignored (other tools add session ids and the like), as long as no line
nests deeper than 64 levels. Blank lines are skipped. Everything else that is off is an error
naming the file and line, found before any token is generated: a length that does not fit
``max_model_len`` fails at once whatever its size.
"""

from __future__ import annotations

import json
import random
from itertools import chain
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        lines = read_mooncake_trace(path, display=str(path), limit=self.max_requests)
        line = max(lines, key=lambda line: line.input_length + line.output_length)
        return f"line {line.line}", line.input_length, line.output_length

    def generate(self, ctx: GenerateContext) -> list[RequestSpec]:
        path = ctx.base_dir / self.path
        lines = read_mooncake_trace(path, display=str(path), limit=self.max_requests)
        first_ms = min(line.timestamp_ms for line in lines)
        arrivals = []
        for line in lines:  # every line is checked before any token is generated
            arrival = (line.timestamp_ms - first_ms) / self.ms_per_step
            if not arrival <= MAX_STEP:  # also inf, from a tiny ms_per_step
                raise WorkloadError(f"{path}: line {line.line}: key timestamp: expected an arrival step "
                                    f"(timestamp - first) / ms_per_step of at most 2**53, got {arrival:.3g} "
                                    f"(ms_per_step {self.ms_per_step:g})")
            arrivals.append(round(arrival))
            ctx.budget.add(f"line {line.line}", line.input_length, line.output_length)
        width = len(str(lines[-1].line))
        block_cache: dict[int, tuple[int, ...]] = {}
        output_rng = random.Random(f"mooncake-outputs/{ctx.seed}")
        requests = []
        for line, arrival_step in zip(lines, arrivals):
            blocks = [_block_tokens(block_cache, ctx.seed, hash_id) for hash_id in line.hash_ids]
            prompt = tuple(chain.from_iterable(blocks))
            requests.append(RequestSpec(
                req_id=f"mc-{line.line:0{width}d}",
                prompt_token_ids=prompt[: line.input_length],
                output_token_ids=random_tokens(output_rng, line.output_length),
                stop="length",
                arrival_step=arrival_step,
            ))
        requests.sort(key=lambda spec: spec.arrival_step)
        return requests


def _block_tokens(cache: dict[int, tuple[int, ...]], seed: int, hash_id: int) -> tuple[int, ...]:
    tokens = cache.get(hash_id)
    if tokens is None:
        tokens = random_tokens(random.Random(f"mooncake-block/{seed}/{hash_id}"), MOONCAKE_BLOCK_TOKENS)
        cache[hash_id] = tokens
    return tokens


def read_mooncake_trace(path: Path, *, display: str, limit: int | None = None) -> list[TraceLine]:
    """Parse and validate a Mooncake JSONL trace; ``display`` names the file in messages."""
    require_regular_file(path, display, "a Mooncake JSONL trace")
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise WorkloadError(f"{display}: cannot read the file ({exc.strerror})") from None
    lines: list[TraceLine] = []
    with handle:
        for number, raw in enumerate(handle, start=1):
            if limit is not None and len(lines) >= limit:
                break
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise WorkloadError(f"{display}: line {number}: expected UTF-8 text, got undecodable bytes") from None
            if text.strip():
                lines.append(_parse_line(text, display=display, number=number))
                if len(lines) > MAX_REQUESTS:
                    raise WorkloadError(f"{display}: line {number}: expected at most {MAX_REQUESTS:,} requests "
                                        f"(10**7; the workload must fit memory; max_requests reads fewer)")
    if not lines:
        raise WorkloadError(f"{display}: expected at least one JSON line, got an empty trace")
    return lines


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
