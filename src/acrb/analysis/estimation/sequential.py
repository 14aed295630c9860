"""Anytime-valid confidence sequences for a sequential audit, and its stopping rule.

A sequential audit adds source images in *rounds* that keep the design balanced: each round
edits m whole sources of every group (all their prompts). After each round every declared Δ
gets a confidence sequence (CS): intervals [L_t, U_t], one per round t, that hold *at every
round at once* with probability at least 1 − α, so the audit may look after each round and
stop whenever it likes without inflating its error (Ville's inequality; Howard, Ramdas,
McAuliffe & Sekhon 2021, "Time-uniform, nonparametric, nonasymptotic confidence sequences",
Annals of Statistics 49:1055-1080). The audit stops when every Δ is decided, "gap" (its CS
excludes 0) or "equivalent" (its CS lies inside [−margin, +margin]), or when the budget is
spent. Method, study and what is not yet built: ``docs/sequential.md``.

Units of independence
---------------------
The source image is the unit, as everywhere in ACRB (``docs/statistics.md``). The observation
of round t for a pair of groups (a, b) is d_t = (mean outcome over the round's sources of
group a, all their requests) − (the same for group b), a difference of cluster means in
[−1, 1]. Given the prompt catalog, the d_t of different rounds are independent with a common
mean, the catalog's gap between a and b (prompt effects are shared by all rounds, so the CS is
conditional on the catalog, as ``analyze.resample: sources`` is). d_t is rescaled to
x_t = (d_t + 1)/2 in [0, 1] and given a bounded-mean CS; the CS of the mean of x maps back to
one of the gap by Δ = 2μ − 1.

Δ over more than two groups (max − min, 7 races: 21 pairs) is covered through its pairs: if
every pair's CS covers its gap, then Δ = max_ab |d_ab| lies in
[max(0, max_ab max(L_ab, −U_ab)), max_ab max(U_ab, −L_ab)]. The pairs' CSs are made
simultaneous by Bonferroni's union bound over the pairs and over the declared Δs: each pair
CS of each Δ has level α / (number of Δs × pairs of that Δ). Bonferroni needs no independence
between the pairs (they share groups) and holds uniformly over rounds, since each pair's CS
does. Only the lower bound needs every pair; the upper bound needs only the pair whose gap is
Δ, a pair the truth fixes, so a share of α spent on a second set of pair CSs without the
division by the pairs bounds Δ from above more tightly (``upper_share``, :func:`upper_level`):
it makes "equivalent" cheaper and "gap" dearer.

Bounds
------
- ``method="hedged"`` (default): the hedged capital CS of Waudby-Smith & Ramdas (2024,
  "Estimating means of bounded random variables by betting", JRSS-B 86:1-27, Section 4, the
  method they recommend). For a candidate mean m the two capital processes
  K⁺_t(m) = Π_{i≤t} (1 + λ⁺_i(m)(x_i − m)) and K⁻_t(m) = Π_{i≤t} (1 − λ⁻_i(m)(x_i − m)) are
  non-negative martingales when m is the mean; the CS is
  {m : max(θK⁺_t(m), (1 − θ)K⁻_t(m)) < 1/α}, θ = 1/2. Bets: the predictable plug-in
  λ̇_t = √(2 log(2/α) / (σ̂²_{t−1} t log(1 + t))), truncated to λ⁺ = min(λ̇, c/m) and
  λ⁻ = min(λ̇, c/(1 − m)), with μ̂_t = (1/2 + Σ_{i≤t} x_i)/(t + 1) and
  σ̂²_t = (1/4 + Σ_{i≤t} (x_i − μ̂_i)²)/(t + 1). The set is computed on a grid of m
  (``grid`` + 1 points on [0, 1]); K⁺ falls and K⁻ rises with m, so the set is an interval
  and each bound is taken at the last grid point outside it, never inside (``_hedged``).
- ``method="empirical-bernstein"``: the predictable plug-in empirical-Bernstein CS of the
  same paper (Section 3): centre Σλ_i x_i / Σλ_i, half-width
  (log(2/α) + Σ v_i ψ_E(λ_i)) / Σλ_i, v_i = 4(x_i − μ̂_{i−1})², ψ_E(λ) = (−log(1 − λ) − λ)/4,
  λ_t = min(λ̇_t, c). Closed form, hence fast, but its bets are capped at c in x units
  (c/2 in gap units), where the hedged bets may reach c/m near m = 1/2: in an audit the
  per-round differences vary far less than their range [−1, 1] allows, the caps bind, and
  the hedged CS decides in about half the rounds at the same c (``docs/sequential.md``).
- ``method="asymptotic"``: the asymptotic CS of Waudby-Smith, Arbour, Sinha, Kennedy &
  Ramdas (2024, "Time-uniform central limit theory and asymptotic confidence sequences",
  Annals of Statistics; arXiv:2103.06476), two-sided, with Robbins' normal-mixture
  (conjugate-mixture) boundary and a plug-in standard deviation. In gap units (d_t itself,
  no rescaling): centre d̄_t = Σ_{i≤t} d_i / t, half-width
  σ̂_t · √( 2(tρ² + 1)/(t²ρ²) · log(√(tρ² + 1)/α) ). ρ² sets the round at which the CS is
  tightest: ρ² = (−2 log α + log(−2 log α + 1)) / t_opt, the paper's closed-form
  approximation of the optimum for a time t_opt (``t_opt``, rounds, default
  :data:`T_OPT` = 30, the size of the fixed design the pipeline's gap test needs for 80%
  power at a 10 pp gap in ``benchmarks/results/sequential_study.md``, where an audit wants
  to decide). It uses the variance, not the range, so it closes as fast as a fixed-time
  interval up to a factor (its boundary is 1.31 times the fixed-time z_{1−α/2}/√t at
  t = t_opt = 30, α = 0.05/21), but its coverage holds only as t → ∞ (a strong approximation
  of the partial sums by a Brownian motion), not at every sample size. Guard:
  σ̂²_t = (w·1 + Σ_{i≤t} (d_i − d̄_t)²)/(t + w), the sample variance shrunk towards 1, the
  largest variance a d in [−1, 1] can have, with the weight of ``prior_rounds`` = w rounds
  (default 1): the same regularisation (1/4 in x units) that the bounded CSs above use for
  their plug-in variance. It is consistent, so the asymptotic guarantee is unchanged; at
  small t it keeps the CS wide where the sample variance of a few rounds (often all 0 in an
  audit at a 10% refusal rate) would make it a point. Chosen by
  measurement (``benchmarks/results/sequential_study.md``, 500 audits per scenario, 21 pair
  CSs at α/21): without the prior (w = 0) the CS is a point after round 1 and missed the true
  Δ in 99.4-100% of audits; w = 0 with nothing decided before round 10 (``min_rounds``)
  still missed in 10.2% of the no-gap audits, before round 20 in 4.2% (95.8% coverage, at
  the target's edge, and falling with every round); with the prior it covered at every
  round in 99.2-100%, with no miss before round 100, so a later start has nothing to fix
  there. ``min_rounds`` (default 1: none) is kept for that comparison: before round
  ``min_rounds`` the CS is the whole range [−1, 1], so nothing can be decided.

All take the running intersection (a point once excluded stays excluded), which keeps the
guarantee (for the asymptotic CS: on the event that every interval covers, so does their
intersection) and keeps a decided Δ decided. ``truncation`` is c: the paper suggests 1/2 or
3/4; the default 3/4 lets the bets grow further where, as here, the variance is small against
the range.

Libraries considered (2025)
---------------------------
- ``confseq`` (PyPI 0.0.11, the Howard / Waudby-Smith / Ramdas package, MIT): only an sdist.
  Its build runs CMake and scikit-build and compiles ``boundaries.cpp`` and
  ``quantiles.cpp`` with pybind11 against Boost headers (``find_package(Boost 1.70.0)``,
  ``#include <boost/math/...>`` in ``uniform_boundaries.h``), and it lists pytest, matplotlib
  and multiprocess as install requirements. A fresh machine without a compiler and Boost
  could not install ACRB, so it is not a dependency. Its pure-Python modules
  (``betting.py``, ``predmix.py``, ``betting_strategies.py``) implement the two bounds above
  and were used once as a reference: :func:`confidence_sequence` equals its
  ``hedged_cs(x, alpha, breaks=grid, running_intersection=True, trunc_scale=c)`` to 1e-16,
  and its ``predmix_empbern_twosided_cs`` in the lower bound; the upper bound differs only
  in the running mean in v_i (confseq starts the mean of 1 − x at 0, the paper at 1/2; any
  predictable mean is valid). How: ``docs/sequential.md``.
- ``expectation`` (PyPI, e-values and confidence sequences): its only releases, 0.6.0 and
  0.6.1, declare Requires-Python >= 3.12; ACRB supports 3.10 and 3.11.
So the bounds are written here with numpy (a few dozen lines each, checked in
``tests/test_sequential_intervals.py`` against a loop written straight from the paper and by
simulation). confseq's asymptotic CS lives in its compiled part (``boundaries``) and was not
used; the asymptotic CS is checked against a loop written from the paper's formula, a
boundary computed by hand and a simulation of audit-like data.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, cast

import numpy as np

from acrb.errors import InputDataError

Method = Literal["hedged", "empirical-bernstein", "asymptotic"]
Decision = Literal["gap", "equivalent", "undecided"]
StopReason = Literal["decided", "budget", "continue"]
DeltaKind = Literal["range", "pair"]

METHODS: tuple[str, ...] = ("hedged", "empirical-bernstein", "asymptotic")
#: c of the bets (see the module docstring).
TRUNCATION = 0.75
#: Grid intervals on [0, 1] of the hedged CS: its bounds are conservative by at most 1/GRID
#: in x units, 2/GRID in gap units (0.004 = 0.4 pp).
GRID = 500
#: Round (1-based) at which the asymptotic CS is tightest (see the module docstring).
T_OPT = 30.0
#: Weight, in rounds, of the worst-case variance in the asymptotic CS's variance estimate.
PRIOR_ROUNDS = 1.0
STATE_VERSION = 1
#: Tolerance of the decisions: bounds on the hedged grid carry rounding (2 x 0.55 − 1 is
#: 0.1 + 9e-17), and a bound on the margin counts as inside.
_EDGE = 1e-12
#: Elements per chunk of the hedged grid computation (sequences x rounds x grid points).
_CHUNK_ELEMENTS = 1_000_000


def _validate_level(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), not {alpha}")


def _validate_unit(x: np.ndarray, what: str) -> None:
    if x.shape[-1] == 0:
        raise ValueError(f"{what}: no rounds")
    if np.isnan(x).any():
        raise ValueError(f"{what}: missing values (NaN); every round needs an observation of "
                         "every group")
    if (x < 0).any() or (x > 1).any():
        raise ValueError(f"{what}: values must lie in [0, 1]")


def _plug_in_bets(x: np.ndarray, alpha: float) -> np.ndarray:
    """λ̇_t = √(2 log(2/α) / (σ̂²_{t−1} t log(1 + t))) for each round of ``x`` (…, T), with the
    regularised running mean and variance of Waudby-Smith & Ramdas (2024)'s predictable
    plug-in: μ̂_t = (1/2 + Σx)/(t + 1), σ̂²_t = (1/4 + Σ(x_i − μ̂_i)²)/(t + 1),
    σ̂²_0 = 1/4."""
    t = np.arange(1, x.shape[-1] + 1, dtype=float)
    mean = (0.5 + np.cumsum(x, axis=-1)) / (t + 1)
    variance = (0.25 + np.cumsum((x - mean) ** 2, axis=-1)) / (t + 1)
    previous = np.concatenate([np.full((*x.shape[:-1], 1), 0.25), variance[..., :-1]], axis=-1)
    return np.sqrt(2.0 * math.log(2.0 / alpha) / (previous * t * np.log1p(t)))


def _empirical_bernstein(x: np.ndarray, alpha: float, truncation: float
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Predictable plug-in empirical-Bernstein CS (Waudby-Smith & Ramdas 2024, Section 3)."""
    t = np.arange(1, x.shape[-1] + 1, dtype=float)
    bets = np.minimum(_plug_in_bets(x, alpha), truncation)
    running_mean = (0.5 + np.cumsum(x, axis=-1)) / (t + 1)
    previous_mean = np.concatenate([np.full((*x.shape[:-1], 1), 0.5), running_mean[..., :-1]],
                                   axis=-1)
    v = 4.0 * (x - previous_mean) ** 2
    psi = (-np.log1p(-bets) - bets) / 4.0
    total = np.cumsum(bets, axis=-1)
    centre = np.cumsum(bets * x, axis=-1) / total
    half = (math.log(2.0 / alpha) + np.cumsum(v * psi, axis=-1)) / total
    return np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)


