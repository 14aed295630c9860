"""Logistic GEE tests of group differences, clustered on source image.

- :func:`gee_group_test`: does a source dimension (race, gender, age) matter for an outcome,
  in any category, differently by category, or as a common effect?
- :func:`model_interaction_test`: do several models treat the groups differently (model x group
  interaction)?

Race, gender and age are properties of the source image, so every group contrast is a contrast
between source images; generalized estimating equations with the source image as the cluster
estimate the population-averaged odds ratios with a sandwich variance that holds whatever the
within-source correlation. Tests are robust generalized score tests by default, which keep
their size with 12-14 sources per group where the sandwich Wald test does not. Why GEE, why
the score test and what was measured: ``docs/statistics.md#gee-tests-clustered-on-source-image``.

The model pieces (treatment coding, design matrices, convergence and separation guards,
odds-ratio tables) are shared with the ordinal model of :mod:`acrb.analysis.agreement.judge_scores`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from acrb.analysis.frame import (
    CLUSTER_COLUMN,
    check_columns,
    check_dimension,
    checked_frame,
    outcome_rows,
)
from acrb.analysis.tests.pvalues import TestResult

if TYPE_CHECKING:  # statsmodels (with scipy.stats) is imported where a model is fitted
    import statsmodels.api as sm

#: A fitted logit coefficient larger than this (|log-odds ratio| > 15, odds ratio > 3e6) means
#: the estimates are running off to infinity: (quasi-)complete separation.
MAX_ABS_LOG_ODDS = 15.0

ODDS_RATIO_COLUMNS: tuple[str, ...] = ("group", "odds_ratio", "ci_low", "ci_high", "p_value")

#: The tests :func:`gee_group_test` and :func:`model_interaction_test` offer.
GEE_TESTS: tuple[str, ...] = ("score", "wald")


@dataclass(frozen=True, eq=False)
class GEEGroupResult:
    """Clustered logistic test of a source dimension (see :func:`gee_group_test`).

    ``statistic``/``df``/``p_value``: χ² test (robust score, or Wald: see ``method``) of every
    group term (main effects and group x category interactions) of
    ``y ~ C(group) * C(category)``: does the group matter in any category?
    ``interaction_*``: the interaction terms alone: does the group effect differ between
    categories? ``main_*``: the group terms of the additive model
    ``y ~ C(group) + C(category)``: is there a group effect common to all categories (more
    powerful when the effect is consistent)? ``odds_ratios``: per non-reference group, the
    category-adjusted population-averaged odds ratio against ``reference`` from the additive
    model, with its Wald interval and p-value (columns :data:`ODDS_RATIO_COLUMNS`).
    ``working_correlation``: the estimated exchangeable within-source correlation.
    ``reason`` / ``interaction_reason`` / ``main_reason`` say why a p-value is NaN; ``notes``
    list categories or terms left out.
    """

    outcome: str
    dimension: str
    method: str
    statistic: float
    df: float
    p_value: float
    interaction_statistic: float
    interaction_df: float
    interaction_p_value: float
    main_statistic: float
    main_df: float
    main_p_value: float
    n: int
    n_clusters: int
    reference: str | None
    odds_ratios: pd.DataFrame
    working_correlation: float = float("nan")
    reason: str | None = None
    interaction_reason: str | None = None
    main_reason: str | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelInteractionResult(TestResult):
    """χ² test of the model x group interaction (see :func:`model_interaction_test`)."""

    outcome: str = ""
    dimension: str = ""
    n_clusters: int = 0
    n_models: int = 0
    notes: tuple[str, ...] = ()


_Block = tuple[np.ndarray, list[str]]

#: statistic, df, p-value, and why the p-value is NaN (None when it is not).
_Test = tuple[float, float, float, str | None]


def treatment_dummies(values: pd.Series | np.ndarray | pd.Categorical, prefix: str) -> _Block:
    """Treatment-coded indicator columns (first level = reference) and their names,
    ``{prefix}[T.{level}]`` as in patsy formulas."""
    codes = pd.Categorical(values)
    levels = list(codes.categories)
    matrix = np.zeros((len(codes), max(len(levels) - 1, 0)))
    for j in range(1, len(levels)):
        matrix[:, j - 1] = codes.codes == j
    return matrix, [f"{prefix}[T.{level}]" for level in levels[1:]]


def _interact(a: _Block, b: _Block) -> _Block:
    (ma, na), (mb, nb) = a, b
    columns = [ma[:, i] * mb[:, j] for i in range(ma.shape[1]) for j in range(mb.shape[1])]
    names = [f"{x}:{y}" for x in na for y in nb]
    matrix = np.column_stack(columns) if columns else np.zeros((ma.shape[0], 0))
    return matrix, names


def _design(n: int, blocks: Sequence[_Block]) -> tuple[pd.DataFrame, list[str]]:
    """Intercept plus ``blocks``, without all-zero or linearly dependent columns.

    Columns are kept greedily left to right (on the Gram matrix), so main effects are kept
    before interactions and an empty group x category cell drops its interaction column.
    Returns the design and the names of the dropped (non-estimable) columns.
    """
    matrix = np.column_stack([np.ones(n), *[m for m, _ in blocks]])
    names = ["Intercept", *[name for _, block_names in blocks for name in block_names]]
    gram = matrix.T @ matrix
    kept: list[int] = []
    dropped: list[str] = []
    for j in range(matrix.shape[1]):
        trial = [*kept, j]
        sub = gram[np.ix_(trial, trial)]
        scale = max(float(np.abs(sub).max()), 1.0)
        if np.linalg.matrix_rank(sub / scale, tol=1e-9) == len(trial):
            kept.append(j)
        else:
            dropped.append(names[j])
    return pd.DataFrame(matrix[:, kept], columns=[names[j] for j in kept]), dropped


def _gee(y: np.ndarray, exog: pd.DataFrame, clusters: np.ndarray) -> sm.GEE:
    import statsmodels.api as sm

    return sm.GEE(
        y,
        exog,
        groups=clusters,
        family=sm.families.Binomial(),
        cov_struct=sm.cov_struct.Exchangeable(),
    )


@dataclass
class _Fit:
    """A fitted GEE, or why there is none."""

    results: Any = None
    reason: str | None = None

    @property
    def params(self) -> pd.Series:
        return pd.Series(np.asarray(self.results.params), index=self.results.model.exog_names)

    @property
    def cov(self) -> pd.DataFrame:
        names = self.results.model.exog_names
        return pd.DataFrame(np.asarray(self.results.cov_params()), index=names, columns=names)

    @property
    def dependence(self) -> float:
        if self.results is None:
            return math.nan
        return float(np.asarray(self.results.model.cov_struct.dep_params).ravel()[0])


def convergence_problems(caught: list[warnings.WarningMessage]) -> list[str]:
    """The messages of the statsmodels ``ConvergenceWarning``s among ``caught``."""
    from statsmodels.tools.sm_exceptions import ConvergenceWarning

    return [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]


def _fit(model: sm.GEE, cov_type: str) -> _Fit:
    """Fit a GEE, turning failures, non-convergence and diverging estimates into a reason."""
    with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
        warnings.simplefilter("always")
        try:
            results = model.fit(cov_type=cov_type)
        except (np.linalg.LinAlgError, ValueError, ZeroDivisionError) as error:
            return _Fit(reason=f"GEE could not be fitted: {error}")
    problems = convergence_problems(caught)
    if problems:
        return _Fit(reason=f"GEE did not converge: {problems[0]}")
    params = np.asarray(results.params)
    if not (np.all(np.isfinite(params)) and np.all(np.isfinite(results.cov_params()))):
        return _Fit(reason="GEE estimates are not finite")
    if np.abs(params[1:]).max(initial=0.0) > MAX_ABS_LOG_ODDS:
        return _Fit(reason="a coefficient diverges (|log odds ratio| > 15): separation")
    return _Fit(results)


def _score_test(full: sm.GEE, submodel: _Fit) -> _Test:
    """Robust (generalized) score test of ``submodel`` within ``full``: statistic, df, p.

    ``statsmodels`` ``GEE.compare_score_test`` (Boos 1992; Guo & Pan 2002): the score of the
    larger model evaluated at the submodel's estimates, with its sandwich variance under the
    null. Only the submodel is fitted, so the test exists even when the larger model's
    estimates would diverge (empty or constant cells).
    """
    if submodel.results is None:
        return math.nan, math.nan, math.nan, submodel.reason
    extra = full.exog.shape[1] - submodel.results.model.exog.shape[1]
    if extra <= 0:
        return math.nan, 0.0, math.nan, "no estimable term to test"
    with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
        warnings.simplefilter("always")
        try:
            test = full.compare_score_test(submodel.results)
        except (np.linalg.LinAlgError, ValueError) as error:
            return math.nan, math.nan, math.nan, f"score test failed: {error}"
    problems = convergence_problems(caught)
    if test is None or problems:
        reason = problems[0] if problems else "singular score covariance"
        return math.nan, math.nan, math.nan, f"score test failed: {reason}"
    statistic = float(test["statistic"])
    if not np.isfinite(statistic):
        return math.nan, math.nan, math.nan, "score test statistic is not finite"
    return statistic, float(test["df"]), float(test["p-value"]), None


def _wald(fit: _Fit, terms: list[str]) -> _Test:
    """Wald χ² test that the coefficients ``terms`` are all 0 (``GEEResults.wald_test``)."""
    if fit.results is None:
        return math.nan, math.nan, math.nan, fit.reason
    if not terms:
        return math.nan, 0.0, math.nan, "no estimable term to test"
    names = list(fit.results.model.exog_names)
    constraints = np.zeros((len(terms), len(names)))
    for i, term in enumerate(terms):
        constraints[i, names.index(term)] = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        test = fit.results.wald_test(constraints, scalar=True)
    return float(test.statistic), float(test.df_denom), float(test.pvalue), None


def _constant_cells(rows: pd.DataFrame, by: list[str]) -> list[str]:
    means = rows.groupby(by, observed=True)["y"].mean()
    constant = means[(means == 0) | (means == 1)]
    return [" x ".join(map(str, i if isinstance(i, tuple) else (i,))) for i in constant.index]


def _wald_fit(rows: pd.DataFrame, cells: list[str], y: np.ndarray,
              exog: pd.DataFrame, clusters: np.ndarray, cov_type: str) -> _Fit:
    """Fit the saturated GEE for a Wald test, unless a cell of ``cells`` has a constant
    outcome: then its estimates diverge (quasi-complete separation) and the fit is refused
    with the reason, pointing to the score test, which needs no such fit."""
    separated = _constant_cells(rows, cells)
    if separated:
        return _Fit(
            reason=f"{' x '.join(cells)} cell(s) with a constant outcome (quasi-complete "
            f"separation; use test='score'): {separated}"
        )
    return _fit(_gee(y, exog, clusters), cov_type)


def _drop_constant_categories(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Categories where every outcome is the same carry no information on group effects in a
    logit model (their category effect is infinite); they are left out, as CMH ignores them."""
    constant = _constant_cells(rows, ["category"])
    kept = rows.loc[~rows["category"].isin(constant)]
    return kept.assign(group=kept["group"].cat.remove_unused_categories()), constant


