"""Hypothesis tests of group differences in an audit's outcomes, from tables to clustered models.

Every function takes an analysis frame (one row per request: ``request_id, source_id,
prompt_id, category, seed, race, gender, age, status`` and boolean outcomes; see
:mod:`acrb.analysis.rates`) and usually an ``outcome`` (``hard_refusal``, ``erasure``,
``lightening``) and a source ``dimension`` (``race``, ``gender``, ``age``). Only rows whose
status is ``ok`` or ``refused`` are used, and only where the outcome (or judge score) is
observed; groups are ordered as in :data:`acrb.demographics.SOURCE_DIMENSIONS` and groups
without observations take no part. Each function returns a small typed result with the
statistic, its degrees of freedom where there are any, the p-value, the method and n. Where a
test cannot be computed (fewer than two groups, a constant outcome, a model whose estimates
diverge) the p-value is NaN and ``reason`` says why; "cannot show a difference" cases that
the contingency-table tests handle by convention (every outcome the same) get p = 1, as in
:func:`acrb.analysis.disparity.homogeneity_test`.

Which test answers what
-----------------------
- :func:`category_tests`, :func:`cmh_test`: contingency-table tests (per category; across
  categories as strata). They treat requests as independent given group and category. In an
  audit the same source image recurs across 150 requests, so outcomes are clustered and these
  p-values are far too small whenever sources differ beyond their group (in simulations of
  the paper design with a moderate source effect, sd 0.5 on the logit scale, and no group
  effect, CMH rejected 90 % of the time for race at α = 0.05). Read them as descriptive
  screens, not as evidence of bias.
- :func:`gee_group_test`, :func:`model_interaction_test`: logistic GEE, clusters = source
  images, robust score tests by default: valid with 12-14 sources per group where the
  sandwich Wald test is not, but with little power against an effect confined to one group
  (see :func:`gee_group_test`); the per-category permutation test over sources in
  :mod:`acrb.analysis.resampling` is the powerful valid test of such gaps.
- :func:`kruskal_dunn` (on source means by default), :func:`ordinal_model` (robust score test
  by default): judge scores (ordinal 1-5).
- :func:`tost_delta`, :func:`design_effect`: equivalence ("no bias": Δ below a margin).
- :func:`minimum_detectable_gap`: design sensitivity (power).
- :func:`adjust`: Holm / Benjamini-Hochberg adjustment, NaN-safe.

Bootstrap and permutation procedures live in :mod:`acrb.analysis.resampling`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import scikit_posthocs
import statsmodels.api as sm
from scipy import stats
from statsmodels.genmod.generalized_estimating_equations import OrdinalGEE
from statsmodels.miscmodels.ordinal_model import OrderedModel
from statsmodels.stats.contingency_tables import StratifiedTable
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import tost_proportions_2indep
from statsmodels.tools.sm_exceptions import ConvergenceWarning

from acrb.analysis.disparity import DEFAULT_PERMUTATIONS, DEFAULT_SEED, homogeneity_test
from acrb.analysis.rates import check_columns
from acrb.demographics import SOURCE_DIMENSIONS

#: Request statuses whose rows carry an outcome: an ``error`` or ``missing`` request has none.
USABLE_STATUSES: tuple[str, ...] = ("ok", "refused")

#: The column that names the source image, the cluster of every clustered method here.
CLUSTER_COLUMN = "source_id"

#: A fitted logit coefficient larger than this (|log-odds ratio| > 15, odds ratio > 3e6) means
#: the estimates are running off to infinity: (quasi-)complete separation.
MAX_ABS_LOG_ODDS = 15.0

#: The adjustments :func:`adjust` offers (names of ``statsmodels.stats.multitest``).
ADJUST_METHODS: tuple[str, ...] = ("holm", "fdr_bh")

CATEGORY_TEST_COLUMNS: tuple[str, ...] = (
    "outcome",
    "dimension",
    "category",
    "statistic",
    "df",
    "p_value",
    "p_adjusted",
    "method",
    "n",
    "n_groups",
)

ODDS_RATIO_COLUMNS: tuple[str, ...] = ("group", "odds_ratio", "ci_low", "ci_high", "p_value")

#: The tests :func:`gee_group_test` and :func:`model_interaction_test` offer.
GEE_TESTS: tuple[str, ...] = ("score", "wald")

#: The tests :func:`ordinal_model` offers.
ORDINAL_TESTS: tuple[str, ...] = ("score", "wald", "lr")


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TestResult:
    """One hypothesis test: statistic, degrees of freedom, p-value, method, sample size.

    ``df`` is NaN for tests without degrees of freedom; ``reason`` says why ``p_value`` is NaN
    (or 1 by convention), and is None for an ordinary result.
    """

    __test__ = False  # not a pytest test class

    method: str
    statistic: float
    df: float
    p_value: float
    n: int
    reason: str | None = None


@dataclass(frozen=True)
class CMHResult(TestResult):
    """Cochran-Mantel-Haenszel test over category strata.

    ``odds_ratio`` is the Mantel-Haenszel common odds ratio (second group vs first, outcome
    True) for two groups, None otherwise.
    """

    n_strata: int = 0
    n_groups: int = 0
    odds_ratio: float | None = None


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

    ``odds_ratios`` (columns :data:`ODDS_RATIO_COLUMNS`): per non-reference group, the odds
    ratio of a *higher* score against ``reference``, with Wald interval and p-value
    (cluster-robust when clustered). ``n_missing``: usable requests without a score
    (dropped). ``notes``: why the odds ratios are missing, when they are.
    """

    n_missing: int = 0
    reference: str | None = None
    odds_ratios: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class DesignEffect:
    """Design effect of clustering requests within sources (see :func:`design_effect`).

    ``icc`` is the ANOVA estimate (may be negative); ``deff`` = 1 + (m − 1)·max(icc, 0) ≥ 1
    with m = ``mean_cluster_size``.
    """

    deff: float
    icc: float
    mean_cluster_size: float
    n: int
    n_clusters: int


