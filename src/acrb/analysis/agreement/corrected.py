"""Judge-corrected rates: people's labels on a random sample correct the judges' errors.

A judged outcome (``soft_erasure``, ``judge_lightening``, ... of :mod:`acrb.analysis.outcomes`)
is read from the judges' scores on *every* output, but a judge errs, and may err more for one
group than another: then its group rates and their Δ are biased however many outputs it
reads. People rate a random sample of the outputs (the ``random_sample`` items of the review
set); their labels are unbiased but few. Prediction-powered inference (PPI; Angelopoulos,
Bates, Fannjiang, Jordan & Zrnic 2023, "Prediction-powered inference", Science 382:669-674)
combines the two: for one group, with n labelled outputs (human label Y, judge label Ŷ) and N
other judged outputs (judge label Ŷ only),

    θ̂ = λ · mean(Ŷ_unlabelled) + mean(Y − λ · Ŷ_labelled)

the judge's rate plus a *rectifier* (the mean error of the judge measured where people looked),
with standard error sqrt(λ² Var(Ŷ_unlabelled) / N + Var(Y − λ Ŷ) / n) and a normal interval.
λ is PPI++'s power tuning (Angelopoulos, Duchi & Zrnic 2023, "PPI++: Efficient
prediction-powered inference", arXiv:2311.01453): λ = Cov(Y, Ŷ) / ((1 + n/N) Var(Ŷ)), clipped
to [0, 1] (:func:`power_tuned_lambda`, the value ``ppi_py`` computes when given no λ); λ = 1 is
plain PPI, λ = 0 the human-only mean. The point estimate and interval of a group are
``ppi_py.ppi_mean_pointestimate`` and ``ppi_py.ppi_mean_ci`` with that λ.

**Δ between two groups** (the audit's disparity; ``ppi_py`` has no two-sample version): the
groups are disjoint samples (a source belongs to one group, and labelled and unlabelled sets are
drawn within each), so the two PPI estimates are independent and their variances add:
Δ̂ = θ̂_a − θ̂_b, SE(Δ̂) = sqrt(SE_a² + SE_b²), normal interval. The formula is ours (a
two-sample version of the paper's mean estimator), checked by simulation in
``benchmarks/ppi_coverage.py``.

**What counts**: only outputs the judges scored (outcome not NA) are estimated over, so the
estimand is each group's rate among judged outputs, as for the judge-only rate. The labelled
set is the ``random_sample`` items whose human consensus gives the outcome (an item added
because the judges disagreed is not a random draw and is never labelled here); the unlabelled
set is every other judged output of the group, so labelled and unlabelled outputs are
disjoint, as PPI assumes. The human label is the outcome rule of params ``judge.outcomes``
applied to the human consensus score (:func:`acrb.analysis.agreement.raters.human_consensus`), the
same rule the judge outcome was read with.

**Limits**: outputs count as independent (the review samples one output per item; the judge-labelled
outputs of one source are correlated, so the imputed term's variance is somewhat understated for
clustered audits); a rate interval is clipped to [0, 1] and a Δ interval to [-1, 1]. The judge-only
and human-only intervals beside it are Wilson intervals for rates
(:func:`acrb.analysis.estimation.rates.wilson_interval`) and Newcombe's hybrid score interval for Δ
(Newcombe 1998, Stat Med 17:873-890, ``statsmodels``'s ``confint_proportions_2indep``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from acrb.analysis.agreement.raters import human_consensus
from acrb.analysis.estimation.rates import wilson_interval
from acrb.analysis.frame import check_columns, usable_rows
from acrb.config import ConsensusRule, OutcomeRule
from acrb.demographics import SOURCE_DIMENSIONS
from acrb.errors import InputDataError

Estimator = Literal["judge", "human", "ppi"]
#: The estimators of every table, in the order rows list them.
ESTIMATORS: tuple[Estimator, ...] = ("judge", "human", "ppi")

CORRECTED_RATE_COLUMNS: tuple[str, ...] = ("outcome", "dimension", "group", "estimator",
                                           "n_labelled", "n_unlabelled", "rate", "ci_low",
                                           "ci_high", "se", "lam", "note")
CORRECTED_DELTA_COLUMNS: tuple[str, ...] = ("outcome", "dimension", "group_a", "group_b",
                                            "estimator", "delta", "ci_low", "ci_high", "se",
                                            "note")


@dataclass(frozen=True)
class RateEstimate:
    """One group's rate by one estimator.

    ``k``/``n``: positives and outputs behind a judge-only or human-only rate (for Newcombe's
    Δ interval); ``se``: the standard error of a PPI estimate (NaN for the others); ``lam``:
    PPI's λ.
    """

    estimator: Estimator
    rate: float
    ci_low: float
    ci_high: float
    n_labelled: int
    n_unlabelled: int
    k: int = 0
    n: int = 0
    se: float = math.nan
    lam: float = math.nan
    note: str = ""


@dataclass(frozen=True)
class DeltaEstimate:
    """Δ = rate(a) − rate(b) by one estimator, with its interval."""

    estimator: Estimator
    delta: float
    ci_low: float
    ci_high: float
    se: float = math.nan
    note: str = ""


def _as_array(values: Sequence[float] | np.ndarray | pd.Series) -> np.ndarray:
    return np.asarray(values, dtype=float).reshape(-1)


def power_tuned_lambda(y: np.ndarray, yhat: np.ndarray, yhat_unlabelled: np.ndarray) -> float:
    """PPI++'s λ for a mean: Cov(Y, Ŷ) / ((1 + n/N) Var(Ŷ)), clipped to [0, 1].

    Cov over the n labelled outputs (divisor n); Var of Ŷ over labelled and unlabelled outputs
    together (divisor n + N − 1), the estimates ``ppi_py`` uses. A judge that gives one answer
    everywhere carries no information: λ = 0.
    """
    n, big_n = len(y), len(yhat_unlabelled)
    variance = float(np.var(np.concatenate([yhat, yhat_unlabelled]), ddof=1))
    if n == 0 or big_n == 0 or variance <= 0:
        return 0.0
    covariance = float(np.mean((y - y.mean()) * (yhat - yhat.mean())))
    return float(np.clip(covariance / ((1 + n / big_n) * variance), 0.0, 1.0))


def ppi_rate(
    y: Sequence[float] | np.ndarray | pd.Series,
    yhat: Sequence[float] | np.ndarray | pd.Series,
    yhat_unlabelled: Sequence[float] | np.ndarray | pd.Series,
    confidence: float = 0.95,
    *,
    lam: float | None = None,
) -> RateEstimate:
    """PPI estimate and interval of one group's rate (module docstring).

    ``y``: human labels (0/1) of the labelled outputs; ``yhat``: the judge's labels of the same
    outputs; ``yhat_unlabelled``: the judge's labels of the group's other outputs. ``lam``:
    None = power-tuned (:func:`power_tuned_lambda`), 1 = plain PPI. With fewer than two labelled
    outputs there is no estimate; with no unlabelled output it is the human-only mean.
    """
    from ppi_py import ppi_mean_ci, ppi_mean_pointestimate  # heavy-ish import, only here
    from scipy import stats

    y_, yhat_, unl = _as_array(y), _as_array(yhat), _as_array(yhat_unlabelled)
    if len(y_) != len(yhat_):
        raise ValueError(f"{len(y_)} human labels but {len(yhat_)} judge labels")
    n, big_n = len(y_), len(unl)
    if n < 2:
        return RateEstimate("ppi", math.nan, math.nan, math.nan, n, big_n,
                            note="fewer than two labelled outputs: no estimate")
    if big_n == 0:
        lam_used = 0.0
        note = "no unlabelled output: the human labels alone"
        estimate = float(y_.mean())
        se = float(y_.std() / math.sqrt(n))
    else:
        lam_used = power_tuned_lambda(y_, yhat_, unl) if lam is None else float(lam)
        estimate = float(np.asarray(ppi_mean_pointestimate(y_, yhat_, unl, lam=lam_used)
                                    ).reshape(-1)[0])
        low, high = ppi_mean_ci(y_, yhat_, unl, alpha=1.0 - confidence, lam=lam_used)
        se = float((np.asarray(high).reshape(-1)[0] - np.asarray(low).reshape(-1)[0])
                   / (2 * stats.norm.ppf(0.5 + confidence / 2)))
        note = ""
    z = stats.norm.ppf(0.5 + confidence / 2)
    if float(np.var(y_ - lam_used * yhat_)) == 0.0:
        # Every labelled output gave the same rectified value (all agree with the judge, or
        # λ = 0 and people all said the same): the normal interval's labelled term is 0 by
        # the luck of a small sample, not by certainty. Take at least the uncertainty of the
        # labels alone (the Wilson half-width of the human rate, as a standard error), so a
        # rare outcome on a few labels never gets a zero-width interval.
        low_h, high_h = wilson_interval(np.array([int(y_.sum())]), np.array([n]), confidence)
        floor = float(high_h[0] - low_h[0]) / (2 * z)
        if floor > se:
            se = floor
            note = ("; ".join(x for x in (note, "labelled outputs all alike: interval widened "
                                          "to the labels' own (Wilson) uncertainty") if x))
    return RateEstimate("ppi", estimate, max(0.0, estimate - z * se), min(1.0, estimate + z * se),
                        n, big_n, se=se, lam=lam_used, note=note)


def count_rate(estimator: Literal["judge", "human"], labels: np.ndarray, n_labelled: int,
               n_unlabelled: int, confidence: float = 0.95) -> RateEstimate:
    """A plain rate k/n of 0/1 ``labels`` with its Wilson interval."""
    k, n = int(np.sum(labels)), len(labels)
    low, high = wilson_interval(np.array([k]), np.array([n]), confidence)
    return RateEstimate(estimator, k / n if n else math.nan, float(low[0]), float(high[0]),
                        n_labelled, n_unlabelled, k=k, n=n,
                        note="" if n else "no output")


def delta(a: RateEstimate, b: RateEstimate, confidence: float = 0.95) -> DeltaEstimate:
    """Δ = a − b with its interval: for PPI the sum-of-variances normal interval (independent
    groups), for judge-only and human-only counts Newcombe's hybrid score interval."""
    from scipy import stats
    from statsmodels.stats.proportion import confint_proportions_2indep

    if a.estimator != b.estimator:
        raise ValueError(f"cannot take Δ of a {a.estimator} and a {b.estimator} estimate")
    value = a.rate - b.rate
    if not (math.isfinite(a.rate) and math.isfinite(b.rate)):
        return DeltaEstimate(a.estimator, math.nan, math.nan, math.nan,
                             note="a group has no estimate")
    if a.estimator == "ppi":
        se = math.sqrt(a.se ** 2 + b.se ** 2)
        z = stats.norm.ppf(0.5 + confidence / 2)
        return DeltaEstimate("ppi", value, max(-1.0, value - z * se), min(1.0, value + z * se),
                             se=se)
    low, high = confint_proportions_2indep(a.k, a.n, b.k, b.n, method="newcomb",
                                           compare="diff", alpha=1.0 - confidence)
    return DeltaEstimate(a.estimator, value, float(low), float(high))