def _thin_groups(rows: pd.DataFrame) -> str | None:
    sources = rows.groupby("group", observed=True)[CLUSTER_COLUMN].nunique()
    thin = sources[sources < 2]
    if len(thin):
        return (
            f"group(s) {list(map(str, thin.index))} have fewer than two sources: the "
            "cluster-robust variance of their effect is not defined"
        )
    return None


def empty_odds_ratio_table() -> pd.DataFrame:
    """An odds-ratio table (columns :data:`ODDS_RATIO_COLUMNS`) without rows."""
    return pd.DataFrame({c: pd.Series(dtype=float) for c in ODDS_RATIO_COLUMNS}).astype(
        {"group": object}
    )


def odds_ratio_table(
    params: pd.Series, cov: pd.DataFrame, terms: list[str], confidence: float
) -> pd.DataFrame:
    """exp(coefficient) with its Wald interval and p-value, one row per ``X[T.level]`` term."""
    if not terms:
        return empty_odds_ratio_table()
    from scipy import stats

    z = stats.norm.ppf(0.5 + confidence / 2.0)
    variances = pd.Series(np.diag(cov.to_numpy(dtype=float)), index=cov.index)
    rows = []
    for term in terms:
        estimate = float(params[term])
        se = math.sqrt(max(float(variances[term]), 0.0))
        rows.append(
            {
                "group": term.split("[T.", 1)[1].rstrip("]"),
                "odds_ratio": math.exp(estimate),
                "ci_low": math.exp(estimate - z * se),
                "ci_high": math.exp(estimate + z * se),
                "p_value": float(2.0 * stats.norm.sf(abs(estimate) / se)) if se > 0 else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=list(ODDS_RATIO_COLUMNS))


def _check_test(test: str) -> None:
    if test not in GEE_TESTS:
        raise ValueError(f"unknown test '{test}'; expected one of {GEE_TESTS}")


def gee_group_test(
    frame: pd.DataFrame,
    outcome: str,
    dimension: str,
    *,
    reference: str | None = None,
    test: str = "score",
    cov_type: str = "bias_reduced",
    confidence: float = 0.95,
) -> GEEGroupResult:
    """Clustered logistic test of a source dimension: GEE, clusters = source images.

    Model: logit P(y = 1) = ``C(group) * C(category)`` (treatment coding, ``reference`` group
    and the first category as baselines; ``C(group)`` alone when there is one category),
    estimated by generalized estimating equations (Liang & Zeger 1986, "Longitudinal data
    analysis using generalized linear models", Biometrika 73:13-22;
    ``statsmodels.genmod.generalized_estimating_equations.GEE``) with a binomial family, logit
    link and an exchangeable working correlation within each source image. Three tests:

    - omnibus (``statistic, df, p_value``): every group term, main effects and group x
      category interactions: does the group matter in any category?
    - ``interaction_*``: the interaction terms: does the group effect differ by category?
    - ``main_*``: the group terms of the additive model ``C(group) + C(category)``: a group
      effect common to all categories (more powerful when the effect is consistent).

    ``test="score"`` (default): robust generalized score tests, ``GEE.compare_score_test``
    (Boos 1992, "On generalized score tests", Am Stat 46:327-333; Guo & Pan 2002; Guo, Pan,
    Connett, Hannan & French 2005, Stat Med 24:3479-3495): only the smaller model is fitted
    and the larger model's score is evaluated at its estimates with a sandwich variance.
    The score test exists even when a group x category cell has a constant outcome
    (quasi-complete separation). ``test="wald"``: Wald χ² tests of the fitted larger model
    (``GEEResults.wald_test(..., scalar=True)``) with ``cov_type``; with 12-14 sources per
    group (race, age) its p-values are far too small. The score tests keep their size but have
    little power against an effect confined to one group; for confirmatory per-category group
    claims use the permutation test over sources
    (:func:`acrb.analysis.estimation.resampling.delta_permutation_p`). Rejection rates of both tests
    under the null, and the power of the score test:
    ``docs/statistics.md#gee-tests-clustered-on-source-image``.

    ``odds_ratios``: per non-reference group, the category-adjusted population-averaged odds
    ratio from the additive model, with a Wald interval and p-value using ``cov_type``
    (default ``"bias_reduced"``, the Mancl & DeRouen 2001 small-sample correction,
    Biometrics 57:126-134; ``"robust"`` is the plain sandwich).

    Why GEE (rather than a random-intercept model), and why clustering on the source alone
    suffices although prompts are crossed with sources: the same section of
    ``docs/statistics.md``.

    Guards (NaN p-values with a reason, never an exception or a leaked warning): fewer than
    two groups, a constant outcome, a group with fewer than two sources, a model that does not
    converge or whose coefficients diverge (|log OR| > 15). Categories where the outcome is
    constant are left out (``notes``). A group whose outcome is constant over all remaining
    categories (separation) leaves the additive model, its odds ratios and the interaction
    score test NaN (``main_reason``, ``interaction_reason``); the omnibus and additive score
    tests, evaluated under the null, remain. With ``test="wald"``, any group x category cell
    with a constant outcome makes the omnibus and interaction tests NaN. Empty cells drop
    their non-estimable interaction columns, reducing df.
    """
    frame = checked_frame(frame)
    _check_test(test)
    vocabulary = check_dimension(dimension)
    if reference is not None and reference not in vocabulary:
        raise ValueError(f"reference '{reference}' is not a {dimension} value")
    rows = outcome_rows(frame, outcome, dimension, extra=[CLUSTER_COLUMN])
    method = f"GEE logit, exchangeable, clusters={CLUSTER_COLUMN}, " + (
        "robust score tests" if test == "score" else f"Wald tests ({cov_type} sandwich)"
    )
    notes: list[str] = []
    present = list(rows["group"].cat.categories)
    base = reference if reference in present else (present[0] if present else None)

    def failed(reason: str) -> GEEGroupResult:
        nan = math.nan
        return GEEGroupResult(
            outcome, dimension, method, nan, nan, nan, nan, nan, nan, nan, nan, nan,
            len(rows), int(rows[CLUSTER_COLUMN].nunique()), base, empty_odds_ratio_table(),
            reason=reason, interaction_reason=reason, main_reason=reason, notes=tuple(notes),
        )

    if len(rows) == 0:
        return failed("no observations")
    if len(present) < 2:
        return failed("fewer than two groups with observations")
    if rows["y"].nunique() < 2:
        return failed("the outcome is constant: nothing to model")
    rows, constant_categories = _drop_constant_categories(rows)
    if constant_categories:
        notes.append(f"categories with a constant outcome left out: {constant_categories}")
    present = list(rows["group"].cat.categories)
    if len(present) < 2:
        return failed("fewer than two groups outside constant categories")
    base = base if base in present else present[0]
    problem = _thin_groups(rows)
    if problem:
        return failed(problem)

    group = pd.Categorical(
        rows["group"].astype(str), categories=[base, *[g for g in present if g != base]]
    )
    clusters = pd.factorize(rows[CLUSTER_COLUMN])[0]
    y = rows["y"].to_numpy()
    g_block = treatment_dummies(group, "C(group)")
    c_blocks = [treatment_dummies(rows["category"].to_numpy(), "C(category)")]
    one_category = rows["category"].nunique() < 2
    if one_category:
        c_blocks = []
        notes.append("one category: no group x category interaction")
    i_blocks = [] if one_category else [_interact(g_block, c_blocks[0])]

    null_exog, _ = _design(len(y), c_blocks)
    additive_exog, _ = _design(len(y), [g_block, *c_blocks])
    full_exog, full_dropped = _design(len(y), [g_block, *c_blocks, *i_blocks])
    if full_dropped:
        notes.append(f"non-estimable (empty-cell) columns dropped: {full_dropped}")
    group_terms = [n for n in additive_exog.columns if n.startswith("C(group)")]

    constant_groups = _constant_cells(rows, ["group"])
    if constant_groups:
        additive = _Fit(reason=f"group(s) {constant_groups} have a constant outcome: separation")
    else:
        additive = _fit(_gee(y, additive_exog, clusters), cov_type)
    odds_ratios = (
        odds_ratio_table(additive.params, additive.cov, group_terms, confidence)
        if additive.results is not None
        else empty_odds_ratio_table()
    )
    if additive.reason:
        notes.append(f"additive model (odds ratios) not available: {additive.reason}")

    if test == "score":
        null = _fit(_gee(y, null_exog, clusters), cov_type)
        main = _score_test(_gee(y, additive_exog, clusters), null)
        if one_category:
            omnibus = main
            interaction: _Test = (math.nan, math.nan, math.nan, "one category: no interaction")
        else:
            omnibus = _score_test(_gee(y, full_exog, clusters), null)
            interaction = _score_test(_gee(y, full_exog, clusters), additive)
        dependence = null.dependence
    else:
        main = _wald(additive, group_terms)
        if one_category:
            omnibus = main
            interaction = (math.nan, math.nan, math.nan, "one category: no interaction")
        else:
            full = _wald_fit(rows, ["group", "category"], y, full_exog, clusters, cov_type)
            terms = [n for n in full_exog.columns if n.startswith("C(group)")]
            omnibus = _wald(full, terms)
            interaction = _wald(full, [n for n in terms if ":" in n])
        dependence = additive.dependence
    return GEEGroupResult(
        outcome,
        dimension,
        method,
        *omnibus[:3],
        *interaction[:3],
        *main[:3],
        n=len(rows),
        n_clusters=int(rows[CLUSTER_COLUMN].nunique()),
        reference=base,
        odds_ratios=odds_ratios,
        working_correlation=dependence,
        reason=omnibus[3],
        interaction_reason=interaction[3],
        main_reason=main[3],
        notes=tuple(notes),
    )


def model_interaction_test(
    frame: pd.DataFrame,
    outcome: str,
    dimension: str,
    *,
    test: str = "score",
    cov_type: str = "bias_reduced",
) -> ModelInteractionResult:
    """Do the models treat the groups differently? Test of the model x group interaction.

    ``frame`` pools several models' analysis frames with a ``model`` column. Model:
    logit P(y = 1) = ``C(model) * C(group) + C(category)``, logistic GEE with an exchangeable
    working correlation, clustered on ``source_id``: every model edits the same source images,
    so a source's requests are correlated across models too and the source remains the
    independent unit. The test is of all model x group interaction coefficients
    ((models − 1)(groups − 1) df): it rejects when the category-adjusted group odds ratios
    differ between models. ``test="score"`` (default): robust score test of the additive
    submodel ``C(model) + C(group) + C(category)`` (``GEE.compare_score_test``);
    ``test="wald"``: Wald χ² of the fitted interaction model with ``cov_type`` (too liberal
    for race; measured in ``docs/statistics.md#model-x-group-interaction``). See
    :func:`gee_group_test` for why GEE and why the score test. NaN ``p_value`` with
    ``reason`` for fewer than two models or groups, a constant outcome, a group with fewer
    than two sources, a group whose outcome is constant in every model (separation), or a
    failed fit; with ``test="wald"`` also for a model x group cell with a constant outcome.
    Categories whose outcome is constant across all models are left out (``notes``).

    Category enters additively, as in the study's H5 model: each model's own category profile
    (``C(model):C(category)``) is not modelled, because a model that never refuses in some
    category would make that term diverge. Every group sees the same prompts, so a
    misspecified category profile is balanced across groups and does not masquerade as a
    model x group interaction to first order.
    """
    check_dimension(dimension)
    _check_test(test)
    check_columns(frame, ["model"])
    rows = outcome_rows(frame, outcome, dimension, extra=[CLUSTER_COLUMN, "model"])
    rows = rows.loc[rows["model"].notna()].reset_index(drop=True)
    rows["model"] = rows["model"].astype(str)
    method = f"GEE logit, exchangeable, clusters={CLUSTER_COLUMN}, " + (
        "robust score test" if test == "score" else f"Wald test ({cov_type} sandwich)"
    )
    models = sorted(rows["model"].unique())
    notes: list[str] = []

    def result(statistic: float, df: float, p_value: float, reason: str | None):
        return ModelInteractionResult(
            method, statistic, df, p_value, len(rows), reason=reason,
            outcome=outcome, dimension=dimension,
            n_clusters=int(rows[CLUSTER_COLUMN].nunique()), n_models=len(models),
            notes=tuple(notes),
        )

    nan = math.nan
    if len(models) < 2:
        return result(nan, nan, nan, "fewer than two models")
    if rows["group"].nunique() < 2:
        return result(nan, nan, nan, "fewer than two groups with observations")
    if rows["y"].nunique() < 2:
        return result(nan, nan, nan, "the outcome is constant: nothing to model")
    rows, constant_categories = _drop_constant_categories(rows)
    if constant_categories:
        notes.append(f"categories with a constant outcome left out: {constant_categories}")
    problem = _thin_groups(rows)
    if problem:
        return result(nan, nan, nan, problem)
    constant_groups = _constant_cells(rows, ["group"])
    if constant_groups:
        return result(
            nan, nan, nan, f"group(s) {constant_groups} have a constant outcome: separation"
        )
    m_block = treatment_dummies(pd.Categorical(rows["model"], categories=models), "C(model)")
    g_block = treatment_dummies(rows["group"], "C(group)")
    c_blocks = []
    if rows["category"].nunique() > 1:
        c_blocks = [treatment_dummies(rows["category"].to_numpy(), "C(category)")]
    y = rows["y"].to_numpy()
    clusters = pd.factorize(rows[CLUSTER_COLUMN])[0]
    additive_exog, _ = _design(len(y), [m_block, g_block, *c_blocks])
    full_exog, dropped = _design(len(y), [m_block, g_block, *c_blocks, _interact(m_block, g_block)])
    if dropped:
        notes.append(f"non-estimable (empty-cell) columns dropped: {dropped}")
    if test == "score":
        additive = _fit(_gee(y, additive_exog, clusters), cov_type)
        outcome_test = _score_test(_gee(y, full_exog, clusters), additive)
    else:
        full = _wald_fit(rows, ["model", "group"], y, full_exog, clusters, cov_type)
        terms = [n for n in full_exog.columns if n.startswith("C(model)") and ":" in n]
        outcome_test = _wald(full, terms)
    return result(*outcome_test)
