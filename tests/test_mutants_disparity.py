"""The Δ table (``acrb.analysis.estimation.disparity``): its intervals at the level the family asks
for, groups with a single request, the permutation settings passed through, and ``flagged``: tests
that kill the mutants the other tests let survive (see docs/mutation.md).

Every expected interval is statsmodels' Newcombe interval of the one pair of groups compared
(with two groups Δ = |p1 − p2| and no Bonferroni over pairs), at the level 1 − (1 − c)/F the
docstring of :func:`disparities` promises, F the rows of the table that compare two or more
groups; every expected p-value comes from scipy, statsmodels or the homogeneity test itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import fisher_exact
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import confint_proportions_2indep

from acrb.analysis.estimation.disparity import delta_interval, disparities
from acrb.analysis.tests.contingency import homogeneity_test
from tests.frames import requests

pytestmark = pytest.mark.filterwarnings("error")


def _row(result: pd.DataFrame, category: str, dimension: str) -> pd.Series:
    match = result.loc[(result["category"] == category) & (result["dimension"] == dimension)]
    assert len(match) == 1
    return match.iloc[0]


def _newcombe(k_high: int, n_high: int, k_low: int, n_low: int,
              alpha: float) -> tuple[float, float]:
    """Newcombe's interval of p_high − p_low, the lower bound clipped at 0 (a gap is ≥ 0)."""
    low, high = confint_proportions_2indep(k_high, n_high, k_low, n_low, method="newcomb",
                                           compare="diff", alpha=alpha)
    return max(0.0, float(low)), float(high)


def _interval(row: pd.Series) -> tuple[float, float]:
    return float(row["ci_low"]), float(row["ci_high"])


# Category A compares Black (12/30) with White (2/20); category B has Black only. Two rows of
# the table compare two groups (all x race and A x race): F = 2. Every other row has one group.
TWO_ROW_FAMILY = [
    requests(30, refused=12, race="Black"),
    requests(20, refused=2, race="White"),
    requests(10, refused=1, race="Black", category="B"),
]


def test_default_intervals_are_simultaneous_over_the_rows_that_compare_groups() -> None:
    result = disparities(pd.concat(TWO_ROW_FAMILY), "hard_refusal")
    # 95% jointly over F = 2 rows: each row at 1 − 0.05/2.
    assert _interval(_row(result, "A", "race")) == pytest.approx(
        _newcombe(12, 30, 2, 20, alpha=0.05 / 2), abs=1e-12)
    assert _interval(_row(result, "all", "race")) == pytest.approx(
        _newcombe(13, 40, 2, 20, alpha=0.05 / 2), abs=1e-12)
    # Rows with one group have Δ = 0 and the interval (0, 0), whatever the level.
    assert _interval(_row(result, "B", "race")) == (0.0, 0.0)
    assert _interval(_row(result, "all", "gender")) == (0.0, 0.0)


def test_simultaneous_level_follows_the_confidence_asked() -> None:
    result = disparities(pd.concat(TWO_ROW_FAMILY), "hard_refusal", confidence=0.9)
    assert _interval(_row(result, "A", "race")) == pytest.approx(
        _newcombe(12, 30, 2, 20, alpha=0.10 / 2), abs=1e-12)


def test_per_row_intervals_when_not_simultaneous() -> None:
    result = disparities(pd.concat(TWO_ROW_FAMILY), "hard_refusal", simultaneous=False)
    assert _interval(_row(result, "A", "race")) == pytest.approx(
        _newcombe(12, 30, 2, 20, alpha=0.05), abs=1e-12)
    assert _interval(_row(result, "all", "race")) == pytest.approx(
        _newcombe(13, 40, 2, 20, alpha=0.05), abs=1e-12)


def test_a_family_of_one_row_is_at_the_confidence_itself() -> None:
    # Each category has one race; only the pooled row compares two groups: F = 1, so that row's
    # interval is the plain 95% one (Bonferroni over one comparison is no correction).
    frame = pd.concat([requests(10, refused=5, race="Black"),
                       requests(10, refused=1, race="White", category="B")])
    result = disparities(frame, "hard_refusal")
    assert _interval(_row(result, "all", "race")) == pytest.approx(
        _newcombe(5, 10, 1, 10, alpha=0.05), abs=1e-12)
    assert _interval(_row(result, "A", "race")) == (0.0, 0.0)


