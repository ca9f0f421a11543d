"""Integer-valued distributions for lengths, gaps and think times.

Written in a definition as a bare integer (a constant) or an inline table::

    answer_len  = 100                                                   # constant
    turns       = {dist = "uniform", min = 6, max = 10}                 # inclusive bounds
    prefix_len  = {dist = "lognormal", mean = 900, sigma = 0.6, max = 4000}
    think_steps = {dist = "poisson", mean = 150}
    doc_len     = {dist = "zipf", alpha = 1.5, max = 64}

| dist        | parameters                  | meaning                                             |
|-------------|-----------------------------|-----------------------------------------------------|
| `constant`  | `value`                     | always `value`                                      |
| `uniform`   | `min`, `max`                | every integer in [min, max] equally likely          |
| `lognormal` | `mean`, `sigma`             | exp(N(mu, sigma²)) with mu chosen so the mean is `mean`, rounded |
| `zipf`      | `alpha` (> 1)               | P(k) ∝ k^-alpha over k = 1, 2, ...                 |
| `poisson`   | `mean`                      | Poisson with rate `mean`                            |

``lognormal``, ``zipf`` and ``poisson`` also take optional ``min`` and ``max``: a sample outside
them is clamped to the bound (the same rule for every distribution, as vLLM's generator caps with
``max``). Every quantity also has a floor of its own (a length is at least 1 token, a think time at
least 0 steps); a bound below that floor is an error, and samples never fall below it.

Sampling uses only the ``random.Random`` handed in, so a seeded generator is repeatable.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from kvoffload.workloads.schema import TableReader, is_int

# Largest value a zipf draw is allowed to reach before clamping (keeps floats finite).
_ZIPF_CEILING = 10**15


def constant(value: int) -> "Distribution":
    return Distribution("constant", low=value, high=value, value=value)


def poisson(mean: float, floor: int = 0) -> "Distribution":
    return Distribution("poisson", low=floor, mean=mean)


@dataclass(frozen=True)
class Distribution:
    """One distribution with its clamp bounds; ``low`` is always at least the quantity's floor."""

    dist: str
    low: int
    high: int | None = None  # None: unbounded above
    value: int = 0  # constant
    mean: float = 0.0  # lognormal, poisson
    sigma: float = 0.0  # lognormal
    alpha: float = 0.0  # zipf

    def sample(self, rng: random.Random) -> int:
        if self.dist == "constant":
            return self.value
        if self.dist == "uniform":
            return rng.randint(self.low, self.high if self.high is not None else self.low)
        if self.dist == "lognormal":
            mu = math.log(self.mean) - self.sigma * self.sigma / 2.0
            drawn = round(rng.lognormvariate(mu, self.sigma))
        elif self.dist == "zipf":
            drawn = zipf_variate(rng, self.alpha)
        else:
            drawn = poisson_variate(rng, self.mean)
        return self._clamp(drawn)

    def _clamp(self, value: int) -> int:
        if self.high is not None and value > self.high:
            return self.high
        return max(value, self.low)


def parse_distribution(reader: TableReader, key: str, *, floor: int,
                       default: Distribution | None = None) -> Distribution:
    """Read ``key`` of ``reader`` as a distribution whose samples are never below ``floor``;
    ``default`` (when given) stands in for a missing key."""
    if default is not None and not reader.has(key):
        reader.raw(key, None)
        return default
    value = reader.raw(key)
    if is_int(value):
        if value < floor:
            reader.fail(key, f"an integer >= {floor} or a distribution table", value)
        return Distribution("constant", low=value, high=value, value=value)
    if not isinstance(value, dict):
        reader.fail(key, f"an integer >= {floor} or a distribution table {{dist = ...}}", value)
    table = reader.table(key)
    kind = table.string("dist", choices=("constant", "uniform", "lognormal", "zipf", "poisson"))
    parsed = _PARSERS[kind](table, floor)
    table.finish()
    return parsed


def _parse_constant(table: TableReader, floor: int) -> Distribution:
    value = table.integer("value", minimum=floor)
    return Distribution("constant", low=value, high=value, value=value)


def _parse_uniform(table: TableReader, floor: int) -> Distribution:
    low = table.integer("min", minimum=floor)
    high = table.integer("max", minimum=floor)
    if high < low:
        table.fail("max", f"an integer >= min ({low})", high)
    return Distribution("uniform", low=low, high=high)


def _bounds(table: TableReader, floor: int) -> tuple[int, int | None]:
    low = table.integer("min", minimum=floor, default=floor)
    high = table.optional_integer("max", minimum=floor)
    if high is not None and high < low:
        table.fail("max", f"an integer >= min ({low})", high)
    return low, high


def _parse_lognormal(table: TableReader, floor: int) -> Distribution:
    mean = table.number("mean", above=0.0)
    sigma = table.number("sigma", minimum=0.0)
    low, high = _bounds(table, floor)
    return Distribution("lognormal", low=low, high=high, mean=mean, sigma=sigma)


def _parse_zipf(table: TableReader, floor: int) -> Distribution:
    alpha = table.number("alpha", above=1.0)
    low, high = _bounds(table, floor)
    return Distribution("zipf", low=low, high=high, alpha=alpha)


def _parse_poisson(table: TableReader, floor: int) -> Distribution:
    mean = table.number("mean", minimum=0.0)
    low, high = _bounds(table, floor)
    return Distribution("poisson", low=low, high=high, mean=mean)


_PARSERS: dict[str, Any] = {
    "constant": _parse_constant,
    "uniform": _parse_uniform,
    "lognormal": _parse_lognormal,
    "zipf": _parse_zipf,
    "poisson": _parse_poisson,
}


def zipf_variate(rng: random.Random, alpha: float) -> int:
    """Zipf(alpha) over {1, 2, ...} by Devroye's rejection method (Non-Uniform Random Variate
    Generation, 1986, X.6.1); expected fewer than two rounds for every alpha > 1."""
    b = 2.0 ** (alpha - 1.0)
    while True:
        u = 1.0 - rng.random()  # (0, 1]
        v = rng.random()
        log_x = -math.log(u) / (alpha - 1.0)
        x = float(_ZIPF_CEILING) if log_x > math.log(_ZIPF_CEILING) else math.floor(math.exp(log_x))
        t = (1.0 + 1.0 / x) ** (alpha - 1.0)
        if v * x * (t - 1.0) / (b - 1.0) <= t / b:
            return int(x)


def poisson_variate(rng: random.Random, mean: float) -> int:
    """Poisson(mean): multiplication method below 10, else Hörmann's transformed rejection with
    squeeze (PTRS, "The transformed rejection method for generating Poisson random variables",
    1993), which costs O(1) draws for any mean."""
    if mean <= 0.0:
        return 0
    if mean < 10.0:
        limit = math.exp(-mean)
        count, product = 0, rng.random()
        while product > limit:
            count += 1
            product *= rng.random()
        return count
    root = math.sqrt(mean)
    log_mean = math.log(mean)
    b = 0.931 + 2.53 * root
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    v_r = 0.9277 - 3.6224 / (b - 2.0)
    while True:
        u = rng.random() - 0.5
        v = rng.random()
        us = 0.5 - abs(u)
        k = math.floor((2.0 * a / us + b) * u + mean + 0.43)
        if us >= 0.07 and v <= v_r:
            return k
        if k < 0 or (us < 0.013 and v > us):
            continue
        lhs = math.log(v) + math.log(inv_alpha) - math.log(a / (us * us) + b)
        if lhs <= -mean + k * log_mean - math.lgamma(k + 1):
            return k

