"""p-values: what a hypothesis test returns, and how a family of them is adjusted.

Every test of :mod:`acrb.analysis` returns a :class:`TestResult` (or a richer result with the
same fields); every table of tests is one family whose p-values :func:`adjust` corrects, by
Holm's method unless said otherwise. See ``docs/statistics.md#multiple-testing``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

#: The adjustments :func:`adjust` offers (names of ``statsmodels.stats.multitest``).
ADJUST_METHODS: tuple[str, ...] = ("holm", "fdr_bh")


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


def adjust(p_values: Sequence[float] | np.ndarray | pd.Series, method: str = "holm") -> np.ndarray:
    """Adjusted p-values over the finite entries of ``p_values``; NaN stays NaN.

    ``method``: ``"holm"`` (Holm 1979, "A simple sequentially rejective multiple test
    procedure", Scand J Statist 6:65-70: family-wise error rate; :func:`holm`) or ``"fdr_bh"``
    (Benjamini & Hochberg 1995, false discovery rate, by
    ``statsmodels.stats.multitest.multipletests``). Returns an array of the input's shape.
    """
    if method not in ADJUST_METHODS:
        raise ValueError(f"unknown adjustment '{method}'; expected one of {ADJUST_METHODS}")
    p = np.asarray(p_values, dtype=float)
    adjusted = np.full(p.shape, np.nan)
    finite = np.isfinite(p)
    if np.any((p[finite] < 0) | (p[finite] > 1)):
        raise ValueError("p-values must lie in [0, 1]")
    if finite.any():
        if method == "holm":
            adjusted[finite] = holm(p[finite])
        else:
            from statsmodels.stats.multitest import multipletests

            adjusted[finite] = multipletests(p[finite], method=method)[1]
    return adjusted


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values of a 1-d array of p-values in [0, 1] (Holm 1979):
    the k-th smallest of m becomes max over j <= k of (m - j + 1) p_(j), capped at 1.

    The same operations in the same order as ``statsmodels.stats.multitest.multipletests(...,
    method="holm")`` (bit for bit, tested), without the full garbage collection statsmodels
    runs on every call: in a process holding a large heap (an analysis with its libraries, a
    test session) that collection cost far more than the adjustment, and it ran for every
    table of tests and every Dunn test.
    """
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p)
    stepped = np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1))
    stepped[stepped > 1] = 1
    adjusted = np.empty_like(stepped)
    adjusted[order] = stepped
    return adjusted