def group_estimates(y: np.ndarray, yhat: np.ndarray, yhat_unlabelled: np.ndarray,
                    confidence: float = 0.95) -> dict[Estimator, RateEstimate]:
    """The judge-only (every judged output), human-only (the labelled outputs) and PPI
    estimate of one group's rate."""
    n, big_n = len(y), len(yhat_unlabelled)
    return {
        "judge": count_rate("judge", np.concatenate([yhat, yhat_unlabelled]), n, big_n,
                            confidence),
        "human": count_rate("human", y, n, big_n, confidence),
        "ppi": ppi_rate(y, yhat, yhat_unlabelled, confidence),
    }


# --------------------------------------------------------------------------------------------
# From review tables to the labelled frame


def human_outcomes(ratings: pd.DataFrame, items: pd.DataFrame, rule: OutcomeRule,
                   output: str = "edited", consensus_rule: ConsensusRule = "median"
                   ) -> pd.DataFrame:
    """The human label of each random-sample item's ``output``: ``rule`` (a ``judge.outcomes``
    entry) applied to the human consensus on its axis. Columns ``request_id``, ``item_id``,
    ``human`` (boolean, NA where nobody could tell). Items outside the random sample, and
    items ACRB did not generate (no request id), are left out. ``consensus_rule``: as
    :func:`acrb.analysis.agreement.raters.human_consensus`.
    """
    check_columns(items, ["item_id", "request_id", "paired_request_id", "random_sample"])
    consensus = human_consensus(ratings, axes=(rule.axis,), rule=consensus_rule)
    consensus = consensus.loc[consensus["output"] == output]
    sampled = items.loc[items["random_sample"].astype(bool)]
    key = "paired_request_id" if output == "feature" else "request_id"
    joined = consensus.merge(sampled[["item_id", key]], on="item_id", how="inner")
    joined = joined.loc[joined[key].notna()]
    human = pd.array([rule.applies(None if pd.isna(s) else float(s))
                      for s in joined[rule.axis]], dtype="boolean")
    return pd.DataFrame({"request_id": joined[key].astype(str).to_numpy(),
                         "item_id": joined["item_id"].to_numpy(), "human": human})


