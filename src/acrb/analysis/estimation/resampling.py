"""Cluster-robust Δ and rates by resampling source images and prompts.

The same source image is edited under every prompt and the same prompt is applied to every source,
so outcomes are correlated within sources and within prompts, and the independent-requests table of
:mod:`acrb.analysis.estimation.disparity` is too narrow and too eager to flag. This module keeps its
point estimates (group rates are pooled k/n over requests) but takes the *source* and the *prompt*
as the units of resampling; :func:`clustered_disparities` is the table the pipeline reports. Why,
and what was measured: ``docs/statistics.md#cluster-bootstrap`` and the sections after it.

Data layout: a :class:`Block` is one set of requests (one prompt category, or all of them)
reduced to two S x P matrices, Y (outcome True) and N (outcome observed), summed over seeds, for
S sources and P prompts. A source belongs to exactly one group (its race, gender or age), so the
group totals are k_g = Σ_{s∈g} Σ_p Y_sp and n_g = Σ_{s∈g} Σ_p N_sp.

Methods
-------
- **Two-way cluster ("pigeonhole") bootstrap** (Owen 2007, "The pigeonhole bootstrap", Annals
  of Applied Statistics 1:386-411; Owen & Eckles 2012, "Bootstrapping data arrays of arbitrary
  order", AoAS 6:895-927): each replicate draws multinomial source weights W (sources
  resampled with replacement *within their group*; Davison & Hinkley 1997, *Bootstrap Methods
  and their Application*, ch. 3) and prompt weights V (prompts resampled within their
  category), and a request of source s and prompt p counts W_s V_p times:
  k*_g = Σ_{s∈g} W_s (Y Vᵀ)_s. Mildly conservative by construction (about 1.6 times the
  binomial SD without any clustering). One-way schemes (``resample="sources"`` or
  ``"prompts"``) are available.
- **Δ interval, per row** (:func:`delta_inversion`, the default): test inversion, valid at
  the boundary Δ = 0 (which the row's permutation test decides), with the bias-corrected Δ.
- **Δ interval, simultaneous** (:func:`delta_bootstrap`): a studentised max-t band over all pairwise
  differences (Westfall & Young 1993, *Resampling-Based Multiple Testing*; Romano & Wolf 2005, JASA
  100:94-108), then Δ ∈ [max(0, max L_ij), max U_ij] as in
  :func:`acrb.analysis.estimation.disparity.delta_interval`. It covers Δ = 0 when the groups are
  equal.
- **Permutation tests** (:func:`group_test_p`): group labels permuted across *sources*,
  within strata of the other source dimensions (Anderson & ter Braak 2003, J Stat Comput
  Simul 73:85-113), mid-p value (Lancaster 1961), of the between-group statistic of the
  per-source rates (default), of Δ (:func:`delta_permutation_p`) or of a GEE score statistic.
- **Group rates at the design's clustering** (:func:`clustered_rates`): Wilson at the
  effective n of the two-way clustered variance.

Every function is seeded (``numpy.random.default_rng(seed)``) and vectorised: replicates and
permutations are rows of matrices, never a Python loop (loops run over groups, strata and
categories only). The stereotype congruence score, bootstrapped the same way, is in
:mod:`acrb.analysis.experiments.congruence`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import pandas as pd

from acrb.analysis import defaults
from acrb.analysis.estimation.disparity import DISPARITY_COLUMNS
from acrb.analysis.estimation.rates import group_rates, wilson_interval
from acrb.analysis.frame import (
    ALL_CATEGORIES,
    category_levels,
    check_columns,
    check_dimension,
    usable_rows,
)
from acrb.analysis.tests.pvalues import adjust
from acrb.demographics import SOURCE_DIMENSIONS
from acrb.errors import InputDataError

#: ``method`` column of :func:`clustered_disparities`.
METHOD = "cluster-bootstrap/permutation"
#: Bootstrap SDs at or below this are treated as zero (no variation in any replicate).
_SD_TOLERANCE = 1e-12
#: Tolerance of the permutation comparison Δ* ≥ Δ_obs, so that ties count as extreme.
_PERM_TOLERANCE = 1e-12

Resample = Literal["auto", "two-way", "sources", "prompts"]
#: Statistics of the per-row permutation test (:func:`group_test_p`).
GroupTest = Literal["between-groups", "range", "gee-score"]
SeedLike = int | Sequence[int] | np.random.SeedSequence | None


@dataclass(frozen=True)
class Block:
    """The requests of one category (or all) for one outcome and one source dimension.

    Attributes
    ----------
    outcome, dimension:
        The outcome column and the source dimension (``race``, ``gender`` or ``age``).
    groups:
        Group names present, in :mod:`acrb.demographics` vocabulary order.
    source_ids, prompt_ids:
        Ids of the S sources (ordered by group, then id) and P prompts (row and column labels
        of ``y`` and ``n``). Only sources and prompts with an observed outcome are kept.
    group_index:
        (S,) index into ``groups`` of each source's group.
    prompt_stratum:
        (P,) integer code of each prompt's category; prompts are resampled within it.
    y, n:
        (S, P) float arrays: outcome True and outcome observed, summed over seeds.
    covariates:
        The other source dimensions, one (S,) array of values per dimension, for stratified
        permutation.
    """

    outcome: str
    dimension: str
    groups: tuple[str, ...]
    source_ids: np.ndarray
    prompt_ids: np.ndarray
    group_index: np.ndarray
    prompt_stratum: np.ndarray
    y: np.ndarray
    n: np.ndarray
    covariates: dict[str, np.ndarray] = field(default_factory=dict)
    #: Whether the plan gave every source of the block every prompt of the block (whatever
    #: the outcome's missing values): then prompt effects cancel in group differences.
    crossed: bool = False

    @property
    def n_sources(self) -> int:
        return int(self.y.shape[0])

    @property
    def n_prompts(self) -> int:
        return int(self.y.shape[1])

    @property
    def onehot(self) -> np.ndarray:
        """(S, G) indicator of each source's group."""
        return np.eye(len(self.groups))[self.group_index]

    @property
    def group_k(self) -> np.ndarray:
        """(G,) outcome True per group."""
        return np.bincount(self.group_index, self.y.sum(axis=1), minlength=len(self.groups))

    @property
    def group_n(self) -> np.ndarray:
        """(G,) outcome observed per group."""
        return np.bincount(self.group_index, self.n.sum(axis=1), minlength=len(self.groups))

    @property
    def group_sources(self) -> np.ndarray:
        """(G,) number of sources per group."""
        return np.bincount(self.group_index, minlength=len(self.groups))

    @property
    def rates(self) -> np.ndarray:
        """(G,) pooled rate k_g / n_g (NaN for a group with n_g = 0, which prepared blocks
        never have)."""
        return pooled_rate(self.group_k, self.group_n)


