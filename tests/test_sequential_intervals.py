"""Confidence sequences of the sequential audit (acrb.analysis.estimation.sequential): known
answers, a loop written straight from Waudby-Smith & Ramdas (2024), the asymptotic CS against a
loop written from Waudby-Smith, Arbour, Sinha, Kennedy & Ramdas (2024) and a boundary computed
by hand, time-uniform coverage by simulation, the Δ of several groups, decisions, the stopping
rule and the resumable state."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss
from scipy.special import expit

from acrb.analysis.estimation.sequential import (
    DeclaredDelta,
    SequentialState,
    budget_rounds,
    confidence_sequence,
    decide,
    delta_bounds,
    difference_confidence_sequence,
    evaluate,
    first_decided_round,
    mixture_boundary,
    pair_level,
    stop_rounds,
    upper_level,
)
from acrb.errors import InputDataError

# ---------------------------------------------------------------------------------------------
# Reference implementations: one round and one candidate mean at a time, products rather than
# log sums, the CS as a set, written from the paper's definitions (Waudby-Smith & Ramdas 2024,
# JRSS-B 86:1-27: μ̂_t = (1/2 + Σx)/(t + 1), σ̂²_t = (1/4 + Σ(x_i − μ̂_i)²)/(t + 1),
# λ̇_t = √(2 log(2/α) / (σ̂²_{t−1} t log(1 + t)))).


def _plug_in(x: list[float], alpha: float) -> list[float]:
    bets, total, squares, variance = [], 0.0, 0.0, 0.25
    for t, value in enumerate(x, start=1):
        bets.append(math.sqrt(2 * math.log(2 / alpha) / (variance * t * math.log(1 + t))))
        total += value
        mean = (0.5 + total) / (t + 1)
        squares += (value - mean) ** 2
        variance = (0.25 + squares) / (t + 1)
    return bets


def hedged_reference(x: list[float], alpha: float, c: float, grid: int
                     ) -> tuple[list[float], list[float]]:
    """The hedged capital CS {m : max(K⁺/2, K⁻/2) < 1/α at every round so far} on the grid
    i/grid, and its bounds: the grid points next to the smallest and largest members."""
    bets = _plug_in(x, alpha)
    points = [i / grid for i in range(grid + 1)]
    alive = [True] * len(points)
    up = [1.0] * len(points)
    down = [1.0] * len(points)
    lower, upper = [], []
    for value, bet in zip(x, bets, strict=True):
        for i, m in enumerate(points):
            plus = min(bet, c / m) if m > 0 else bet
            minus = min(bet, c / (1 - m)) if m < 1 else bet
            up[i] *= 1 + plus * (value - m)
            down[i] *= 1 - minus * (value - m)
            if max(0.5 * up[i], 0.5 * down[i]) >= 1 / alpha:
                alive[i] = False
        members = [i for i, keep in enumerate(alive) if keep]
        assert members == list(range(members[0], members[-1] + 1))  # an interval
        lower.append(points[max(members[0] - 1, 0)])
        upper.append(points[min(members[-1] + 1, grid)])
    return lower, upper


def bernstein_reference(x: list[float], alpha: float, c: float
                        ) -> tuple[list[float], list[float]]:
    """Predictable plug-in empirical-Bernstein CS with its running intersection."""
    bets = [min(b, c) for b in _plug_in(x, alpha)]
    lower, upper = [], []
    weighted = total_bets = penalty = total = 0.0
    low, high = 0.0, 1.0
    for t, (value, bet) in enumerate(zip(x, bets, strict=True), start=1):
        previous_mean = (0.5 + total) / t
        weighted += bet * value
        total_bets += bet
        penalty += 4 * (value - previous_mean) ** 2 * (-math.log(1 - bet) - bet) / 4
        total += value
        centre = weighted / total_bets
        half = (math.log(2 / alpha) + penalty) / total_bets
        low, high = max(low, centre - half, 0.0), min(high, centre + half, 1.0)
        lower.append(low)
        upper.append(high)
    return lower, upper


@pytest.mark.parametrize("c", [0.5, 0.75])
def test_hedged_cs_is_the_papers_definition(c: float) -> None:
    rng = np.random.default_rng(11)
    for x in (rng.beta(2, 5, 60), (rng.random(60) < 0.3).astype(float)):
        lower, upper = confidence_sequence(x, 0.1, truncation=c, grid=80)
        ref_lower, ref_upper = hedged_reference(list(x), 0.1, c, 80)
        np.testing.assert_allclose(lower, ref_lower, atol=1e-12)
        np.testing.assert_allclose(upper, ref_upper, atol=1e-12)


def test_empirical_bernstein_cs_is_the_papers_definition() -> None:
    rng = np.random.default_rng(12)
    x = rng.beta(2, 3, 300)
    lower, upper = confidence_sequence(x, 0.05, method="empirical-bernstein", truncation=0.5)
    ref_lower, ref_upper = bernstein_reference(list(x), 0.05, 0.5)
    np.testing.assert_allclose(lower, ref_lower, atol=1e-12)
    np.testing.assert_allclose(upper, ref_upper, atol=1e-12)


def test_sequences_on_leading_axes_are_computed_independently() -> None:
    rng = np.random.default_rng(13)
    x = rng.random((2, 3, 40))
    lower, upper = confidence_sequence(x, 0.05, grid=100)
    assert lower.shape == upper.shape == (2, 3, 40)
    one_lower, one_upper = confidence_sequence(x[1, 2], 0.05, grid=100)
    np.testing.assert_array_equal(lower[1, 2], one_lower)
    np.testing.assert_array_equal(upper[1, 2], one_upper)


# ---------------------------------------------------------------------------------------------
# Known answers


def test_empirical_bernstein_cs_of_a_constant_sequence() -> None:
    """x_t = 1/2: every v_i is 0, every bet is the cap c, so the half-width is exactly
    log(2/α)/(c t) (once below 1/2; the CS is clipped to [0, 1] before)."""
    alpha, c = 0.05, 0.5
    lower, upper = confidence_sequence(np.full(400, 0.5), alpha, method="empirical-bernstein",
                                       truncation=c)
    t = np.arange(1, 401)
    half = math.log(2 / alpha) / (c * t)
    narrow = half < 0.5
    np.testing.assert_allclose(upper[narrow] - 0.5, half[narrow], rtol=1e-12)
    np.testing.assert_allclose(0.5 - lower[narrow], half[narrow], rtol=1e-12)


def test_hedged_cs_of_a_constant_sequence_closes_in_like_one_over_t() -> None:
    lower, upper = confidence_sequence(np.full(400, 0.3), 0.05, grid=1000)
    assert (lower <= 0.3).all() and (upper >= 0.3).all()
    width = upper - lower
    # No variance: the width falls like 1/t (a quarter from t = 100 to 400, up to the grid),
    # much faster than the sqrt(log t / t) of a noisy sequence (0.56).
    assert width[399] < 0.35 * width[99]
    assert width[99] < 0.08


def test_width_shrinks_like_sqrt_log_t_over_t() -> None:
    """Alternating 0, 1 (variance 1/4): the empirical-Bernstein width over sqrt(log t / t)
    stays near 2 from t = 10³ to 10⁵, while width x sqrt(t) keeps growing."""
    x = np.tile([0.0, 1.0], 50_000)
    lower, upper = confidence_sequence(x, 0.05, method="empirical-bernstein")
    times = np.array([1_000, 10_000, 100_000])
    width = (upper - lower)[times - 1]
    ratio = width / np.sqrt(np.log(times) / times)
    assert ratio.max() / ratio.min() < 1.2
    assert ratio.min() > 1.8 and ratio.max() < 2.4
    assert width[-1] * math.sqrt(times[-1]) > 1.3 * width[0] * math.sqrt(times[0])


def test_hedged_cs_is_narrower_than_empirical_bernstein_on_small_variance() -> None:
    """Audit-like data: differences of cluster means, small spread against the range."""
    rng = np.random.default_rng(14)
    d = np.clip(rng.normal(0.1, 0.15, 200), -1, 1)
    hedged = difference_confidence_sequence(d, 0.01, grid=1000)
    bernstein = difference_confidence_sequence(d, 0.01, method="empirical-bernstein")
    assert (hedged[1] - hedged[0])[-1] < 0.75 * (bernstein[1] - bernstein[0])[-1]


def test_bounds_are_monotone_and_nested() -> None:
    rng = np.random.default_rng(15)
    x = rng.random((5, 120))
    for method in ("hedged", "empirical-bernstein"):
        lower, upper = confidence_sequence(x, 0.05, method=method, grid=200)
        assert (np.diff(lower, axis=-1) >= 0).all() and (np.diff(upper, axis=-1) <= 0).all()
        assert (lower <= upper).all() and (lower >= 0).all() and (upper <= 1).all()
        # A smaller α gives a wider CS.
        wide_lower, wide_upper = confidence_sequence(x, 0.005, method=method, grid=200)
        assert (wide_lower <= lower).all() and (wide_upper >= upper).all()


def test_difference_cs_is_the_mean_cs_rescaled() -> None:
    rng = np.random.default_rng(16)
    d = rng.uniform(-0.6, 0.8, 50)
    lower, upper = difference_confidence_sequence(d, 0.05, grid=100)
    x_lower, x_upper = confidence_sequence((d + 1) / 2, 0.05, grid=100)
    np.testing.assert_allclose(lower, 2 * x_lower - 1)
    np.testing.assert_allclose(upper, 2 * x_upper - 1)
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        difference_confidence_sequence([0.5, 1.5], 0.05)


def test_invalid_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="missing"):
        confidence_sequence([0.2, float("nan")], 0.05)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        confidence_sequence([0.2, 1.2], 0.05)
    with pytest.raises(ValueError, match="alpha"):
        confidence_sequence([0.2], 1.0)
    with pytest.raises(ValueError, match="truncation"):
        confidence_sequence([0.2], 0.05, truncation=1.0)
    with pytest.raises(ValueError, match="method"):
        confidence_sequence([0.2], 0.05, method="wald")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="t_opt"):
        difference_confidence_sequence([0.2], 0.05, method="asymptotic", t_opt=0)
    with pytest.raises(ValueError, match="prior_rounds"):
        difference_confidence_sequence([0.2], 0.05, method="asymptotic", prior_rounds=-1)
    with pytest.raises(ValueError, match="min_rounds"):
        confidence_sequence([0.2], 0.05, method="asymptotic", min_rounds=0)
    with pytest.raises(ValueError, match="missing"):
        difference_confidence_sequence([0.2, float("nan")], 0.05, method="asymptotic")
    with pytest.raises(ValueError, match="alpha"):
        difference_confidence_sequence([0.2], 0.0, method="asymptotic")


# ---------------------------------------------------------------------------------------------
# Time-uniform coverage by simulation


def _time_uniform_miss(lower: np.ndarray, upper: np.ndarray, mean: float) -> float:
    """Share of sequences whose CS misses ``mean`` at some round."""
    return float(np.mean(((lower > mean) | (upper < mean)).any(axis=-1)))


@pytest.mark.parametrize("method", ["hedged", "empirical-bernstein"])
def test_time_uniform_miscoverage_of_a_bernoulli_mean_is_at_most_alpha(method: str) -> None:
    """1,000 Bernoulli(0.3) sequences of 200 rounds, α = 0.1: the share that is ever missed
    stays below α (Monte Carlo SE 0.009 at α). The fixed-time interval at the same level
    misses at some round in far more than α of the same sequences, so the check can fail."""
    rng = np.random.default_rng(20261201)
    x = (rng.random((1_000, 200)) < 0.3).astype(float)
    lower, upper = confidence_sequence(x, 0.1, method=method, grid=200)  # type: ignore[arg-type]
    assert _time_uniform_miss(lower, upper, 0.3) <= 0.1
    t = np.arange(1, 201)
    mean = np.cumsum(x, axis=1) / t
    spread = 1.6449 * np.sqrt(np.maximum(mean * (1 - mean), 1e-12) / t)
    assert _time_uniform_miss(mean - spread, mean + spread, 0.3) > 0.3


# ---------------------------------------------------------------------------------------------
# The asymptotic CS (Waudby-Smith, Arbour, Sinha, Kennedy & Ramdas 2024, Annals of Statistics):
# d̄_t ± σ̂_t √(2(tρ² + 1)/(t²ρ²) · log(√(tρ² + 1)/α)), ρ² = (−2 log α + log(−2 log α + 1))/t_opt,
# σ̂²_t = (w + Σ_{i≤t} (d_i − d̄_t)²)/(t + w), running intersection.


def asymptotic_reference(d: list[float], alpha: float, t_opt: float = 30.0, w: float = 1.0,
                         min_rounds: int = 1, intersect: bool = True
                         ) -> tuple[list[float], list[float]]:
    """One round at a time, the variance by a second pass over the rounds so far."""
    rho2 = (-2 * math.log(alpha) + math.log(-2 * math.log(alpha) + 1)) / t_opt
    low, high = -1.0, 1.0
    lower, upper = [], []
    for t in range(1, len(d) + 1):
        seen = d[:t]
        mean = sum(seen) / t
        variance = (w * 1.0 + sum((v - mean) ** 2 for v in seen)) / (t + w)
        half = math.sqrt(variance) * math.sqrt(
            2 * (t * rho2 + 1) / (t ** 2 * rho2) * math.log(math.sqrt(t * rho2 + 1) / alpha))
        this_low, this_high = max(mean - half, -1.0), min(mean + half, 1.0)
        if t < min_rounds:
            this_low, this_high = -1.0, 1.0
        if intersect:
            low, high = max(low, this_low), min(high, this_high)
            assert low <= high  # the data below never empty the intersection
        else:
            low, high = this_low, this_high
        lower.append(low)
        upper.append(high)
    return lower, upper


@pytest.mark.parametrize(("t_opt", "w", "min_rounds"), [(30.0, 1.0, 1), (10.0, 2.5, 1),
                                                        (100.0, 1.0, 7)])
def test_asymptotic_cs_is_the_papers_formula(t_opt: float, w: float, min_rounds: int) -> None:
    rng = np.random.default_rng(31)
    for d in (np.clip(rng.normal(0.1, 0.2, 150), -1, 1),
              rng.binomial(10, 0.2, 150) / 10 - rng.binomial(10, 0.1, 150) / 10):
        lower, upper = difference_confidence_sequence(d, 0.01, method="asymptotic", t_opt=t_opt,
                                                      prior_rounds=w, min_rounds=min_rounds)
        ref_lower, ref_upper = asymptotic_reference(list(d), 0.01, t_opt, w, min_rounds)
        np.testing.assert_allclose(lower, ref_lower, rtol=0, atol=1e-12)
        np.testing.assert_allclose(upper, ref_upper, rtol=0, atol=1e-12)
        # On [0, 1] it is the same CS: it is affine-equivariant.
        x_lower, x_upper = confidence_sequence((d + 1) / 2, 0.01, method="asymptotic",
                                               t_opt=t_opt, prior_rounds=w,
                                               min_rounds=min_rounds)
        np.testing.assert_allclose(2 * x_lower - 1, lower, atol=1e-12)
        np.testing.assert_allclose(2 * x_upper - 1, upper, atol=1e-12)


def test_asymptotic_boundary_by_hand() -> None:
    """α = 0.05, t = t_opt = 30: −2 log α = 5.991465, log(−2 log α + 1) = log 6.991465 =
    1.944690, ρ² = 7.936155/30 = 0.264538; tρ² + 1 = 8.936155; 2(tρ² + 1)/(t²ρ²) =
    17.872309/238.084638 = 0.0750670; log(√8.936155/0.05) = log(2.989340/0.05) = log 59.78680
    = 4.090785; boundary √(0.0750670 x 4.090785) = √0.307083 = 0.554151. A constant
    d_t = 0.2 has no spread, so σ̂²_30 = 1/31 (the prior alone), σ̂ = 0.179605, and the CS is
    0.2 ± 0.179605 x 0.554151 = 0.2 ± 0.099528 (the boundary falls with t, so the running
    intersection is this round's interval)."""
    assert float(mixture_boundary(30, 0.05, 30.0)) == pytest.approx(0.554151, abs=2e-6)
    lower, upper = difference_confidence_sequence(np.full(40, 0.2), 0.05, method="asymptotic")
    assert upper[29] - 0.2 == pytest.approx(0.099528, abs=2e-6)
    assert 0.2 - lower[29] == pytest.approx(0.099528, abs=2e-6)
    # ρ² optimised for t_opt: at t = 30 the boundary tuned for 30 is narrower than one tuned
    # for 10 or 100 rounds.
    at_30 = float(mixture_boundary(30, 0.05, 30.0))
    assert at_30 < float(mixture_boundary(30, 0.05, 10.0))
    assert at_30 < float(mixture_boundary(30, 0.05, 100.0))


def test_asymptotic_width_shrinks_like_sqrt_log_t_over_t() -> None:
    """Alternating −0.2, 0.2 (variance 0.04): the width falls at every round up to the
    alternation, its ratio to √(log t / t) stays within 15% from t = 10³ to 10⁵, and at 30
    rounds it is narrower than the bounded CSs of the same data (the point of the method: it
    pays for the variance, not the range)."""
    d = np.tile([-0.2, 0.2], 50_000)
    lower, upper = difference_confidence_sequence(d, 0.05, method="asymptotic")
    width = upper - lower
    assert (np.diff(width) <= 1e-15).all()
    assert width[0] == 2.0  # round 1: the whole range (clipped)
    assert width[20] < width[10] and width[1_000] < 0.2 * width[10]
    times = np.array([1_000, 10_000, 100_000])
    ratio = width[times - 1] / np.sqrt(np.log(times) / times)
    assert ratio.max() / ratio.min() < 1.15
    # At an audit's size and pair level (30 rounds, α/21) it is the narrowest of the three.
    level = 0.05 / 21
    short = d[:30]
    asymptotic = difference_confidence_sequence(short, level, method="asymptotic")
    hedged = difference_confidence_sequence(short, level, grid=1000)
    bernstein = difference_confidence_sequence(short, level, method="empirical-bernstein")
    narrow = (asymptotic[1] - asymptotic[0])[-1]
    assert narrow < 0.8 * (hedged[1] - hedged[0])[-1]
    assert narrow < 0.5 * (bernstein[1] - bernstein[0])[-1]


def test_asymptotic_cs_takes_the_running_intersection() -> None:
    """Twenty rounds of 0, then three of 1: this round's interval widens and moves up, the
    CS keeps what it had excluded."""
    d = [0.0] * 20 + [1.0] * 3
    lower, upper = difference_confidence_sequence(d, 0.05, method="asymptotic")
    raw_lower, raw_upper = asymptotic_reference(d, 0.05, intersect=False)
    assert raw_upper[20] > raw_upper[19] and raw_lower[22] > raw_lower[19]
    np.testing.assert_allclose(lower, np.maximum.accumulate(raw_lower), atol=1e-12)
    np.testing.assert_allclose(upper, np.minimum.accumulate(raw_upper), atol=1e-12)
    assert (np.diff(lower) >= 0).all() and (np.diff(upper) <= 0).all()
    # Monotone and nested in α on audit-like data too.
    d = np.clip(np.random.default_rng(32).normal(0.05, 0.2, (5, 120)), -1, 1)
    lower, upper = difference_confidence_sequence(d, 0.05, method="asymptotic")
    assert (np.diff(lower, axis=-1) >= 0).all() and (np.diff(upper, axis=-1) <= 0).all()
    wide_lower, wide_upper = difference_confidence_sequence(d, 0.005, method="asymptotic")
    assert (wide_lower <= lower).all() and (wide_upper >= upper).all()
    assert ((wide_upper - wide_lower) > (upper - lower))[:, 5:].all()
    # min_rounds: the whole range before it, nothing decided.
    lower, upper = difference_confidence_sequence(np.full(30, 0.5), 0.05, method="asymptotic",
                                                  min_rounds=10)
    assert (lower[:9] == -1).all() and (upper[:9] == 1).all() and lower[9] > 0


def _audit_differences(rng: np.random.Generator, sequences: int, rounds: int,
                       etas: tuple[float, float]) -> tuple[np.ndarray, float]:
    """Per-round differences of two groups' cluster means as an audit sees them: each round
    one new source per group (logit random effect SD 0.8) with the same 10 prompts (fixed
    prompt effects, SD 0.8), one Bernoulli outcome per request. Returns the differences
    (sequences, rounds) and their mean, E over the source effect by Gauss-Hermite."""
    prompt = np.random.default_rng(7).normal(0.0, 0.8, 10)
    nodes, weights = hermegauss(40)
    weights = weights / weights.sum()
    means, truth = [], []
    for eta in etas:
        source = rng.normal(0.0, 0.8, (sequences, rounds, 1))
        means.append((rng.random((sequences, rounds, 10)) < expit(eta + source + prompt))
                     .mean(axis=-1))
        truth.append(float(np.mean([(weights * expit(eta + 0.8 * nodes + v)).sum()
                                    for v in prompt])))
    return means[0] - means[1], truth[0] - truth[1]


@pytest.mark.parametrize("etas", [(-2.6, -2.6), (-2.0, -2.6), (-1.0, -1.0)],
                         ids=["no gap, ~10%", "5 pp gap", "no gap, ~30%"])
def test_asymptotic_time_uniform_miscoverage_on_audit_like_data(etas: tuple[float, float]
                                                                ) -> None:
    """2,000 simulated pair differences of 200 rounds, α = 0.1: the share ever missed stays
    below α + 3 Monte Carlo SE (0.02); measured 0.55%, 1.45% and 2.85%. The same data without the
    variance guard (the plain variance, a point CS after round 1, often at 0) are missed in
    most sequences, and a fixed-time 90% interval read at every round in nearly all, so the
    check can fail."""
    alpha, sequences = 0.1, 2_000
    d, mean = _audit_differences(np.random.default_rng(20261202), sequences, 200, etas)
    slack = 3 * math.sqrt(alpha * (1 - alpha) / sequences)
    lower, upper = difference_confidence_sequence(d, alpha, method="asymptotic")
    assert _time_uniform_miss(lower, upper, mean) <= alpha + slack
    bare_lower, bare_upper = difference_confidence_sequence(d, alpha, method="asymptotic",
                                                            prior_rounds=0.0)
    assert _time_uniform_miss(bare_lower, bare_upper, mean) > 0.5
    t = np.arange(1, 201)
    running = np.cumsum(d, axis=1) / t
    spread = 1.6449 * np.sqrt(np.maximum(np.cumsum(d * d, axis=1) / t - running ** 2, 1e-12) / t)
    assert _time_uniform_miss(running - spread, running + spread, mean) > 0.5


# ---------------------------------------------------------------------------------------------
# Δ over several groups, decisions, stopping


def test_range_delta_is_bounded_through_all_pairs() -> None:
    rng = np.random.default_rng(21)
    means = rng.uniform(0, 0.5, (40, 3)) + np.array([0.0, 0.1, 0.3])
    level = 0.05 / 3
    lower, upper = delta_bounds(means, "range", level, grid=200)
    pair_bounds = {}
    for a, b in ((0, 1), (0, 2), (1, 2)):
        pair_bounds[a, b] = difference_confidence_sequence(means[:, a] - means[:, b], level,
                                                           grid=200)
    expected_lower = np.maximum.reduce([np.maximum(lo, -hi) for lo, hi in pair_bounds.values()])
    expected_upper = np.maximum.reduce([np.maximum(hi, -lo) for lo, hi in pair_bounds.values()])
    np.testing.assert_allclose(lower, np.maximum(expected_lower, 0.0))
    np.testing.assert_allclose(upper, expected_upper)
    pair_lower, pair_upper = delta_bounds(means[:, [2, 0]], "pair", 0.05, grid=200)
    np.testing.assert_allclose(
        (pair_lower, pair_upper),
        difference_confidence_sequence(means[:, 2] - means[:, 0], 0.05, grid=200))


def test_bonferroni_level_over_deltas_and_pairs() -> None:
    races = DeclaredDelta("delta_refusal", tuple("ABCDEFG"), margin=0.1)
    pair = DeclaredDelta("black_white", ("A", "B"), kind="pair")
    assert races.n_pairs == 21 and pair.n_pairs == 1
    assert pair_level(0.05, [races, pair], races) == pytest.approx(0.05 / 42)
    assert pair_level(0.05, [races, pair], pair) == pytest.approx(0.025)
    assert pair_level(0.05, [races], races) == pytest.approx(0.05 / 21)


def test_a_share_of_alpha_spent_on_the_upper_bound_alone() -> None:
    races = DeclaredDelta("delta_refusal", tuple("ABCDEFG"), margin=0.1)
    pair = DeclaredDelta("black_white", ("A", "B"), kind="pair")
    # The lower bound's pair CSs keep (1 − s) of the Bonferroni level; the upper bound's second
    # set is divided by the Δs only.
    assert pair_level(0.05, [races, pair], races, 0.5) == pytest.approx(0.025 / 42)
    assert upper_level(0.05, [races, pair], races, 0.5) == pytest.approx(0.0125)
    assert upper_level(0.05, [races], races, 0.2) == pytest.approx(0.01)
    # A pair Δ is one CS: nothing to split.
    assert pair_level(0.05, [races, pair], pair, 0.5) == pytest.approx(0.025)
    assert upper_level(0.05, [races, pair], pair, 0.5) is None
    assert upper_level(0.05, [races], races, 0.0) is None
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="upper_share"):
            pair_level(0.05, [races], races, bad)
        with pytest.raises(ValueError, match="upper_share"):
            upper_level(0.05, [races], races, bad)