def labelled_frame(frame: pd.DataFrame, outcome: str, human: pd.DataFrame) -> pd.DataFrame:
    """The judged outputs of an analysis frame with their human label where there is one.

    ``frame``: one model's analysis frame with the judge outcome column ``outcome`` (verdict
    columns joined); rows that count (:func:`acrb.analysis.frame.usable_rows`) with the outcome
    observed are kept. ``human``: :func:`human_outcomes`. Columns ``request_id``, the source
    dimensions, ``judge`` (bool) and ``human`` (boolean, NA = unlabelled).
    """
    check_columns(frame, ["request_id", "status", outcome, *SOURCE_DIMENSIONS])
    check_columns(human, ["request_id", "human"])
    rows = usable_rows(frame)
    judge = rows[outcome].astype("boolean")
    rows = rows.loc[judge.notna().to_numpy(dtype=bool)]
    duplicated = human["request_id"].duplicated()
    if duplicated.any():
        raise InputDataError(
            f"request {human.loc[duplicated, 'request_id'].iloc[0]!r} has two human labels",
            "a request is one review item; check the review set for repeated items",
        )
    out = rows[["request_id", *SOURCE_DIMENSIONS]].assign(
        judge=rows[outcome].astype(bool).to_numpy())
    return out.merge(human[["request_id", "human"]], on="request_id", how="left")


