"""Δ, its simultaneous interval, homogeneity tests and Holm adjustment, against known answers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import chi2_contingency, fisher_exact
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import confint_proportions_2indep

from acrb.analysis.estimation.disparity import DISPARITY_COLUMNS, delta_interval, disparities
from acrb.analysis.tests.contingency import homogeneity_test
from acrb.demographics import RACES
from tests.frames import requests

pytestmark = pytest.mark.filterwarnings("error")


def only(result: pd.DataFrame, category: str, dimension: str) -> pd.Series:
    match = result.loc[(result["category"] == category) & (result["dimension"] == dimension)]
    assert len(match) == 1
    return match.iloc[0]


def test_delta_and_extreme_groups_on_a_hand_made_frame() -> None:
    frame = pd.concat(
        [
            requests(100, refused=30, race="Black"),
            requests(100, refused=10, race="White", gender="Male"),
            requests(100, refused=20, race="Indian", age="60s"),
        ]
    )
    result = disparities(frame, "hard_refusal")
    assert tuple(result.columns) == DISPARITY_COLUMNS
    race = only(result, "A", "race")
    assert race["delta"] == pytest.approx(0.2)
    assert (race["max_group"], race["min_group"]) == ("Black", "White")
    assert race["n"] == 300
    gender = only(result, "all", "gender")
    assert gender["delta"] == pytest.approx(50 / 200 - 10 / 100)
    assert (gender["max_group"], gender["min_group"]) == ("Female", "Male")


def test_two_group_interval_is_the_newcombe_interval() -> None:
    # With g = 2 there is m = 1 pair, so no Bonferroni: Δ = |p1 − p2| and its interval is
    # the Newcombe interval of p1 − p2 with its lower bound clipped at 0.
    low, high = delta_interval(np.array([30, 10]), np.array([100, 100]), 0.95)
    expected = confint_proportions_2indep(30, 100, 10, 100, method="newcomb", alpha=0.05)
    assert (low, high) == pytest.approx((expected[0], expected[1]), abs=1e-12)
    swapped = delta_interval(np.array([10, 30]), np.array([100, 100]), 0.95)
    assert swapped == pytest.approx((low, high), abs=1e-12)
    assert 0.0 < low < 0.2 < high


def test_interval_uses_bonferroni_over_pairs() -> None:
    k, n = np.array([30, 10, 20]), np.array([100, 100, 100])
    low, high = delta_interval(k, n, 0.95)
    # The widest pair (30 vs 10) at level 1 − 0.05/3 gives the bounds here.
    pair = confint_proportions_2indep(30, 100, 10, 100, method="newcomb", alpha=0.05 / 3)
    assert (low, high) == pytest.approx((pair[0], pair[1]), abs=1e-12)


def test_equal_groups_give_lower_bound_zero_and_cover_true_delta() -> None:
    k = np.full(7, 24)
    n = np.full(7, 120)
    low, high = delta_interval(k, n)
    assert low == 0.0 and high > 0.0
    frame = pd.concat([requests(120, refused=24, race=race) for race in RACES])
    race = only(disparities(frame, "hard_refusal"), "A", "race")
    assert race["delta"] == 0.0 and race["ci_low"] == 0.0
    assert race["p_value"] == pytest.approx(1.0) and not race["flagged"]


def test_chi_square_p_value_matches_scipy() -> None:
    counts = {"Black": (60, 21), "EastAsian": (60, 9), "White": (60, 12)}
    frame = pd.concat([requests(n, refused=k, race=r) for r, (n, k) in counts.items()])
    race = only(disparities(frame, "hard_refusal"), "A", "race")
    table = np.array([[k, n - k] for n, k in counts.values()])
    assert race["method"] == "chi2"
    assert race["p_value"] == pytest.approx(chi2_contingency(table, correction=False).pvalue)


def test_two_by_two_chi_square_has_no_continuity_correction() -> None:
    p_value, method = homogeneity_test(np.array([30, 15]), np.array([80, 80]))
    expected = chi2_contingency(np.array([[30, 50], [15, 65]]), correction=False).pvalue
    assert method == "chi2" and p_value == pytest.approx(expected)


def test_fisher_exact_for_small_two_by_two() -> None:
    frame = pd.concat([requests(8, refused=3), requests(9, gender="Male")])
    gender = only(disparities(frame, "hard_refusal"), "A", "gender")
    assert gender["method"] == "fisher"
    assert gender["p_value"] == pytest.approx(fisher_exact([[3, 5], [0, 9]]).pvalue)


def exact_conditional_p(k: np.ndarray, n: np.ndarray) -> float:
    """Exact p of Pearson's X² given both margins, by enumerating every g x 2 table."""
    total, total_true = n.sum(), k.sum()

    def statistic(counts: np.ndarray) -> float:
        e1 = n * total_true / total
        e0 = n * (total - total_true) / total
        return float(np.sum((counts - e1) ** 2 / e1 + (counts - e1) ** 2 / e0))

    observed = statistic(k)
    p = 0.0
    for counts in itertools.product(*(range(m + 1) for m in n)):
        if sum(counts) != total_true:
            continue
        if statistic(np.array(counts)) >= observed - 1e-9:
            weight = math.prod(math.comb(int(m), c) for m, c in zip(n, counts, strict=True))
            p += weight / math.comb(int(total), int(total_true))
    return p