def test_the_upper_bound_alone_is_the_smaller_of_two_sets_of_pair_css() -> None:
    means = np.random.default_rng(22).binomial(10, [0.1, 0.12, 0.1], (80, 3)) / 10
    lower, upper = delta_bounds(means, "range", 0.01, grid=200, upper_level=0.05)
    base_lower, base_upper = delta_bounds(means, "range", 0.01, grid=200)
    wide_upper = delta_bounds(means, "range", 0.05, grid=200)[1]
    np.testing.assert_allclose(lower, base_lower)
    np.testing.assert_allclose(upper, np.minimum(base_upper, wide_upper))
    assert (upper < base_upper - 0.01).any()
    assert (np.diff(upper) <= 0).all()  # still a running intersection


def _audit_group_means(rng: np.random.Generator, sequences: int, rounds: int,
                       etas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-round cluster means of several groups as an audit sees them (one new source per
    group a round, logit random effect SD 0.8, the same 10 prompts, SD 0.8), shape
    (sequences, rounds, groups), and each group's mean rate (Gauss-Hermite over sources)."""
    prompt = np.random.default_rng(8).normal(0.0, 0.8, 10)
    nodes, weights = hermegauss(40)
    weights = weights / weights.sum()
    source = rng.normal(0.0, 0.8, (sequences, rounds, len(etas), 1))
    logits = etas[:, None] + source + prompt
    means = (rng.random(logits.shape) < expit(logits)).mean(axis=-1)
    truth = np.array([np.mean([(weights * expit(eta + 0.8 * nodes + v)).sum() for v in prompt])
                      for eta in etas])
    return means, truth


def test_a_split_range_covers_at_every_round_and_its_upper_bound_at_its_share() -> None:
    """Seven groups at about 20%, 6% and five at 11% (one pair's gap is Δ, 14 points), 2,000
    simulated audits of 150 rounds, the asymptotic CS, α = 0.2 with half on the upper bound.
    The upper bound alone misses Δ at some round in at most s·α + 3 SE (its pair CSs are not
    divided by the 21 pairs: only the pair whose gap is Δ must cover; measured 0.6%), the
    interval in at most α + 3 SE. The same upper bound read from fixed-time 90% intervals at
    every round is missed in a third of the audits, so the check can fail."""
    alpha, share, sequences = 0.2, 0.5, 2_000
    etas = np.array([-1.4, -3.0, *[-2.2] * 5])
    means, truth = _audit_group_means(np.random.default_rng(20261203), sequences, 150, etas)
    delta = float(truth.max() - truth.min())
    races = DeclaredDelta("delta", tuple("ABCDEFG"))
    level = pair_level(alpha, [races], races, share)
    top = upper_level(alpha, [races], races, share)
    lower, upper = delta_bounds(means, "range", level, method="asymptotic", upper_level=top)
    assert top is not None
    slack = 3 * math.sqrt(top * (1 - top) / sequences)
    upper_missed = float(np.mean((upper < delta).any(axis=-1)))
    assert upper_missed <= top + slack
    assert _time_uniform_miss(lower, upper, delta) <= alpha + 3 * math.sqrt(
        alpha * (1 - alpha) / sequences)
    a, b = np.triu_indices(7, 1)
    d = means[..., a] - means[..., b]                      # (sequences, rounds, pairs)
    t = np.arange(1, 151)[:, None]
    running = np.cumsum(d, axis=1) / t
    spread = 1.6449 * np.sqrt(np.maximum(np.cumsum(d * d, axis=1) / t - running ** 2,
                                         1e-12) / t)
    naive_upper = np.maximum(running + spread, -(running - spread)).max(axis=-1)
    assert float(np.mean((naive_upper < delta).any(axis=-1))) > 2 * top  # measured 33%


def test_a_share_on_the_upper_bound_decides_equivalence_sooner_and_gaps_later() -> None:
    """The trade the share makes, on 60 simulated audits of 100 rounds (hedged CS, 7 groups,
    α = 0.05, margin 15 pp): with half of α on the upper bound, audits without a gap are shown
    inside the margin sooner on average, and an audit with a 40-point gap never shows it
    sooner (its lower bound's pair CSs are wider)."""
    races = DeclaredDelta("delta", tuple("ABCDEFG"), margin=0.15)
    rng = np.random.default_rng(20261204)
    fair, _ = _audit_group_means(rng, 60, 100, np.full(7, -2.2))
    biased, _ = _audit_group_means(rng, 60, 100, np.array([-0.2, *[-2.2] * 6]))

    def first(means: np.ndarray, share: float) -> np.ndarray:
        low, high = delta_bounds(means, "range", pair_level(0.05, [races], races, share),
                                 grid=100, upper_level=upper_level(0.05, [races], races, share))
        return first_decided_round(low, high, races.margin)

    plain, split = first(fair, 0.0), first(fair, 0.5)
    never = 101
    assert (np.where(split > 0, split, never).mean()
            < 0.9 * np.where(plain > 0, plain, never).mean())
    plain_gap, split_gap = first(biased, 0.0), first(biased, 0.5)
    assert (plain_gap > 0).all() and (split_gap >= plain_gap).all()


@pytest.mark.parametrize(("lower", "upper", "margin", "expected"), [
    (0.0, 0.2, 0.1, "undecided"),       # a bound at 0 keeps 0 in the set
    (1e-9, 0.2, 0.1, "gap"),
    (-0.3, -1e-9, 0.1, "gap"),
    (-0.1, 0.1, 0.1, "equivalent"),     # bounds on the margin count as inside
    (-0.1, 0.1 + 1e-9, 0.1, "undecided"),
    (-0.1 - 1e-9, 0.05, 0.1, "undecided"),
    (0.01, 0.05, 0.1, "gap"),           # a real gap, and a small one: gap
    (-0.05, 0.05, None, "undecided"),   # no margin: never equivalent
])
def test_decide_at_its_boundaries(lower: float, upper: float, margin: float | None,
                                  expected: str) -> None:
    assert decide(lower, upper, margin) == expected


def test_first_decided_round_and_stop_rounds() -> None:
    lower = np.array([[-0.5, -0.2, 0.01, 0.02], [-0.5, -0.09, -0.05, -0.04]])
    upper = np.array([[0.9, 0.5, 0.3, 0.2], [0.5, 0.2, 0.1, 0.06]])
    np.testing.assert_array_equal(first_decided_round(lower, upper, 0.1), [3, 3])
    np.testing.assert_array_equal(first_decided_round(lower, upper, None), [3, 0])
    first = [np.array([3, 0, 5, 2]), np.array([4, 2, 0, 7])]
    stop, reason = stop_rounds(first, rounds_seen=10, max_rounds=6)
    np.testing.assert_array_equal(stop, [4, 6, 6, 6])
    assert list(reason) == ["decided", "budget", "budget", "budget"]
    stop, reason = stop_rounds(first, rounds_seen=5, max_rounds=6)
    np.testing.assert_array_equal(stop, [4, 0, 0, 0])
    assert list(reason) == ["decided", "continue", "continue", "continue"]


def test_budget_in_rounds() -> None:
    assert budget_rounds(70, max_rounds=100) == 100
    assert budget_rounds(70, max_requests=7_000) == 100
    assert budget_rounds(70, max_rounds=50, max_requests=7_000) == 50
    with pytest.raises(ValueError, match="one round"):
        budget_rounds(70, max_requests=69)


def _audit_rounds(gap: float, rounds: int, seed: int) -> np.ndarray:
    """(rounds, 3) cluster means of three groups, the first ``gap`` above the others."""
    rng = np.random.default_rng(seed)
    rate = np.array([0.1 + gap, 0.1, 0.1])
    return rng.binomial(10, rate, (rounds, 3)) / 10


def test_evaluate_decides_a_large_gap_and_runs_out_of_budget_without_one() -> None:
    delta = DeclaredDelta("delta_refusal", ("Black", "White", "Asian"), margin=0.05)
    big = evaluate({"delta_refusal": _audit_rounds(0.5, 60, 1)}, [delta], 0.05, 60, grid=200)
    assert big.reason == "decided" and 0 < big.stop_round < 60
    assert big.deltas[0].decision == "gap"
    assert big.deltas[0].lower[big.stop_round - 1] > 0
    none = evaluate({"delta_refusal": _audit_rounds(0.0, 30, 2)}, [delta], 0.05, 30, grid=200)
    assert none.reason == "budget" and none.stop_round == 30
    assert none.deltas[0].decision == "undecided"
    going = evaluate({"delta_refusal": _audit_rounds(0.0, 20, 2)}, [delta], 0.05, 30, grid=200)
    assert going.reason == "continue" and going.stop_round == 0


def test_every_delta_must_be_decided_before_stopping() -> None:
    gap = DeclaredDelta("refusal", ("Black", "White", "Asian"), margin=0.05)
    still = DeclaredDelta("erasure", ("Black", "White", "Asian"), margin=0.05)
    result = evaluate({"refusal": _audit_rounds(0.5, 60, 3),
                       "erasure": _audit_rounds(0.0, 60, 4)}, [gap, still], 0.05, 60, grid=200)
    assert result.deltas[0].decided_round > 0 and result.deltas[1].decided_round == 0
    assert result.reason == "budget" and result.stop_round == 60
    assert result.deltas[0].level == pytest.approx(0.05 / 6)


# ---------------------------------------------------------------------------------------------
# The resumable state


def _state() -> SequentialState:
    return SequentialState(
        deltas=(DeclaredDelta("delta_refusal", ("Black", "White", "Asian"), margin=0.1),
                DeclaredDelta("black_white", ("Black", "White"), kind="pair")),
        alpha=0.05, max_rounds=40, grid=200)


def test_state_json_round_trip_and_resumption_give_the_same_intervals() -> None:
    means = _audit_rounds(0.3, 25, 5)
    state = _state()
    for t, row in enumerate(means):
        state = state.add_round({"delta_refusal": row, "black_white": row[:2]},
                                sources=(f"s{t}a", f"s{t}b", f"s{t}c"))
        state = SequentialState.from_json(state.to_json())  # killed and resumed every round
    assert len(state.rounds) == 25 and state.rounds[3].sources == ("s3a", "s3b", "s3c")
    assert SequentialState.from_json(state.to_json()) == state
    at_once = evaluate({"delta_refusal": means, "black_white": means[:, :2]}, state.deltas,
                       0.05, 40, grid=200)
    assert state.evaluate() == at_once


def test_state_with_the_asymptotic_cs_resumes_with_its_t_opt() -> None:
    means = _audit_rounds(0.3, 15, 6)
    state = SequentialState(deltas=_state().deltas[:1], alpha=0.05, max_rounds=40,
                            method="asymptotic", t_opt=12.0)
    for row in means:
        state = SequentialState.from_json(state.add_round({"delta_refusal": row}).to_json())
    assert state.method == "asymptotic" and state.t_opt == 12.0
    at_once = evaluate({"delta_refusal": means}, state.deltas, 0.05, 40, method="asymptotic",
                       t_opt=12.0)
    assert state.evaluate() == at_once
    other = evaluate({"delta_refusal": means}, state.deltas, 0.05, 40, method="asymptotic")
    assert other.deltas[0].lower != at_once.deltas[0].lower
    # A state written before t_opt was stored reads with the default.
    old = state.to_json().replace('  "t_opt": 12.0,\n', "")
    assert SequentialState.from_json(old).t_opt == 30.0


def test_state_resumes_with_its_upper_share() -> None:
    means = _audit_rounds(0.0, 30, 7)
    state = SequentialState(deltas=_state().deltas[:1], alpha=0.05, max_rounds=40, grid=200,
                            upper_share=0.4)
    for row in means:
        state = SequentialState.from_json(state.add_round({"delta_refusal": row}).to_json())
    assert state.upper_share == 0.4
    result = state.evaluate()
    assert result == evaluate({"delta_refusal": means}, state.deltas, 0.05, 40, grid=200,
                              upper_share=0.4)
    assert result.deltas[0].upper_level == pytest.approx(0.02)
    assert result.deltas[0].level == pytest.approx(0.03 / 3)
    plain = evaluate({"delta_refusal": means}, state.deltas, 0.05, 40, grid=200)
    assert plain.deltas[0].upper_level is None and plain.deltas[0].upper != result.deltas[0].upper
    # A state written before the share was stored reads as 0, what it was written with.
    old = state.to_json().replace('  "upper_share": 0.4,\n', "")
    assert SequentialState.from_json(old).upper_share == 0.0
    with pytest.raises(ValueError, match="upper_share"):
        SequentialState(deltas=state.deltas, alpha=0.05, max_rounds=40, upper_share=1.0)


def test_state_refuses_bad_rounds_and_bad_files() -> None:
    state = _state()
    with pytest.raises(ValueError, match="no means"):
        state.add_round({"delta_refusal": [0.1, 0.2, 0.3]})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        state.add_round({"delta_refusal": [0.1, float("nan"), 0.3], "black_white": [0, 0]})
    with pytest.raises(ValueError, match="2 group means"):
        state.add_round({"delta_refusal": [0.1, 0.2, 0.3], "black_white": [0.1]})
    full = SequentialState(deltas=state.deltas[:1], alpha=0.05, max_rounds=1)
    full = full.add_round({"delta_refusal": [0.1, 0.2, 0.3]})
    with pytest.raises(ValueError, match="budget"):
        full.add_round({"delta_refusal": [0.1, 0.2, 0.3]})
    with pytest.raises(InputDataError, match="version"):
        SequentialState.from_json(state.to_json().replace('"version": 1', '"version": 2'))
    with pytest.raises(InputDataError, match="not a sequential audit state"):
        SequentialState.from_json('{"version": 1}')