def _hedged(x: np.ndarray, alpha: float, truncation: float, grid: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """Hedged capital CS (Waudby-Smith & Ramdas 2024, Section 4), θ = 1/2, on a grid of m.

    Each factor 1 + λ⁺_i(m)(x_i − m) is positive and non-increasing in m (it is
    1 + λ̇_i(x_i − m) below m = c/λ̇_i and 1 − c + c·x_i/m above), so K⁺_t(m) is non-increasing
    and, likewise, K⁻_t(m) non-decreasing: the points K⁺ excludes form a prefix [0, a] of
    [0, 1], those K⁻ excludes a suffix [b, 1], and the CS is the interval (a, b), also after
    the running intersection (a point once excluded stays excluded). On the grid the lower
    bound is the largest grid point excluded by K⁺ (0 if none), the upper the smallest
    excluded by K⁻ (1 if none), so the true interval lies inside the bounds."""
    flat = x.reshape(-1, x.shape[-1])
    sequences, rounds = flat.shape
    m = np.linspace(0.0, 1.0, grid + 1)
    with np.errstate(divide="ignore"):
        cap_up = truncation / m  # inf at m = 0: no cap needed, x − m ≥ 0 there
        cap_down = truncation / (1.0 - m)
    threshold = math.log(1.0 / alpha) - math.log(0.5)  # θK ≥ 1/α with θ = 1/2
    bets = _plug_in_bets(flat, alpha)
    lower = np.empty((sequences, rounds))
    upper = np.empty((sequences, rounds))
    step = max(1, _CHUNK_ELEMENTS // max(rounds * (grid + 1), 1))
    for start in range(0, sequences, step):
        xs = flat[start:start + step, :, None]
        plug = bets[start:start + step, :, None]
        excess = xs - m
        # Points excluded after round t form a prefix (K⁺) and a suffix (K⁻) of the grid, so
        # counting them gives the bounds, and the running intersection is the running maximum
        # of the counts. (In-place steps: this loop is the cost of the whole module.)
        counts = []
        for sign, cap in ((1.0, cap_up), (-1.0, cap_down)):
            log_capital = np.minimum(plug, cap)
            log_capital *= excess
            if sign < 0:
                np.negative(log_capital, out=log_capital)
            np.log1p(log_capital, out=log_capital)
            np.cumsum(log_capital, axis=1, out=log_capital)
            counts.append(np.maximum.accumulate(
                np.count_nonzero(log_capital >= threshold, axis=2), axis=1))
        excluded_up, excluded_down = counts
        lower[start:start + step] = np.where(excluded_up > 0,
                                             m[np.maximum(excluded_up - 1, 0)], 0.0)
        upper[start:start + step] = np.where(excluded_down > 0,
                                             m[np.minimum(grid + 1 - excluded_down, grid)], 1.0)
    # Both sides exclude everything only on the α event (the data contradict every mean):
    # report the point between the bounds.
    crossed = lower > upper
    if crossed.any():
        middle = (lower + upper) / 2.0
        lower = np.where(crossed, middle, lower)
        upper = np.where(crossed, middle, upper)
    return lower.reshape(x.shape), upper.reshape(x.shape)


def mixture_boundary(t: np.ndarray | float, alpha: float, t_opt: float = T_OPT
                     ) -> np.ndarray:
    """Robbins' two-sided normal-mixture boundary per unit standard deviation at round(s) t:
    √( 2(tρ² + 1)/(t²ρ²) · log(√(tρ² + 1)/α) ), ρ² = (−2 log α + log(−2 log α + 1)) / t_opt
    (Waudby-Smith, Arbour, Sinha, Kennedy & Ramdas 2024, Annals of Statistics). The asymptotic
    CS is d̄_t ± σ̂_t times this."""
    _validate_level(alpha)
    if not t_opt > 0:
        raise ValueError(f"t_opt must be positive, not {t_opt}")
    times = np.asarray(t, dtype=float)
    log_alpha = math.log(alpha)
    rho2 = (-2.0 * log_alpha + math.log(-2.0 * log_alpha + 1.0)) / t_opt
    scaled = times * rho2 + 1.0
    return np.sqrt(2.0 * scaled / (times ** 2 * rho2) * np.log(np.sqrt(scaled) / alpha))


def _asymptotic(d: np.ndarray, alpha: float, t_opt: float, prior_rounds: float,
                min_rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """Asymptotic CS (module docstring) of the mean of d in [−1, 1], gap units, with its
    running intersection; bounds clipped to [−1, 1]."""
    t = np.arange(1, d.shape[-1] + 1, dtype=float)
    mean = np.cumsum(d, axis=-1) / t
    # Σ_{i≤t} (d_i − d̄_t)² = Σ d_i² − t d̄_t²: with |d| ≤ 1 its rounding error is about
    # 1e-16 t, nothing against the prior (and clipped at 0).
    squares = np.maximum(np.cumsum(d * d, axis=-1) - t * mean ** 2, 0.0)
    sd = np.sqrt((prior_rounds * 1.0 + squares) / (t + prior_rounds))
    half = sd * mixture_boundary(t, alpha, t_opt)
    lower = np.clip(mean - half, -1.0, 1.0)
    upper = np.clip(mean + half, -1.0, 1.0)
    if min_rounds > 1:
        lower[..., :min_rounds - 1] = -1.0
        upper[..., :min_rounds - 1] = 1.0
    lower = np.maximum.accumulate(lower, axis=-1)
    upper = np.minimum.accumulate(upper, axis=-1)
    # The intersection is empty only on the miss event: report the point between the bounds.
    crossed = lower > upper
    if crossed.any():
        middle = (lower + upper) / 2.0
        lower = np.where(crossed, middle, lower)
        upper = np.where(crossed, middle, upper)
    return lower, upper


def _validate_asymptotic(t_opt: float, prior_rounds: float, min_rounds: int) -> None:
    if not t_opt > 0:
        raise ValueError(f"t_opt must be positive, not {t_opt}")
    if not prior_rounds >= 0:
        raise ValueError(f"prior_rounds must be at least 0, not {prior_rounds}")
    if min_rounds < 1:
        raise ValueError(f"min_rounds must be at least 1, not {min_rounds}")


def confidence_sequence(
    observations: np.ndarray | Sequence[float],
    alpha: float = 0.05,
    *,
    method: Method = "hedged",
    truncation: float = TRUNCATION,
    grid: int = GRID,
    t_opt: float = T_OPT,
    prior_rounds: float = PRIOR_ROUNDS,
    min_rounds: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Anytime-valid two-sided CS for the mean of observations in [0, 1].

    ``observations`` has shape (…, T): any number of independent sequences of T rounds each
    (rounds on the last axis; within a sequence, the observations of rounds are independent
    with a common mean given the past, or more generally their conditional means average to
    the target). Returns ``(lower, upper)``, each of shape (…, T): the CS after rounds
    1 … t, on the same [0, 1] scale, with P(lower_t ≤ μ ≤ upper_t for every t) ≥ 1 − α. The
    running intersection is taken, so lower is non-decreasing and upper non-increasing.

    ``method``: ``"hedged"`` (the hedged capital CS, Waudby-Smith & Ramdas 2024, JRSS-B 86:1-27,
    Section 4), ``"empirical-bernstein"`` (their predictable plug-in empirical-Bernstein CS,
    Section 3) or ``"asymptotic"`` (the asymptotic CS of Waudby-Smith, Arbour, Sinha, Kennedy &
    Ramdas 2024, valid as t → ∞ only: see the module docstring); ``truncation`` is the cap
    c ∈ (0, 1) of the bets; ``grid`` the number of grid intervals of the hedged CS (its bounds
    are conservative to 1/grid). Only for ``"asymptotic"``: ``t_opt`` (rounds) where it is
    tightest, ``prior_rounds`` the weight of the worst-case variance (1/4 on this scale) in
    its variance estimate, ``min_rounds`` the first round whose interval is not the whole
    range. Formulas: the module docstring.
    """
    _validate_level(alpha)
    if not 0.0 < truncation < 1.0:
        raise ValueError(f"truncation must lie in (0, 1), not {truncation}")
    x = np.asarray(observations, dtype=float)
    if x.ndim == 0:
        raise ValueError("observations: need at least one round")
    _validate_unit(x, "observations")
    if method == "hedged":
        if grid < 2:
            raise ValueError("grid must be at least 2")
        return _hedged(x, alpha, truncation, grid)
    if method == "empirical-bernstein":
        lower, upper = _empirical_bernstein(x, alpha, truncation)
        return np.maximum.accumulate(lower, axis=-1), np.minimum.accumulate(upper, axis=-1)
    if method == "asymptotic":
        # The asymptotic CS is affine-equivariant: run it on d = 2x − 1 (gap units, where the
        # worst-case variance is 1) and map back.
        _validate_asymptotic(t_opt, prior_rounds, min_rounds)
        lower, upper = _asymptotic(2.0 * x - 1.0, alpha, t_opt, prior_rounds, min_rounds)
        return (lower + 1.0) / 2.0, (upper + 1.0) / 2.0
    raise ValueError(f"method must be one of {METHODS}, not {method!r}")


def difference_confidence_sequence(
    differences: np.ndarray | Sequence[float],
    alpha: float = 0.05,
    *,
    method: Method = "hedged",
    truncation: float = TRUNCATION,
    grid: int = GRID,
    t_opt: float = T_OPT,
    prior_rounds: float = PRIOR_ROUNDS,
    min_rounds: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """CS for the mean of per-round differences d_t in [−1, 1] (rate units: 0.1 = 10 pp).

    For the bounded CSs d_t is rescaled to (d_t + 1)/2 in [0, 1], given
    :func:`confidence_sequence` (same arguments), and the bounds mapped back by 2μ − 1; the
    asymptotic CS is computed on d_t directly (gap units, worst-case variance 1). Shapes as
    there: (…, T) in and out.
    """
    d = np.asarray(differences, dtype=float)
    if d.size and ((d < -1).any() or (d > 1).any()):
        raise ValueError("differences must lie in [-1, 1]")
    if method == "asymptotic":
        _validate_level(alpha)
        if d.ndim == 0:
            raise ValueError("differences: need at least one round")
        _validate_unit((d + 1.0) / 2.0, "differences")
        _validate_asymptotic(t_opt, prior_rounds, min_rounds)
        return _asymptotic(d, alpha, t_opt, prior_rounds, min_rounds)
    lower, upper = confidence_sequence((d + 1.0) / 2.0, alpha, method=method,
                                       truncation=truncation, grid=grid)
    return 2.0 * lower - 1.0, 2.0 * upper - 1.0


def group_pairs(groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (a, b), a < b, of the g(g − 1)/2 pairs of ``groups`` groups, in the order
    every function of this module uses (``numpy.triu_indices``)."""
    a, b = np.triu_indices(groups, 1)
    return a, b


@dataclass(frozen=True)
class DeclaredDelta:
    """A Δ the sequential audit must decide.

    ``kind="range"``: Δ = max − min of the rates of ``groups`` (at least two), decided
    through all their pairs. ``kind="pair"``: Δ = rate(groups[0]) − rate(groups[1]), signed.
    ``margin`` (rate units, > 0) is the equivalence margin; None means Δ can only be decided
    as a gap. ``name`` identifies the Δ in rounds and results, e.g. ``"delta_refusal"``.
    """

    name: str
    groups: tuple[str, ...]
    margin: float | None = None
    kind: DeltaKind = "range"

    def __post_init__(self) -> None:
        if self.kind not in ("range", "pair"):
            raise ValueError(f"{self.name}: kind must be 'range' or 'pair', not {self.kind!r}")
        if len(set(self.groups)) != len(self.groups):
            raise ValueError(f"{self.name}: a group is named twice")
        if self.kind == "pair" and len(self.groups) != 2:
            raise ValueError(f"{self.name}: a pair Δ needs exactly two groups")
        if len(self.groups) < 2:
            raise ValueError(f"{self.name}: Δ needs at least two groups")
        if self.margin is not None and not 0.0 < self.margin < 1.0:
            raise ValueError(f"{self.name}: margin must lie in (0, 1), not {self.margin}")

    @property
    def n_pairs(self) -> int:
        return 1 if self.kind == "pair" else len(self.groups) * (len(self.groups) - 1) // 2


def _validate_share(upper_share: float) -> None:
    if not 0.0 <= upper_share < 1.0:
        raise ValueError(f"upper_share must lie in [0, 1), not {upper_share}")


def pair_level(alpha: float, deltas: Sequence[DeclaredDelta], delta: DeclaredDelta,
               upper_share: float = 0.0) -> float:
    """The level of each pair CS of ``delta``: α / (number of Δs × pairs of ``delta``), the
    Bonferroni union bound over the declared Δs and their pairs; with ``upper_share`` s > 0
    (a range Δ, :func:`upper_level`), (1 − s)·α / (number of Δs × pairs)."""
    _validate_level(alpha)
    _validate_share(upper_share)
    share = upper_share if delta.kind == "range" else 0.0
    return (1.0 - share) * alpha / (len(deltas) * delta.n_pairs)


def upper_level(alpha: float, deltas: Sequence[DeclaredDelta], delta: DeclaredDelta,
                upper_share: float) -> float | None:
    """The level of the second set of pair CSs that bound a range Δ from above alone:
    s·α / (number of Δs), no division by the pairs; None for s = 0 or a pair Δ.

    Why no union bound over the pairs is needed: Δ = max − min = |d*| for the pair (a*, b*)
    whose gap is the largest, a pair fixed by the truth (not by the data). If that one pair's
    CS covers d*, then Δ = |d*| ≤ max(U*, −L*) ≤ max_ab max(U_ab, −L_ab), whatever the other
    pairs' CSs do, so this upper bound fails with probability at most its own level. The
    lower bound still needs every pair (the pair whose lower bound is largest is chosen by the
    data), at :func:`pair_level` with (1 − s)·α. Together: P(Δ outside [lower, upper] at some
    round) ≤ (1 − s)·α + s·α = α. The upper bound is what shows a Δ inside the margin, so a
    share s makes "equivalent" cheaper (log(2k/(sα)) instead of log(2kP/α) of log-capital for
    k Δs of P pairs) and "gap" dearer (log(2kP/((1 − s)α)))."""
    _validate_level(alpha)
    _validate_share(upper_share)
    if upper_share == 0.0 or delta.kind != "range":
        return None
    return upper_share * alpha / len(deltas)


def delta_bounds(
    group_means: np.ndarray,
    kind: DeltaKind,
    level: float,
    *,
    method: Method = "hedged",
    truncation: float = TRUNCATION,
    grid: int = GRID,
    t_opt: float = T_OPT,
    prior_rounds: float = PRIOR_ROUNDS,
    min_rounds: int = 1,
    upper_level: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """CS of one Δ from per-round per-group cluster means, ``group_means`` of shape (…, T, G).

    Entry [t, g] is the mean outcome (in [0, 1]) over the requests of the sources of group g
    added in round t. For ``kind="pair"`` (G = 2) Δ = group 0 − group 1 and its CS has level
    ``level``; for ``kind="range"`` each of the G(G − 1)/2 pair CSs has level ``level`` (pass
    the Bonferroni level, :func:`pair_level`) and Δ = max − min gets
    [max(0, max_ab max(L_ab, −U_ab)), max_ab max(U_ab, −L_ab)]. With ``upper_level`` (a range
    Δ; :func:`upper_level`) the pair CSs are computed a second time at that level and the
    upper bound is the smaller of the two upper bounds. Returns ``(lower, upper)`` of shape
    (…, T), rate units. The other keywords are :func:`difference_confidence_sequence`'s.
    """
    means = np.asarray(group_means, dtype=float)
    if means.ndim < 2 or means.shape[-1] < 2:
        raise ValueError("group_means must have shape (..., rounds, groups) with 2+ groups")
    if kind == "pair" and means.shape[-1] != 2:
        raise ValueError("a pair Δ needs exactly two groups")
    _validate_unit(np.moveaxis(means, -1, -2), "group means")
    a, b = group_pairs(means.shape[-1])
    differences = np.moveaxis(means[..., a] - means[..., b], -1, -2)  # (..., pairs, T)
    options = {"method": method, "truncation": truncation, "grid": grid, "t_opt": t_opt,
               "prior_rounds": prior_rounds, "min_rounds": min_rounds}
    if kind == "pair":
        low, high = difference_confidence_sequence(differences, level, **options)  # type: ignore[arg-type]
        return low[..., 0, :], high[..., 0, :]
    lower, upper, _, _ = range_bounds(differences, level, upper_level=upper_level, **options)  # type: ignore[arg-type]
    return lower, upper


def range_bounds(
    differences: np.ndarray,
    level: float,
    *,
    upper_level: float | None = None,
    method: Method = "hedged",
    truncation: float = TRUNCATION,
    grid: int = GRID,
    t_opt: float = T_OPT,
    prior_rounds: float = PRIOR_ROUNDS,
    min_rounds: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CS of a range Δ from its per-round pair differences, ``differences`` of shape
    (…, pairs, T): the pair CSs at ``level`` give :func:`range_from_pairs`' bounds; with
    ``upper_level`` they are computed a second time at that level and Δ's upper bound is the
    smaller of the two (:func:`upper_level`). Returns ``(lower, upper)`` of shape (…, T) and
    the pair CSs at ``level``, ``(pair_lower, pair_upper)`` of shape (…, pairs, T). What
    :func:`delta_bounds` computes for ``kind="range"``; the simulation studies call it for the
    pair CSs as well."""
    options = {"method": method, "truncation": truncation, "grid": grid, "t_opt": t_opt,
               "prior_rounds": prior_rounds, "min_rounds": min_rounds}
    low, high = difference_confidence_sequence(differences, level, **options)  # type: ignore[arg-type]
    lower, upper = range_from_pairs(low, high)
    if upper_level is not None:
        _validate_level(upper_level)
        wide_low, wide_high = difference_confidence_sequence(differences, upper_level,
                                                             **options)  # type: ignore[arg-type]
        upper = np.minimum(upper, range_from_pairs(wide_low, wide_high)[1])
    return lower, upper, low, high


def range_from_pairs(pair_lower: np.ndarray, pair_upper: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """CS of Δ = max − min from simultaneous CSs of its pair gaps, (…, pairs, T) each:
    [max(0, max_ab max(L_ab, −U_ab)), max_ab max(U_ab, −L_ab)] of shape (…, T). If every
    pair's CS covers its gap d_ab then Δ = max_ab |d_ab| lies in it."""
    low, high = np.asarray(pair_lower), np.asarray(pair_upper)
    lower = np.maximum(np.maximum(low, -high).max(axis=-2), 0.0)
    upper = np.maximum(high, -low).max(axis=-2)
    return lower, upper


def is_gap(lower: np.ndarray | float, upper: np.ndarray | float) -> np.ndarray:
    """Whether a CS excludes 0 (strictly: a bound at 0, to 1e-12, keeps 0 in the set)."""
    return (np.asarray(lower) > _EDGE) | (np.asarray(upper) < -_EDGE)


def is_equivalent(lower: np.ndarray | float, upper: np.ndarray | float,
                  margin: float | None) -> np.ndarray:
    """Whether a CS lies inside the closed margin [−margin, +margin], to 1e-12 (never, for
    None)."""
    low, high = np.asarray(lower), np.asarray(upper)
    if margin is None:
        return np.zeros(np.broadcast(low, high).shape, dtype=bool)
    return (low >= -margin - _EDGE) & (high <= margin + _EDGE)


def decide(lower: float, upper: float, margin: float | None) -> Decision:
    """The decision a CS [lower, upper] (rate units) supports.

    ``"gap"`` when it excludes 0 (lower > 0 or upper < 0); else ``"equivalent"`` when it lies
    inside [−margin, +margin] (bounds on the margin count as inside); else ``"undecided"``. A
    CS that excludes 0 *and* lies inside the margin is a gap: the gap is real, and its CS
    says it is small.
    """
    if bool(is_gap(lower, upper)):
        return "gap"
    if bool(is_equivalent(lower, upper, margin)):
        return "equivalent"
    return "undecided"


def first_decided_round(lower: np.ndarray, upper: np.ndarray, margin: float | None
                        ) -> np.ndarray:
    """Per sequence, the first round (1-based) at which ``(lower, upper)`` (…, T) is decided
    (gap or equivalent), 0 where it never is within the T rounds."""
    decided = is_gap(lower, upper) | is_equivalent(lower, upper, margin)
    return np.where(decided.any(axis=-1), np.argmax(decided, axis=-1) + 1, 0)


def stop_rounds(first_decided: Sequence[np.ndarray] | np.ndarray, rounds_seen: int,
                max_rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """Stopping round and reason from each Δ's :func:`first_decided_round`.

    The audit stops after the first round at which every Δ is decided ("decided"), or after
    ``max_rounds`` ("budget"); with ``rounds_seen`` < ``max_rounds`` rounds and a Δ still
    undecided it goes on ("continue", round 0). Returns (round, reason) arrays over the
    sequences (shape of one entry of ``first_decided``).
    """
    if max_rounds < 1:
        raise ValueError("max_rounds must be at least 1")
    stacked = np.stack([np.asarray(f) for f in first_decided])
    every = np.where((stacked > 0).all(axis=0), stacked.max(axis=0), 0)
    decided = (every > 0) & (every <= max_rounds)
    budget = ~decided & (rounds_seen >= max_rounds)
    stop = np.where(decided, every, np.where(budget, max_rounds, 0))
    reason = np.where(decided, "decided", np.where(budget, "budget", "continue"))
    return stop, reason


def budget_rounds(requests_per_round: int, max_rounds: int | None = None,
                  max_requests: int | None = None) -> int:
    """The audit's budget in rounds: ``max_rounds``, or the most whole rounds that fit in
    ``max_requests`` (requests_per_round = sources per group per round x groups x prompts x
    seeds), or the smaller of the two."""
    if requests_per_round < 1:
        raise ValueError("requests_per_round must be at least 1")
    limits = [r for r in (max_rounds, None if max_requests is None
                          else max_requests // requests_per_round) if r is not None]
    if not limits:
        raise ValueError("give max_rounds or max_requests")
    rounds = min(limits)
    if rounds < 1:
        raise ValueError("the budget does not cover one round")
    return int(rounds)


@dataclass(frozen=True)
class DeltaSequence:
    """One declared Δ's CS after each round so far and what it supports.

    ``lower``/``upper`` (rate units) have one entry per round; ``level`` is the level of each
    of its pair CSs; ``upper_level`` that of the pair CSs of its upper bound alone (None: the
    upper bound is taken from the same CSs, :func:`upper_level`); ``decided_round`` the first
    round at which it was decided (0: not yet); ``decision`` the decision at the audit's last
    (or stopping) round."""

    name: str
    kind: DeltaKind
    margin: float | None
    level: float
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    decided_round: int
    decision: Decision
    upper_level: float | None = None


@dataclass(frozen=True)
class SequentialResult:
    """Where a sequential audit stands: each Δ's CS, and whether (and why) it stops.

    ``stop_round`` is the round after which it stopped (0 while it goes on); ``reason`` is
    ``"decided"`` (every Δ decided), ``"budget"`` (``max_rounds`` spent) or ``"continue"``.
    Decisions are read at ``stop_round`` (at the last round while it goes on)."""

    rounds: int
    stop_round: int
    reason: StopReason
    deltas: tuple[DeltaSequence, ...]


def evaluate(
    group_means: Mapping[str, np.ndarray],
    deltas: Sequence[DeclaredDelta],
    alpha: float,
    max_rounds: int,
    *,
    method: Method = "hedged",
    truncation: float = TRUNCATION,
    grid: int = GRID,
    t_opt: float = T_OPT,
    upper_share: float = 0.0,
) -> SequentialResult:
    """Each declared Δ's CS after every round so far, and the stopping decision.

    ``group_means[delta.name]`` is a (T, G) array of per-round per-group cluster means of
    Δ's outcome (groups in the order of ``delta.groups``), the same T for every Δ. Each Δ's
    pair CSs have the Bonferroni level :func:`pair_level`, so all Δs hold together at 1 − α
    uniformly over rounds; the audit stops at the first round where every Δ is decided, or at
    ``max_rounds`` (:func:`stop_rounds`). ``t_opt`` is the asymptotic CS's (its variance
    guard keeps the measured defaults, :data:`PRIOR_ROUNDS` and no ``min_rounds``).
    ``upper_share`` > 0 spends that share of α on each range Δ's upper bound alone
    (:func:`upper_level`); the pair CSs then have (1 − share) of the Bonferroni level.
    """
    if not deltas:
        raise ValueError("declare at least one Δ")
    names = [d.name for d in deltas]
    if len(set(names)) != len(names):
        raise ValueError("every declared Δ needs its own name")
    arrays = {}
    for delta in deltas:
        if delta.name not in group_means:
            raise ValueError(f"no group means for Δ {delta.name!r}")
        means = np.asarray(group_means[delta.name], dtype=float)
        if means.ndim != 2 or means.shape[1] != len(delta.groups):
            raise ValueError(f"{delta.name}: group means must have shape (rounds, "
                             f"{len(delta.groups)})")
        arrays[delta.name] = means
    rounds = {a.shape[0] for a in arrays.values()}
    if len(rounds) != 1:
        raise ValueError("every Δ needs the same number of rounds")
    seen = rounds.pop()
    bounds, first = [], []
    for delta in deltas:
        level = pair_level(alpha, deltas, delta, upper_share)
        top = upper_level(alpha, deltas, delta, upper_share)
        low, high = delta_bounds(arrays[delta.name], delta.kind, level, method=method,
                                 truncation=truncation, grid=grid, t_opt=t_opt, upper_level=top)
        bounds.append((level, top, low, high))
        first.append(first_decided_round(low, high, delta.margin))
    stop, reason = stop_rounds([np.asarray(f) for f in first], seen, max_rounds)
    at = int(stop) if int(stop) > 0 else seen
    sequences = tuple(
        DeltaSequence(
            name=delta.name, kind=delta.kind, margin=delta.margin, level=level,
            lower=tuple(float(v) for v in low), upper=tuple(float(v) for v in high),
            decided_round=int(f), decision=decide(float(low[at - 1]), float(high[at - 1]),
                                                  delta.margin), upper_level=top)
        for delta, (level, top, low, high), f in zip(deltas, bounds, first, strict=True))
    return SequentialResult(rounds=seen, stop_round=int(stop),
                            reason=cast(StopReason, str(reason)), deltas=sequences)


@dataclass(frozen=True)
class RoundObservation:
    """One round's observations: for each declared Δ (by name), the cluster mean of its
    outcome over the round's sources of each of its groups (in [0, 1], in the order of
    ``DeclaredDelta.groups``), and the ids of the sources the round added."""

    means: Mapping[str, tuple[float, ...]]
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class SequentialState:
    """Everything a sequential audit needs to resume: its declaration and the rounds so far.

    A killed audit reloads this (:meth:`from_json`), :meth:`evaluate`\\ s it and starts at round
    ``len(rounds) + 1``; the CS is a function of the observations only, so resuming gives the
    same intervals and decisions as an audit that never stopped. Immutable: :meth:`add_round`
    returns a new state. ``t_opt`` is used by ``method="asymptotic"`` only (a file written
    before it was stored reads with the default, :data:`T_OPT`); ``upper_share`` is
    :func:`evaluate`'s (a file without it reads as 0, what it was written with).
    """

    deltas: tuple[DeclaredDelta, ...]
    alpha: float
    max_rounds: int
    method: Method = "hedged"
    truncation: float = TRUNCATION
    grid: int = GRID
    rounds: tuple[RoundObservation, ...] = field(default_factory=tuple)
    t_opt: float = T_OPT
    upper_share: float = 0.0

    def __post_init__(self) -> None:
        _validate_level(self.alpha)
        _validate_share(self.upper_share)
        if not self.t_opt > 0:
            raise ValueError(f"t_opt must be positive, not {self.t_opt}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, not {self.method!r}")
        if self.max_rounds < 1:
            raise ValueError("max_rounds must be at least 1")
        if not self.deltas:
            raise ValueError("declare at least one Δ")
        if len({d.name for d in self.deltas}) != len(self.deltas):
            raise ValueError("every declared Δ needs its own name")

    def add_round(self, means: Mapping[str, Sequence[float]],
                  sources: Sequence[str] = ()) -> SequentialState:
        """This state with one more round: ``means[name]`` gives the round's cluster mean per
        group of each declared Δ."""
        if len(self.rounds) >= self.max_rounds:
            raise ValueError(f"the budget of {self.max_rounds} rounds is spent")
        unknown = sorted(set(means) - {d.name for d in self.deltas})
        if unknown:
            raise ValueError(f"no declared Δ named {unknown}")
        checked: dict[str, tuple[float, ...]] = {}
        for delta in self.deltas:
            if delta.name not in means:
                raise ValueError(f"round {len(self.rounds) + 1} has no means for {delta.name!r}")
            values = tuple(float(v) for v in means[delta.name])
            if len(values) != len(delta.groups):
                raise ValueError(f"{delta.name}: {len(delta.groups)} group means expected, "
                                 f"got {len(values)}")
            if any(not 0.0 <= v <= 1.0 for v in values):  # NaN fails too
                raise ValueError(f"{delta.name}: group means must lie in [0, 1]")
            checked[delta.name] = values
        observation = RoundObservation(means=checked, sources=tuple(sources))
        return replace(self, rounds=(*self.rounds, observation))

    def group_means(self, name: str) -> np.ndarray:
        """(rounds, groups) array of the cluster means of Δ ``name``."""
        delta = next(d for d in self.deltas if d.name == name)
        return np.array([r.means[name] for r in self.rounds],
                        dtype=float).reshape(len(self.rounds), len(delta.groups))

    def evaluate(self) -> SequentialResult:
        """:func:`evaluate` on the rounds so far (at least one)."""
        if not self.rounds:
            raise ValueError("no rounds yet")
        return evaluate({d.name: self.group_means(d.name) for d in self.deltas}, self.deltas,
                        self.alpha, self.max_rounds, method=self.method,
                        truncation=self.truncation, grid=self.grid, t_opt=self.t_opt,
                        upper_share=self.upper_share)

    def to_json(self) -> str:
        """The state as JSON text (``version``, the declaration, the rounds)."""
        payload = {
            "version": STATE_VERSION,
            "alpha": self.alpha,
            "max_rounds": self.max_rounds,
            "method": self.method,
            "truncation": self.truncation,
            "grid": self.grid,
            "t_opt": self.t_opt,
            "upper_share": self.upper_share,
            "deltas": [{"name": d.name, "groups": list(d.groups), "margin": d.margin,
                        "kind": d.kind} for d in self.deltas],
            "rounds": [{"means": {k: list(v) for k, v in r.means.items()},
                        "sources": list(r.sources)} for r in self.rounds],
        }
        return json.dumps(payload, indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SequentialState:
        """The state :meth:`to_json` wrote; every round is validated again."""
        try:
            payload = json.loads(text)
            version = payload["version"]
            if version != STATE_VERSION:
                raise InputDataError(
                    f"sequential state version {version!r}; this ACRB reads version "
                    f"{STATE_VERSION}", "resume with the ACRB version that wrote it")
            state = cls(
                deltas=tuple(DeclaredDelta(name=d["name"], groups=tuple(d["groups"]),
                                           margin=d["margin"], kind=d["kind"])
                             for d in payload["deltas"]),
                alpha=float(payload["alpha"]), max_rounds=int(payload["max_rounds"]),
                method=payload["method"], truncation=float(payload["truncation"]),
                grid=int(payload["grid"]), t_opt=float(payload.get("t_opt", T_OPT)),
                upper_share=float(payload.get("upper_share", 0.0)))
            for observation in payload["rounds"]:
                state = state.add_round(observation["means"], observation["sources"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputDataError(f"not a sequential audit state: {exc}",
                                 "restore the state file, or restart the audit") from exc
        return state