@dataclass(frozen=True)
class _Design:
    """Y and N over every source and prompt of a frame, before choosing a block."""

    outcome: str
    source_ids: np.ndarray
    source_values: dict[str, np.ndarray]
    prompt_ids: np.ndarray
    prompt_category: np.ndarray
    y: np.ndarray
    n: np.ndarray
    #: Requests planned per cell (every status), to tell a crossed design from attrition.
    planned: np.ndarray | None = None


def _one_value_each(table: pd.DataFrame, key: str, column: str) -> pd.Series:
    """The single value of ``column`` per ``key``; InputDataError if a key has several."""
    counts = table.groupby(key, sort=False)[column].nunique(dropna=False)
    bad = counts.index[counts > 1]
    if len(bad):
        raise InputDataError(
            f"{key} {bad[0]!r} has more than one {column} in the analysis frame",
            f"every {key} must carry a single {column}; rebuild the frame from the plan",
        )
    return table.groupby(key, sort=False)[column].first()


def _design(frame: pd.DataFrame, outcome: str) -> _Design:
    check_columns(
        frame, ["source_id", "prompt_id", "category", "status", outcome, *SOURCE_DIMENSIONS]
    )
    usable = usable_rows(frame)
    observed = usable[outcome].astype("boolean")
    source_codes, source_ids = pd.factorize(usable["source_id"].astype(str), sort=True)
    prompt_codes, prompt_ids = pd.factorize(usable["prompt_id"].astype(str), sort=True)
    s_count, p_count = len(source_ids), len(prompt_ids)
    cell = source_codes * p_count + prompt_codes
    seen = observed.notna().to_numpy(dtype=bool)
    true = observed.fillna(False).to_numpy(dtype=bool)
    size = s_count * p_count
    n = np.bincount(cell[seen], minlength=size).astype(float).reshape(s_count, p_count)
    y = np.bincount(cell[true], minlength=size).astype(float).reshape(s_count, p_count)
    planned = np.bincount(cell, minlength=size).reshape(s_count, p_count)
    keyed = usable.assign(source_id=usable["source_id"].astype(str))
    source_values = {}
    for dimension in SOURCE_DIMENSIONS:
        values = _one_value_each(keyed, "source_id", dimension).reindex(source_ids)
        source_values[dimension] = values.astype(object).to_numpy()
    prompts = usable.assign(prompt_id=usable["prompt_id"].astype(str))
    category = _one_value_each(prompts, "prompt_id", "category").reindex(prompt_ids)
    return _Design(
        outcome=outcome,
        source_ids=np.asarray(source_ids, dtype=object),
        source_values=source_values,
        prompt_ids=np.asarray(prompt_ids, dtype=object),
        prompt_category=category.astype(str).to_numpy(dtype=object),
        y=y,
        n=n,
        planned=planned,
    )


def _warn_unknown(design: _Design) -> None:
    for dimension, vocabulary in SOURCE_DIMENSIONS.items():
        values = design.source_values[dimension]
        unknown = sorted({str(v) for v in values if v not in vocabulary and not pd.isna(v)})
        if unknown:
            warnings.warn(
                f"{dimension} value(s) {unknown} are not in the ACRB vocabulary and are left out "
                f"of the {dimension} breakdown",
                stacklevel=3,
            )


def _block(design: _Design, dimension: str, prompt_mask: np.ndarray | None = None) -> Block:
    """Cut a block out of a design: prompts in ``prompt_mask``, sources with a known group."""
    vocabulary = check_dimension(dimension)
    values = design.source_values[dimension]
    known = np.array([v in vocabulary for v in values], dtype=bool)
    prompts = np.ones(len(design.prompt_ids), bool) if prompt_mask is None else prompt_mask
    n = design.n[np.ix_(known, prompts)]
    y = design.y[np.ix_(known, prompts)]
    keep_s = n.sum(axis=1) > 0
    keep_p = n.sum(axis=0) > 0
    n, y = n[np.ix_(keep_s, keep_p)], y[np.ix_(keep_s, keep_p)]
    source_rows = np.flatnonzero(known)[keep_s]
    source_values = values[source_rows]
    groups = tuple(g for g in vocabulary if g in set(source_values))
    position = {g: i for i, g in enumerate(groups)}
    group_index = np.array([position[v] for v in source_values], dtype=np.int64)
    # Sources ordered by group (then id) so that group totals are contiguous sums.
    by_group = np.lexsort((design.source_ids[source_rows].astype(str), group_index))
    source_rows, source_values = source_rows[by_group], source_values[by_group]
    group_index, n, y = group_index[by_group], n[by_group], y[by_group]
    planned = None if design.planned is None else design.planned[np.ix_(known, prompts)]
    crossed = planned is not None and bool((planned[np.ix_(keep_s, keep_p)] > 0).all())
    categories = design.prompt_category[np.flatnonzero(prompts)[keep_p]]
    prompt_stratum = pd.factorize(categories, sort=True)[0].astype(np.int64)
    covariates = {
        other: design.source_values[other][source_rows].astype(object)
        for other in SOURCE_DIMENSIONS
        if other != dimension
    }
    return Block(
        outcome=design.outcome,
        dimension=dimension,
        groups=groups,
        source_ids=design.source_ids[source_rows],
        prompt_ids=design.prompt_ids[np.flatnonzero(prompts)[keep_p]],
        group_index=group_index,
        prompt_stratum=prompt_stratum,
        covariates=covariates,
        y=y,
        n=n,
        crossed=crossed,
    )


def prepare_block(frame: pd.DataFrame, outcome: str, dimension: str) -> Block:
    """Reduce the requests of ``frame`` to a :class:`Block` for ``outcome`` and ``dimension``.

    The caller chooses the requests (e.g. one prompt category); prompts are resampled within
    their category, so a pooled frame keeps its category mix in every replicate. Rows with
    status ``error`` or ``missing`` and rows where the outcome is NA do not count. Sources
    whose ``dimension`` value is outside the vocabulary are left out with a warning; sources
    and prompts without an observed outcome are dropped, and so are groups without sources.
    Raises :class:`InputDataError` if a source carries two values of a dimension or a prompt
    two categories.
    """
    design = _design(frame, outcome)
    _warn_unknown(design)
    return _block(design, dimension)


# --------------------------------------------------------------------------------------------
# Bootstrap


def _stratified_weights(rng: np.random.Generator, strata: np.ndarray, n_boot: int) -> np.ndarray:
    """(B, m) multinomial counts: each stratum's units resampled with replacement within it.

    Vectorised over replicates and strata: every unit's slot draws one unit of its own stratum
    uniformly (floor(U x stratum size)), and the draws are counted with one ``bincount``, so a
    stratum of size m_k gets a Multinomial(m_k, 1/m_k) vector per replicate.
    """
    m = len(strata)
    codes = np.unique(strata, return_inverse=True)[1].ravel()
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.searchsorted(sorted_codes, sorted_codes, side="left")
    sizes = np.bincount(codes)[sorted_codes]
    draws = (rng.random((n_boot, m)) * sizes).astype(np.int64)  # floor: U x size ≥ 0
    np.minimum(draws, sizes - 1, out=draws)  # U x size can round up to size
    draws += starts
    flat = (draws + m * np.arange(n_boot)[:, None]).ravel()
    counts = np.bincount(flat, minlength=n_boot * m).reshape(n_boot, m)
    weights = np.empty((n_boot, m))
    weights[:, order] = counts
    return weights


