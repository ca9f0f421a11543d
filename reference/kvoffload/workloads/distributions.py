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

Every quantity has a ceiling too (``workloads/limits.py``: the most a length, a step count or a
turn count can be). Parameters are finite numbers; a mean, ``value``, ``min`` or ``max`` above the
ceiling is an error when the definition is read; a draw above it from a distribution without
``max`` (a heavy zipf tail, a wide lognormal) is an error naming the key, never an overflow.

Sampling uses only the ``random.Random`` handed in, so a seeded generator is repeatable.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import Any

from kvoffload.workloads.limits import MAX_STEP
from kvoffload.workloads.schema import TableReader, WorkloadError, is_int

# Largest value a zipf draw is allowed to reach before clamping (keeps floats finite).
_ZIPF_CEILING = 10**15
# A lognormal draw is made in log space; above this it stands for "more than any ceiling".
_DRAW_CAP = 2**63
_LOG_DRAW_CAP = math.log(_DRAW_CAP)
# sigma**2 / 2 must stay a finite float for the location parameter mu.
_MAX_SIGMA = 1e150


def constant(value: int) -> "Distribution":
    return Distribution("constant", low=value, high=value, value=value, ceiling=max(value, MAX_STEP))


def poisson(mean: float, floor: int = 0) -> "Distribution":
    """A default gap or think time (steps)."""
    return Distribution("poisson", low=floor, mean=mean, ceiling=MAX_STEP)


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
    ceiling: int = MAX_STEP  # the most the quantity can be (workloads/limits.py)
    where: str = "distribution"  # "file: key generator.x", for messages

    def sample(self, rng: random.Random) -> int:
        if self.dist == "constant":
            return self.value
        if self.dist == "uniform":
            return rng.randint(self.low, self.high if self.high is not None else self.low)
        if self.dist == "lognormal":
            mu = math.log(self.mean) - self.sigma * self.sigma / 2.0
            # random.lognormvariate is exp(normalvariate(mu, sigma)): the same draw, kept in log
            # space until it is known to fit.
            log_drawn = rng.normalvariate(mu, self.sigma)
            drawn = round(math.exp(log_drawn)) if log_drawn < _LOG_DRAW_CAP else _DRAW_CAP
        elif self.dist == "zipf":
            drawn = zipf_variate(rng, self.alpha)
        else:
            drawn = poisson_variate(rng, self.mean)
        return self._clamp(drawn)

    def _clamp(self, value: int) -> int:
        if self.high is not None:
            if value > self.high:
                return self.high
        elif value > self.ceiling:
            raise WorkloadError(f"{self.where}: expected draws of at most {self.ceiling:,}, got a {self.dist} "
                                f"draw of {value:,} (give the distribution a max)")
        return max(value, self.low)


def parse_distribution(reader: TableReader, key: str, *, floor: int, ceiling: int,
                       default: Distribution | None = None) -> Distribution:
    """Read ``key`` of ``reader`` as a distribution whose samples lie in [``floor``, ``ceiling``];
    ``default`` (when given) stands in for a missing key."""
    if default is not None and not reader.has(key):
        reader.raw(key, None)
        return default
    value = reader.raw(key)
    where = f"{reader.source}: {reader.where(key)}"
    if is_int(value):
        if value < floor:
            reader.fail(key, f"an integer >= {floor} or a distribution table", value)
        if value > ceiling:
            reader.fail(key, f"an integer at most {ceiling:,} or a distribution table", value)
        return Distribution("constant", low=value, high=value, value=value, ceiling=ceiling, where=where)
    if not isinstance(value, dict):
        reader.fail(key, f"an integer >= {floor} or a distribution table {{dist = ...}}", value)
    table = reader.table(key)
    kind = table.string("dist", choices=("constant", "uniform", "lognormal", "zipf", "poisson"))
    parsed = _PARSERS[kind](table, floor, ceiling)
    table.finish()
    return dataclasses.replace(parsed, ceiling=ceiling, where=where)


def _parse_constant(table: TableReader, floor: int, ceiling: int) -> Distribution:
    value = table.integer("value", minimum=floor, maximum=ceiling)
    return Distribution("constant", low=value, high=value, value=value)


def _parse_uniform(table: TableReader, floor: int, ceiling: int) -> Distribution:
    low = table.integer("min", minimum=floor, maximum=ceiling)
    high = table.integer("max", minimum=floor, maximum=ceiling)
    if high < low:
        table.fail("max", f"an integer >= min ({low})", high)
    return Distribution("uniform", low=low, high=high)


def _bounds(table: TableReader, floor: int, ceiling: int) -> tuple[int, int | None]:
    low = table.integer("min", minimum=floor, maximum=ceiling, default=floor)
    high = table.optional_integer("max", minimum=floor, maximum=ceiling)
    if high is not None and high < low:
        table.fail("max", f"an integer >= min ({low})", high)
    return low, high


def _parse_lognormal(table: TableReader, floor: int, ceiling: int) -> Distribution:
    mean = table.number("mean", above=0.0, maximum=ceiling)
    sigma = table.number("sigma", minimum=0.0, maximum=_MAX_SIGMA)
    low, high = _bounds(table, floor, ceiling)
    return Distribution("lognormal", low=low, high=high, mean=mean, sigma=sigma)


def _parse_zipf(table: TableReader, floor: int, ceiling: int) -> Distribution:
    # Devroye's method computes 2**(alpha - 1) (finite up to alpha 1024; beyond ~64 every draw
    # is 1 anyway) and divides by 2**(alpha - 1) - 1 (zero in floating point just above 1).
    alpha = table.number("alpha", above=1.0, maximum=1000.0)
    if not 2.0 ** (alpha - 1.0) > 1.0:
        table.fail("alpha", "a number far enough above 1 that 2**(alpha - 1) > 1 in floating point", alpha)
    low, high = _bounds(table, floor, ceiling)
    return Distribution("zipf", low=low, high=high, alpha=alpha)


def _parse_poisson(table: TableReader, floor: int, ceiling: int) -> Distribution:
    mean = table.number("mean", minimum=0.0, maximum=ceiling)
    low, high = _bounds(table, floor, ceiling)
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