@dataclass(frozen=True, eq=False)
class TostResult:
    """Equivalence test of Δ = max − min group rate < margin (see :func:`tost_delta`).

    ``p_value`` is the intersection-union p-value (the largest pairwise TOST p-value) and
    ``statistic`` the TOST z statistic of that pair; ``equivalent`` is ``p_value < alpha``.
    ``pairs`` has one row per pair of groups: ``group_a, group_b, diff`` (rate a − rate b),
    ``p_value``. ``n`` counts requests before the design-effect deflation.
    """

    outcome: str
    dimension: str
    method: str
    statistic: float
    p_value: float
    equivalent: bool
    delta: float
    max_group: str | None
    min_group: str | None
    margin: float
    alpha: float
    deff: float
    n: int
    n_groups: int
    pairs: pd.DataFrame
    reason: str | None = None


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------


def _check_dimension(dimension: str) -> tuple[str, ...]:
    if dimension not in SOURCE_DIMENSIONS:
        raise ValueError(
            f"unknown dimension '{dimension}'; expected one of {sorted(SOURCE_DIMENSIONS)}"
        )
    return SOURCE_DIMENSIONS[dimension]


def _check_single_model(frame: pd.DataFrame) -> None:
    if "model" in frame.columns and frame["model"].nunique(dropna=True) > 1:
        raise ValueError(
            "the frame pools several models; pass one model's rows "
            "(or use model_interaction_test to compare models)"
        )


def _usable(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.loc[frame["status"].isin(USABLE_STATUSES)]


def _group_series(rows: pd.DataFrame, dimension: str) -> pd.Series:
    """The dimension as a categorical in vocabulary order; values outside it become NaN."""
    vocabulary = _check_dimension(dimension)
    values = rows[dimension].astype("string")
    unknown = sorted(set(values.dropna().unique()) - set(vocabulary))
    if unknown:
        warnings.warn(
            f"{dimension} value(s) {unknown} are not in the ACRB vocabulary and are left out",
            stacklevel=3,
        )
    return pd.Series(
        pd.Categorical(values.astype(object), categories=list(vocabulary)), index=rows.index
    )


def _outcome_rows(
    frame: pd.DataFrame, outcome: str, dimension: str, extra: Sequence[str] = ()
) -> pd.DataFrame:
    """Usable rows with the outcome observed: columns ``y`` (0/1 float), ``group``,
    ``category`` and the ``extra`` columns; the group categorical keeps only present levels."""
    _check_dimension(dimension)
    check_columns(frame, ["status", "category", dimension, outcome, *extra])
    usable = _usable(frame)
    observed = usable[outcome].astype("boolean")
    group = _group_series(usable, dimension)
    keep = observed.notna().to_numpy() & group.notna().to_numpy()
    rows = pd.DataFrame(
        {
            "y": observed[keep].to_numpy(dtype=float),
            "group": group[keep].cat.remove_unused_categories().array,
            "category": usable["category"][keep].astype(str).to_numpy(),
        }
    )
    for column in extra:
        rows[column] = usable[column][keep].to_numpy()
    return rows


def _nan_odds_ratios() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=float) for c in ODDS_RATIO_COLUMNS}).astype(
        {"group": object}
    )


# ---------------------------------------------------------------------------------------------
# 8. Multiple-testing adjustment
# ---------------------------------------------------------------------------------------------