def _split(part: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    labelled = part["human"].notna().to_numpy(dtype=bool)
    y = part.loc[labelled, "human"].astype(float).to_numpy()
    yhat = part.loc[labelled, "judge"].astype(float).to_numpy()
    unl = part.loc[~labelled, "judge"].astype(float).to_numpy()
    return y, yhat, unl


def _estimate_row(outcome: str, dimension: str, group: str, est: RateEstimate) -> dict:
    return {"outcome": outcome, "dimension": dimension, "group": group,
            "estimator": est.estimator, "n_labelled": est.n_labelled,
            "n_unlabelled": est.n_unlabelled, "rate": est.rate, "ci_low": est.ci_low,
            "ci_high": est.ci_high, "se": est.se, "lam": est.lam, "note": est.note}


def corrected_rates(labelled: pd.DataFrame, outcome: str, *,
                    dimensions: Sequence[str] = tuple(SOURCE_DIMENSIONS),
                    confidence: float = 0.95) -> pd.DataFrame:
    """Per source group: the judge-only, human-only and PPI rate of ``outcome`` with
    ``confidence`` intervals, from :func:`labelled_frame`; the first rows pool every output
    (dimension and group ``all``). Columns :data:`CORRECTED_RATE_COLUMNS`."""
    rows = []
    cells = [("all", "all", labelled)]
    for dimension in dimensions:
        values = labelled[dimension].astype(str)
        cells += [(dimension, g, labelled.loc[values == g])
                  for g in SOURCE_DIMENSIONS[dimension] if (values == g).any()]
    for dimension, group, part in cells:
        estimates = group_estimates(*_split(part), confidence=confidence)
        rows += [_estimate_row(outcome, dimension, group, estimates[e]) for e in ESTIMATORS]
    return pd.DataFrame(rows, columns=list(CORRECTED_RATE_COLUMNS))


def corrected_deltas(labelled: pd.DataFrame, outcome: str, dimension: str, *,
                     pair: tuple[str, str] | None = None,
                     confidence: float = 0.95) -> pd.DataFrame:
    """Δ between two groups of ``dimension`` by each estimator, with its interval.

    ``pair`` = (a, b): Δ = rate(a) − rate(b), a comparison declared in advance. Without it,
    a and b are the groups with the highest and lowest PPI rate (Δ = max − min, the audit's
    disparity), and every estimator compares that same pair. Since that pair was picked from
    the data, its interval is simultaneous over every pair of the groups (Bonferroni: each at
    confidence 1 − α / (k(k − 1)/2) for k groups), so it covers the chosen pair's difference
    with at least ``confidence`` whichever pair is chosen, as the audit's simultaneous Δ
    intervals do. Columns :data:`CORRECTED_DELTA_COLUMNS`.
    """
    vocabulary = SOURCE_DIMENSIONS.get(dimension)
    if vocabulary is None:
        raise InputDataError(f"unknown source dimension {dimension!r}",
                             f"use one of {list(SOURCE_DIMENSIONS)}")
    values = labelled[dimension].astype(str)
    estimates = {g: group_estimates(*_split(labelled.loc[values == g]), confidence=confidence)
                 for g in vocabulary if (values == g).any()}
    note = ""
    if pair is not None:
        missing = [g for g in pair if g not in estimates]
        if missing:
            raise InputDataError(f"no judged output of {dimension} group(s) {missing}",
                                 f"name two groups present in the frame: {list(estimates)}")
        a, b = pair
    else:
        ranked = sorted((e["ppi"].rate, g) for g, e in estimates.items()
                        if math.isfinite(e["ppi"].rate))
        if len(ranked) < 2:
            return pd.DataFrame([{"outcome": outcome, "dimension": dimension, "group_a": "",
                                  "group_b": "", "estimator": e, "delta": math.nan,
                                  "ci_low": math.nan, "ci_high": math.nan, "se": math.nan,
                                  "note": "fewer than two groups with a PPI estimate"}
                                 for e in ESTIMATORS], columns=list(CORRECTED_DELTA_COLUMNS))
        (_, b), (_, a) = ranked[0], ranked[-1]
        pairs = len(ranked) * (len(ranked) - 1) // 2
        confidence = 1.0 - (1.0 - confidence) / pairs
        note = (f"max - min of the PPI rates; simultaneous interval (Bonferroni over {pairs} "
                "pairs)")
    rows = []
    for estimator in ESTIMATORS:
        d = delta(estimates[a][estimator], estimates[b][estimator], confidence)
        rows.append({"outcome": outcome, "dimension": dimension, "group_a": a, "group_b": b,
                     "estimator": estimator, "delta": d.delta, "ci_low": d.ci_low,
                     "ci_high": d.ci_high, "se": d.se,
                     "note": "; ".join(x for x in (note, d.note) if x)})
    return pd.DataFrame(rows, columns=list(CORRECTED_DELTA_COLUMNS))


__all__ = [
    "CORRECTED_DELTA_COLUMNS",
    "CORRECTED_RATE_COLUMNS",
    "ESTIMATORS",
    "DeltaEstimate",
    "RateEstimate",
    "corrected_deltas",
    "corrected_rates",
    "count_rate",
    "delta",
    "group_estimates",
    "human_outcomes",
    "labelled_frame",
    "power_tuned_lambda",
    "ppi_rate",
]