def test_a_group_with_a_single_request_takes_part() -> None:
    # One Black request (refused) against nine White ones (none refused): Δ = 1, and both rows
    # that compare them (all x race, A x race) are the family, F = 2.
    frame = pd.concat([requests(1, refused=1, race="Black"), requests(9, race="White")])
    race = _row(disparities(frame, "hard_refusal"), "A", "race")
    assert race["delta"] == 1.0
    assert (race["max_group"], race["min_group"]) == ("Black", "White")
    assert race["n"] == 10
    assert _interval(race) == pytest.approx(_newcombe(1, 1, 0, 9, alpha=0.05 / 2), abs=1e-12)
    assert race["method"] == "fisher"
    assert race["p_value"] == pytest.approx(fisher_exact([[1, 0], [0, 9]]).pvalue)
    assert delta_interval(np.array([1, 0]), np.array([1, 9])) == pytest.approx(
        _newcombe(1, 1, 0, 9, alpha=0.05), abs=1e-12)


def test_equal_rates_in_groups_of_different_sizes() -> None:
    # 1/2 and 50/100: Δ = 0. The interval is Newcombe's for the one pair; the narrower
    # bound of the larger group must not be replaced by the smaller group's own width.
    low, high = delta_interval(np.array([1, 50]), np.array([2, 100]))
    assert (low, high) == pytest.approx(_newcombe(1, 2, 50, 100, alpha=0.05), abs=1e-12)
    assert low == 0.0


def test_a_complete_gap_has_an_interval_inside_zero_one() -> None:
    # Every request of one group refused, none of the other: Newcombe's upper limit is
    # u1 − l2 = 1 − 0 = 1 exactly; statsmodels' arithmetic lands one ulp above it.
    for k, n in (([0, 10], [3, 10]), ([27, 0], [27, 1]), ([0, 0, 13], [5, 3, 13])):
        low, high = delta_interval(np.array(k), np.array(n))
        assert 0.0 < low < 1.0
        assert high == 1.0


def test_counts_from_a_mixed_type_table_give_the_same_interval() -> None:
    # Rows of a table with a text column come out of to_numpy() as object arrays of ints.
    table = pd.DataFrame({"group": ["Black", "White", "Indian"], "k": [30, 10, 20],
                          "n": [100, 100, 100]}).to_numpy()
    as_objects = delta_interval(table[:, 1], table[:, 2])
    assert table[:, 1].dtype == object
    ints = delta_interval(np.array([30, 10, 20]), np.array([100, 100, 100]))
    assert as_objects == ints
    # Only one of the two in object form.
    assert delta_interval(table[:, 1], np.array([100, 100, 100])) == ints
    assert delta_interval(np.array([30, 10, 20]), table[:, 2]) == ints


def test_the_permutation_settings_reach_the_test() -> None:
    # A sparse 3 x 2 table: its p is a permutation p (Monte Carlo, seeded).
    counts = {"Black": (6, 4), "White": (7, 0), "Indian": (5, 1)}
    frame = pd.concat([requests(n, refused=k, race=race) for race, (n, k) in counts.items()])
    # The groups in vocabulary order (Black, Indian, White), as the table lists them.
    k = np.array([4, 1, 0])
    n = np.array([6, 5, 7])
    for seed in (3, 11):
        race = _row(disparities(frame, "hard_refusal", permutations=199, seed=seed), "A", "race")
        assert race["method"] == "permutation"
        assert race["p_value"] == homogeneity_test(k, n, permutations=199, seed=seed)[0]
        # With B draws the p-value is (1 + #extreme) / (B + 1).
        assert race["p_value"] * 200 == pytest.approx(round(race["p_value"] * 200), abs=1e-9)
        again = _row(disparities(frame, "hard_refusal", permutations=199, seed=seed), "A",
                     "race")
        assert again["p_value"] == race["p_value"]


def test_flagged_is_a_boolean_strictly_below_alpha() -> None:
    # One category, two races: the race rows (all and A) share Fisher's p; the four
    # single-group rows have p = 1 and stay in Holm's family.
    frame = pd.concat([requests(8, refused=3, race="Black"), requests(9, race="White")])
    p = fisher_exact([[3, 5], [0, 9]]).pvalue
    holm = multipletests([p, 1.0, 1.0, p, 1.0, 1.0], method="holm")[1]
    result = disparities(frame, "hard_refusal")
    race = _row(result, "A", "race")
    assert race["p_adjusted"] == pytest.approx(holm[0])
    assert result["flagged"].dtype == bool
    at_alpha = disparities(frame, "hard_refusal", alpha=float(race["p_adjusted"]))
    assert not at_alpha["flagged"].any()
    above = disparities(frame, "hard_refusal",
                        alpha=float(np.nextafter(race["p_adjusted"], 1.0)))
    assert above["flagged"].tolist() == [True, False, False, True, False, False]