def adjust(p_values: Sequence[float] | np.ndarray | pd.Series, method: str = "holm") -> np.ndarray:
    """Adjusted p-values over the finite entries of ``p_values``; NaN stays NaN.

    ``method``: ``"holm"`` (Holm 1979, family-wise error rate) or ``"fdr_bh"``
    (Benjamini & Hochberg 1995, false discovery rate), computed by
    ``statsmodels.stats.multitest.multipletests``. Returns an array of the input's shape.
    """
    if method not in ADJUST_METHODS:
        raise ValueError(f"unknown adjustment '{method}'; expected one of {ADJUST_METHODS}")
    p = np.asarray(p_values, dtype=float)
    adjusted = np.full(p.shape, np.nan)
    finite = np.isfinite(p)
    if np.any((p[finite] < 0) | (p[finite] > 1)):
        raise ValueError("p-values must lie in [0, 1]")
    if finite.any():
        adjusted[finite] = multipletests(p[finite], method=method)[1]
    return adjusted


# ---------------------------------------------------------------------------------------------
# 1. Per-category contingency tests
# ---------------------------------------------------------------------------------------------


def category_tests(
    frame: pd.DataFrame,
    outcome: str,
    dimension: str,
    *,
    permutations: int = DEFAULT_PERMUTATIONS,
    seed: int = DEFAULT_SEED,
) -> pd.DataFrame:
    """Per prompt category, a test of outcome x group independence (a g x 2 table).

    The p-value and method come from :func:`acrb.analysis.disparity.homogeneity_test`:
    Pearson's χ² without continuity correction (``scipy.stats.chi2_contingency``) when every
    expected count is at least 5 (Cochran 1954); otherwise Fisher's exact test for two groups
    (``scipy.stats.fisher_exact``) or, for more groups, a Monte-Carlo permutation test of X²
    conditioning on both margins (``permutations`` draws, fixed ``seed``). ``statistic`` is
    always Pearson's X² of the table (whatever test gives the p-value; NaN when fewer than
    two groups or a constant outcome), ``df`` = groups − 1. ``p_adjusted`` is Holm's
    adjustment over the categories. Groups with no observation in a category take no part.

    Returns one row per category present (sorted), columns :data:`CATEGORY_TEST_COLUMNS`.
    Requests are treated as independent (see the module docstring).
    """
    _check_single_model(frame)
    rows = _outcome_rows(frame, outcome, dimension)
    categories = sorted(
        {str(c) for c in _usable(frame)["category"].dropna().unique()} | set(rows["category"])
    )
    records = []
    for category in categories:
        block = rows.loc[rows["category"] == category]
        counts = block.groupby("group", observed=True)["y"].agg(["size", "sum"])
        n = counts["size"].to_numpy(dtype=float)
        k = counts["sum"].to_numpy(dtype=float)
        p_value, method = homogeneity_test(k, n, permutations=permutations, seed=seed)
        statistic = float("nan")
        if method not in ("degenerate", "no data"):
            table = np.column_stack([k, n - k])
            statistic = float(stats.chi2_contingency(table, correction=False).statistic)
        groups = len(n)
        records.append(
            {
                "outcome": outcome,
                "dimension": dimension,
                "category": category,
                "statistic": statistic,
                "df": float(groups - 1) if groups >= 2 else float("nan"),
                "p_value": p_value,
                "method": method,
                "n": int(n.sum()),
                "n_groups": groups,
            }
        )
    result = pd.DataFrame(records, columns=[c for c in CATEGORY_TEST_COLUMNS if c != "p_adjusted"])
    result["p_adjusted"] = adjust(result["p_value"].to_numpy(dtype=float), "holm")
    return result[list(CATEGORY_TEST_COLUMNS)]


# ---------------------------------------------------------------------------------------------
# 2. Cochran-Mantel-Haenszel over category strata
# ---------------------------------------------------------------------------------------------


def generalized_cmh(tables: np.ndarray) -> tuple[float, int]:
    """Generalized CMH general-association statistic Q and its degrees of freedom.

    ``tables`` has shape (K, r, c): K strata of r x c count tables. Under the null of no
    association in any stratum, conditioning on every stratum's margins, the counts of the
    first (r−1) x (c−1) cells have hypergeometric mean m_h = n_h (p_h ⊗ q_h) and covariance
    V_h = n_h² / (n_h − 1) · (D_p − p p') ⊗ (D_q − q q'), with p_h, q_h the first r−1 row and
    c−1 column proportions of stratum h (Landis, Heyman & Koch 1978, "Average partial
    association in three-way contingency tables: a review and discussion of alternative
    tests", Int Stat Rev 46:237-254; Agresti 2002, Categorical Data Analysis, 2nd ed., §7.5).
    Q = d' V⁻ d with d = Σ_h (n_h − m_h), V = Σ_h V_h and V⁻ the Moore-Penrose inverse;
    df = rank(V) (= (r−1)(c−1) when no row or column is empty in every stratum), and Q is
    asymptotically χ²_df. Strata with fewer than two observations carry no information and
    are skipped. For one stratum Q = (N − 1)/N · Pearson X²; for 2 x 2 tables Q is the
    Mantel-Haenszel statistic without continuity correction.
    """
    tables = np.asarray(tables, dtype=float)
    if tables.ndim != 3:
        raise ValueError("tables must have shape (strata, rows, columns)")
    _, r, c = tables.shape
    size = (r - 1) * (c - 1)
    d = np.zeros(size)
    v = np.zeros((size, size))
    for table in tables:
        n = table.sum()
        if n < 2:
            continue
        p = table.sum(axis=1)[: r - 1] / n
        q = table.sum(axis=0)[: c - 1] / n
        d += table[: r - 1, : c - 1].ravel() - n * np.outer(p, q).ravel()
        v += n**2 / (n - 1) * np.kron(np.diag(p) - np.outer(p, p), np.diag(q) - np.outer(q, q))
    if size == 0 or not np.any(v):
        return 0.0, 0
    scale = float(np.abs(v).max())
    rank = int(np.linalg.matrix_rank(v / scale, tol=1e-10 * size))
    statistic = float(d @ np.linalg.pinv(v / scale, rcond=1e-10, hermitian=True) @ d) / scale
    return max(statistic, 0.0), rank