def resolve_resample(block: Block, resample: Resample) -> Resample:
    """The units to resample for a *difference between groups* of ``block``: ``"auto"``
    chooses from the design, sources alone when it is crossed (every source has every prompt,
    so a prompt's effect moves every group alike and cancels in group differences; the
    simulation study measures the coverage this keeps) and both ways otherwise; any other
    value is used as given. A group's own rate does not cancel prompt effects, so wherever
    rates themselves are bootstrapped ``"auto"`` means two-way (:func:`bootstrap_weights`)."""
    if resample == "auto":
        return "sources" if block.crossed else "two-way"
    return resample


def bootstrap_weights(
    rng: np.random.Generator,
    source_strata: np.ndarray,
    prompt_strata: np.ndarray,
    n_boot: int,
    resample: Resample,
) -> tuple[np.ndarray, np.ndarray]:
    """(B, S) source weights W and (B, P) prompt weights V of ``n_boot`` bootstrap replicates.

    Sources are resampled with replacement within ``source_strata`` and prompts within
    ``prompt_strata`` (multinomial counts, :func:`_stratified_weights`); ``resample`` says
    which of the two are resampled (``"two-way"``: both; ``"sources"`` or ``"prompts"``: one,
    the other weights 1). A request of source s and prompt p counts W_s V_p times.
    """
    if resample == "auto":  # no design to choose from here: the conservative scheme
        resample = "two-way"
    if resample not in ("two-way", "sources", "prompts"):
        raise ValueError(
            f"resample must be 'auto', 'two-way', 'sources' or 'prompts', not {resample!r}")
    if resample in ("two-way", "sources"):
        w = _stratified_weights(rng, source_strata, n_boot)
    else:
        w = np.ones((n_boot, len(source_strata)))
    if resample in ("two-way", "prompts"):
        v = _stratified_weights(rng, prompt_strata, n_boot)
    else:
        v = np.ones((n_boot, len(prompt_strata)))
    return w, v


def pooled_rate(k: np.ndarray, n: np.ndarray) -> np.ndarray:
    """k / n elementwise (pooled rates of replicates), NaN where n = 0, without warnings."""
    out = np.full(np.broadcast(k, n).shape, np.nan)
    np.divide(k, n, out=out, where=n > 0)
    return out


def bootstrap_rates(
    block: Block,
    n_boot: int = defaults.BOOTSTRAP_RESAMPLES,
    seed: SeedLike = defaults.SEED,
    *,
    resample: Resample = "two-way",
) -> np.ndarray:
    """(n_boot, G) replicate group rates of the cluster bootstrap (see the module docstring).

    ``resample="two-way"`` (default) resamples sources within groups *and* prompts within
    categories (pigeonhole bootstrap); ``"sources"`` or ``"prompts"`` resample one way only.
    A replicate in which a group has no observed request (possible when outcomes are sparse)
    has NaN for that group.
    """
    rng = np.random.default_rng(seed)
    w, v = bootstrap_weights(rng, block.group_index, block.prompt_stratum, n_boot, resample)
    s_count = block.n_sources
    # One product for numerator and denominator: (B, P) @ (P, 2S) -> (B, 2S).
    per_source = v @ np.concatenate([block.y, block.n]).T
    k_source = w * per_source[:, :s_count]
    n_source = w * per_source[:, s_count:]
    if s_count and np.all(np.diff(block.group_index) >= 0):  # sources sorted by group
        starts = np.searchsorted(block.group_index, np.arange(len(block.groups)))
        k, n = np.add.reduceat(k_source, starts, axis=1), np.add.reduceat(n_source, starts, axis=1)
    else:
        onehot = block.onehot
        k, n = k_source @ onehot, n_source @ onehot
    return pooled_rate(k, n)


@dataclass(frozen=True)
class DeltaResult:
    """Δ = max − min of group rates with its cluster-bootstrap simultaneous interval."""

    estimate: float
    ci_low: float
    ci_high: float
    max_group: str | None
    min_group: str | None
    groups: tuple[str, ...]
    rates: np.ndarray
    #: Bootstrap SD of each group rate.
    rate_sd: np.ndarray
    #: Group pairs (i, j), i before j in vocabulary order, and the bootstrap SD of p_i − p_j.
    pairs: tuple[tuple[str, str], ...]
    pair_sd: np.ndarray
    #: Quantile c of max_ij |d*_ij − d_ij| / sd_ij at ``level`` (0 when every sd is 0).
    critical_value: float
    level: float
    n: int
    n_boot: int
    #: Replicates in which every group had an observation (the others are left out).
    n_valid: int


def delta_bootstrap(
    block: Block,
    confidence: float = 0.95,
    n_boot: int = defaults.BOOTSTRAP_RESAMPLES,
    seed: SeedLike = defaults.SEED,
    simultaneous_over: int = 1,
    *,
    resample: Resample = "two-way",
) -> DeltaResult:
    """Δ = max_g p_g − min_g p_g with a cluster-bootstrap interval that covers 0 under equality.

    Construction: from the bootstrap replicates of the group rates take every pairwise
    difference d*_ij = p*_i − p*_j, its bootstrap SD sd_ij, and the ``level`` quantile c of
    T* = max_ij |d*_ij − d_ij| / sd_ij (a studentised max-t band, simultaneous over pairs).
    Then [d_ij − c sd_ij, d_ij + c sd_ij] covers every pair jointly with probability ≈
    ``level``, and so Δ ∈ [max(0, max_ij L_ij), max_ij U_ij] over both orientations of every
    pair (see :func:`acrb.analysis.estimation.disparity.delta_interval`), clipped to [0, 1].
    ``level`` = 1 − (1 − confidence)/``simultaneous_over`` (Bonferroni over the rows of a
    table). With B replicates only about B(1 − level) of them lie beyond c, so raise
    ``n_boot`` for large families.

    Pairs whose SD is 0 (both groups all True or all False in every replicate) get the point
    interval [d_ij, d_ij]. One group gives Δ = 0 and (0, 0); no group gives NaN.
    """
    level = 1.0 - (1.0 - confidence) / max(int(simultaneous_over), 1)
    groups = block.groups
    rates = block.rates if groups else np.zeros(0)
    n_total = int(block.n.sum())
    g = len(groups)
    if g == 0:
        nan = float("nan")
        empty = np.zeros(0)
        return DeltaResult(
            nan,
            nan,
            nan,
            None,
            None,
            groups,
            rates,
            empty,
            (),
            empty,
            0.0,
            level,
            n_total,
            n_boot,
            0,
        )
    replicates = bootstrap_rates(block, n_boot, seed, resample=resolve_resample(block, resample))
    return delta_from_replicates(groups, rates, replicates, level, n_total, n_boot)