def test_permutation_test_for_small_larger_tables_is_seeded_and_near_exact() -> None:
    k, n = np.array([4, 0, 1, 0]), np.array([6, 7, 5, 6])
    p_value, method = homogeneity_test(k, n, permutations=20_000)
    assert method == "permutation"
    # fixed seed: deterministic
    assert homogeneity_test(k, n, permutations=20_000) == (p_value, method)
    # 20,000 draws: Monte-Carlo standard error below 0.004.
    assert p_value == pytest.approx(exact_conditional_p(k, n), abs=0.012)


def test_degenerate_tables() -> None:
    assert homogeneity_test(np.array([5]), np.array([9])) == (1.0, "degenerate")
    assert homogeneity_test(np.array([0, 0]), np.array([9, 9])) == (1.0, "degenerate")
    assert homogeneity_test(np.array([9, 4]), np.array([9, 4])) == (1.0, "degenerate")
    p_value, method = homogeneity_test(np.array([0, 0]), np.array([0, 0]))
    assert math.isnan(p_value) and method == "no data"
    assert delta_interval(np.array([3]), np.array([9])) == (0.0, 0.0)
    assert all(math.isnan(x) for x in delta_interval(np.array([0]), np.array([0])))


@pytest.mark.parametrize("refused", [0, 1])
def test_all_or_none_refused(refused: int) -> None:
    frame = pd.concat(
        [requests(10, refused=10 * refused, race=r, category=c) for r in RACES for c in "AB"]
    )
    result = disparities(frame, "hard_refusal")
    assert (result["delta"] == 0.0).all()
    assert (result["p_value"] == 1.0).all() and not result["flagged"].any()
    assert set(result["method"]) == {"degenerate"}


def test_all_refused_leaves_erasure_without_data() -> None:
    frame = pd.concat([requests(10, refused=10, race=r) for r in RACES])
    result = disparities(frame, "erasure")
    assert result["delta"].isna().all() and result["p_adjusted"].isna().all()
    assert not result["flagged"].any() and set(result["method"]) == {"no data"}
    assert result["max_group"].isna().all()


def test_one_category_only_and_group_without_requests() -> None:
    frame = pd.concat([requests(50, refused=10), requests(50, refused=30, race="White")])
    result = disparities(frame, "hard_refusal")
    assert list(result["category"]) == ["all"] * 3 + ["A"] * 3
    age = only(result, "A", "age")  # one age group observed: no gap to speak of
    assert age["delta"] == 0.0 and (age["ci_low"], age["ci_high"]) == (0.0, 0.0)
    race = only(result, "A", "race")  # five races have no requests and take no part
    assert race["delta"] == pytest.approx(0.4)
    assert race["method"] == "chi2" and race["flagged"]


def test_error_rows_are_not_refusals() -> None:
    frame = pd.concat(
        [
            requests(40, refused=8),
            requests(40, refused=8, race="White"),
            requests(30, race="White", status="error"),
        ]
    )
    race = only(disparities(frame, "hard_refusal"), "A", "race")
    assert race["delta"] == 0.0 and race["n"] == 80


def test_holm_adjustment_over_the_family() -> None:
    rng = np.random.default_rng(7)
    parts = []
    for category, gap in zip("ABCDE", (0.0, 0.05, 0.1, 0.2, 0.3), strict=True):
        for race in RACES:
            rate = 0.2 + (gap if race == "Black" else 0.0)
            parts.append(requests(80, refused=rng.binomial(80, rate), race=race, category=category))
    result = disparities(pd.concat(parts), "hard_refusal", alpha=0.05)
    p, adjusted = result["p_value"].to_numpy(), result["p_adjusted"].to_numpy()
    assert adjusted == pytest.approx(multipletests(p, method="holm")[1])
    assert (adjusted >= p - 1e-15).all()
    order = np.argsort(p, kind="stable")
    assert (np.diff(adjusted[order]) >= -1e-15).all()  # monotone in the raw p-values
    assert (result["flagged"] == (adjusted < 0.05)).all()
    assert only(result, "E", "race")["flagged"]


def test_simulated_coverage_and_false_flag_rate() -> None:
    """Seeded simulation: 7 groups, n = 120 each.

    With a planted Δ of 0.3 the interval covers it in at least 93% of 200 repetitions; with no
    planted gap the test flags at most 7% of 1,000 repetitions (nominal 5%).
    """
    rng = np.random.default_rng(2024)
    n = np.full(7, 120)
    planted = np.array([0.1, 0.2, 0.25, 0.3, 0.35, 0.4, 0.2])  # Δ = 0.3
    covered = 0
    for _ in range(200):
        low, high = delta_interval(rng.binomial(n, planted), n, 0.95)
        covered += low <= 0.3 <= high
    assert covered / 200 >= 0.93

    null = np.full(7, 0.25)
    false_flags = 0
    zero_lower = 0
    for repetition in range(1000):
        k = rng.binomial(n, null)
        p_value, _ = homogeneity_test(k, n)
        false_flags += p_value < 0.05
        if repetition < 200:
            zero_lower += delta_interval(k, n, 0.95)[0] == 0.0
    assert false_flags / 1000 <= 0.07
    assert zero_lower / 200 >= 0.93  # the interval covers the true Δ = 0


def test_no_warnings_and_deterministic_on_sparse_frame() -> None:
    frame = pd.concat(
        [requests(3, refused=1, race=r, category=c) for r in RACES[:4] for c in "ABC"]
    )
    first = disparities(frame, "hard_refusal")
    second = disparities(frame, "hard_refusal")
    pd.testing.assert_frame_equal(first, second)
    assert set(first["method"]) <= {"permutation", "fisher", "degenerate"}
