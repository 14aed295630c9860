"""Per-group outcome rates with Wilson score intervals.

A group's rate of an outcome (:mod:`acrb.analysis.outcomes`) is the share of True among the
requests of that group that count (:func:`acrb.analysis.frame.usable_rows`) and where the
outcome is observed: erasure and lightening are NA on refused requests, so their rates are
conditional on the request not being refused, and an errored request is never part of a rate.

Rates are proportions in [0, 1]. Intervals are Wilson score intervals (Wilson 1927, "Probable
inference, the law of succession, and statistical inference", JASA 22:209-212; why Wilson:
``docs/statistics.md#group-rates``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from acrb.analysis.frame import ALL_CATEGORIES, category_levels, check_columns, usable_rows
from acrb.demographics import SOURCE_DIMENSIONS

RATE_COLUMNS: tuple[str, ...] = (
    "outcome",
    "category",
    "dimension",
    "value",
    "n",
    "k",
    "rate",
    "ci_low",
    "ci_high",
)


def group_counts(frame: pd.DataFrame, outcome: str) -> pd.DataFrame:
    """n (outcome observed) and k (outcome True) per category x dimension x group.

    Columns ``category, dimension, value, n, k``; one row for every category of
    :func:`acrb.analysis.frame.category_levels` and every group of
    :data:`acrb.demographics.SOURCE_DIMENSIONS`, in that order, with n = k = 0 for groups
    without observations. Group values outside the vocabulary are dropped with a warning.
    """
    check_columns(frame, ["category", "status", outcome, *SOURCE_DIMENSIONS])
    levels = category_levels(frame)
    usable = usable_rows(frame)
    observed_values = usable[outcome].astype("boolean")
    counts = pd.DataFrame(
        {
            "category": usable["category"].astype(str),
            "n": observed_values.notna().to_numpy(dtype=np.int64),
            "k": observed_values.fillna(False).to_numpy(dtype=np.int64),
        },
        index=usable.index,
    )
    pieces = []
    for dimension, values in SOURCE_DIMENSIONS.items():
        groups = usable[dimension].astype(str)
        unknown = sorted(set(groups.unique()) - set(values))
        if unknown:
            warnings.warn(
                f"{dimension} value(s) {unknown} are not in the ACRB vocabulary and are left out "
                f"of the {dimension} breakdown",
                stacklevel=3,
            )
        by_category = counts.assign(value=groups).groupby(["category", "value"])[["n", "k"]].sum()
        pooled = counts.assign(value=groups).groupby("value")[["n", "k"]].sum()
        pooled.index = pd.MultiIndex.from_product(
            [[ALL_CATEGORIES], pooled.index], names=["category", "value"]
        )
        full_index = pd.MultiIndex.from_product([levels, values], names=["category", "value"])
        table = (
            pd.concat([pooled, by_category])
            .reindex(full_index, fill_value=0)
            .astype(np.int64)
            .reset_index()
        )
        table.insert(1, "dimension", dimension)
        pieces.append(table)
    result = pd.concat(pieces, ignore_index=True)
    order = {c: i for i, c in enumerate(levels)}
    # Category-major order: all dimensions of one category before the next category.
    result = result.sort_values(
        "category", key=lambda s: s.map(order), kind="stable", ignore_index=True
    )
    return result[["category", "dimension", "value", "n", "k"]]


def wilson_interval(
    k: np.ndarray, n: np.ndarray, confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval for k successes in n trials (arrays); NaN where n = 0.

    Computed by ``statsmodels.stats.proportion.proportion_confint(method="wilson")``.
    """
    from statsmodels.stats.proportion import proportion_confint

    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    low = np.full(k.shape, np.nan)
    high = np.full(k.shape, np.nan)
    has_data = n > 0
    if has_data.any():
        lo, hi = proportion_confint(
            k[has_data], n[has_data], alpha=1.0 - confidence, method="wilson"
        )
        low[has_data] = np.clip(lo, 0.0, 1.0)
        high[has_data] = np.clip(hi, 0.0, 1.0)
        # The Wilson bound is exactly 0 at k = 0 (1 at k = n); remove floating-point residue.
        low[has_data & (k == 0)] = 0.0
        high[has_data & (k == n)] = 1.0
    return low, high


def group_rates(frame: pd.DataFrame, outcome: str, confidence: float = 0.95) -> pd.DataFrame:
    """Rate of ``outcome`` per prompt category (and pooled, ``"all"``) and source group.

    Parameters
    ----------
    frame:
        The analysis frame of one model (one row per request).
    outcome:
        One of :data:`acrb.analysis.outcomes.OUTCOMES`.
    confidence:
        Coverage of the Wilson score interval (two-sided).

    Returns
    -------
    DataFrame with columns ``outcome, category, dimension, value, n, k, rate, ci_low, ci_high``:
    for each category and ``"all"``, each dimension of ``SOURCE_DIMENSIONS`` and each of its
    values (all listed), n = requests that count where the outcome is observed, k = how many
    of them are True, rate = k / n (a proportion; NaN when n = 0) and its Wilson score
    interval.
    """
    counts = group_counts(frame, outcome)
    n = counts["n"].to_numpy()
    k = counts["k"].to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(n > 0, k / np.maximum(n, 1), np.nan)
    low, high = wilson_interval(k, n, confidence)
    result = counts.assign(rate=rate, ci_low=low, ci_high=high)
    result.insert(0, "outcome", outcome)
    return result[list(RATE_COLUMNS)]
