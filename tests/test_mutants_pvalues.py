"""Tests that kill the mutants of :mod:`acrb.analysis.tests.pvalues` the other tests let survive
(see docs/mutation.md): the default method is Holm, p = 0 is a valid p-value, a missing p
(None) stays missing, and the refusal of an out-of-range p says what is wrong."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from acrb.analysis.tests.pvalues import adjust


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


def test_holm_is_statsmodels_holm_bit_for_bit_without_a_garbage_collection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(7)
    families = [rng.uniform(size=n) ** rng.uniform(0.2, 5) for n in (1, 2, 3, 7, 30, 200)]
    families += [np.round(rng.uniform(size=40), 2),  # ties
                 np.array([0.0, 1.0, 1.0, 0.5, 0.5]), np.full(6, 0.3)]
    import gc

    gc.freeze()  # statsmodels' own collection on each call, over a test session's heap
    try:
        expected = [multipletests(p, method="holm")[1] for p in families]
    finally:
        gc.unfreeze()

    def collect(*args: object) -> int:
        raise AssertionError("the Holm adjustment ran a garbage collection")

    monkeypatch.setattr(gc, "collect", collect)
    for p, holm_p in zip(families, expected, strict=True):
        assert adjust(p).tobytes() == holm_p.tobytes()
