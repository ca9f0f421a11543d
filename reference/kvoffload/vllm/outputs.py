"""The output oracle: what a real model said with offloading, against what it says without.

A run of the ``vllm`` engine keeps, per request, the prompt it actually sent (a follow-up's
prompt holds its parent's actual output), the greedy tokens and their log-probabilities, and
the token ranges the connector loaded for it. :func:`compare_outputs` holds that run against a
second run of the same workload on the same engine settings with prefix caching and offloading
off: every request's greedy tokens must be equal, and the log-probabilities of its first
``first_n`` tokens within ``tolerance``.

Only the same request can be compared: one whose prompt differs between the runs (its parent's
output already differed, or an abort cut the parent at another length) is listed as not
compared, with the reason. An aborted request is compared over the tokens both runs produced.

This module imports no vLLM: the comparison is tested on hand-made outcomes in the main suite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Log-probability tolerance per model dtype. Both runs compute the same function; they differ in
# which forward computed a position's KV (a parent's batch and chunking, or the request's own
# prefill) and so in the order of floating-point reductions. The KV cache and the activations
# round to the dtype's mantissa (float32: 2^-24, bfloat16 and float16: 2^-8 / 2^-11 relative);
# a log-probability near -log(vocab) ~ -10 inherits that relative error a few times over across
# the layers. The margins sit well above that and well below what one wrong KV position moves
# (docs/engine.md, "The output oracle", has the measured spread).
LOGPROB_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.15, "float16": 0.05}
FIRST_N_LOGPROBS = 8


@dataclass
class RequestOutcome:
    """One request of a real-model run, as the driver saw it."""

    req_id: str
    prompt: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # of each sampled token
    aborted: bool = False
    loaded: list[tuple[int, int]] = field(default_factory=list)  # token ranges the connector loaded
    added_at: float = 0.0  # perf_counter when the request was handed to the engine
    first_token_at: float | None = None
    last_token_at: float | None = None

    def loaded_chunks(self, tokens_per_chunk: int) -> list[int]:
        chunks: set[int] = set()
        for start, end in self.loaded:
            chunks.update(range(start // tokens_per_chunk, -(-end // tokens_per_chunk)))
        return sorted(chunks)


@dataclass(frozen=True)
class Mismatch:
    req_id: str
    position: int  # index into the output
    kind: str  # "token", "logprob" or "length"
    ours: float
    theirs: float
    prompt_tokens: int
    loaded_chunks: tuple[int, ...]

    def describe(self) -> str:
        chunks = (f"chunks {', '.join(map(str, self.loaded_chunks))} loaded for it" if self.loaded_chunks
                  else "no chunk loaded for it")
        what = {"token": f"token {int(self.ours)} instead of {int(self.theirs)}",
                "length": f"the end of {int(self.ours)} tokens instead of {int(self.theirs)}",
                "logprob": f"logprob {self.ours:.5f} instead of {self.theirs:.5f}"}[self.kind]
        return (f"request {self.req_id}: output position {self.position} (sequence position "
                f"{self.prompt_tokens + self.position}) has {what}; {chunks}")


@dataclass
class OracleReport:
    first_n: int
    tolerance: float
    identical: list[str] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)  # the first per request, in run order
    not_compared: dict[str, str] = field(default_factory=dict)
    max_logprob_delta: float = 0.0  # largest delta seen among the compared log-probabilities

    @property
    def compared(self) -> int:
        return len(self.identical) + len(self.mismatches)

    def as_dict(self) -> dict:
        return {"first_n_logprobs": self.first_n, "logprob_tolerance": self.tolerance,
                "compared": self.compared, "identical": len(self.identical),
                "mismatches": [m.describe() for m in self.mismatches],
                "first_mismatch": None if not self.mismatches else {
                    "request": self.mismatches[0].req_id, "position": self.mismatches[0].position,
                    "kind": self.mismatches[0].kind, "loaded_chunks": list(self.mismatches[0].loaded_chunks)},
                "not_compared": dict(self.not_compared), "max_logprob_delta": self.max_logprob_delta}


def compare_outputs(run: dict[str, RequestOutcome], baseline: dict[str, RequestOutcome], *,
                    tokens_per_chunk: int, first_n: int = FIRST_N_LOGPROBS, tolerance: float) -> OracleReport:
    """``run`` against ``baseline``, request by request in ``run``'s order."""
    report = OracleReport(first_n, tolerance)
    for req_id, ours in run.items():
        theirs = baseline.get(req_id)
        if theirs is None:
            report.not_compared[req_id] = "absent from the offload-off run"
            continue
        if tuple(ours.prompt) != tuple(theirs.prompt):
            report.not_compared[req_id] = "its prompt differs (an earlier output differed or was cut elsewhere)"
            continue
        cut = ours.aborted or theirs.aborted  # compared over the tokens both runs produced
        length = min(len(ours.tokens), len(theirs.tokens))
        mismatch = _first_difference(ours, theirs, length, first_n, tolerance, tokens_per_chunk, report)
        if mismatch is None and not cut and len(ours.tokens) != len(theirs.tokens):
            mismatch = Mismatch(req_id, length, "length", len(ours.tokens), len(theirs.tokens), len(ours.prompt),
                                tuple(ours.loaded_chunks(tokens_per_chunk)))
        if mismatch is None:
            report.identical.append(req_id)
        else:
            report.mismatches.append(mismatch)
    return report


def _first_difference(ours: RequestOutcome, theirs: RequestOutcome, length: int, first_n: int, tolerance: float,
                      tokens_per_chunk: int, report: OracleReport) -> Mismatch | None:
    chunks = tuple(ours.loaded_chunks(tokens_per_chunk))
    for position in range(length):
        if ours.tokens[position] != theirs.tokens[position]:
            return Mismatch(ours.req_id, position, "token", ours.tokens[position], theirs.tokens[position],
                            len(ours.prompt), chunks)
        if position < first_n and position < len(ours.logprobs) and position < len(theirs.logprobs):
            a, b = ours.logprobs[position], theirs.logprobs[position]
            delta = abs(a - b) if math.isfinite(a) and math.isfinite(b) else (0.0 if a == b else math.inf)
            report.max_logprob_delta = max(report.max_logprob_delta, delta)
            if delta > tolerance:
                return Mismatch(ours.req_id, position, "logprob", a, b, len(ours.prompt), chunks)
    return None
