""":func:`acrb.analysis.estimation.resampling.clustered_rates` puts each group's clustered interval
(:func:`acrb.analysis.estimation.resampling.rate_intervals` of its block) on that group's row, in
one assignment per column; a group no block holds keeps the independent (Wilson) interval."""

from __future__ import annotations

import pandas as pd
import pytest

from acrb.analysis.estimation.rates import group_rates
from acrb.analysis.estimation.resampling import _block, _design, clustered_rates, rate_intervals
from acrb.analysis.frame import ALL_CATEGORIES, category_levels
from acrb.demographics import SOURCE_DIMENSIONS
from tests.test_resampling import simulate


def test_each_group_row_has_its_blocks_interval_to_the_bit() -> None:
    frame = simulate(52, categories="AB", prompts=6, source_sd=1.0, shift={"Black": 0.5})
    frame.loc[frame["prompt_id"] == "B03", "status"] = "error"  # a prompt less in one block
    ours = clustered_rates(frame, "erasure", 0.9)
    wilson = group_rates(frame, "erasure", 0.9)
    design = _design(frame, "erasure")
    expected = wilson.copy()
    for category in category_levels(frame):
        mask = None if category == ALL_CATEGORIES else design.prompt_category == category
        for dimension in SOURCE_DIMENSIONS:
            block = _block(design, dimension, mask)
            for group, low, high in zip(block.groups, *rate_intervals(block, 0.9), strict=True):
                row = ((expected["category"] == category) & (expected["dimension"] == dimension)
                       & (expected["value"] == group))
                assert row.sum() == 1
                expected.loc[row, ["ci_low", "ci_high"]] = (low, high)
    assert ours.dtypes.equals(wilson.dtypes)
    pd.testing.assert_frame_equal(ours, expected, check_exact=True)


@pytest.mark.filterwarnings("ignore:race value")  # the unknown race is named: its own tests
def test_a_group_without_a_block_keeps_its_independent_interval() -> None:
    frame = simulate(53, prompts=4)
    frame["race"] = frame["race"].astype(object)
    frame.loc[frame["race"] == "White", "race"] = "Martian"  # outside the vocabulary
    ours = clustered_rates(frame, "hard_refusal")
    wilson = group_rates(frame, "hard_refusal")
    empty = (wilson["dimension"] == "race") & (wilson["value"] == "White")
    assert empty.sum() == 2 and (wilson.loc[empty, "n"] == 0).all()  # listed, in no block
    assert ours.loc[empty, ["ci_low", "ci_high"]].equals(wilson.loc[empty, ["ci_low", "ci_high"]])
    assert (ours.loc[~empty, "ci_low"] != wilson.loc[~empty, "ci_low"]).all()
