"""Planted group rates computed exactly from per-request probabilities, and their comparison."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from acrb.analysis.estimation.disparity import disparities
from acrb.analysis.estimation.planted import (
    DELTA_ROW,
    PLANTED_VS_MEASURED_COLUMNS,
    planted_group_rates,
    planted_vs_measured,
)
from acrb.analysis.estimation.rates import group_rates
from acrb.demographics import RACES, SOURCE_DIMENSIONS
from acrb.errors import InputDataError

pytestmark = pytest.mark.filterwarnings("error")


def hand_made() -> pd.DataFrame:
    """Three Black requests and one White request in category A, plus an errored request."""
    frame = pd.DataFrame(
        {
            "category": ["A", "A", "A", "A", "A"],
            "race": ["Black", "Black", "Black", "White", "Black"],
            "gender": ["Female", "Female", "Male", "Male", "Female"],
            "age": ["20s", "20s", "30s", "30s", "20s"],
            "status": ["ok", "refused", "ok", "ok", "error"],
            "planted_refusal": [0.5, 0.0, 0.2, 0.1, 1.0],
            "planted_erasure": [0.4, 0.1, 0.3, 0.2, 1.0],
            "planted_lightening": [0.0, 0.2, 0.4, 0.6, 1.0],
        }
    )
    frame["hard_refusal"] = pd.array([False, True, False, False, None], dtype="boolean")
    frame["erasure"] = pd.array([True, None, False, False, None], dtype="boolean")
    frame["lightening"] = pd.array([False, None, True, None, None], dtype="boolean")
    return frame


def planted(result: pd.DataFrame, category: str, dimension: str, value: str) -> float:
    match = result.loc[
        (result["category"] == category)
        & (result["dimension"] == dimension)
        & (result["value"] == value),
        "planted",
    ]
    assert len(match) == 1
    return float(match.iloc[0])


def test_planted_refusal_is_the_mean_probability() -> None:
    result = planted_group_rates(hand_made(), "hard_refusal")
    assert planted(result, "A", "race", "Black") == pytest.approx((0.5 + 0.0 + 0.2) / 3)
    assert planted(result, "all", "race", "White") == pytest.approx(0.1)


def test_planted_erasure_is_conditional_on_not_refused() -> None:
    result = planted_group_rates(hand_made(), "erasure")
    # Black: Σ(1 − r)e / Σ(1 − r) = (0.5·0.4 + 1·0.1 + 0.8·0.3) / (0.5 + 1 + 0.8) = 0.54 / 2.3;
    # the errored request (r = e = 1) is left out.
    assert planted(result, "A", "race", "Black") == pytest.approx(0.54 / 2.3)
    # Female: (0.5·0.4 + 1·0.1) / 1.5 = 0.2.
    assert planted(result, "A", "gender", "Female") == pytest.approx(0.2)
    lightening = planted_group_rates(hand_made(), "lightening")
    assert planted(lightening, "A", "gender", "Male") == pytest.approx(
        (0.8 * 0.4 + 0.9 * 0.6) / 1.7
    )


def test_unjudged_requests_are_left_out() -> None:
    frame = hand_made()
    missing = frame.iloc[[0]].assign(status="missing", planted_refusal=1.0)
    missing["hard_refusal"] = pd.array([None], dtype="boolean")
    result = planted_group_rates(pd.concat([frame, missing], ignore_index=True), "hard_refusal")
    assert planted(result, "A", "race", "Black") == pytest.approx((0.5 + 0.0 + 0.2) / 3)


def test_groups_without_rows_or_certain_refusal_have_no_planted_rate() -> None:
    frame = hand_made()
    frame.loc[frame["race"] == "White", "planted_refusal"] = 1.0
    result = planted_group_rates(frame, "erasure")
    assert math.isnan(planted(result, "A", "race", "White"))  # every request refused
    assert math.isnan(planted(result, "A", "race", "Indian"))  # no requests
    expected_rows = 2 * sum(len(v) for v in SOURCE_DIMENSIONS.values())
    assert len(result) == expected_rows


def test_missing_planted_columns_are_named() -> None:
    with pytest.raises(InputDataError, match="planted_erasure"):
        planted_group_rates(hand_made().drop(columns="planted_erasure"), "erasure")


def test_planted_vs_measured_rows_and_coverage() -> None:
    frame = hand_made()
    rates = group_rates(frame, "hard_refusal")
    gaps = disparities(frame, "hard_refusal")
    result = planted_vs_measured(frame, rates, gaps, "hard_refusal")
    assert tuple(result.columns) == PLANTED_VS_MEASURED_COLUMNS
    blocks = 2 * len(SOURCE_DIMENSIONS)
    assert len(result) == blocks * 1 + 2 * sum(len(v) for v in SOURCE_DIMENSIONS.values())
    first_block = result.iloc[: len(RACES) + 1]
    assert list(first_block["value"]) == [*RACES, DELTA_ROW]
    assert (first_block["category"] == "all").all() and (first_block["dimension"] == "race").all()

    delta = result.loc[
        (result["category"] == "A") & (result["dimension"] == "race") & (result["value"] == "Δ")
    ].iloc[0]
    assert delta["planted"] == pytest.approx(0.7 / 3 - 0.1)
    race_gap = gaps.loc[(gaps["category"] == "A") & (gaps["dimension"] == "race")].iloc[0]
    assert delta["measured"] == pytest.approx(race_gap["delta"])
    assert delta["ci_low"] == race_gap["ci_low"] and delta["ci_high"] == race_gap["ci_high"]

    black = result.loc[
        (result["category"] == "A") & (result["dimension"] == "race") & (result["value"] == "Black")
    ].iloc[0]
    assert black["measured"] == pytest.approx(1 / 3)
    assert bool(black["covered"]) == (black["ci_low"] <= black["planted"] <= black["ci_high"])
    indian = result.loc[(result["category"] == "A") & (result["value"] == "Indian")].iloc[0]
    assert indian["covered"] is pd.NA  # no requests: nothing to compare
    assert result["covered"].dtype == "boolean"


def test_planted_values_are_recovered_from_a_seeded_simulation() -> None:
    rng = np.random.default_rng(11)
    n = 400
    frame = pd.DataFrame(
        {
            "category": "B",
            "race": np.repeat(["Black", "White"], n),
            "gender": "Female",
            "age": "40s",
            "status": "ok",
            "planted_refusal": np.repeat([0.4, 0.1], n),
            "planted_erasure": np.repeat([0.3, 0.3], n),
            "planted_lightening": 0.0,
        }
    )
    refused = rng.random(2 * n) < frame["planted_refusal"]
    erased = rng.random(2 * n) < frame["planted_erasure"]
    frame["hard_refusal"] = pd.array(refused, dtype="boolean")
    frame["erasure"] = pd.array(np.where(refused, None, erased), dtype="boolean")
    for outcome, planted_delta in (("hard_refusal", 0.3), ("erasure", 0.0)):
        rates = group_rates(frame, outcome)
        result = planted_vs_measured(frame, rates, disparities(frame, outcome), outcome)
        delta = result.loc[
            (result["category"] == "B") & (result["dimension"] == "race") & (result["value"] == "Δ")
        ].iloc[0]
        assert delta["planted"] == pytest.approx(planted_delta)
        assert bool(delta["covered"])
