"""What the audit's design can detect: the design effect of clustering and the smallest gap.

- :func:`design_effect`: how much clustering of requests within source images inflates the
  variance of a rate (Kish's deff, from the ANOVA intraclass correlation).
- :func:`minimum_detectable_gap`: the smallest gap between two groups' rates that a design
  detects with a given power.
- :func:`detectable_gap`: that gap for the design of an analysis frame, as the report prints
  it next to every gap that is not significant.

How the power model compares with the power the permutation test reached in simulation:
``docs/statistics.md#minimum-detectable-gap``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from acrb.analysis.frame import (
    CLUSTER_COLUMN,
    check_columns,
    checked_frame,
    group_series,
    usable_rows,
)


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
    frame = checked_frame(frame)
    check_columns(frame, ["status", CLUSTER_COLUMN, outcome])
    usable = usable_rows(frame)
    observed = usable[outcome].astype("boolean")
    keep = observed.notna().to_numpy()
    y = observed[keep].to_numpy(dtype=float)
    sources = usable[CLUSTER_COLUMN][keep].to_numpy()
    if dimension is not None:
        group = group_series(usable, dimension)[keep].astype(object).to_numpy()
        known = pd.notna(group)
        y, sources, group = y[known], sources[known], group[known]
    else:
        group = np.zeros(len(y), dtype=np.int64)
    n = len(y)
    # Rows -> (group, source) cells, numbered in the order of their names as a sorted groupby
    # lists them, so that every sum below adds the same numbers in the same order.
    group_of_row, group_names = pd.factorize(group, sort=True)
    source_of_row, source_names = pd.factorize(sources, sort=True)
    cells, cell_of_row = np.unique(group_of_row.astype(np.int64) * len(source_names)
                                   + source_of_row, return_inverse=True)
    k = len(cells)
    group_of_cell = cells // max(len(source_names), 1)
    groups = len(group_names)
    if n == 0 or k - groups < 1 or n - k < 1:
        mean_size = n / k if k else math.nan
        return DesignEffect(1.0, math.nan, mean_size, n, k)
    sizes = np.bincount(cell_of_row, minlength=k).astype(float)
    means = np.bincount(cell_of_row, weights=y, minlength=k) / sizes
    group_n = np.bincount(group_of_cell, weights=sizes, minlength=groups)[group_of_cell]
    group_mean = (np.bincount(group_of_row, weights=y, minlength=groups)
                  / np.bincount(group_of_row, minlength=groups))
    centre = group_mean[group_of_cell]
    ss_between = float(np.sum(sizes * (means - centre) ** 2))
    ss_within = float(np.sum((y - means[cell_of_row]) ** 2))
    ms_between = ss_between / (k - groups)
    ms_within = ss_within / (n - k)
    m0 = (n - float(np.sum(sizes**2 / group_n))) / (k - groups)
    denominator = ms_between + (m0 - 1.0) * ms_within
    icc = (ms_between - ms_within) / denominator if denominator > 0 else 0.0
    mean_size = n / k
    return DesignEffect(max(1.0, 1.0 + (mean_size - 1.0) * icc), float(icc), mean_size, n, k)


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
    from statsmodels.stats.power import NormalIndPower

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


def detectable_gap(frame: pd.DataFrame, outcome: str, dimension: str, alpha: float,
                   power: float) -> float:
    """Minimum detectable gap between two groups of ``dimension`` for this frame's design.

    Uses the frame's own design: sources per group, requests per source with the outcome
    observed, the pooled rate as base rate, and the design effect of clustering within
    sources; Bonferroni over all pairs of groups (see :func:`minimum_detectable_gap`).
    """
    rows = usable_rows(frame)
    rows = rows.loc[rows[outcome].notna()]
    if rows.empty:
        return float("nan")
    groups = rows.groupby(dimension, observed=True)["source_id"].nunique()
    if len(groups) < 2:
        return float("nan")
    sources = rows["source_id"].nunique()
    base = float(rows[outcome].astype(float).mean())
    base = min(max(base, 0.005), 0.995)
    deff = design_effect(rows, outcome, dimension).deff
    return float(minimum_detectable_gap(
        n_sources_per_group=float(groups.mean()), requests_per_source=len(rows) / sources,
        base_rate=base, alpha=alpha, power=power, n_groups=len(groups), deff=deff,
    ))