def cmh_test(frame: pd.DataFrame, outcome: str, dimension: str) -> CMHResult:
    """Cochran-Mantel-Haenszel test of outcome x group association across category strata.

    Tests whether the outcome depends on the group after conditioning on the prompt category,
    pooling the evidence of every category (most powerful when the group difference points
    the same way in every category).

    - Two groups: ``statsmodels.stats.contingency_tables.StratifiedTable(...)
      .test_null_odds(correction=False)`` (Mantel & Haenszel 1959), with the MH common
      odds ratio (second group vs first, in vocabulary order) in ``odds_ratio``.
    - More groups: the generalized CMH general-association statistic, df = groups − 1
      (:func:`generalized_cmh`, Landis, Heyman & Koch 1978), p from ``scipy.stats.chi2``.

    Strata are the categories present; strata with fewer than two requests are dropped, as
    are groups with no request at all. Every outcome the same gives statistic 0 and p = 1
    (``reason``: degenerate), as in :func:`acrb.analysis.disparity.homogeneity_test`.
    Requests are treated as independent within strata (see the module docstring).
    """
    _check_single_model(frame)
    rows = _outcome_rows(frame, outcome, dimension)
    n = len(rows)
    groups = list(rows["group"].cat.categories)
    if n == 0:
        return CMHResult("no data", math.nan, math.nan, math.nan, 0, reason="no observations")
    if len(groups) < 2:
        return CMHResult(
            "degenerate", 0.0, 0.0, 1.0, n, reason="fewer than two groups", n_groups=len(groups)
        )
    categories = sorted(rows["category"].unique())
    counts = (
        rows.assign(true=rows["y"], false=1.0 - rows["y"])
        .groupby(["category", "group"], observed=True)[["true", "false"]]
        .sum()
        .reindex(pd.MultiIndex.from_product([categories, groups]), fill_value=0.0)
    )
    tables = counts.to_numpy().reshape(len(categories), len(groups), 2)
    tables = tables[tables.sum(axis=(1, 2)) >= 2]
    strata = len(tables)
    if rows["y"].nunique() < 2:
        return CMHResult(
            "degenerate", 0.0, 0.0, 1.0, n, reason="every outcome is the same",
            n_strata=strata, n_groups=len(groups),
        )
    if len(groups) == 2:
        # StratifiedTable wants 2 x 2 x K; drop strata with an empty margin, which carry
        # no information and would make its variance terms 0/0.
        informative = (tables.sum(axis=1).min(axis=1) > 0) & (tables.sum(axis=2).min(axis=1) > 0)
        table = np.transpose(tables[informative], (1, 2, 0))
        if table.shape[2] == 0:
            return CMHResult(
                "degenerate", 0.0, 0.0, 1.0, n,
                reason="no stratum has both groups and both outcomes",
                n_strata=strata, n_groups=2,
            )
        stratified = StratifiedTable(table)
        test = stratified.test_null_odds(correction=False)
        with np.errstate(divide="ignore", invalid="ignore"):
            # MH odds ratio of True for the first group vs the second; report second vs first.
            pooled = float(stratified.oddsratio_pooled)
        return CMHResult(
            "cmh (mantel-haenszel)", float(test.statistic), 1.0, float(test.pvalue), n,
            n_strata=strata, n_groups=2,
            odds_ratio=1.0 / pooled if pooled > 0 else math.inf,
        )
    statistic, df = generalized_cmh(tables)
    if df == 0:
        return CMHResult(
            "degenerate", 0.0, 0.0, 1.0, n, reason="no stratum varies in both margins",
            n_strata=strata, n_groups=len(groups),
        )
    return CMHResult(
        "generalized cmh (general association)", statistic, float(df),
        float(stats.chi2.sf(statistic, df)), n, n_strata=strata, n_groups=len(groups),
    )


# ---------------------------------------------------------------------------------------------
# 3-4. GEE logistic models, clusters = source images
# ---------------------------------------------------------------------------------------------

_Block = tuple[np.ndarray, list[str]]
#: statistic, df, p-value, and why the p-value is NaN (None when it is not).
_Test = tuple[float, float, float, str | None]


