"""Group rates and their Wilson intervals, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.proportion import proportion_confint

from acrb.analysis.estimation.power import design_effect
from acrb.analysis.estimation.rates import RATE_COLUMNS, group_rates, wilson_interval
from acrb.analysis.outcomes import OUTCOMES
from acrb.analysis.tests.contingency import category_tests
from acrb.demographics import SOURCE_DIMENSIONS
from tests.frames import requests

pytestmark = pytest.mark.filterwarnings("error")


def row(rates: pd.DataFrame, category: str, dimension: str, value: str) -> pd.Series:
    match = rates.loc[
        (rates["category"] == category)
        & (rates["dimension"] == dimension)
        & (rates["value"] == value)
    ]
    assert len(match) == 1
    return match.iloc[0]


def test_wilson_interval_matches_hand_computation_and_statsmodels() -> None:
    # k = 12, n = 40, z = 1.959964: centre (p + z²/2n)/(1 + z²/n) = 0.317524,
    # half-width z/(1 + z²/n) * sqrt(p(1−p)/n + z²/4n²) = 0.136776.
    low, high = wilson_interval(np.array([12]), np.array([40]), 0.95)
    assert low[0] == pytest.approx(0.180748, abs=1e-6)
    assert high[0] == pytest.approx(0.454300, abs=1e-6)
    expected = proportion_confint(12, 40, alpha=0.05, method="wilson")
    assert (low[0], high[0]) == pytest.approx(expected, abs=1e-12)


def test_group_rate_of_twelve_refusals_in_forty() -> None:
    frame = requests(40, refused=12)
    rates = group_rates(frame, "hard_refusal")
    black = row(rates, "A", "race", "Black")
    assert (black["n"], black["k"]) == (40, 12)
    assert black["rate"] == pytest.approx(0.3)
    assert black["ci_low"] == pytest.approx(0.180748, abs=1e-6)
    assert black["ci_high"] == pytest.approx(0.454300, abs=1e-6)
    narrower = group_rates(frame, "hard_refusal", confidence=0.8)
    assert row(narrower, "A", "race", "Black")["ci_low"] > black["ci_low"]


def test_every_group_and_category_is_listed_in_order() -> None:
    frame = pd.concat([requests(5, category="B"), requests(5, category="A", race="White")])
    rates = group_rates(frame, "hard_refusal")
    assert tuple(rates.columns) == RATE_COLUMNS
    groups_per_category = sum(len(v) for v in SOURCE_DIMENSIONS.values())
    assert len(rates) == 3 * groups_per_category
    assert list(dict.fromkeys(rates["category"])) == ["all", "A", "B"]
    first = rates.loc[rates["category"] == "all"]
    expected = [(d, v) for d, values in SOURCE_DIMENSIONS.items() for v in values]
    assert list(zip(first["dimension"], first["value"], strict=True)) == expected
    assert set(rates["outcome"]) == {"hard_refusal"}


def test_group_without_requests_has_rate_nan() -> None:
    rates = group_rates(requests(10, refused=3), "hard_refusal")
    white = row(rates, "A", "race", "White")
    assert (white["n"], white["k"]) == (0, 0)
    assert (
        math.isnan(white["rate"]) and math.isnan(white["ci_low"]) and math.isnan(white["ci_high"])
    )


def test_pooled_category_sums_the_categories() -> None:
    frame = pd.concat(
        [requests(10, refused=2, category="A"), requests(30, refused=15, category="E")]
    )
    rates = group_rates(frame, "hard_refusal")
    pooled = row(rates, "all", "race", "Black")
    assert (pooled["n"], pooled["k"]) == (40, 17)
    assert pooled["rate"] == pytest.approx(17 / 40)


def test_error_rows_are_excluded_even_if_marked_refused() -> None:
    errors = requests(7, status="error")
    errors["hard_refusal"] = pd.array([True] * 7, dtype="boolean")  # a malformed upstream row
    frame = pd.concat([requests(10, refused=4), errors])
    black = row(group_rates(frame, "hard_refusal"), "all", "race", "Black")
    assert (black["n"], black["k"]) == (10, 4)


def test_unjudged_requests_count_nowhere_even_if_marked() -> None:
    # Status "missing" (no judgement yet) has no outcome. Rates, the contingency tests and the
    # design effect read the same rows, so none of them counts it, whatever its columns say.
    unjudged = requests(6, refused=6, status="missing")
    frame = pd.concat([requests(10, refused=4), requests(10, refused=1, race="White"), unjudged])
    frame["source_id"] = [f"s{i % 4}-{race}" for i, race in enumerate(frame["race"])]
    black = row(group_rates(frame, "hard_refusal"), "all", "race", "Black")
    assert (black["n"], black["k"]) == (10, 4)
    assert category_tests(frame, "hard_refusal", "race")["n"].item() == 20
    assert design_effect(frame, "hard_refusal").n == 20


def test_erasure_is_conditional_on_not_refused() -> None:
    frame = requests(20, refused=5, erased=6)
    black = row(group_rates(frame, "erasure"), "A", "race", "Black")
    assert (black["n"], black["k"]) == (15, 6)
    assert black["rate"] == pytest.approx(0.4)


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_all_refused_gives_no_conditional_observations(outcome: str) -> None:
    frame = requests(12, refused=12)
    if outcome not in frame:  # a judge outcome: NA on refused requests, like erasure
        frame[outcome] = frame["erasure"].copy()
    rates = group_rates(frame, outcome)
    black = row(rates, "A", "race", "Black")
    if outcome == "hard_refusal":
        assert black["rate"] == 1.0 and black["ci_high"] == 1.0
    else:
        assert black["n"] == 0 and math.isnan(black["rate"])


def test_none_refused_has_rate_zero_and_positive_upper_bound() -> None:
    black = row(group_rates(requests(25), "hard_refusal"), "A", "race", "Black")
    assert black["rate"] == 0.0 and black["ci_low"] == 0.0
    assert 0.0 < black["ci_high"] < 0.2


def test_unknown_group_value_warns_and_is_left_out() -> None:
    frame = pd.concat([requests(4, refused=1), requests(3, race="Martian")])
    with pytest.warns(UserWarning, match="Martian"):
        rates = group_rates(frame, "hard_refusal")
    assert "Martian" not in set(rates["value"])
    assert row(rates, "all", "gender", "Female")["n"] == 7


def test_missing_column_is_named() -> None:
    from acrb.errors import InputDataError

    with pytest.raises(InputDataError, match="erasure"):
        group_rates(requests(3).drop(columns="erasure"), "erasure")