def delta_from_replicates(
    groups: tuple[str, ...],
    rates: np.ndarray,
    replicates: np.ndarray,
    level: float,
    n_total: int,
    n_boot: int,
) -> DeltaResult:
    """Δ and its studentised max-t interval from bootstrap replicates of the group rates.

    The second half of :func:`delta_bootstrap`, for any resampling scheme that yields (B, G)
    replicate rates: the text-to-image analysis (:mod:`acrb.analysis.experiments.attributes`)
    resamples base prompts instead of sources and prompts, and builds the same interval here.
    ``groups`` must be non-empty; replicates with a NaN rate are left out.
    """
    g = len(groups)
    top, bottom = int(np.argmax(rates)), int(np.argmin(rates))
    estimate = float(rates[top] - rates[bottom])
    valid = np.isfinite(replicates).all(axis=1)
    replicates = replicates[valid]
    n_valid = int(valid.sum())
    rate_sd = replicates.std(axis=0, ddof=1) if n_valid > 1 else np.full(g, np.nan)
    if g == 1:
        return DeltaResult(
            0.0,
            0.0,
            0.0,
            groups[0],
            groups[0],
            groups,
            rates,
            rate_sd,
            (),
            np.zeros(0),
            0.0,
            level,
            n_total,
            n_boot,
            n_valid,
        )
    i, j = np.triu_indices(g, k=1)
    pairs = tuple((groups[a], groups[b]) for a, b in zip(i, j, strict=True))
    if n_valid < 2:
        nan = float("nan")
        return DeltaResult(
            estimate,
            nan,
            nan,
            groups[top],
            groups[bottom],
            groups,
            rates,
            rate_sd,
            pairs,
            np.full(len(i), np.nan),
            nan,
            level,
            n_total,
            n_boot,
            n_valid,
        )
    d = rates[i] - rates[j]
    d_star = replicates[:, i] - replicates[:, j]
    pair_sd = d_star.std(axis=0, ddof=1)
    varies = pair_sd > _SD_TOLERANCE
    if varies.any():
        t_star = np.max(np.abs(d_star[:, varies] - d[varies]) / pair_sd[varies], axis=1)
        critical = float(np.quantile(t_star, level))
    else:
        critical = 0.0
    half = np.where(varies, critical * pair_sd, 0.0)
    low, high = d - half, d + half
    lower = max(0.0, float(np.max(np.maximum(low, -high))))
    upper = float(np.max(np.maximum(high, -low)))
    return DeltaResult(
        estimate=estimate,
        ci_low=float(np.clip(lower, 0.0, 1.0)),
        ci_high=float(np.clip(upper, 0.0, 1.0)),
        max_group=groups[top],
        min_group=groups[bottom],
        groups=groups,
        rates=rates,
        rate_sd=rate_sd,
        pairs=pairs,
        pair_sd=pair_sd,
        critical_value=critical,
        level=level,
        n=n_total,
        n_boot=n_boot,
        n_valid=n_valid,
    )


def rate_bootstrap(
    block: Block,
    confidence: float = 0.95,
    n_boot: int = defaults.BOOTSTRAP_RESAMPLES,
    seed: SeedLike = defaults.SEED,
    *,
    resample: Resample = "two-way",
) -> pd.DataFrame:
    """Per-group rate with its Wilson interval and its cluster-bootstrap percentile interval.

    Columns ``outcome, dimension, value, n_sources, n, k, rate, ci_low, ci_high`` (Wilson,
    independent requests, as in :func:`acrb.analysis.estimation.rates.group_rates`) and ``boot_sd,
    boot_low, boot_high`` (bootstrap SD and percentile interval, Davison & Hinkley 1997 ch. 5,
    over the replicates where the group has an observation).
    """
    k, n = block.group_k, block.group_n
    low, high = wilson_interval(k, n, confidence)
    replicates = bootstrap_rates(block, n_boot, seed, resample=resample)
    tail = (1.0 - confidence) / 2.0
    g = len(block.groups)
    boot_sd, boot_low, boot_high = np.full(g, np.nan), np.full(g, np.nan), np.full(g, np.nan)
    for index in range(g):
        column = replicates[:, index]
        column = column[np.isfinite(column)]
        if len(column) > 1:
            boot_sd[index] = column.std(ddof=1)
            boot_low[index], boot_high[index] = np.quantile(column, [tail, 1.0 - tail])
    return pd.DataFrame(
        {
            "outcome": block.outcome,
            "dimension": block.dimension,
            "value": list(block.groups),
            "n_sources": block.group_sources.astype(np.int64),
            "n": n.astype(np.int64),
            "k": k.astype(np.int64),
            "rate": k / np.where(n > 0, n, 1),
            "ci_low": low,
            "ci_high": high,
            "boot_sd": boot_sd,
            "boot_low": boot_low,
            "boot_high": boot_high,
        }
    )


def _two_way_variance(y: np.ndarray, n: np.ndarray) -> float:
    """Variance of the pooled rate Σy/Σn of one group's S x P cells, clustered on both sources
    and prompts: V_S + V_P − V_0 (Cameron, Gelbach & Miller 2011, "Robust inference with
    multiway clustering", JBES 29:238-249), from the linearised residuals r = y − p̂·n, V_S and
    V_P clustered on sources and on prompts (each with its G/(G − 1) factor) and V_0 on cells.
    Where the difference is not positive, the larger one-way variance."""
    total = n.sum()
    if total <= 0:
        return float("nan")
    residual = y - (y.sum() / total) * n
    by_source, by_prompt = residual.sum(axis=1), residual.sum(axis=0)
    by_prompt = by_prompt[n.sum(axis=0) > 0]
    s_count, p_count = len(by_source), len(by_prompt)
    v_s = (by_source**2).sum() * s_count / max(s_count - 1, 1)
    v_p = (by_prompt**2).sum() * p_count / max(p_count - 1, 1)
    v_0 = (residual**2).sum()
    both = v_s + v_p - v_0
    return float((both if both > 0 else max(v_s, v_p)) / total**2)