def _dummies(values: pd.Series | np.ndarray | pd.Categorical, prefix: str) -> _Block:
    """Treatment-coded indicator columns (first level = reference) and their names."""
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


def _convergence_problems(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]


def _fit(model: sm.GEE, cov_type: str) -> _Fit:
    """Fit a GEE, turning failures, non-convergence and diverging estimates into a reason."""
    with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore"):
        warnings.simplefilter("always")
        try:
            results = model.fit(cov_type=cov_type)
        except (np.linalg.LinAlgError, ValueError, ZeroDivisionError) as error:
            return _Fit(reason=f"GEE could not be fitted: {error}")
    problems = _convergence_problems(caught)
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
    problems = _convergence_problems(caught)
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


def _odds_ratio_table(
    params: pd.Series, cov: pd.DataFrame, terms: list[str], confidence: float
) -> pd.DataFrame:
    """exp(coefficient) with its Wald interval and p-value, one row per ``X[T.level]`` term."""
    if not terms:
        return _nan_odds_ratios()
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
    ``test="wald"``: Wald χ² tests of the fitted larger model (``GEEResults.wald_test(...,
    scalar=True)``) with ``cov_type``. Why score by default: a group is a set of source images
    (12 per race, 14 per age, 42 per gender in the paper design), and each group's effects
    (1 main + 4 interaction coefficients) are estimated from that group's sources only. The
    sandwich variance of so many coefficients from so few clusters is biased down and very
    variable, and the Wald test is far too liberal. In simulations of the paper design
    (84 sources x 50 prompts x 3 seeds, refusal rates 5-27 % by category, no group effect,
    100-200 replicates per setting), for race at α = 0.05 the robust Wald test rejected
    72-80 % of the time (omnibus), 52-62 % (interaction) and 12-21 % (additive), even with
    independent requests; with the bias-reduced sandwich 50-64 %, 45-50 % and 7-12 %. The
    score tests rejected 1-2 % (omnibus), 1-3 % (interaction) and 3-5 % (additive): valid,
    somewhat conservative for the many-df tests. For gender (42 sources per group) the
    robust Wald tests rejected 5-9 %. The score test also exists when a group x category
    cell has a constant outcome, where the Wald test breaks down (quasi-complete separation).

    The price of validity is power against effects confined to one group: the score variance
    is taken under the null, so the contribution of one group's effect to the statistic is
    bounded by about the number of that group's sources (12 per race), whatever the effect
    size. In the same simulations, raising one race's refusal rate in one category from
    7.6 % to 18 % (to 38 %) was detected by the interaction score test 12 % (27 %) of the
    time. For confirmatory per-category group claims use the permutation test over sources
    (:func:`acrb.analysis.resampling.delta_permutation_p`); a permutation-calibrated GEE
    statistic would combine validity and power but costs one refit per permutation. With
    ``test="wald"`` the p-values are far too small for race and age (see above).

    ``odds_ratios``: per non-reference group, the category-adjusted population-averaged odds
    ratio from the additive model, with a Wald interval and p-value using ``cov_type``
    (default ``"bias_reduced"``, the Mancl & DeRouen 2001 small-sample correction,
    Biometrics 57:126-134; ``"robust"`` is the plain sandwich).

    Why GEE: race, gender and age are properties of the source image, so all requests of a
    source share its group and every group contrast is a between-cluster contrast; a test
    that treats requests as independent overstates the evidence by the design effect (see
    :func:`design_effect`). GEE estimates the population-averaged effect (the odds ratio
    between groups averaged over source images, the audit's question) and its sandwich
    variance is consistent whatever the true within-source correlation; the 84 sources of the
    paper design are enough clusters for the score tests. ``BinomialBayesMixedGLM`` (a
    random-intercept logit) is fitted by variational Bayes and gives posterior summaries of
    subject-specific effects, not p-values, and statsmodels has no Laplace/quadrature GLMM.
    Prompts are *crossed* with sources, not nested in them: every prompt is applied to every
    source. Clustering on source alone leaves the prompt-level correlation to the category
    fixed effects; correlation between requests of one prompt beyond its category is not in
    the sandwich. Because every prompt is applied to every source of every group, prompt
    effects are balanced across groups and cancel from group contrasts to first order; a
    crossed (two-way) bootstrap (:mod:`acrb.analysis.resampling`) is the check.

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
    _check_single_model(frame)
    _check_test(test)
    vocabulary = _check_dimension(dimension)
    if reference is not None and reference not in vocabulary:
        raise ValueError(f"reference '{reference}' is not a {dimension} value")
    rows = _outcome_rows(frame, outcome, dimension, extra=[CLUSTER_COLUMN])
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
            len(rows), int(rows[CLUSTER_COLUMN].nunique()), base, _nan_odds_ratios(),
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
    g_block = _dummies(group, "C(group)")
    c_blocks = [_dummies(rows["category"].to_numpy(), "C(category)")]
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
        _odds_ratio_table(additive.params, additive.cov, group_terms, confidence)
        if additive.results is not None
        else _nan_odds_ratios()
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
    ``test="wald"``: Wald χ² of the fitted interaction model with ``cov_type``. In
    simulations of the paper design (3 models, 84 sources, no interaction, 100 replicates),
    for race the score test rejected 3 % of the time at α = 0.05 and the bias-reduced Wald
    test 11 % (5 % at α = 0.01). See :func:`gee_group_test` for why GEE, why the score test,
    and its limited power against an effect confined to one group. NaN ``p_value`` with
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
    _check_dimension(dimension)
    _check_test(test)
    check_columns(frame, ["model"])
    rows = _outcome_rows(frame, outcome, dimension, extra=[CLUSTER_COLUMN, "model"])
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
    m_block = _dummies(pd.Categorical(rows["model"], categories=models), "C(model)")
    g_block = _dummies(rows["group"], "C(group)")
    c_blocks = []
    if rows["category"].nunique() > 1:
        c_blocks = [_dummies(rows["category"].to_numpy(), "C(category)")]
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


# ---------------------------------------------------------------------------------------------
# 5. Judge scores
# ---------------------------------------------------------------------------------------------


def _score_rows(
    frame: pd.DataFrame, score_column: str, dimension: str, extra: Sequence[str] = ()
) -> tuple[pd.DataFrame, int]:
    """Usable rows with a score: columns ``score`` (float), ``group`` (+ ``extra``); and how
    many usable rows had no score (NaN, NA: abstentions, refused requests)."""
    _check_single_model(frame)
    _check_dimension(dimension)
    check_columns(frame, ["status", dimension, score_column, *extra])
    usable = _usable(frame)
    group = _group_series(usable, dimension)
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
    Pairwise: ``scikit_posthocs.posthoc_dunn(p_adjust="holm")`` (Dunn 1964, "Multiple
    comparisons using rank sums", Technometrics 6:241-252, with the tie correction), Holm
    adjusted over the pairs. Usable requests whose score is missing (NaN / NA: abstention,
    refusal) are dropped and counted in ``n_missing``.

    ``unit="source"`` (default) first averages each source's scores (needs ``source_id``) and
    compares the source means (``n`` counts sources): a valid test with the source image as
    the independent unit, which is what race, gender and age are attributes of.
    ``unit="request"`` ranks every request's score as if requests were independent; a
    source's requests share its image, so when scores cluster by source this overstates the
    evidence badly (in simulations of the paper design with a moderate source effect and no
    group effect it rejected ~96 % of the time for race at α = 0.05, the source-level test
    5 %). Use it only for data without source clustering.
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
    result = stats.kruskal(*samples)
    posthoc = scikit_posthocs.posthoc_dunn(
        rows.assign(group=rows["group"].astype(str)),
        val_col="score",
        group_col="group",
        p_adjust="holm",
    )
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
    - ``"wald"``: Wald χ² of the OrderedModel fit with the cluster-robust covariance. In
      simulations of the paper design (12 sources per race) it rejected a true null ~15 % of
      the time at α = 0.05, against ~5 % for the score test: its intervals are too narrow for
      dimensions with few sources per group, and so are the odds-ratio intervals.
    - ``"lr"``: likelihood-ratio test against the thresholds-only OrderedModel, which treats
      requests as independent (only for data without clustering). Used whenever ``cluster``
      is None or not a column of the frame.

    NaN ``p_value`` with ``reason``: fewer than two groups or score levels, a fit that does
    not converge, or (``wald``, ``lr``) diverging coefficients (a group whose scores all lie
    at one end). The score test is evaluated under the null and survives such separation;
    the odds ratios are then NaN (``notes``).
    """
    vocabulary = _check_dimension(dimension)
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
            reference=base, odds_ratios=_nan_odds_ratios() if odds is None else odds,
            notes=tuple(notes),
        )

    nan = math.nan
    if len(present) < 2:
        return result(nan, nan, nan, "fewer than two groups with scores")
    levels = np.sort(rows["score"].unique())
    if len(levels) < 2:
        return result(nan, nan, nan, "fewer than two score levels observed")
    ordered = [base, *[g for g in present if g != base]]
    matrix, names = _dummies(pd.Categorical(rows["group"].astype(str), categories=ordered), "g")
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
        fitted = OrderedModel(endog, exog, distr="logit").fit(**fit_kwargs)
    fit_problem: str | None = None
    problems = _convergence_problems(caught)
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
        odds = _odds_ratio_table(
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
        problems = _convergence_problems(caught)
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
        null_fit = OrderedModel(endog, None, distr="logit").fit(method="bfgs", disp=False)
    if _convergence_problems(caught) or not null_fit.mle_retvals.get("converged", True):
        return result(nan, nan, nan, "thresholds-only ordinal model did not converge", odds)
    statistic = max(2.0 * float(fitted.llf - null_fit.llf), 0.0)
    return result(
        statistic, float(len(names)), float(stats.chi2.sf(statistic, len(names))), None, odds
    )


# ---------------------------------------------------------------------------------------------
# 6. Equivalence: "no bias" claims
# ---------------------------------------------------------------------------------------------


def design_effect(
    frame: pd.DataFrame, outcome: str, dimension: str | None = None
) -> DesignEffect:
    """Design effect of clustering requests within source images, from the ANOVA ICC.

    One-way ANOVA estimator of the intraclass correlation of the (0/1) outcome within sources
    (Fleiss 1981; for binary data Ridout, Demétrio & Firth 1999, "Estimating intraclass
    correlation for binary data", Biometrics 55:137-148, where it performs well):
    ICC = (MSB − MSW) / (MSB + (m₀ − 1)·MSW) with m₀ = (N − Σ nᵢ²/N)/(k − 1) for k sources
    of sizes nᵢ. With ``dimension`` given, sources are nested in its groups and MSB is taken
    around the group means (df k − G, m₀ = (N − Σ_g Σ_{i∈g} nᵢ²/N_g)/(k − G)), so a real group
    difference is not mistaken for clustering. deff = 1 + (m − 1)·ICC with m the mean number
    of requests per source (Kish 1965), floored at 1 (a negative ICC estimate gives 1).
    A constant outcome gives ICC 0, deff 1. Prompt-level clustering (prompts are crossed
    with sources) is not included.
    """
    _check_single_model(frame)
    check_columns(frame, ["status", CLUSTER_COLUMN, outcome])
    usable = _usable(frame)
    observed = usable[outcome].astype("boolean")
    keep = observed.notna().to_numpy()
    rows = pd.DataFrame(
        {"y": observed[keep].to_numpy(dtype=float), "source": usable[CLUSTER_COLUMN][keep]}
    )
    if dimension is not None:
        rows["group"] = _group_series(usable, dimension)[keep].astype(object).to_numpy()
        rows = rows.loc[rows["group"].notna()]
    else:
        rows["group"] = "all"
    n = len(rows)
    per_source = rows.groupby(["group", "source"])["y"].agg(["size", "mean"]).reset_index()
    k = len(per_source)
    groups = per_source["group"].nunique()
    if n == 0 or k - groups < 1 or n - k < 1:
        mean_size = n / k if k else math.nan
        return DesignEffect(1.0, math.nan, mean_size, n, k)
    sizes = per_source["size"].to_numpy(dtype=float)
    group_n = per_source.groupby("group")["size"].transform("sum").to_numpy(dtype=float)
    group_mean = rows.groupby("group")["y"].mean()
    centre = per_source["group"].map(group_mean).to_numpy(dtype=float)
    means = per_source["mean"].to_numpy(dtype=float)
    ss_between = float(np.sum(sizes * (means - centre) ** 2))
    source_mean = rows.groupby(["group", "source"])["y"].transform("mean").to_numpy()
    ss_within = float(np.sum((rows["y"].to_numpy() - source_mean) ** 2))
    ms_between = ss_between / (k - groups)
    ms_within = ss_within / (n - k)
    m0 = (n - float(np.sum(sizes**2 / group_n))) / (k - groups)
    denominator = ms_between + (m0 - 1.0) * ms_within
    icc = (ms_between - ms_within) / denominator if denominator > 0 else 0.0
    mean_size = n / k
    return DesignEffect(max(1.0, 1.0 + (mean_size - 1.0) * icc), float(icc), mean_size, n, k)


def tost_delta(
    frame: pd.DataFrame,
    outcome: str,
    dimension: str,
    *,
    margin: float = 0.03,
    alpha: float = 0.05,
    deff: float | None = 1.0,
) -> TostResult:
    """Equivalence test of "no disparity": Δ = max − min group rate < ``margin``.

    Δ < margin holds iff |p_i − p_j| < margin for every pair of groups, so the claim is an
    intersection of pairwise equivalences and is tested by the intersection-union principle
    (Berger 1982, "Multiparameter hypothesis testing and acceptance sampling",
    Technometrics 24:295-300; Berger & Hsu 1996, Statistical Science 11:283-319): each pair
    is tested by two one-sided tests (Schuirmann 1987) of H0: |p_i − p_j| ≥ margin,
    ``statsmodels.stats.proportion.tost_proportions_2indep(compare="diff", low=−margin,
    upp=margin)`` (its default Agresti-Caffo interval method, which copes with zero counts),
    and p = max over pairs. No multiplicity adjustment is needed: the IUT is a level-α test
    of the union null. Equivalence is concluded when p < ``alpha``.

    Clustering: requests of one source are correlated, which inflates the variance of each
    rate by the design effect. ``deff`` (≥ 1) is applied by dividing each group's count and
    n by it (effective sample size, Kish 1965) before the test; ``deff=None`` estimates it by
    :func:`design_effect` (sources nested in ``dimension``). The default 1 assumes
    independence, which is anti-conservative here: for equivalence claims pass the
    estimated design effect.

    Filter ``frame`` to the requests the claim is about (e.g. neutral prompts) before calling.
    With fewer than two groups p is NaN (``reason``).
    """
    _check_single_model(frame)
    if margin <= 0:
        raise ValueError("margin must be positive")
    rows = _outcome_rows(frame, outcome, dimension)
    if deff is None:
        deff = design_effect(frame, outcome, dimension).deff
    if not deff >= 1.0:
        raise ValueError("deff must be at least 1")
    counts = rows.groupby("group", observed=True)["y"].agg(["size", "sum"])
    names = [str(g) for g in counts.index]
    n = counts["size"].to_numpy(dtype=float)
    k = counts["sum"].to_numpy(dtype=float)
    rates = k / n
    method = "TOST (agresti-caffo) per pair, intersection-union"
    pair_columns = ["group_a", "group_b", "diff", "p_value"]
    if len(names) < 2:
        return TostResult(
            outcome, dimension, method, math.nan, math.nan, False,
            0.0 if names else math.nan, names[0] if names else None,
            names[0] if names else None, margin, alpha, float(deff), int(n.sum()), len(names),
            pd.DataFrame(columns=pair_columns), reason="fewer than two groups with observations",
        )
    pairs = []
    worst_statistic, worst_p = math.nan, -1.0
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            with np.errstate(divide="ignore", invalid="ignore"):
                test = tost_proportions_2indep(
                    k[i] / deff, n[i] / deff, k[j] / deff, n[j] / deff,
                    low=-margin, upp=margin, compare="diff",
                )
            p = float(test.pvalue)
            pairs.append((names[i], names[j], float(rates[i] - rates[j]), p))
            if p > worst_p:
                worst_p, worst_statistic = p, float(test.statistic)
    top, bottom = int(np.argmax(rates)), int(np.argmin(rates))
    return TostResult(
        outcome, dimension, method, worst_statistic, worst_p, bool(worst_p < alpha),
        float(rates[top] - rates[bottom]), names[top], names[bottom], margin, alpha,
        float(deff), int(n.sum()), len(names), pd.DataFrame(pairs, columns=pair_columns),
    )


# ---------------------------------------------------------------------------------------------
# 7. Sensitivity of the design
# ---------------------------------------------------------------------------------------------


def minimum_detectable_gap(
    n_sources_per_group: float,
    requests_per_source: float,
    base_rate: float,
    alpha: float = 0.05,
    power: float = 0.8,
    n_groups: int = 2,
    deff: float | None = None,
    icc: float | None = None,
) -> float:
    """Smallest rate gap above ``base_rate`` between two groups detectable with ``power``.

    Two-sided test of two independent proportions at the Bonferroni level
    α / (g(g − 1)/2) (all pairs of ``n_groups`` groups), on Cohen's effect size
    h = 2·asin(√p₂) − 2·asin(√p₁) (Cohen 1988, §6.2), the arcsine test whose power is
    normal and depends on h only: ``statsmodels.stats.power.NormalIndPower().solve_power``
    with equal groups of effective size n = n_sources · requests_per_source / deff. The
    design effect is ``deff``, or 1 + (requests_per_source − 1)·``icc`` from the within-source
    intraclass correlation (give at most one; neither means independent requests, deff 1).
    The h found is converted back with p₂ = sin²(asin(√p₁) + h/2) and the gap p₂ − p₁ is
    returned, in rate units (a proportion: 0.05 = 5 pp). Returns ``inf`` when no p₂ ≤ 1 is
    far enough from ``base_rate``.
    """
    if deff is not None and icc is not None:
        raise ValueError("give deff or icc, not both")
    if icc is not None:
        if not -1.0 < icc <= 1.0:
            raise ValueError("icc must lie in (-1, 1]")
        deff = 1.0 + (requests_per_source - 1.0) * icc
    deff = 1.0 if deff is None else float(deff)
    if deff < 1.0:
        raise ValueError("deff must be at least 1")
    if not 0.0 <= base_rate < 1.0:
        raise ValueError("base_rate must lie in [0, 1)")
    if n_groups < 2:
        raise ValueError("n_groups must be at least 2")
    if n_sources_per_group <= 0 or requests_per_source <= 0:
        raise ValueError("sample sizes must be positive")
    level = alpha / (n_groups * (n_groups - 1) / 2.0)
    n_effective = n_sources_per_group * requests_per_source / deff
    h = float(
        NormalIndPower().solve_power(
            effect_size=None, nobs1=n_effective, alpha=level, power=power, ratio=1.0,
            alternative="two-sided",
        )
    )
    angle = math.asin(math.sqrt(base_rate)) + abs(h) / 2.0
    if angle > math.pi / 2.0:
        return math.inf
    return math.sin(angle) ** 2 - base_rate
