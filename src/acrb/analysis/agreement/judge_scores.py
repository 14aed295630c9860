"""Tests of group differences in a judge's scores (ordinal, 1-5).

- :func:`kruskal_dunn`: Kruskal-Wallis across groups with Dunn's pairwise post hoc test, on
  each source's mean score by default (the source image is the independent unit).
- :func:`ordinal_model`: proportional-odds (cumulative logit) model of the score on the
  groups, with odds ratios, tested by a robust score test clustered on source image.

Used once VLM judges score the edits. Why the source is the unit and what the request-level and
Wald versions do under clustering: ``docs/statistics.md#judge-scores``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from acrb.analysis.frame import (
    CLUSTER_COLUMN,
    check_columns,
    check_dimension,
    checked_frame,
    group_series,
    usable_rows,
)
from acrb.analysis.tests.gee import (
    MAX_ABS_LOG_ODDS,
    convergence_problems,
    empty_odds_ratio_table,
    odds_ratio_table,
    treatment_dummies,
)
from acrb.analysis.tests.pvalues import TestResult, holm

#: The tests :func:`ordinal_model` offers.
ORDINAL_TESTS: tuple[str, ...] = ("score", "wald", "lr")


@dataclass(frozen=True, eq=False)
class KruskalDunnResult(TestResult):
    """Kruskal-Wallis H test with Dunn's pairwise post hoc test.

    ``posthoc`` is the square matrix of Holm-adjusted pairwise p-values returned by
    ``scikit_posthocs.posthoc_dunn`` (groups as index and columns; empty when the omnibus
    test could not be computed). ``unit`` is what one observation is: a request, or a
    source's mean score. ``n_missing``: usable requests without a score (dropped).
    """

    n_missing: int = 0
    n_groups: int = 0
    unit: str = "source"
    posthoc: pd.DataFrame = field(default_factory=pd.DataFrame)


@dataclass(frozen=True, eq=False)
class OrdinalResult(TestResult):
    """Proportional-odds (cumulative logit) test of a dimension on a judge score.

    ``odds_ratios`` (columns :data:`acrb.analysis.tests.gee.ODDS_RATIO_COLUMNS`): per non-reference
    group, the odds ratio of a *higher* score against ``reference``, with Wald interval and
    p-value (cluster-robust when clustered). ``n_missing``: usable requests without a score
    (dropped). ``notes``: why the odds ratios are missing, when they are.
    """

    n_missing: int = 0
    reference: str | None = None
    odds_ratios: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: tuple[str, ...] = ()


def _score_rows(
    frame: pd.DataFrame, score_column: str, dimension: str, extra: Sequence[str] = ()
) -> tuple[pd.DataFrame, int]:
    """Usable rows with a score: columns ``score`` (float), ``group`` (+ ``extra``); and how
    many usable rows had no score (NaN, NA: abstentions, refused requests)."""
    frame = checked_frame(frame)
    check_dimension(dimension)
    check_columns(frame, ["status", dimension, score_column, *extra])
    usable = usable_rows(frame)
    group = group_series(usable, dimension)
    score = pd.to_numeric(usable[score_column], errors="coerce").astype("Float64")
    has_group = group.notna().to_numpy()
    has_score = score.notna().to_numpy()
    keep = has_group & has_score
    rows = pd.DataFrame(
        {
            "score": score[keep].to_numpy(dtype=float),
            "group": group[keep].cat.remove_unused_categories().array,
        }
    )
    for column in extra:
        rows[column] = usable[column][keep].to_numpy()
    return rows, int((has_group & ~has_score).sum())


def kruskal_dunn(
    frame: pd.DataFrame,
    score_column: str,
    dimension: str,
    *,
    unit: str = "source",
) -> KruskalDunnResult:
    """Kruskal-Wallis test of a judge score across groups, with Dunn's post hoc test.

    Omnibus: ``scipy.stats.kruskal`` (Kruskal & Wallis 1952; tie-corrected H, df = groups − 1).
    Pairwise: ``scikit_posthocs.posthoc_dunn`` (Dunn 1964, "Multiple comparisons using rank
    sums", Technometrics 6:241-252, with the tie correction), Holm adjusted over the pairs
    (:func:`acrb.analysis.tests.pvalues.holm`, the values of its ``p_adjust="holm"``). Usable
    requests whose score is missing (NaN / NA: abstention, refusal) are dropped and counted in
    ``n_missing``.

    ``unit="source"`` (default) first averages each source's scores (needs ``source_id``) and
    compares the source means (``n`` counts sources): a valid test with the source image as
    the independent unit, which is what race, gender and age are attributes of.
    ``unit="request"`` ranks every request's score as if requests were independent; a
    source's requests share its image, so when scores cluster by source this overstates the
    evidence badly (measured in ``docs/statistics.md#judge-scores``). Use it only for data
    without source clustering.
    """
    if unit not in ("request", "source"):
        raise ValueError("unit must be 'request' or 'source'")
    extra = [CLUSTER_COLUMN] if unit == "source" else []
    rows, missing = _score_rows(frame, score_column, dimension, extra)
    if unit == "source":
        rows = (
            rows.groupby([CLUSTER_COLUMN, "group"], observed=True)["score"].mean().reset_index()
        )
    method = f"kruskal-wallis + dunn (holm), unit={unit}"
    samples = [s["score"].to_numpy() for _, s in rows.groupby("group", observed=True)]
    groups = len(samples)

    def failed(reason: str) -> KruskalDunnResult:
        return KruskalDunnResult(
            method, math.nan, math.nan, math.nan, len(rows), reason=reason,
            n_missing=missing, n_groups=groups, unit=unit,
        )

    if groups < 2:
        return failed("fewer than two groups with scores")
    if rows["score"].nunique() < 2:
        return failed("every score is the same: no ranks to compare")
    import scikit_posthocs
    from scipy import stats

    result = stats.kruskal(*samples)
    posthoc = scikit_posthocs.posthoc_dunn(
        rows.assign(group=rows["group"].astype(str)),
        val_col="score",
        group_col="group",
    )
    # Holm over the pairs (the upper triangle), mirrored, as posthoc_dunn(p_adjust="holm")
    # does, without statsmodels' garbage collection on every call (see pvalues.holm).
    pairs = posthoc.to_numpy(dtype=float, copy=True)
    upper = np.triu_indices(len(pairs), 1)
    pairs[upper] = holm(pairs[upper])
    lower = np.tril_indices(len(pairs), -1)
    pairs[lower] = pairs.T[lower]
    posthoc = pd.DataFrame(pairs, index=posthoc.index, columns=posthoc.columns)
    order = [str(g) for g in rows["group"].cat.categories]
    posthoc = posthoc.reindex(index=order, columns=order)
    return KruskalDunnResult(
        method, float(result.statistic), float(groups - 1), float(result.pvalue), len(rows),
        n_missing=missing, n_groups=groups, unit=unit, posthoc=posthoc,
    )


def ordinal_model(
    frame: pd.DataFrame,
    score_column: str,
    dimension: str,
    *,
    reference: str | None = None,
    test: str = "score",
    cluster: str | None = CLUSTER_COLUMN,
    confidence: float = 0.95,
) -> OrdinalResult:
    """Proportional-odds (cumulative logit) model of a judge score on group dummies.

    Model: logit P(score ≤ j) = θ_j − x'β with x the treatment-coded group indicators
    (``reference`` group, default the first present in vocabulary order), fitted by maximum
    likelihood (McCullagh 1980, "Regression models for ordinal data", JRSS-B 42:109-142;
    ``statsmodels.miscmodels.ordinal_model.OrderedModel(distr="logit")``). ``odds_ratios``:
    exp(β), the odds of a *higher* score against the reference group, with Wald intervals
    from the cluster-robust covariance (clusters = ``cluster``; model-based when
    ``cluster=None``). Only the score levels observed are modelled (an unused level has no
    estimable threshold). Missing scores are dropped and counted (``n_missing``).

    Test that all β = 0 (df = groups − 1), by ``test``:

    - ``"score"`` (default): robust score test of the same cumulative-logit model fitted as a
      GEE with clusters = ``cluster`` (``statsmodels`` ``OrdinalGEE``, independence working
      correlation, ``compare_score_test`` against the thresholds-only model; Lipsitz, Kim &
      Zhao 1994, "Analysis of repeated categorical data using generalized estimating
      equations", Stat Med 13:1149-1163; Boos 1992). Scores of one source are correlated,
      and every group contrast is between sources.
    - ``"wald"``: Wald χ² of the OrderedModel fit with the cluster-robust covariance. Too
      liberal for dimensions with few sources per group (race: measured in
      ``docs/statistics.md#judge-scores``), and so are the odds-ratio intervals.
    - ``"lr"``: likelihood-ratio test against the thresholds-only OrderedModel, which treats
      requests as independent (only for data without clustering). Used whenever ``cluster``
      is None or not a column of the frame.

    NaN ``p_value`` with ``reason``: fewer than two groups or score levels, a fit that does
    not converge, or (``wald``, ``lr``) diverging coefficients (a group whose scores all lie
    at one end). The score test is evaluated under the null and survives such separation;
    the odds ratios are then NaN (``notes``).
    """
    import statsmodels.api as sm
    from scipy import stats
    from statsmodels.genmod.generalized_estimating_equations import OrdinalGEE

    from acrb.analysis.tests.ordered_logit import LogitOrderedModel

    vocabulary = check_dimension(dimension)
    if test not in ORDINAL_TESTS:
        raise ValueError(f"unknown test '{test}'; expected one of {ORDINAL_TESTS}")
    if reference is not None and reference not in vocabulary:
        raise ValueError(f"reference '{reference}' is not a {dimension} value")
    use_cluster = cluster is not None and cluster in frame.columns
    if not use_cluster:
        test = "lr"
    extra = [cluster] if use_cluster and cluster is not None else []
    rows, missing = _score_rows(frame, score_column, dimension, extra)
    present = list(rows["group"].cat.categories)
    base = reference if reference in present else (present[0] if present else None)
    method = "proportional odds (logit), " + {
        "score": f"robust score test (OrdinalGEE, clusters={cluster})",
        "wald": f"Wald test (cluster-robust, clusters={cluster})",
        "lr": "likelihood-ratio test (independent requests)",
    }[test]
    notes: list[str] = []

    def result(statistic: float, df: float, p_value: float, reason: str | None, odds=None):
        return OrdinalResult(
            method, statistic, df, p_value, len(rows), reason=reason, n_missing=missing,
            reference=base, odds_ratios=empty_odds_ratio_table() if odds is None else odds,
            notes=tuple(notes),
        )

    nan = math.nan
    if len(present) < 2:
        return result(nan, nan, nan, "fewer than two groups with scores")
    levels = np.sort(rows["score"].unique())
    if len(levels) < 2:
        return result(nan, nan, nan, "fewer than two score levels observed")
    ordered = [base, *[g for g in present if g != base]]
    matrix, names = treatment_dummies(
        pd.Categorical(rows["group"].astype(str), categories=ordered), "g"
    )
    names = [n.split("[T.", 1)[1].rstrip("]") for n in names]
    exog = pd.DataFrame(matrix, columns=names)
    endog = pd.Series(pd.Categorical(rows["score"], categories=levels, ordered=True))
    clusters = pd.factorize(rows[cluster])[0] if use_cluster else None

    # Estimates: the proportional-odds MLE.
    fit_kwargs: dict[str, Any] = {"method": "bfgs", "disp": False, "maxiter": 500}
    if clusters is not None:
        fit_kwargs.update(cov_type="cluster", cov_kwds={"groups": clusters})
    with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
        warnings.simplefilter("always")
        fitted = LogitOrderedModel(endog, exog, distr="logit").fit(**fit_kwargs)
    fit_problem: str | None = None
    problems = convergence_problems(caught)
    params = pd.Series(np.asarray(fitted.params), index=list(fitted.model.exog_names))
    if problems or not fitted.mle_retvals.get("converged", True):
        fit_problem = "ordinal model did not converge" + (f": {problems[0]}" if problems else "")
    elif not np.all(np.isfinite(params)) or np.abs(params[names]).max() > MAX_ABS_LOG_ODDS:
        fit_problem = "a coefficient diverges (|log odds ratio| > 15): separation"
    odds = None
    if fit_problem is None:
        cov = pd.DataFrame(
            np.asarray(fitted.cov_params()), index=params.index, columns=params.index
        )
        labels = {n: f"g[T.{n}]" for n in names}
        odds = odds_ratio_table(
            params.rename(labels), cov.rename(index=labels, columns=labels),
            list(labels.values()), confidence,
        )
    else:
        notes.append(f"odds ratios not available: {fit_problem}")

    if test == "score":
        assert clusters is not None
        y = rows["score"].to_numpy()
        with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
            warnings.simplefilter("always")
            try:
                null = OrdinalGEE(
                    y, np.zeros((len(y), 0)), groups=clusters,
                    cov_struct=sm.cov_struct.Independence(),
                ).fit()
                full = OrdinalGEE(y, exog, groups=clusters, cov_struct=sm.cov_struct.Independence())
                score = full.compare_score_test(null)
            except (np.linalg.LinAlgError, ValueError) as error:
                return result(nan, nan, nan, f"score test failed: {error}", odds)
        problems = convergence_problems(caught)
        if score is None or problems or not np.isfinite(score["statistic"]):
            why = problems[0] if problems else "singular score covariance"
            return result(nan, nan, nan, f"score test failed: {why}", odds)
        return result(
            float(score["statistic"]), float(score["df"]), float(score["p-value"]), None, odds
        )
    if fit_problem is not None:
        return result(nan, nan, nan, fit_problem)
    if test == "wald":
        constraints = np.eye(len(params))[: len(names)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wald = fitted.wald_test(constraints, scalar=True)
        return result(float(wald.statistic), float(len(names)), float(wald.pvalue), None, odds)
    with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
        warnings.simplefilter("always")
        null_fit = LogitOrderedModel(endog, None, distr="logit").fit(method="bfgs",
                                                                      disp=False)
    if convergence_problems(caught) or not null_fit.mle_retvals.get("converged", True):
        return result(nan, nan, nan, "thresholds-only ordinal model did not converge", odds)
    statistic = max(2.0 * float(fitted.llf - null_fit.llf), 0.0)
    return result(
        statistic, float(len(names)), float(stats.chi2.sf(statistic, len(names))), None, odds
    )
