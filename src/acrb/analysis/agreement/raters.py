"""How far human raters agree, with each other, with themselves and with the judges.

Every function takes frames of :class:`acrb.records.RatingRecord` rows (``ratings``) and of
:class:`acrb.records.ReviewItemRecord` rows (``items``, for the model and the source's group
labels), and returns a frame; nothing here reads files. A *unit* is one output of one item
(``item_id``, ``output``): the edited output, or the feature-prompt output shown beside it.
Repeated ratings (``repeat`` True) are left out of everything except
:func:`intra_rater_consistency`, unless a function is asked to keep them. "Cannot tell"
(None) is a missing rating.

- :func:`rater_agreement`: agreement between raters per axis and arm (the edited outputs, the
  feature-prompt outputs, both pooled), overall, per model and per source group: Fleiss' kappa
  (Fleiss 1971, "Measuring nominal scale agreement among many raters", Psychol Bull
  76:378-382; ``statsmodels.stats.inter_rater.fleiss_kappa``, generalised to unequal numbers
  of ratings, see below) and Krippendorff's alpha at the ordinal and interval level
  (Krippendorff 2011, "Computing Krippendorff's Alpha-Reliability", Annenberg School for
  Communication; the ``krippendorff`` package), each with a percentile bootstrap interval over
  items.
- :func:`intra_rater_consistency`: a rater's first and repeated answer about the same output:
  share identical and quadratic-weighted Cohen's kappa (Cohen 1968, Psychol Bull 70:213-220;
  ``sklearn.metrics.cohen_kappa_score``).
- :func:`judge_human_units`, :func:`judge_human_agreement`, :func:`judge_misses`: the judges'
  ensemble score (:class:`acrb.records.VerdictRecord`) against the human consensus, per axis
  and group; and, per source group, how often the judge misses an outcome the humans see
  ("does the judge miss lightening more often on darker skin?").
- :func:`arm_tests`, :func:`group_tests`: Wilcoxon signed-rank between the two arms of an
  item, Kruskal-Wallis across groups and Mann-Whitney between two groups (``scipy.stats``).

**Human consensus** of a unit on an axis: the median (params ``review.consensus``, default) or
the mean (the study's paper) of its raters' answers, rounded the way the judges' study ensemble
rounds (:mod:`acrb.judges.ensemble`: halves to the even integer, so 2.5 -> 2 and 3.5 -> 4), so
that a human and a judge outcome are read from scores on the same footing. With an odd number
of answers the median is already an answer.

**Unequal numbers of ratings per unit** (a "cannot tell", a survey whose items got 3 to 6
raters): Fleiss' kappa (1971) is defined for the same number m of ratings per unit, and
statsmodels' ``fleiss_kappa`` needs a count table with equal row sums. Units with fewer than
two ratings are dropped (they carry no pair to agree on). Where every unit left has the same
count, statsmodels computes the kappa. Otherwise :func:`fleiss_kappa_unequal` computes its
generalisation to unequal counts (Gwet 2014, Handbook of Inter-Rater Reliability, 4th ed.,
ch. 2, "Fleiss' generalized kappa"; it reduces to Fleiss' formula when counts are equal):
observed agreement p_a = mean over units of sum_k r_ik (r_ik − 1) / (r_i (r_i − 1)), chance
agreement p_e = sum_k pi_k^2 with pi_k = mean over units of r_ik / r_i, kappa = (p_a − p_e) /
(1 − p_e). **Every unit counts once**, however many ratings it has: a unit rated by six people
contributes its share of agreeing pairs (estimated from 15 pairs instead of 3) and its
category shares, with the weight of a unit rated by three. No rating is dropped and nothing is
random, so the kappa is the same on every run. Krippendorff's alpha also uses every rating
(pairable values, so a unit with more ratings weighs more there).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

import krippendorff
import numpy as np
import pandas as pd

from acrb.analysis import defaults
from acrb.analysis.estimation.rates import wilson_interval
from acrb.analysis.frame import check_columns
from acrb.analysis.tests.contingency import homogeneity_test
from acrb.analysis.tests.pvalues import adjust
from acrb.config import ConsensusRule, OutcomeRule, ReviewParams
from acrb.demographics import SOURCE_DIMENSIONS
from acrb.errors import InputDataError
from acrb.records import RATED_AXES, REVIEW_AXES

#: The values of every review axis.
LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5)
#: The pseudo-dimension and group of rows that pool every unit.
ALL = "all"
#: The dimension of per-model rows (the source dimensions come from SOURCE_DIMENSIONS).
MODEL = "model"
#: Bootstrap replicates of agreement intervals when none are given: params ``review.bootstrap``'s
#: default.
REVIEW_BOOTSTRAP: int = ReviewParams.model_fields["bootstrap"].default
#: Keys of a unit.
UNIT: tuple[str, str] = ("item_id", "output")
#: The arms agreement is reported for: each output alone, and both pooled.
ARMS: tuple[str, ...] = ("edited", "feature", "both")
#: The arm that pools both outputs.
BOTH = "both"

AlphaLevel = Literal["nominal", "ordinal", "interval"]
#: Statistics of :func:`rater_agreement`, in the order its rows list them.
AGREEMENT_STATISTICS: tuple[str, ...] = ("fleiss_kappa", "alpha_ordinal", "alpha_interval")

AGREEMENT_COLUMNS: tuple[str, ...] = ("axis", "arm", "statistic", "dimension", "group",
                                      "n_items", "n_units", "n_ratings", "estimate", "ci_low",
                                      "ci_high", "note")
CONSISTENCY_COLUMNS: tuple[str, ...] = ("axis", "rater", "n_pairs", "share_identical",
                                        "weighted_kappa", "note")
JUDGE_HUMAN_COLUMNS: tuple[str, ...] = ("axis", "dimension", "group", "n", "weighted_kappa",
                                        "spearman", "spearman_p", "mean_difference", "ci_low",
                                        "ci_high", "note")
MISS_COLUMNS: tuple[str, ...] = ("outcome", "dimension", "group", "n", "human_positive",
                                 "judge_missed", "miss_rate", "ci_low", "ci_high",
                                 "mean_difference", "p_value", "test", "note")
TEST_COLUMNS: tuple[str, ...] = ("axis", "test", "dimension", "groups", "n", "statistic",
                                 "p_value", "p_adjusted", "note")

_RATING_COLUMNS: tuple[str, ...] = ("rater", "item_id", "output", "repeat")
_ITEM_COLUMNS: tuple[str, ...] = ("item_id", "model", *SOURCE_DIMENSIONS)


# --------------------------------------------------------------------------------------------
# Units and the per-unit count table


def between_rater_ratings(ratings: pd.DataFrame, include_repeats: bool = False) -> pd.DataFrame:
    """The ratings that count between raters: repeats left out unless ``include_repeats``."""
    check_columns(ratings, list(_RATING_COLUMNS))
    if include_repeats:
        return ratings
    return ratings.loc[~ratings["repeat"].astype(bool)]


def rated_axes(ratings: pd.DataFrame) -> tuple[str, ...]:
    """The axes ``ratings`` answer: :data:`~acrb.records.REVIEW_AXES`, and ``age_direction``
    where any rating carries it (people asked the study's bipolar age item), in
    :data:`~acrb.records.RATED_AXES` order."""
    extra = [axis for axis in RATED_AXES if axis not in REVIEW_AXES and axis in ratings
             and ratings[axis].notna().any()]
    return (*REVIEW_AXES, *extra)


def _axis_scores(ratings: pd.DataFrame, axis: str) -> pd.Series:
    """The answers on ``axis`` as integers 1-5 (NA = cannot tell); anything else is refused."""
    check_columns(ratings, [axis])
    scores = pd.to_numeric(ratings[axis], errors="coerce")
    bad = scores.notna() & ~scores.isin(LEVELS)
    if bad.any():
        raise InputDataError(
            f"rating {ratings.loc[bad].index[0]!r} has {axis} = {scores[bad].iloc[0]!r}, "
            f"outside 1-5",
            "ratings are integers 1-5 or empty (cannot tell); fix or re-import the ratings",
        )
    return scores.astype("Int64")


@dataclass(frozen=True)
class UnitCounts:
    """Per unit, how many raters gave each value on one axis (a units x 5 count table, the
    ``value_counts`` of :func:`krippendorff.alpha` and the table of Fleiss' kappa).

    ``units``: ``item_id``, ``output`` and the item's labels, one row per unit with at least
    two ratings; ``counts``: (U, 5) integers, column j = value j + 1.
    """

    units: pd.DataFrame
    counts: np.ndarray

    @property
    def n_ratings(self) -> np.ndarray:
        return self.counts.sum(axis=1)


def unit_counts(ratings: pd.DataFrame, items: pd.DataFrame, axis: str) -> UnitCounts:
    """The count table of ``axis`` over the units of ``ratings`` (repeats already removed).

    Units with fewer than two answers on the axis are dropped: they have no pair to agree on.
    Raises :class:`InputDataError` if a rating names an item missing from ``items``.
    """
    scores = _axis_scores(ratings, axis)
    answered = ratings.assign(_score=scores).loc[scores.notna()]
    if answered.empty:
        return UnitCounts(pd.DataFrame(columns=[*UNIT, *_ITEM_COLUMNS[1:]]),
                          np.zeros((0, len(LEVELS)), dtype=np.int64))
    table = pd.crosstab([answered["item_id"], answered["output"]],
                        answered["_score"].astype(int))
    table = table.reindex(columns=list(LEVELS), fill_value=0)
    table = table.loc[table.sum(axis=1) >= 2]
    units = table.index.to_frame(index=False)
    units = _with_labels(units, items)
    return UnitCounts(units, table.to_numpy(dtype=np.int64))


def _with_labels(units: pd.DataFrame, items: pd.DataFrame) -> pd.DataFrame:
    """``units`` (with ``item_id``) joined with the item's model and source groups."""
    check_columns(items, list(_ITEM_COLUMNS))
    labels = items[list(_ITEM_COLUMNS)].drop_duplicates("item_id")
    joined = units.merge(labels, on="item_id", how="left", validate="many_to_one")
    unknown = joined["model"].isna()
    if unknown.any():
        raise InputDataError(
            f"ratings name item {joined.loc[unknown, 'item_id'].iloc[0]!r}, which is not in "
            "the review items",
            "rate only items of the review set (or import the survey's items with its ratings)",
        )
    return joined


def fleiss_kappa_unequal(counts: np.ndarray) -> float:
    """Fleiss' kappa generalised to units with unequal numbers of ratings (Gwet 2014, see the
    module docstring: every unit weighs the same). ``counts``: (units, categories) integers;
    units with fewer than two ratings are left out. NaN when undefined (no unit, or every
    rating in one category, where chance agreement is 1). Equals Fleiss' (1971) kappa when
    every unit has the same count."""
    table = np.asarray(counts, dtype=float)
    totals = table.sum(axis=1) if table.ndim == 2 else np.zeros(0)
    keep = totals >= 2
    table, totals = table[keep], totals[keep]
    if len(table) == 0:
        return math.nan
    observed = float(((table * (table - 1)).sum(axis=1) / (totals * (totals - 1))).mean())
    shares = (table / totals[:, None]).mean(axis=0)
    chance = float((shares ** 2).sum())
    if np.isclose(chance, 1.0):
        return math.nan
    return (observed - chance) / (1.0 - chance)


def _fleiss(counts: np.ndarray) -> float:
    """Fleiss' kappa of a count table: statsmodels' when every unit has the same number of
    ratings, :func:`fleiss_kappa_unequal` otherwise; NaN when undefined."""
    from statsmodels.stats.inter_rater import fleiss_kappa

    if len(counts) == 0:
        return math.nan
    totals = counts.sum(axis=1)
    if not (totals == totals[0]).all():
        return fleiss_kappa_unequal(counts)
    p = counts.sum(axis=0) / counts.sum()
    if np.isclose((p ** 2).sum(), 1.0):
        return math.nan
    return float(fleiss_kappa(counts, method="fleiss"))


def _alpha(counts: np.ndarray, level: AlphaLevel) -> float:
    """Krippendorff's alpha from a count table; NaN when undefined (fewer than two values
    used: no disagreement is possible, so the coefficient has no denominator)."""
    if len(counts) == 0 or (counts.sum(axis=0) > 0).sum() < 2:
        return math.nan
    return float(krippendorff.alpha(value_counts=counts, value_domain=list(LEVELS),
                                     level_of_measurement=level))


# --------------------------------------------------------------------------------------------
# Agreement between raters


def _cells(units: pd.DataFrame) -> list[tuple[str, str, np.ndarray]]:
    """(dimension, group, unit mask): all units, each model, each source group present."""
    cells = [(ALL, ALL, np.ones(len(units), dtype=bool))]
    for model in sorted(units["model"].astype(str).unique()):
        cells.append((MODEL, model, (units["model"].astype(str) == model).to_numpy()))
    for dimension, vocabulary in SOURCE_DIMENSIONS.items():
        values = units[dimension].astype(str)
        for group in vocabulary:
            mask = (values == group).to_numpy()
            if mask.any():
                cells.append((dimension, group, mask))
    return cells


def _item_bootstrap_weights(item_codes: np.ndarray, n_boot: int,
                            rng: np.random.Generator) -> np.ndarray:
    """How often each unit enters each of ``n_boot`` bootstrap replicates that resample *items*
    with replacement (both outputs of an item travel together, since one rater saw them side
    by side): a (replicates, units) integer array."""
    n_items = int(item_codes.max()) + 1
    draws = rng.integers(0, n_items, size=(n_boot, n_items))
    weights = np.stack([np.bincount(d, minlength=n_items) for d in draws])
    return weights[:, item_codes]


def replicate_fleiss(counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """:func:`_fleiss` of each replicate, where replicate b holds unit u ``weights[b, u]``
    times: the same per-unit observed agreement and category shares as
    :func:`fleiss_kappa_unequal` (which equals statsmodels' Fleiss kappa for equal counts),
    weighted sums in place of copies. NaN where undefined."""
    table = np.asarray(counts, dtype=float)
    totals = table.sum(axis=1)
    keep = totals >= 2
    table, totals, w = table[keep], totals[keep], np.asarray(weights, dtype=float)[:, keep]
    mass = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        observed = w @ ((table * (table - 1)).sum(axis=1) / (totals * (totals - 1))) / mass
        shares = (w @ (table / totals[:, None])) / mass[:, None]
        chance = (shares ** 2).sum(axis=1)
        kappa = (observed - chance) / (1.0 - chance)
    return np.where((mass > 0) & ~np.isclose(chance, 1.0), kappa, np.nan)


def replicate_alpha(counts: np.ndarray, weights: np.ndarray, level: AlphaLevel) -> np.ndarray:
    """:func:`_alpha` (Krippendorff's alpha, as the ``krippendorff`` package computes it) of
    each replicate, where replicate b holds unit u ``weights[b, u]`` times. A replicate's
    coincidence matrix is the weighted sum of the units' own (Krippendorff 2011, "Computing
    Krippendorff's alpha-reliability", eq. for o_ck), so every replicate is one matrix product
    instead of a table copied and counted again; the ordinal metric is computed from each
    replicate's own value totals. NaN where undefined (fewer than two values used)."""
    table = np.asarray(counts, dtype=float)
    n_values = table.shape[1]
    pairable = np.maximum(table.sum(axis=1), 2)
    per_unit = (table[:, :, None] * table[:, None, :]
                - table[:, :, None] * np.eye(n_values)[None]) / (pairable - 1)[:, None, None]
    w = np.asarray(weights, dtype=float)
    coincidences = (w @ per_unit.reshape(len(table), -1)).reshape(len(w), n_values, n_values)
    totals = coincidences.sum(axis=1)  # n_v per replicate
    n = totals.sum(axis=1)
    if level == "interval":
        values = np.asarray(LEVELS, dtype=float)
        distance = np.broadcast_to((values[:, None] - values[None, :]) ** 2,
                                   coincidences.shape)
    else:  # ordinal: (sum of n_g for g between c and k) - (n_c + n_k) / 2, squared
        cumulative = np.concatenate([np.zeros((len(w), 1)), np.cumsum(totals, axis=1)], axis=1)
        low = np.minimum.outer(np.arange(n_values), np.arange(n_values))
        high = np.maximum.outer(np.arange(n_values), np.arange(n_values))
        between = cumulative[:, high + 1] - cumulative[:, low]
        distance = (between - (totals[:, :, None] + totals[:, None, :]) / 2) ** 2
    expected = (totals[:, :, None] * totals[:, None, :]
                - totals[:, :, None] * np.eye(n_values)[None]) / (n - 1)[:, None, None]
    used = ((w @ table) > 0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        alpha = 1 - (coincidences * distance).sum(axis=(1, 2)) / (
            expected * distance).sum(axis=(1, 2))
    return np.where(used >= 2, alpha, np.nan)


def _arm_ratings(counted: pd.DataFrame, arm: str) -> pd.DataFrame:
    """The ratings of one arm: its output's, or every output's for :data:`BOTH`."""
    if arm == BOTH:
        return counted
    return counted.loc[counted["output"] == arm]


def rater_agreement(
    ratings: pd.DataFrame,
    items: pd.DataFrame,
    *,
    axes: Sequence[str] = REVIEW_AXES,
    arms: Sequence[str] | None = None,
    levels: Sequence[AlphaLevel] = ("ordinal", "interval"),
    include_repeats: bool = False,
    confidence: float = 0.95,
    n_boot: int = REVIEW_BOOTSTRAP,
    seed: int = defaults.SEED,
) -> pd.DataFrame:
    """Agreement between raters per axis and arm: Fleiss' kappa and Krippendorff's alpha at
    each of ``levels`` side by side, overall, per model and per source group (race, gender,
    age).

    ``arms``: any of :data:`ARMS`; ``edited`` and ``feature`` take the units of that output,
    ``both`` pools them (the pooled figure a study that rated both outputs together quotes).
    Default: ``edited`` and ``feature`` where any rating of that output exists, and ``both``.
    Repeats are left out unless ``include_repeats``. Fleiss' kappa treats the five answers as
    nominal categories and uses every rating, deterministically (see the module docstring for
    units with unequal counts); alpha uses every rating (ordinal: Krippendorff's rank-based
    metric; interval: squared differences).

    Interval: percentile bootstrap over items (``n_boot`` replicates, items resampled with
    replacement within the cell, both outputs of an item together), seeded per axis, arm and
    statistic from ``numpy.random.SeedSequence(seed)``. Replicates where a coefficient is
    undefined (one value only) are left out of its interval. Columns
    :data:`AGREEMENT_COLUMNS`; ``statistic`` is ``fleiss_kappa`` or ``alpha_<level>``;
    ``n_ratings`` counts the ratings used.
    """
    counted = between_rater_ratings(ratings, include_repeats)
    if arms is None:
        present = set(counted["output"].astype(str))
        arms = [arm for arm in ARMS if arm == BOTH or arm in present]
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        raise InputDataError(f"unknown review arm {unknown[0]!r}", f"use any of {list(ARMS)}")
    tail = (1.0 - confidence) / 2.0
    rows: list[dict] = []
    axis_seeds = np.random.SeedSequence(seed).spawn(len(axes))
    for axis, axis_seed in zip(axes, axis_seeds, strict=True):
        for arm, arm_seed in zip(arms, axis_seed.spawn(len(arms)), strict=True):
            rows += _arm_agreement(_arm_ratings(counted, arm), items, axis, arm, levels,
                                   tail, n_boot, arm_seed)
    return pd.DataFrame(rows, columns=list(AGREEMENT_COLUMNS))


def _arm_agreement(counted: pd.DataFrame, items: pd.DataFrame, axis: str, arm: str,
                   levels: Sequence[AlphaLevel], tail: float, n_boot: int,
                   seed: np.random.SeedSequence) -> list[dict]:
    """The rows of :func:`rater_agreement` for one axis and arm."""
    table = unit_counts(counted, items, axis)
    totals = table.n_ratings
    fleiss_note = ""
    if len(totals) and totals.min() != totals.max():
        fleiss_note = (f"{int(totals.min())}-{int(totals.max())} ratings per unit: Fleiss' "
                       "kappa generalised to unequal counts, every unit weighted equally")
    item_codes = pd.factorize(table.units["item_id"])[0] if len(table.units) else None
    cells = _cells(table.units) if len(table.units) else [(ALL, ALL, np.zeros(0, bool))]
    statistics: list[tuple[str, Callable[[np.ndarray], float],
                           Callable[[np.ndarray, np.ndarray], np.ndarray], str]] = [
        ("fleiss_kappa", _fleiss, replicate_fleiss, fleiss_note)]
    statistics += [(f"alpha_{level}", partial(_alpha, level=level),
                    partial(replicate_alpha, level=level), "") for level in levels]
    rng = np.random.default_rng(seed)
    rows = []
    for dimension, group, mask in cells:
        n_items = int(table.units.loc[mask, "item_id"].nunique()) if mask.any() else 0
        weights = None
        if n_items >= 2 and n_boot > 0 and item_codes is not None:
            codes = pd.factorize(item_codes[mask])[0]
            weights = _item_bootstrap_weights(codes, n_boot, rng)
        for name, statistic, replicated, note in statistics:
            cell = table.counts[mask]
            estimate = statistic(cell)
            low = high = math.nan
            cell_note = note
            if weights is not None and math.isfinite(estimate):
                values = replicated(cell, weights)
                values = values[np.isfinite(values)]
                if len(values):
                    low, high = (float(q) for q in np.quantile(values, [tail, 1 - tail]))
            if not math.isfinite(estimate):
                cell_note = "undefined: fewer than two values used" if len(cell) else \
                    "no unit with two ratings"
            elif n_items < 2:
                cell_note = "one item: no interval"
            rows.append({"axis": axis, "arm": arm, "statistic": name, "dimension": dimension,
                         "group": group, "n_items": n_items, "n_units": len(cell),
                         "n_ratings": int(cell.sum()), "estimate": estimate,
                         "ci_low": low, "ci_high": high, "note": cell_note})
    return rows


# --------------------------------------------------------------------------------------------
# Consistency within a rater


def _weighted_kappa(a: np.ndarray, b: np.ndarray) -> float:
    """Quadratic-weighted Cohen's kappa of two integer 1-5 vectors; NaN when undefined (both
    constant: chance agreement is perfect)."""
    from sklearn.metrics import cohen_kappa_score

    if len(a) == 0:
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = cohen_kappa_score(a, b, labels=list(LEVELS), weights="quadratic")
    return float(value)


def intra_rater_consistency(ratings: pd.DataFrame,
                            axes: Sequence[str] = REVIEW_AXES) -> pd.DataFrame:
    """Does a rater give the same answer when shown the same output again?

    Pairs each repeated rating (``repeat`` True) with the same rater's first rating of the same
    unit; per axis (pairs where both answers are 1-5): the share of identical answers and the
    quadratic-weighted kappa between first and second answers, over all raters (``rater`` =
    ``"all"``) and per rater. Columns :data:`CONSISTENCY_COLUMNS`.
    """
    check_columns(ratings, list(_RATING_COLUMNS))
    keys = ["rater", *UNIT]
    first = ratings.loc[~ratings["repeat"].astype(bool)].drop_duplicates(keys)
    second = ratings.loc[ratings["repeat"].astype(bool)].drop_duplicates(keys)
    pairs = first.merge(second, on=keys, suffixes=("_1", "_2"))
    scopes = [(ALL, np.ones(len(pairs), dtype=bool))]
    scopes += [(str(r), (pairs["rater"].astype(str) == r).to_numpy())
               for r in sorted(pairs["rater"].astype(str).unique())]
    rows = []
    for axis in axes:
        if pairs.empty:
            rows.append({"axis": axis, "rater": ALL, "n_pairs": 0, "share_identical": math.nan,
                         "weighted_kappa": math.nan, "note": "no repeated rating"})
            continue
        a = _axis_scores(pairs, f"{axis}_1")
        b = _axis_scores(pairs, f"{axis}_2")
        both = (a.notna() & b.notna()).to_numpy(dtype=bool)
        for rater, mask in scopes:
            keep = both & mask
            x = a[keep].to_numpy(int)
            y = b[keep].to_numpy(int)
            kappa = _weighted_kappa(x, y)
            note = "" if len(x) else "no pair answered on this axis"
            if len(x) and not math.isfinite(kappa):
                note = "kappa undefined: one answer only"
            rows.append({"axis": axis, "rater": rater, "n_pairs": len(x),
                         "share_identical": float((x == y).mean()) if len(x) else math.nan,
                         "weighted_kappa": kappa, "note": note})
    return pd.DataFrame(rows, columns=list(CONSISTENCY_COLUMNS))


# --------------------------------------------------------------------------------------------
# Human consensus and the judges


def round_half_even(values: pd.Series) -> pd.Series:
    """Scores rounded as the judges' study ensemble rounds them (halves to the even integer)."""
    numeric = pd.to_numeric(values, errors="coerce").astype(float)
    return pd.Series(np.round(numeric.to_numpy()), index=values.index)  # numpy: half to even


def human_consensus(ratings: pd.DataFrame, axes: Sequence[str] = REVIEW_AXES,
                    include_repeats: bool = False,
                    rule: ConsensusRule = "median") -> pd.DataFrame:
    """Per unit (``item_id``, ``output``) and axis: the consensus (``rule``: the median or
    the mean of the raters' answers, rounded half to even, see the module docstring) in column
    ``<axis>`` and the number of answers in ``<axis>_n``; NaN where nobody could tell."""
    if rule not in ("median", "mean"):
        raise InputDataError(f"unknown consensus rule {rule!r}", "use median or mean")
    counted = between_rater_ratings(ratings, include_repeats)
    columns: dict[str, pd.Series] = {}
    grouped = counted.assign(**{axis: _axis_scores(counted, axis).astype(float)
                                for axis in axes}).groupby(list(UNIT), sort=True)
    for axis in axes:
        columns[axis] = round_half_even(grouped[axis].agg(rule))
        columns[f"{axis}_n"] = grouped[axis].count()
    return pd.DataFrame(columns).reset_index()


def judge_human_units(ratings: pd.DataFrame, items: pd.DataFrame, verdicts: pd.DataFrame,
                      axes: Sequence[str] = REVIEW_AXES,
                      consensus_rule: ConsensusRule = "median") -> pd.DataFrame:
    """One row per rated unit with the human consensus (``human_<axis>``) and the judges'
    ensemble score (``judge_<axis>``) of the same output.

    The edited output's verdict is the one of the item's ``request_id``, the feature output's
    that of its ``paired_request_id`` (both joined on ``request_id`` of the verdicts table).
    Units without a verdict (an imported survey item ACRB did not generate) keep NaN judge
    scores. Also carries ``request_id``, ``model``, ``random_sample`` and the source groups.
    ``consensus_rule``: as :func:`human_consensus`.
    """
    check_columns(items, [*_ITEM_COLUMNS, "request_id", "paired_request_id", "random_sample"])
    check_columns(verdicts, ["request_id", *axes])
    consensus = human_consensus(ratings, axes, rule=consensus_rule)
    units = consensus.rename(columns={axis: f"human_{axis}" for axis in axes})
    units = _with_labels(units, items)
    info = items[["item_id", "request_id", "paired_request_id", "random_sample"]]
    units = units.merge(info.drop_duplicates("item_id"), on="item_id", how="left")
    units["request_id"] = np.where(units["output"] == "feature", units["paired_request_id"],
                                   units["request_id"])
    units = units.drop(columns="paired_request_id")
    judged = verdicts[["request_id", *axes]].drop_duplicates("request_id").rename(
        columns={axis: f"judge_{axis}" for axis in axes})
    return units.merge(judged, on="request_id", how="left")


def _agreement_row(human: pd.Series, judge: pd.Series) -> dict:
    from scipy import stats

    both = human.notna() & judge.notna()
    h = human[both].to_numpy(float)
    j = judge[both].to_numpy(float)
    row: dict = {"n": int(both.sum()), "weighted_kappa": math.nan, "spearman": math.nan,
                 "spearman_p": math.nan, "mean_difference": math.nan, "ci_low": math.nan,
                 "ci_high": math.nan, "note": ""}
    if len(h) == 0:
        row["note"] = "no unit scored by both"
        return row
    judge_levels = np.round(j).astype(int)  # mean/median ensembles can give halves
    row["weighted_kappa"] = _weighted_kappa(h.astype(int), judge_levels)
    difference = j - h
    row["mean_difference"] = float(difference.mean())
    if len(h) >= 2:
        sem = stats.sem(difference)
        if sem > 0:
            low, high = stats.t.interval(0.95, len(h) - 1, loc=difference.mean(), scale=sem)
            row["ci_low"], row["ci_high"] = float(low), float(high)
        else:
            row["ci_low"] = row["ci_high"] = float(difference.mean())
    if len(h) >= 3 and np.ptp(h) > 0 and np.ptp(j) > 0:
        result = stats.spearmanr(j, h)
        row["spearman"], row["spearman_p"] = float(result.statistic), float(result.pvalue)
    else:
        row["note"] = "Spearman undefined: fewer than 3 units or a constant score"
    return row


def judge_human_agreement(units: pd.DataFrame, axes: Sequence[str] = REVIEW_AXES,
                          outputs: Sequence[str] = ("edited",)) -> pd.DataFrame:
    """The judges against the humans per axis, overall, per model and per source group.

    On the units of :func:`judge_human_units` (``outputs``: which arm; default the edited
    outputs, the ones the audit's rates count) where both have a score: quadratic-weighted
    Cohen's kappa (judge scores rounded half to even), Spearman's rho (scipy) and the mean
    signed difference judge − human consensus, in scale steps (positive: the judge reads a
    higher score than people; on ``skin_tone``, lighter), with a 95% t interval over units.
    Columns :data:`JUDGE_HUMAN_COLUMNS`.
    """
    chosen = units.loc[units["output"].isin(list(outputs))].reset_index(drop=True)
    rows = []
    for axis in axes:
        for dimension, group, mask in _cells(chosen):
            part = chosen.loc[mask]
            rows.append({"axis": axis, "dimension": dimension, "group": group,
                         **_agreement_row(part[f"human_{axis}"], part[f"judge_{axis}"])})
    return pd.DataFrame(rows, columns=list(JUDGE_HUMAN_COLUMNS))


def judge_misses(
    units: pd.DataFrame,
    rule: OutcomeRule,
    outcome: str,
    dimension: str = "race",
    *,
    outputs: Sequence[str] = ("edited",),
    confidence: float = 0.95,
    n_perm: int = defaults.PERMUTATIONS,
    seed: int = defaults.SEED,
) -> pd.DataFrame:
    """Per group of ``dimension``: among the units where the humans' consensus shows
    ``outcome`` (``rule`` applied to ``human_<axis>``), the share the judge missed (``rule``
    false on ``judge_<axis>``), with a Wilson interval; and the mean signed difference judge −
    human on the axis over all units of the group.

    With ``judge.outcomes.judge_lightening`` (skin tone at least 4) and ``race`` this answers
    "does the judge miss lightening more often on darker skin?". Whether the miss rate differs
    between groups: :func:`acrb.analysis.tests.contingency.homogeneity_test` on the groups x
    (missed, seen) table (chi-square, Fisher or a seeded permutation test by table size),
    repeated on each group row; the ``all`` row pools the groups. Units count as independent
    (one output per item). Columns :data:`MISS_COLUMNS`.
    """
    vocabulary = SOURCE_DIMENSIONS.get(dimension)
    if vocabulary is None:
        raise InputDataError(f"unknown source dimension {dimension!r}",
                             f"use one of {list(SOURCE_DIMENSIONS)}")
    axis = rule.axis
    chosen = units.loc[units["output"].isin(list(outputs))]
    human = chosen[f"human_{axis}"].map(lambda s: rule.applies(None if pd.isna(s) else s))
    judge = chosen[f"judge_{axis}"].map(lambda s: rule.applies(None if pd.isna(s) else s))
    both = human.notna() & judge.notna()
    frame = pd.DataFrame({"group": chosen[dimension].astype(str), "human": human,
                          "judge": judge, "difference": chosen[f"judge_{axis}"]
                          - chosen[f"human_{axis}"]}).loc[both]
    positive = frame.loc[frame["human"].astype(bool)]

    def row(group: str, part: pd.DataFrame, seen: pd.DataFrame) -> dict:
        k = int((~seen["judge"].astype(bool)).sum())
        n = len(seen)
        low, high = wilson_interval(np.array([k]), np.array([n]), confidence)
        return {"outcome": outcome, "dimension": dimension if group != ALL else ALL,
                "group": group, "n": len(part), "human_positive": n, "judge_missed": k,
                "miss_rate": k / n if n else math.nan, "ci_low": float(low[0]),
                "ci_high": float(high[0]),
                "mean_difference": float(part["difference"].mean()) if len(part)
                else math.nan}

    rows = [row(ALL, frame, positive)]
    groups = [g for g in vocabulary if (frame["group"] == g).any()]
    k = np.array([int((~positive.loc[positive["group"] == g, "judge"].astype(bool)).sum())
                  for g in groups])
    n = np.array([int((positive["group"] == g).sum()) for g in groups])
    p_value, test = homogeneity_test(k, n, permutations=n_perm, seed=seed)
    rows[0].update({"p_value": math.nan, "test": "", "note": ""})
    for g in groups:
        rows.append({**row(g, frame.loc[frame["group"] == g],
                           positive.loc[positive["group"] == g]),
                     "p_value": p_value, "test": test,
                     "note": "" if (positive["group"] == g).any() else
                     "no unit where the humans see the outcome"})
    return pd.DataFrame(rows, columns=list(MISS_COLUMNS))


# --------------------------------------------------------------------------------------------
# Tests: between arms, across groups


def arm_tests(ratings: pd.DataFrame, axes: Sequence[str] = REVIEW_AXES, *,
              unit: Literal["item", "rating"] = "item") -> pd.DataFrame:
    """Do people score the edited and the feature-prompt output of an item differently?

    Pairs are formed within a rater: the same rater's answers on both outputs of one item
    (repeats left out). ``unit="item"`` (default) averages each item's within-rater
    differences (feature − edited) so that each item counts once (its raters are not
    independent of each other), then tests the item means; ``unit="rating"`` tests every
    rater's pair. Wilcoxon signed-rank test (``scipy.stats.wilcoxon``, two-sided, zero
    differences dropped as in Wilcoxon's original test). Holm over the axes. Columns
    :data:`TEST_COLUMNS`; ``statistic`` is the median difference feature − edited.
    """
    from scipy import stats

    counted = between_rater_ratings(ratings)
    keys = ["rater", "item_id"]
    edited = counted.loc[counted["output"] == "edited"].drop_duplicates(keys)
    feature = counted.loc[counted["output"] == "feature"].drop_duplicates(keys)
    pairs = edited.merge(feature, on=keys, suffixes=("_edited", "_feature"))
    rows = []
    for axis in axes:
        if pairs.empty:
            rows.append(_test_row(axis, "Wilcoxon signed-rank", ALL, "feature - edited", 0,
                                  math.nan, math.nan, "no item rated on both outputs"))
            continue
        difference = (pd.to_numeric(pairs[f"{axis}_feature"], errors="coerce")
                      - pd.to_numeric(pairs[f"{axis}_edited"], errors="coerce"))
        values = difference.dropna()
        if unit == "item":
            values = values.groupby(pairs.loc[values.index, "item_id"]).mean()
        x = values.to_numpy(float)
        note = ""
        p_value = math.nan
        if (x != 0).sum() == 0:
            note = "no nonzero difference: no test"
        else:
            p_value = float(stats.wilcoxon(x, zero_method="wilcox").pvalue)
        rows.append(_test_row(axis, "Wilcoxon signed-rank", ALL, "feature - edited",
                              len(x), float(np.median(x)) if len(x) else math.nan, p_value,
                              note))
    return _adjusted(rows)


def _test_row(axis: str, test: str, dimension: str, groups: str, n: int, statistic: float,
              p_value: float, note: str) -> dict:
    return {"axis": axis, "test": test, "dimension": dimension, "groups": groups, "n": n,
            "statistic": statistic, "p_value": p_value, "note": note}


def _adjusted(rows: list[dict]) -> pd.DataFrame:
    table = pd.DataFrame(rows, columns=[c for c in TEST_COLUMNS if c != "p_adjusted"])
    table["p_adjusted"] = adjust(table["p_value"].to_numpy(float), "holm") if len(table) \
        else []
    return table[list(TEST_COLUMNS)]


#: Columns of :func:`human_group_means`.
GROUP_MEAN_COLUMNS: tuple[str, ...] = ("output", "dimension", "group", "axis", "n", "mean")
#: The ``output`` of :func:`human_group_means`' rows of paired differences.
ARM_DIFFERENCE = "feature - edited"


def human_group_means(ratings: pd.DataFrame, items: pd.DataFrame,
                      axes: Sequence[str] = REVIEW_AXES, *, dimension: str = "race",
                      consensus_rule: ConsensusRule = "median") -> pd.DataFrame:
    """People's mean consensus score per output, source group of ``dimension`` (and ``all``)
    and axis, and on the items rated on both outputs the mean paired difference (``output``
    :data:`ARM_DIFFERENCE`): the numbers of the study's human-evaluation figure (people's
    mean skin tone by race; the change in edit success and in drift with the feature prompt).
    Repeats are left out; ``n`` counts the units (or pairs) with a consensus on the axis.
    Columns :data:`GROUP_MEAN_COLUMNS`."""
    vocabulary = SOURCE_DIMENSIONS.get(dimension)
    if vocabulary is None:
        raise InputDataError(f"unknown source dimension {dimension!r}",
                             f"use one of {list(SOURCE_DIMENSIONS)}")
    units = _with_labels(human_consensus(ratings, axes, rule=consensus_rule), items)
    edited = units.loc[units["output"] == "edited"].set_index("item_id")
    feature = units.loc[units["output"] == "feature"].set_index("item_id")
    paired = edited.index.intersection(feature.index)
    difference = edited.loc[paired, [dimension]].assign(
        **{axis: feature.loc[paired, axis] - edited.loc[paired, axis] for axis in axes})
    parts = [("edited", edited), ("feature", feature), (ARM_DIFFERENCE, difference)]
    rows = []
    for output, part in parts:
        if output == "feature" and part.empty:
            continue
        groups = [(ALL, np.ones(len(part), dtype=bool))] + [
            (g, (part[dimension].astype(str) == g).to_numpy()) for g in vocabulary]
        for axis in axes:
            values = pd.to_numeric(part[axis], errors="coerce").astype(float).to_numpy()
            for group, mask in groups:
                seen = values[mask & np.isfinite(values)]
                rows.append({"output": output, "dimension": ALL if group == ALL else dimension,
                             "group": group, "axis": axis, "n": len(seen),
                             "mean": float(seen.mean()) if len(seen) else math.nan})
    return pd.DataFrame(rows, columns=list(GROUP_MEAN_COLUMNS))


def group_tests(ratings: pd.DataFrame, items: pd.DataFrame, axes: Sequence[str] = REVIEW_AXES,
                *, dimension: str = "race", pair: tuple[str, str] | None = None,
                rest_of: str | None = None, output: str = "edited",
                consensus_rule: ConsensusRule = "median") -> pd.DataFrame:
    """Do people's consensus scores differ between source groups?

    On the human consensus of each unit of ``output`` (one value per item: units are
    independent): Kruskal-Wallis across the groups of ``dimension`` (``scipy.stats.kruskal``),
    when ``pair`` names two groups Mann-Whitney U between them, and when ``rest_of`` names one
    group Mann-Whitney U between it and every other group pooled (groups ``"White vs
    non-White"``: the study's test on people's skin-tone ratings) (``scipy.stats.mannwhitneyu``,
    two-sided; ``statistic`` is U of the first sample). Holm over the table.
    ``consensus_rule``: as :func:`human_consensus`. Columns :data:`TEST_COLUMNS`.
    """
    from scipy import stats

    vocabulary = SOURCE_DIMENSIONS.get(dimension)
    if vocabulary is None:
        raise InputDataError(f"unknown source dimension {dimension!r}",
                             f"use one of {list(SOURCE_DIMENSIONS)}")
    if pair is not None and not set(pair) <= set(vocabulary):
        raise InputDataError(f"Mann-Whitney pair {pair} is not two {dimension} groups",
                             f"name two of {list(vocabulary)}")
    if rest_of is not None and rest_of not in vocabulary:
        raise InputDataError(f"Mann-Whitney group {rest_of!r} is not a {dimension} group",
                             f"name one of {list(vocabulary)}")
    consensus = human_consensus(ratings, axes, rule=consensus_rule)
    units = _with_labels(consensus.loc[consensus["output"] == output], items)
    rows = []
    for axis in axes:
        scores = units[[dimension, axis]].dropna()
        samples = [scores.loc[scores[dimension].astype(str) == g, axis].to_numpy(float)
                   for g in vocabulary]
        present = [s for s in samples if len(s)]
        n = int(sum(len(s) for s in present))
        if len(present) < 2 or len(np.unique(np.concatenate(present))) < 2:
            rows.append(_test_row(axis, "Kruskal-Wallis", dimension, ALL, n, math.nan,
                                  math.nan, "fewer than two groups or one value: no test"))
        else:
            result = stats.kruskal(*present)
            rows.append(_test_row(axis, "Kruskal-Wallis", dimension, ALL, n,
                                  float(result.statistic), float(result.pvalue), ""))
        comparisons: list[tuple[str, np.ndarray, np.ndarray]] = []
        if pair is not None:
            comparisons.append((f"{pair[0]} vs {pair[1]}", samples[vocabulary.index(pair[0])],
                                samples[vocabulary.index(pair[1])]))
        if rest_of is not None:
            others = [s for g, s in zip(vocabulary, samples, strict=True) if g != rest_of]
            comparisons.append((f"{rest_of} vs non-{rest_of}",
                                samples[vocabulary.index(rest_of)], np.concatenate(others)))
        for groups, a, b in comparisons:
            if len(a) and len(b):
                result = stats.mannwhitneyu(a, b, alternative="two-sided")
                rows.append(_test_row(axis, "Mann-Whitney U", dimension, groups,
                                      len(a) + len(b), float(result.statistic),
                                      float(result.pvalue), ""))
            else:
                rows.append(_test_row(axis, "Mann-Whitney U", dimension, groups,
                                      len(a) + len(b), math.nan, math.nan,
                                      "a group has no unit: no test"))
    return _adjusted(rows)


__all__ = [
    "AGREEMENT_COLUMNS",
    "AGREEMENT_STATISTICS",
    "ARMS",
    "ARM_DIFFERENCE",
    "BOTH",
    "CONSISTENCY_COLUMNS",
    "GROUP_MEAN_COLUMNS",
    "JUDGE_HUMAN_COLUMNS",
    "MISS_COLUMNS",
    "TEST_COLUMNS",
    "UnitCounts",
    "arm_tests",
    "between_rater_ratings",
    "fleiss_kappa_unequal",
    "group_tests",
    "human_consensus",
    "human_group_means",
    "intra_rater_consistency",
    "judge_human_agreement",
    "judge_human_units",
    "judge_misses",
    "rated_axes",
    "rater_agreement",
    "round_half_even",
    "unit_counts",
]
