"""Tests that kill the mutants of :mod:`acrb.analysis.pvalues` the other tests let survive
(see docs/mutation.md): the default method is Holm, p = 0 is a valid p-value, a missing p
(None) stays missing, and the refusal of an out-of-range p says what is wrong."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from acrb.analysis.pvalues import adjust


def test_the_default_adjustment_is_holm() -> None:
    # Holm by hand: sorted 0.01, 0.03, 0.04 -> 3 x 0.01, 2 x 0.03, max(1 x 0.04, 0.06).
    np.testing.assert_allclose(adjust([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])


def test_a_p_value_of_zero_is_accepted() -> None:
    np.testing.assert_allclose(adjust([0.0, 0.5]), [0.0, 0.5])


def test_a_missing_p_value_stays_missing() -> None:
    # A table column with a missing entry arrives as an object Series holding None.
    column = pd.Series([0.01, None, 0.04], dtype=object)
    adjusted = adjust(column)
    assert np.isnan(adjusted[1])
    np.testing.assert_allclose(adjusted[[0, 2]], [0.02, 0.04])


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_an_out_of_range_p_value_is_refused_with_its_reason(bad: float) -> None:
    with pytest.raises(ValueError, match=r"^p-values must lie in \[0, 1\]$"):
        adjust([0.2, bad])
