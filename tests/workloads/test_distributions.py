"""Distributions: each samples what its table says, clamps where asked, rejects bad tables."""

from __future__ import annotations

import random
import statistics

import pytest

from kvoffload.workloads.distributions import Distribution, parse_distribution, poisson_variate, zipf_variate
from kvoffload.workloads.limits import MAX_TOKENS
from kvoffload.workloads.schema import TableReader, WorkloadError


def parse(value, *, floor=1, ceiling=MAX_TOKENS) -> Distribution:
    reader = TableReader({"x": value}, source="w.toml", prefix="generator.")
    dist = parse_distribution(reader, "x", floor=floor, ceiling=ceiling)
    reader.finish()
    return dist


def draws(dist: Distribution, n=20_000, seed=1):
    rng = random.Random(seed)
    return [dist.sample(rng) for _ in range(n)]


class TestSampling:
    def test_a_bare_integer_is_a_constant(self):
        assert set(draws(parse(100), n=10)) == {100}
        assert set(draws(parse({"dist": "constant", "value": 7}), n=10)) == {7}

    def test_uniform_covers_its_inclusive_range_evenly(self):
        values = draws(parse({"dist": "uniform", "min": 6, "max": 10}))
        assert set(values) == {6, 7, 8, 9, 10}
        assert statistics.fmean(values) == pytest.approx(8.0, abs=0.05)

    def test_lognormal_mean_is_the_mean_not_the_median(self):
        values = draws(parse({"dist": "lognormal", "mean": 1000, "sigma": 0.5}))
        assert statistics.fmean(values) == pytest.approx(1000, rel=0.02)
        assert statistics.median(values) < 950  # median = mean * exp(-sigma^2 / 2) ~ 882

    def test_lognormal_is_clamped_to_min_and_max(self):
        values = draws(parse({"dist": "lognormal", "mean": 1000, "sigma": 1.0, "min": 300, "max": 2000}))
        assert min(values) == 300 and max(values) == 2000

    @pytest.mark.parametrize("mean", [0.5, 4.0, 25.0, 150.0, 5000.0])
    def test_poisson_has_equal_mean_and_variance(self, mean):
        rng = random.Random(3)
        values = [poisson_variate(rng, mean) for _ in range(20_000)]
        assert statistics.fmean(values) == pytest.approx(mean, rel=0.03, abs=0.02)
        assert statistics.pvariance(values) == pytest.approx(mean, rel=0.06, abs=0.03)

    def test_zipf_follows_its_power_law(self):
        rng = random.Random(5)
        values = [zipf_variate(rng, 2.0) for _ in range(50_000)]
        # P(1) = 1 / zeta(2) = 6 / pi^2 ~ 0.608; P(2) / P(1) = 2^-2.
        ones, twos = values.count(1), values.count(2)
        assert ones / len(values) == pytest.approx(0.608, abs=0.01)
        assert twos / ones == pytest.approx(0.25, abs=0.02)

    def test_zipf_close_to_one_stays_finite_and_clamps(self):
        values = draws(parse({"dist": "zipf", "alpha": 1.01, "max": 64}), n=5_000)
        assert min(values) >= 1 and max(values) == 64

    def test_samples_never_fall_below_the_quantitys_floor(self):
        values = draws(parse({"dist": "poisson", "mean": 0.5}, floor=1), n=1_000)
        assert min(values) == 1

    def test_the_same_seed_gives_the_same_draws(self):
        dist = parse({"dist": "lognormal", "mean": 50, "sigma": 0.8})
        assert draws(dist, n=100, seed=9) == draws(dist, n=100, seed=9)
        assert draws(dist, n=100, seed=9) != draws(dist, n=100, seed=10)


class TestValidation:
    @pytest.mark.parametrize("value, message", [
        (-3, "w.toml: key generator.x: expected an integer >= 1 or a distribution table, got -3"),
        (2.5, "w.toml: key generator.x: expected an integer >= 1 or a distribution table {dist = ...}, got 2.5"),
        ({"dist": "normal"}, "w.toml: key generator.x.dist: expected one of 'constant', 'uniform', 'lognormal', "
                             "'zipf', 'poisson', got 'normal'"),
        ({"dist": "uniform", "min": 10, "max": 6},
         "w.toml: key generator.x.max: expected an integer >= min (10), got 6"),
        ({"dist": "uniform", "min": 0, "max": 6}, "w.toml: key generator.x.min: expected an integer >= 1, at most 67,108,864, got 0"),
        ({"dist": "uniform", "min": 1}, "w.toml: key generator.x.max: required key is missing"),
        ({"dist": "lognormal", "mean": 0, "sigma": 1}, "w.toml: key generator.x.mean: expected a finite number > 0 and <= 67,108,864, got 0"),
        ({"dist": "lognormal", "mean": 5, "sigma": -1},
         "w.toml: key generator.x.sigma: expected a finite number within [0, 1e+150], got -1"),
        ({"dist": "zipf", "alpha": 1}, "w.toml: key generator.x.alpha: expected a finite number > 1 and <= 1,000, got 1"),
        ({"dist": "poisson", "mean": 5, "lambda": 3}, "w.toml: key generator.x.lambda: unknown key"),
        ({"dist": "poisson", "mean": True}, "w.toml: key generator.x.mean: expected a finite number within [0, 67,108,864], got True"),
    ])
    def test_a_bad_table_is_a_one_line_error_naming_the_key(self, value, message):
        with pytest.raises(WorkloadError) as caught:
            parse(value)
        assert str(caught.value).startswith(message)
        assert "\n" not in str(caught.value)


class Uniforms:
    """An rng that hands out the given uniforms in order, counting them."""

    def __init__(self, *values: float) -> None:
        self.values, self.used = list(values), 0

    def random(self) -> float:
        self.used += 1
        return self.values.pop(0)


@pytest.mark.parametrize("mean", [30.0, 100.0, 1000.0])
def test_a_poisson_tail_point_under_the_pmf_in_the_narrow_strip_is_accepted(mean):
    """PTRS's quick rejection in the strip next to the hat's edges (us < 0.013, Hörmann 1993 step
    3a) turns away only points above the line v = us; one below it goes to the exact test, which
    takes a point far enough under the pmf (v = 1e-7 here: a draw well out in the right tail, on
    the first pair of uniforms) and refuses one above it (v = 1e-3: the next pair, at the mode)."""
    tail = Uniforms(0.988, 1e-7, 0.5, 0.5)  # u = 0.488: us = 0.012
    drawn = poisson_variate(tail, mean)
    assert tail.used == 2 and drawn > mean + 5 * mean ** 0.5
    above = Uniforms(0.988, 1e-3, 0.5, 0.5)
    assert poisson_variate(above, mean) == int(mean) and above.used == 4