def rate_intervals(block: Block, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """(G,) lower and upper limits of each group's rate at the design's clustering: the Wilson
    score interval at the effective number of requests n_eff = p̂(1 − p̂)/V, V the two-way
    clustered variance (:func:`_two_way_variance`; Korn & Graubard 1998, "Confidence intervals
    for proportions with small expected number of positive counts estimated from survey data",
    Survey Methodology 24:193-201). n_eff is at most n (clustering never makes requests worth
    more than independent ones). A rate of 0 or 1 has no variance of its own; it takes the
    design effect of the whole block. With few clusters the variance is itself uncertain: the
    critical value is Student's t with min(sources, prompts) − 1 degrees of freedom (Cameron,
    Gelbach & Miller 2011), the fewest clusters of the group's two ways."""
    g = len(block.groups)
    k, n = block.group_k, block.group_n
    rates = pooled_rate(k, n)
    total_rate = block.y.sum() / max(block.n.sum(), 1.0)
    block_variance = _two_way_variance(block.y, block.n)
    binomial = total_rate * (1 - total_rate) / max(block.n.sum(), 1.0)
    block_deff = block_variance / binomial if binomial > 0 else 1.0
    low, high = np.full(g, np.nan), np.full(g, np.nan)
    for index in range(g):
        rows = block.group_index == index
        y, m = block.y[rows], block.n[rows]
        variance = _two_way_variance(y, m)
        rate = rates[index]
        if 0 < rate < 1 and variance > 0:
            n_eff = rate * (1 - rate) / variance
        else:
            n_eff = n[index] / max(block_deff, 1.0)
        n_eff = min(n_eff, n[index])
        clusters = min(int(rows.sum()), int((m.sum(axis=0) > 0).sum()))
        level = _t_level(confidence, clusters)
        lo, hi = wilson_interval(np.array([rate * n_eff]), np.array([n_eff]), level)
        low[index], high[index] = lo[0], hi[0]
    return low, high


def _t_level(confidence: float, clusters: int) -> float:
    """The normal coverage whose z is Student's t quantile at ``confidence`` with
    ``clusters`` − 1 degrees of freedom (held below 1 − 1e-15, z ≈ 8, which only a group of
    two or three clusters nears); ``confidence`` itself with fewer than two clusters."""
    from scipy.stats import norm, t

    if clusters < 2:
        return confidence
    return min(1.0 - 2.0 * norm.sf(t.ppf(0.5 + confidence / 2, clusters - 1)), 1.0 - 1e-15)


def mean_intervals(block: Block, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """(G,) limits of each group's pooled mean Σy/Σn of a score (not a rate) at the design's
    clustering: mean ± t·√V, V the two-way clustered variance of :func:`_two_way_variance`
    (the ratio estimator linearised) and t Student's quantile with min(sources, prompts) − 1
    degrees of freedom, as :func:`rate_intervals` takes for a rate. A group whose every
    request scores the same has V = 0 and the point interval."""
    from scipy.stats import norm

    g = len(block.groups)
    means = pooled_rate(block.group_k, block.group_n)
    low, high = np.full(g, np.nan), np.full(g, np.nan)
    for index in range(g):
        rows = block.group_index == index
        y, m = block.y[rows], block.n[rows]
        if m.sum() <= 0:
            continue
        clusters = min(int(rows.sum()), int((m.sum(axis=0) > 0).sum()))
        z = norm.ppf(0.5 + _t_level(confidence, clusters) / 2)
        half = z * np.sqrt(max(_two_way_variance(y, m), 0.0))
        low[index], high[index] = means[index] - half, means[index] + half
    return low, high


def clustered_rates(frame: pd.DataFrame, outcome: str, confidence: float = 0.95) -> pd.DataFrame:
    """:func:`acrb.analysis.estimation.rates.group_rates` (same rows, counts and rates) with each
    interval at the design's clustering (:func:`rate_intervals`) instead of counting requests as
    independent. Groups without requests keep NaN limits."""
    rates = group_rates(frame, outcome, confidence)
    design = _design(frame, outcome)
    limits: dict[tuple[str, str, str], tuple[float, float]] = {}
    for category in category_levels(frame):
        mask = None if category == ALL_CATEGORIES else design.prompt_category == category
        for dimension in SOURCE_DIMENSIONS:
            block = _block(design, dimension, mask)
            if not block.groups:
                continue
            low, high = rate_intervals(block, confidence)
            for group, lo, hi in zip(block.groups, low, high, strict=True):
                limits[(category, dimension, group)] = (lo, hi)
    # One assignment per column (a masked assignment per group took most of the time).
    keys = zip(rates["category"], rates["dimension"], rates["value"], strict=True)
    rows = [(i, limits[key]) for i, key in enumerate(keys) if key in limits]
    if rows:
        at = np.array([i for i, _ in rows])
        for column, side in (("ci_low", 0), ("ci_high", 1)):
            values = rates[column].to_numpy(dtype=float, copy=True)
            values[at] = [interval[side] for _, interval in rows]
            rates[column] = values
    return rates


# --------------------------------------------------------------------------------------------
# Permutation test


@dataclass(frozen=True)
class PermutationResult:
    """Permutation p-value of Δ with labels permuted across sources."""

    p_value: float
    observed: float
    n_perm: int
    #: Whether labels were permuted within strata of the other source dimensions.
    stratified: bool
    n_strata: int


def _strata(block: Block, stratify: bool | None) -> tuple[np.ndarray, bool]:
    """Stratum code per source, and whether the permutation is stratified.

    Automatic rule (``stratify=None``): stratify by the combination of the other source
    dimensions when every stratum holds more than one source and at least one stratum holds
    two groups (otherwise nothing could move); else permute freely.
    """
    count = block.n_sources
    if not block.covariates or stratify is False:
        return np.zeros(count, np.int64), False
    combined = np.zeros(count, np.int64)
    for values in block.covariates.values():
        level, uniques = pd.factorize(np.asarray(values, dtype=object).astype(str), sort=True)
        combined = combined * max(len(uniques), 1) + level
    codes = np.unique(combined, return_inverse=True)[1].ravel().astype(np.int64)
    sizes = np.bincount(codes)
    pairs = np.unique(codes * len(block.groups) + block.group_index)
    distinct = np.bincount(pairs // len(block.groups), minlength=len(sizes))
    usable = bool((sizes > 1).all() and (distinct > 1).any())
    if stratify is None and not usable:
        return np.zeros(count, np.int64), False
    return codes, True


def _permuted_delta(
    labels: np.ndarray, y_source: np.ndarray, n_source: np.ndarray, groups: int
) -> np.ndarray:
    """Δ for each row of ``labels`` (R, S): max − min over groups of the pooled rates."""
    rows = labels.shape[0]
    flat = (labels + groups * np.arange(rows)[:, None]).ravel()
    k = np.bincount(flat, np.tile(y_source, rows), minlength=rows * groups).reshape(rows, groups)
    n = np.bincount(flat, np.tile(n_source, rows), minlength=rows * groups).reshape(rows, groups)
    rate = pooled_rate(k, n)
    return np.nanmax(rate, axis=1) - np.nanmin(rate, axis=1)


def _between_groups(labels: np.ndarray, rate_source: np.ndarray, groups: int) -> np.ndarray:
    """Σ_g (Σ_{s∈g} r_s)² / m_g for each row of ``labels`` (R, S): the between-group sum of
    squares of the per-source rates r_s plus a constant. A permutation keeps the group sizes
    m_g and the total sum of squares, so this orders the permutations exactly as the one-way
    ANOVA F of the per-source rates does."""
    rows = labels.shape[0]
    flat = (labels + groups * np.arange(rows)[:, None]).ravel()
    sums = np.bincount(flat, np.tile(rate_source, rows), minlength=rows * groups)
    sizes = np.bincount(flat, minlength=rows * groups)
    share = np.zeros(rows * groups)
    np.divide(sums**2, sizes, out=share, where=sizes > 0)
    return share.reshape(rows, groups).sum(axis=1)


def _gee_score(labels: np.ndarray, y_source: np.ndarray, n_source: np.ndarray,
               groups: int) -> np.ndarray:
    """The robust score statistic of "no group effect" in a logistic GEE with an independence
    working correlation, clustered on source (Rotnitzky & Jewell 1990, Biometrika 77:485-497),
    for each row of ``labels``: Σ_g U_g² / V_g with U_g = Σ_{s∈g} (y_s − n_s p̄) and
    V_g = Σ_{s∈g} (y_s − n_s p̄)² (a source lies in one group, so the sandwich is diagonal)."""
    rows = labels.shape[0]
    residual = y_source - n_source * (y_source.sum() / max(n_source.sum(), 1.0))
    flat = (labels + groups * np.arange(rows)[:, None]).ravel()
    score = np.bincount(flat, np.tile(residual, rows), minlength=rows * groups)
    spread = np.bincount(flat, np.tile(residual**2, rows), minlength=rows * groups)
    share = np.zeros(rows * groups)
    np.divide(score**2, spread, out=share, where=spread > _SD_TOLERANCE)
    return share.reshape(rows, groups).sum(axis=1)


def _test_statistic(test: GroupTest, labels: np.ndarray, block: Block) -> np.ndarray:
    y_source, n_source = block.y.sum(axis=1), block.n.sum(axis=1)
    g = len(block.groups)
    if test == "range":
        return _permuted_delta(labels, y_source, n_source, g)
    if test == "between-groups":
        return _between_groups(labels, y_source / n_source, g)
    if test == "gee-score":
        return _gee_score(labels, y_source, n_source, g)
    raise ValueError(f"test must be 'between-groups', 'range' or 'gee-score', not {test!r}")


def group_test_p(
    block: Block,
    test: GroupTest = "between-groups",
    n_perm: int = defaults.PERMUTATIONS,
    seed: SeedLike = defaults.SEED,
    *,
    stratify: bool | None = None,
    mid_p: bool | None = None,
) -> PermutationResult:
    """p-value of "the groups' rates differ by more than chance" by permuting group labels
    across sources.

    Statistics (``test``): ``"between-groups"`` (default), the one-way between-group sum of
    squares of the per-source rates (equivalent to the ANOVA F of per-source means, which it
    matches in power at the study's design while keeping the permutation test's exact size);
    ``"range"``, Δ = max − min of the pooled group rates; ``"gee-score"``, the robust GEE
    score statistic (:func:`_gee_score`). Which is most powerful, measured:
    ``docs/statistics.md#the-row-test``.

    The group labels are permuted across sources (each source keeps all its requests), within
    strata of the other source dimensions (see :func:`_strata`), ``n_perm`` times at once: the
    sources of each stratum are put in a random order by sorting ``stratum + U(0, 1)`` keys, so
    every row of the (n_perm, S) label matrix is a uniform within-stratum permutation.
    p = (1 + #{T* ≥ T}) / (1 + n_perm), whose size is at most α; for Δ (``mid_p=None``
    chooses by the statistic), which takes few distinct values and ties often, the mid-p value
    (1 + #{T* > T} + ½·#{T* = T}) / (1 + n_perm) instead, which brings its size up to about α
    (the plain one is conservative there). A statistic with no gap at
    all (Δ = 0, or no between-group spread) gives p = 1. Fewer than two groups give p = 1
    (NaN when there is no group).
    """
    g = len(block.groups)
    if g == 0:
        return PermutationResult(float("nan"), float("nan"), n_perm, False, 0)
    codes, stratified = _strata(block, stratify)
    labels = block.group_index
    observed = float(_test_statistic(test, labels[None, :], block)[0])
    if g < 2:
        return PermutationResult(1.0, observed, n_perm, stratified, int(codes.max()) + 1)
    rng = np.random.default_rng(seed)
    keys = codes[None, :] + rng.random((n_perm, block.n_sources))
    order = np.argsort(keys, axis=1)
    slots = np.argsort(codes, kind="stable")
    permuted = np.empty((n_perm, block.n_sources), dtype=np.int64)
    permuted[:, slots] = labels[order]
    simulated = _test_statistic(test, permuted, block)
    tolerance = _PERM_TOLERANCE * max(1.0, abs(observed))
    above = int(np.count_nonzero(simulated > observed + tolerance))
    tied = int(np.count_nonzero(np.abs(simulated - observed) <= tolerance))
    # Δ takes few distinct values (rates are k/n), so many permutations tie with the observed
    # value and the plain p-value (1 + above + tied)/(1 + B) is conservative. The mid-p value
    # counts ties half (Lancaster 1961; Agresti 2001, "Exact inference for
    # categorical data", Stat Med 20); the size of both:
    # docs/statistics.md#permutation-test-over-sources.
    if mid_p is None:
        mid_p = test == "range"
    extreme = above + (0.5 * tied if mid_p else tied)
    if _no_gap(test, block, observed):  # no gap at all: no evidence, whatever the ties
        extreme = n_perm
    return PermutationResult(
        p_value=float((1 + extreme) / (1 + n_perm)),
        observed=observed,
        n_perm=n_perm,
        stratified=stratified,
        n_strata=int(codes.max()) + 1,
    )


def _no_gap(test: GroupTest, block: Block, observed: float) -> bool:
    """Whether the observed statistic shows no difference between the groups at all."""
    if test == "range":
        return observed <= _PERM_TOLERANCE
    rates = block.y.sum(axis=1) / block.n.sum(axis=1)
    means = np.bincount(block.group_index, rates) / np.bincount(block.group_index)
    return bool(np.ptp(means) <= _PERM_TOLERANCE)


def delta_permutation_p(
    block: Block,
    n_perm: int = defaults.PERMUTATIONS,
    seed: SeedLike = defaults.SEED,
    *,
    stratify: bool | None = None,
    mid_p: bool = True,
) -> PermutationResult:
    """p-value of "Δ is larger than it would be if group labels did not matter": the
    permutation test of :func:`group_test_p` with Δ = max − min of the pooled rates as its
    statistic."""
    return group_test_p(block, "range", n_perm, seed, stratify=stratify, mid_p=mid_p)


# --------------------------------------------------------------------------------------------
# Δ by test inversion, and the bias-corrected Δ

#: Share of α the lower limit's one-sided test spends away from Δ = 0 (the upper limit's
#: spends ½). The bootstrap's lower tail of a group rate is too light at a few sources per
#: group (skewed per-source rates); with ½ the lower limit missed in 4-6% of simulated audits
#: at half the study's sources. Measured: docs/statistics.md, "The interval of Δ".
LOWER_SHARE = 0.2
#: Resolution of the inverted limits (rate units: 0.01 pp).
_RESOLUTION = 1e-4


@dataclass(frozen=True)
class DeltaInversion:
    """Δ with its bias-corrected estimate and its interval by test inversion."""

    estimate: float
    corrected: float
    ci_low: float
    ci_high: float
    max_group: str | None
    min_group: str | None
    #: The units resampled (after ``"auto"`` chose from the design).
    resample: str
    n: int
    n_boot: int


def _range_at(delta: float, shape: np.ndarray, errors: np.ndarray) -> np.ndarray:
    """Δ* = max − min of (δ·shape + e*) for each bootstrap error vector e* (rows)."""
    values = delta * shape[None, :] + errors
    return values.max(axis=1) - values.min(axis=1)


def _smallest(predicate, low: float = 0.0, high: float = 1.0) -> float:
    """The smallest δ in [low, high] where ``predicate`` holds, assuming it holds from some
    point on (bisection to :data:`_RESOLUTION`); ``high`` if it never holds below it."""
    if predicate(low):
        return low
    if not predicate(high):
        return high
    while high - low > _RESOLUTION:
        middle = (low + high) / 2
        if predicate(middle):
            high = middle
        else:
            low = middle
    return high


def stratum_adjusted(block: Block) -> Block:
    """The block as the Δ interval's bootstrap sees it: each source's requests moved so that
    its rate r_s becomes r̄ + c_k·(r_s − r̄_k), with r̄_k the pooled rate of its stratum k (the
    combination of the other source dimensions, as the permutation test stratifies:
    :func:`_strata`), r̄ the block's and c_k = √(S_k/(S_k − 1)) for the S_k sources of the
    stratum, which gives back the variance the stratum mean took. Cell by cell
    y'_sp = n_sp·r̄ + c_k·(y_sp − n_sp·r̄_k), so the counts n stay.

    Why: the design fixes how many sources of each stratum a group has (FairFace sourcing
    balances gender x age within each race), so when gender or age moves the rate, that
    variation is not sampling error of a group's rate. A source bootstrap of the raw block
    would count it, and the interval would be too wide (measured: 1.35-1.42 times the spread
    of Δ-hat with gender and age effects of ±1 on the logit, 97-98% coverage). The group
    rates' shifts this makes cancel in centred replicates, which are all the interval uses.
    A block the permutation test would not stratify is returned as it is."""
    codes, stratified = _strata(block, None)
    if not stratified:
        return block
    total = block.n.sum()
    if total <= 0:
        return block
    overall = block.y.sum() / total
    k_sum = np.bincount(codes, block.y.sum(axis=1))
    n_sum = np.bincount(codes, block.n.sum(axis=1))
    stratum_rate = np.divide(k_sum, n_sum, out=np.full(len(n_sum), overall), where=n_sum > 0)
    sizes = np.bincount(codes).astype(float)
    scale = np.sqrt(sizes / np.maximum(sizes - 1, 1))
    y = (block.n * overall
         + scale[codes][:, None] * (block.y - block.n * stratum_rate[codes][:, None]))
    return replace(block, y=y)


def delta_inversion(
    block: Block,
    boundary_p: float,
    confidence: float = 0.95,
    n_boot: int = defaults.BOOTSTRAP_RESAMPLES,
    seed: SeedLike = defaults.SEED,
    *,
    resample: Resample = "auto",
) -> DeltaInversion:
    """Δ = max − min of the pooled group rates, a bias-corrected Δ and a per-row interval.

    The sampling error of the group rates is taken from the cluster bootstrap (``resample``;
    ``"auto"``: sources within their group when the design is crossed, else two-way):
    e* = (p* − mean p*)·√(m_g / (m_g − 1)) with m_g the group's sources (the bootstrap's
    small-sample variance factor undone). Under a configuration of true rates δ·shape (the
    range is unchanged by a shift), Δ-hat behaves like Δ*(δ) = range(δ·shape + e*).

    - **Interval** (test inversion; Δ ≥ 0 puts Δ = 0 on the boundary): δ = 0 is in the
      interval exactly when the row's permutation test does not reject (``boundary_p`` ≥
      α = 1 − ``confidence``), so the interval excludes 0 exactly when the row test is
      significant on its own; its coverage at Δ = 0 is the test's size. Away from 0 the limits
      invert one-sided bootstrap tests: the lower limit is the smallest δ whose upper
      (1 − α·:data:`LOWER_SHARE`) quantile of Δ*(δ) reaches Δ-hat, under the configuration
      that makes Δ-hat largest (the highest half of the groups at δ, the rest at 0); the upper
      limit is the largest δ whose α/2 quantile of Δ*(δ) stays at or below Δ-hat, under the
      observed configuration scaled to range δ (which spreads the groups and so biases Δ-hat
      least, keeping the limit high). When 0 is in the interval no α is spent below it, and
      the upper limit takes the α quantile (one-sided), as a confidence bound [0, U] does.
    - **Bias-corrected Δ**: the δ at which the mean of Δ*(δ) equals Δ-hat, under the
      two-cluster configuration read from the data (groups above the midpoint of the observed
      rates at δ, the others at 0); below the mean of Δ*(0) it is Δ-hat minus that mean,
      negative when the groups look more alike than chance alone would make them, so that it
      is unbiased at Δ = 0 too. Max − min of estimated rates is biased upward (most at
      Δ = 0: the range of noise).

    Fewer than two groups give Δ = 0 with (0, 0), and rates no replicate moves (all True or
    all False) the point Δ; no group gives NaN.
    """
    scheme = resolve_resample(block, resample)
    replicates = (bootstrap_rates(stratum_adjusted(block), n_boot, seed, resample=scheme)
                  if len(block.groups) >= 2 else np.empty((0, len(block.groups))))
    return invert_delta(block.groups, block.rates, replicates, block.group_sources,
                        boundary_p, confidence, resample=scheme, n=int(block.n.sum()),
                        n_boot=n_boot)


def invert_delta(
    groups: tuple[str, ...],
    rates: np.ndarray,
    replicates: np.ndarray,
    units: np.ndarray,
    boundary_p: float,
    confidence: float = 0.95,
    *,
    resample: str,
    n: int,
    n_boot: int,
) -> DeltaInversion:
    """The body of :func:`delta_inversion` on bootstrap replicates of the group rates drawn
    by any cluster bootstrap: ``replicates`` (B, G) of the point ``rates`` (G,), ``units``
    (G,) the clusters each group's rate averages over (sources, or the text-to-image table's
    base prompts), whose small-sample variance factor is undone; ``resample`` and ``n`` are
    only reported. The interval's boundary is ``boundary_p``, the row test's p-value."""
    g = len(groups)
    if g == 0:
        nan = float("nan")
        return DeltaInversion(nan, nan, nan, nan, None, None, resample, n, n_boot)
    rates = np.asarray(rates, dtype=float)
    top, bottom = int(np.argmax(rates)), int(np.argmin(rates))
    estimate = float(rates[top] - rates[bottom])
    if g == 1:
        return DeltaInversion(0.0, 0.0, 0.0, 0.0, groups[0], groups[0], resample, n, n_boot)
    replicates = replicates[np.isfinite(replicates).all(axis=1)]
    if len(replicates) < 2:
        nan = float("nan")
        return DeltaInversion(estimate, nan, nan, nan, groups[top], groups[bottom], resample,
                              n, n_boot)
    sources = np.asarray(units, dtype=float)
    inflation = np.sqrt(np.where(sources > 1, sources / np.maximum(sources - 1, 1), 1.0))
    # Centred on the replicates' mean: the noise has mean 0, so (Jensen) the mean of Δ*(δ) is
    # at least δ and the corrected Δ never exceeds the raw one.
    errors = (replicates - replicates.mean(axis=0)) * inflation
    if not (np.abs(errors) > _SD_TOLERANCE).any():  # no replicate moved a rate: no noise
        return DeltaInversion(estimate, estimate, estimate, estimate, groups[top],
                              groups[bottom], resample, n, n_boot)
    alpha = 1.0 - confidence
    rank = np.argsort(np.argsort(-rates, kind="stable"), kind="stable")
    halves = (rank < g // 2).astype(float)
    midpoint = (rates[top] + rates[bottom]) / 2
    clustered = (rates >= midpoint).astype(float) if estimate > 0 else halves
    scaled = (rates - rates[bottom]) / estimate if estimate > 0 else np.eye(g)[0]

    def quantile_reaches(delta: float) -> bool:
        return float(np.quantile(_range_at(delta, halves, errors),
                                 1.0 - alpha * LOWER_SHARE)) >= estimate

    # δ = 0 is the row test's to decide; a rejected 0 leaves the interval just above it.
    low = 0.0 if boundary_p >= alpha else max(_smallest(quantile_reaches), _RESOLUTION)
    upper_tail = alpha if low == 0.0 else alpha / 2

    def quantile_passes(delta: float) -> bool:
        return float(np.quantile(_range_at(delta, scaled, errors), upper_tail)) > estimate

    def mean_reaches(delta: float) -> bool:
        return float(_range_at(delta, clustered, errors).mean()) >= estimate

    high = max(_smallest(quantile_passes), low)
    null_mean = float(_range_at(0.0, clustered, errors).mean())
    corrected = estimate - null_mean if estimate < null_mean else _smallest(mean_reaches)
    # Jensen puts the solution at or below Δ-hat; the bisection's last step may overshoot it.
    corrected = min(corrected, estimate)
    return DeltaInversion(
        estimate=estimate,
        corrected=float(corrected),
        ci_low=float(np.clip(low, 0.0, 1.0)),
        ci_high=float(np.clip(high, 0.0, 1.0)),
        max_group=groups[top],
        min_group=groups[bottom],
        resample=resample,
        n=n,
        n_boot=n_boot,
    )


# --------------------------------------------------------------------------------------------
# The table


def clustered_disparities(
    frame: pd.DataFrame,
    outcome: str,
    confidence: float = 0.95,
    alpha: float = 0.05,
    n_boot: int = defaults.BOOTSTRAP_RESAMPLES,
    n_perm: int = defaults.PERMUTATIONS,
    seed: int = defaults.SEED,
    simultaneous: bool = False,
    *,
    resample: Resample = "auto",
    test: GroupTest = "between-groups",
) -> pd.DataFrame:
    """Cluster-robust counterpart of :func:`acrb.analysis.estimation.disparity.disparities`.

    One row per category (``"all"`` first, then the frame's categories sorted) x source
    dimension, columns :data:`acrb.analysis.estimation.disparity.DISPARITY_COLUMNS`. ``delta``,
    ``max_group``, ``min_group`` and ``n`` equal those of ``disparities`` (same pooled rates);
    ``delta_corrected`` is the bias-corrected Δ of :func:`delta_inversion`; ``p_value`` is the
    row's permutation test over sources (:func:`group_test_p` with ``test``), ``p_adjusted``
    Holm over every row with a p-value (the screening of the whole table), ``flagged`` =
    p_adjusted < ``alpha``.

    Intervals: by default each row's own interval at ``confidence`` by test inversion
    (:func:`delta_inversion`; it excludes 0 exactly when the row's unadjusted p < 1 −
    ``confidence``); ``method`` says ``"test-inversion/<test> permutation"``. With
    ``simultaneous`` the intervals are the studentised max-t bands of :func:`delta_bootstrap`
    at level 1 − (1 − confidence)/F, F the number of rows comparing at least two groups, so
    they cover all the table's gaps jointly (``method`` ``"max-t band (simultaneous)/…"``).
    ``resample="auto"`` resamples sources alone in a crossed block, both ways otherwise. Each
    row draws its own seed from ``numpy.random.SeedSequence(seed)``, so the table is
    reproducible to the digit.
    """
    design = _design(frame, outcome)
    _warn_unknown(design)
    blocks = []
    for category in category_levels(frame):
        mask = None if category == ALL_CATEGORIES else design.prompt_category == category
        for dimension in SOURCE_DIMENSIONS:
            blocks.append((category, dimension, _block(design, dimension, mask)))
    family = sum(int(len(block.groups) >= 2) for _, _, block in blocks)
    over = max(family, 1)
    children = np.random.SeedSequence(seed).spawn(len(blocks))
    interval = "max-t band (simultaneous)" if simultaneous else "test-inversion"
    rows = []
    for (category, dimension, block), child in zip(blocks, children, strict=True):
        boot_seed, perm_seed = child.spawn(2)
        permutation = group_test_p(block, test, n_perm, perm_seed)
        inverted = delta_inversion(block, permutation.p_value, confidence, n_boot, boot_seed,
                                   resample=resample)
        low, high = inverted.ci_low, inverted.ci_high
        if simultaneous:
            band = delta_bootstrap(block, confidence, n_boot, boot_seed, over, resample=resample)
            low, high = band.ci_low, band.ci_high
        rows.append(
            {
                "outcome": outcome,
                "category": category,
                "dimension": dimension,
                "delta": inverted.estimate,
                "delta_corrected": inverted.corrected,
                "ci_low": low,
                "ci_high": high,
                "max_group": inverted.max_group,
                "min_group": inverted.min_group,
                "n": inverted.n,
                "p_value": permutation.p_value,
                "method": f"{interval}/{test} permutation",
            }
        )
    result = pd.DataFrame(rows)
    result["p_adjusted"] = adjust(result["p_value"].to_numpy(dtype=float), "holm")
    result["flagged"] = (result["p_adjusted"] < alpha).fillna(False).astype(bool)
    return result[list(DISPARITY_COLUMNS)]


__all__ = [
    "LOWER_SHARE",
    "METHOD",
    "Block",
    "DeltaInversion",
    "DeltaResult",
    "PermutationResult",
    "bootstrap_rates",
    "bootstrap_weights",
    "clustered_disparities",
    "clustered_rates",
    "delta_bootstrap",
    "delta_from_replicates",
    "delta_inversion",
    "delta_permutation_p",
    "group_test_p",
    "invert_delta",
    "mean_intervals",
    "pooled_rate",
    "prepare_block",
    "rate_bootstrap",
    "rate_intervals",
    "resolve_resample",
    "stratum_adjusted",
]
