"""Agreement between raters, within a rater and with the judges (acrb.analysis.agreement.raters):
checked against published worked examples to the third decimal, and on ratings built by hand
where the answer is known.

Published data typed in from the publications (facts, not code):
- Fleiss, J. L. (1971). Measuring nominal scale agreement among many raters. Psychological
  Bulletin 76(5):378-382, Table 1: 30 patients, 6 psychiatric diagnoses each, 5 categories
  (depression, personality disorder, schizophrenia, neurosis, other); overall kappa 0.430,
  per category 0.245, 0.245, 0.520, 0.471, 0.566.
- Krippendorff, K. (2011). Computing Krippendorff's Alpha-Reliability. Annenberg School for
  Communication, University of Pennsylvania, the example with missing values: 4 observers x
  12 units, values 1-5; alpha nominal 0.743, ordinal 0.815, interval 0.849.

And on a matrix of the study's survey's shape (6 raters, 3-6 ratings per item, both outputs),
against the reference libraries themselves: the ``krippendorff`` package and statsmodels'
``fleiss_kappa``, and Fleiss' kappa for unequal counts against a calculation by hand.
"""

from __future__ import annotations

import math
from itertools import product

import krippendorff
import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.inter_rater import fleiss_kappa

from acrb.analysis.agreement.raters import (
    AGREEMENT_COLUMNS,
    JUDGE_HUMAN_COLUMNS,
    MISS_COLUMNS,
    arm_tests,
    fleiss_kappa_unequal,
    group_tests,
    human_consensus,
    intra_rater_consistency,
    judge_human_agreement,
    judge_human_units,
    judge_misses,
    rater_agreement,
    unit_counts,
)
from acrb.config import OutcomeRule
from acrb.demographics import RACES
from acrb.errors import InputDataError

# Fleiss (1971), Table 1: per patient, how many of the six psychiatrists chose each category.
FLEISS_1971 = [
    [0, 0, 0, 6, 0], [0, 3, 0, 0, 3], [0, 1, 4, 0, 1], [0, 0, 0, 0, 6], [0, 3, 0, 3, 0],
    [2, 0, 4, 0, 0], [0, 0, 4, 0, 2], [2, 0, 3, 1, 0], [2, 0, 0, 4, 0], [0, 0, 0, 0, 6],
    [1, 0, 0, 5, 0], [1, 1, 0, 4, 0], [0, 3, 3, 0, 0], [1, 0, 0, 5, 0], [0, 2, 0, 3, 1],
    [0, 0, 5, 0, 1], [3, 0, 0, 1, 2], [5, 1, 0, 0, 0], [0, 2, 0, 4, 0], [1, 0, 2, 0, 3],
    [0, 0, 0, 0, 6], [0, 1, 0, 5, 0], [0, 2, 0, 1, 3], [2, 0, 0, 4, 0], [1, 0, 0, 4, 1],
    [0, 5, 0, 1, 0], [4, 0, 0, 0, 2], [0, 2, 0, 4, 0], [1, 0, 5, 0, 0], [0, 0, 0, 0, 6],
]
FLEISS_KAPPA = 0.430
FLEISS_CATEGORY_KAPPAS = (0.245, 0.245, 0.520, 0.471, 0.566)

# Krippendorff (2011): rows are observers A-D, columns units 1-12; None = no value recorded.
KRIPPENDORFF_2011 = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
    [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
]
KRIPPENDORFF_ALPHAS = {"nominal": 0.743, "ordinal": 0.815, "interval": 0.849}


def rating(rater: str, item: str, output: str = "edited", repeat: bool = False,
           **axes: int | None) -> dict:
    """A RatingRecord row (axes not given are "cannot tell")."""
    row = {"rating_id": f"{rater}-{item}-{output}-{int(repeat)}", "rater": rater,
           "item_id": item, "output": output, "shown_first": None, "repeat": repeat,
           "duration_ms": 1000, "created_at": "2026-01-01T00:00:00Z", "origin": "test",
           "edit_success": None, "skin_tone": None, "race_change": None,
           "gender_change": None, "age_change": None}
    row.update(axes)
    return row


def item(item_id: str, race: str = "White", gender: str = "Female", age: str = "20s",
         model: str = "m", request_id: str | None = None, random_sample: bool = True) -> dict:
    """A ReviewItemRecord row."""
    return {"item_id": item_id, "request_id": request_id or f"req-{item_id}",
            "paired_request_id": f"feat-{item_id}", "model": model, "prompt_id": "p",
            "instruction": "", "source_id": f"src-{item_id}", "source_path": "",
            "output_path": "", "paired_output_path": "", "race": race, "gender": gender,
            "age": age, "random_sample": random_sample, "needs_review": False}


def fleiss_frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fleiss' table as ratings on the edit_success axis (category j -> answer j + 1)."""
    ratings, items = [], []
    for subject, counts in enumerate(FLEISS_1971):
        items.append(item(f"s{subject}", race=RACES[subject % len(RACES)]))
        answers = np.repeat(np.arange(1, 6), counts)
        assert len(answers) == 6
        for rater, answer in enumerate(answers):
            ratings.append(rating(f"r{rater}", f"s{subject}", edit_success=int(answer)))
    return pd.DataFrame(ratings), pd.DataFrame(items)


def krippendorff_frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    ratings, items = [], []
    for unit in range(12):
        items.append(item(f"u{unit}"))
        for observer, values in zip("ABCD", KRIPPENDORFF_2011, strict=True):
            ratings.append(rating(observer, f"u{unit}", skin_tone=values[unit]))
    return pd.DataFrame(ratings), pd.DataFrame(items)


def overall(table: pd.DataFrame, axis: str, statistic: str, arm: str = "both") -> pd.Series:
    row = table[(table["axis"] == axis) & (table["statistic"] == statistic)
                & (table["dimension"] == "all") & (table["arm"] == arm)]
    assert len(row) == 1
    return row.iloc[0]


def test_fleiss_1971_kappa_to_the_third_decimal() -> None:
    ratings, items = fleiss_frames()
    table = rater_agreement(ratings, items, axes=("edit_success",), n_boot=200)
    assert list(table.columns) == list(AGREEMENT_COLUMNS)
    row = overall(table, "edit_success", "fleiss_kappa")
    assert round(row["estimate"], 3) == FLEISS_KAPPA
    assert (row["n_units"], row["n_ratings"], row["note"]) == (30, 180, "")
    assert row["ci_low"] < FLEISS_KAPPA < row["ci_high"]


def test_fleiss_1971_category_kappas() -> None:
    """Fleiss' per-category kappas: each category against the rest is a 2-category table."""
    ratings, items = fleiss_frames()
    counts = unit_counts(ratings, items, "edit_success").counts
    for category, expected in enumerate(FLEISS_CATEGORY_KAPPAS):
        binary = np.column_stack([counts[:, category], counts.sum(axis=1) - counts[:, category]])
        ratings_binary = []
        for subject, (yes, no) in enumerate(binary):
            for rater, answer in enumerate([1] * yes + [2] * no):
                ratings_binary.append(rating(f"r{rater}", f"s{subject}", edit_success=answer))
        table = rater_agreement(pd.DataFrame(ratings_binary), items, axes=("edit_success",),
                                n_boot=0)
        assert round(overall(table, "edit_success", "fleiss_kappa")["estimate"], 3) == expected


def test_krippendorff_2011_alphas_to_the_third_decimal() -> None:
    ratings, items = krippendorff_frames()
    table = rater_agreement(ratings, items, axes=("skin_tone",),
                            levels=("nominal", "ordinal", "interval"), n_boot=200)
    for level, expected in KRIPPENDORFF_ALPHAS.items():
        row = overall(table, "skin_tone", f"alpha_{level}")
        assert round(row["estimate"], 3) == expected, level
        # Unit 12 has one value only: it has no pair and is not counted.
        assert (row["n_units"], row["n_ratings"]) == (11, 40)
        assert row["ci_low"] <= row["estimate"] <= row["ci_high"]


def test_unequal_counts_use_every_rating_for_fleiss_and_say_so() -> None:
    ratings, items = krippendorff_frames()
    table = rater_agreement(ratings, items, axes=("skin_tone",), n_boot=0)
    row = overall(table, "skin_tone", "fleiss_kappa")
    # Units hold 2, 3 or 4 values: none is cut, nothing random.
    assert row["n_ratings"] == 40 and row["n_units"] == 11
    assert "2-4 ratings per unit" in row["note"] and "generalised" in row["note"]
    counts = unit_counts(ratings, items, "skin_tone").counts
    assert row["estimate"] == pytest.approx(fleiss_kappa_unequal(counts), abs=1e-12)
    again = rater_agreement(ratings, items, axes=("skin_tone",), n_boot=0, seed=99)
    assert overall(again, "skin_tone", "fleiss_kappa")["estimate"] == row["estimate"]


def test_fleiss_unequal_counts_by_hand() -> None:
    """Gwet's generalised kappa on three units rated 2, 3 and 4 times, worked by hand.

    Unit 1: (2, 0) -> agreement 2*1 / (2*1) = 1; shares (1, 0).
    Unit 2: (2, 1) -> (2*1 + 0) / (3*2) = 1/3; shares (2/3, 1/3).
    Unit 3: (1, 3) -> (0 + 3*2) / (4*3) = 1/2; shares (1/4, 3/4).
    p_a = (1 + 1/3 + 1/2) / 3 = 11/18; pi = ((1 + 2/3 + 1/4) / 3, (0 + 1/3 + 3/4) / 3)
    = (23/36, 13/36); p_e = (529 + 169) / 1296 = 698/1296; kappa = (p_a - p_e) / (1 - p_e).
    """
    counts = np.array([[2, 0], [2, 1], [1, 3]])
    p_a = 11 / 18
    p_e = 698 / 1296
    assert fleiss_kappa_unequal(counts) == pytest.approx((p_a - p_e) / (1 - p_e), abs=1e-12)
    # A unit with one rating carries no pair: left out, the kappa unchanged.
    assert fleiss_kappa_unequal(np.vstack([counts, [[1, 0]]])) == pytest.approx(
        fleiss_kappa_unequal(counts), abs=1e-12)
    # Equal counts: Fleiss (1971) itself.
    assert fleiss_kappa_unequal(np.array(FLEISS_1971)) == pytest.approx(
        fleiss_kappa(np.array(FLEISS_1971), method="fleiss"), abs=1e-12)


def survey_shaped(equal: bool, seed: int = 5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """50 items rated by 3-6 of 6 raters (or exactly 4 when ``equal``), both outputs, answers
    that mostly agree around an item's own true value, with some "cannot tell"."""
    rng = np.random.default_rng(seed)
    ratings, items = [], []
    for i in range(50):
        name = f"it{i:02d}"
        items.append(item(name, race=RACES[i % len(RACES)], model=("flux", "qwen", "step1x")[
            i % 3]))
        n = 4 if equal else int(rng.integers(3, 7))
        raters = rng.choice(6, size=n, replace=False)
        truth = {"edited": int(rng.integers(1, 6)), "feature": int(rng.integers(1, 6))}
        for r in raters:
            for output in ("edited", "feature"):
                value = int(np.clip(truth[output] + rng.choice([-1, 0, 0, 0, 1]), 1, 5))
                ratings.append(rating(f"r{r}", name, output, edit_success=value))
    return pd.DataFrame(ratings), pd.DataFrame(items)


def reliability_matrix(ratings: pd.DataFrame, output: str | None) -> np.ndarray:
    """Raters x units, NaN where a rater gave no value (the krippendorff package's input)."""
    part = ratings if output is None else ratings[ratings["output"] == output]
    wide = part.pivot_table(index="rater", columns=["item_id", "output"],
                            values="edit_success", aggfunc="first")
    return wide.to_numpy(dtype=float)


@pytest.mark.parametrize("arm", ["edited", "feature", "both"])
def test_survey_shaped_alphas_equal_the_krippendorff_package(arm: str) -> None:
    ratings, items = survey_shaped(equal=False)
    table = rater_agreement(ratings, items, axes=("edit_success",), n_boot=0)
    data = reliability_matrix(ratings, None if arm == "both" else arm)
    for level in ("interval", "ordinal"):
        expected = krippendorff.alpha(reliability_data=data, level_of_measurement=level)
        row = overall(table, "edit_success", f"alpha_{level}", arm)
        assert row["estimate"] == pytest.approx(expected, abs=1e-9), level
    assert overall(table, "edit_success", "alpha_interval", arm)["n_items"] == 50


def test_survey_shaped_kappa_equals_statsmodels_when_counts_are_equal() -> None:
    ratings, items = survey_shaped(equal=True)
    table = rater_agreement(ratings, items, axes=("edit_success",), n_boot=0)
    for arm in ("edited", "feature", "both"):
        part = ratings if arm == "both" else ratings[ratings["output"] == arm]
        counts = pd.crosstab([part["item_id"], part["output"]], part["edit_success"]).reindex(
            columns=range(1, 6), fill_value=0).to_numpy()
        row = overall(table, "edit_success", "fleiss_kappa", arm)
        assert row["estimate"] == pytest.approx(fleiss_kappa(counts, method="fleiss"),
                                                abs=1e-9)
        assert row["note"] == ""


def test_agreement_per_arm_and_model() -> None:
    ratings, items = survey_shaped(equal=False)
    table = rater_agreement(ratings, items, axes=("edit_success",), n_boot=0)
    assert list(dict.fromkeys(table["arm"])) == ["edited", "feature", "both"]
    edited = overall(table, "edit_success", "alpha_interval", "edited")
    both = overall(table, "edit_success", "alpha_interval", "both")
    assert both["n_units"] == 2 * edited["n_units"] == 100
    models = table[(table["dimension"] == "model") & (table["arm"] == "edited")
                   & (table["statistic"] == "alpha_interval")]
    assert set(models["group"]) == {"flux", "qwen", "step1x"}
    assert models["n_units"].sum() == 50
    only = rater_agreement(ratings, items, axes=("edit_success",), arms=("feature",), n_boot=0)
    assert set(only["arm"]) == {"feature"}
    with pytest.raises(InputDataError, match="unknown review arm"):
        rater_agreement(ratings, items, axes=("edit_success",), arms=("left",), n_boot=0)


def test_groups_models_and_repeats() -> None:
    """Per-group rows see only their units; repeats never enter agreement between raters."""
    ratings, items = fleiss_frames()
    items.loc[items.index[:15], "model"] = "other"
    # A repeat that disagrees with everything would change kappa if it were counted.
    extra = pd.DataFrame([rating("r0", "s0", repeat=True, edit_success=1)])
    table = rater_agreement(pd.concat([ratings, extra], ignore_index=True), items,
                            axes=("edit_success",), n_boot=50)
    assert round(overall(table, "edit_success", "fleiss_kappa")["estimate"], 3) == FLEISS_KAPPA
    table = table[table["arm"] == "both"]
    models = table[(table["dimension"] == "model") & (table["statistic"] == "fleiss_kappa")]
    assert set(models["group"]) == {"m", "other"}
    assert models["n_units"].sum() == 30
    races = table[(table["dimension"] == "race") & (table["statistic"] == "fleiss_kappa")]
    assert races["n_units"].sum() == 30 and set(races["group"]) == set(RACES)
    # Per arm (edited, and both pooled: no feature output here): three statistics x (all,
    # 2 models, 7 races, 1 gender, 1 age).
    assert len(table) == 3 * (1 + 2 + 7 + 1 + 1)


def test_bootstrap_is_seeded_and_over_items() -> None:
    ratings, items = fleiss_frames()
    a = rater_agreement(ratings, items, axes=("edit_success",), n_boot=100, seed=3)
    b = rater_agreement(ratings, items, axes=("edit_success",), n_boot=100, seed=3)
    c = rater_agreement(ratings, items, axes=("edit_success",), n_boot=100, seed=4)
    pd.testing.assert_frame_equal(a, b)
    assert not a["ci_low"].equals(c["ci_low"])


def test_perfect_agreement_and_unknown_item() -> None:
    rows = [rating(r, f"i{i}", edit_success=1 + i % 5) for r in "abc" for i in range(10)]
    items = pd.DataFrame([item(f"i{i}") for i in range(10)])
    table = rater_agreement(pd.DataFrame(rows), items, axes=("edit_success",), n_boot=50)
    assert (table.loc[table["dimension"] == "all", "estimate"] == 1.0).all()
    with pytest.raises(InputDataError, match="not in the review items"):
        rater_agreement(pd.DataFrame(rows), items.iloc[:5], axes=("edit_success",), n_boot=0)
    out_of_range = pd.DataFrame([rating("a", "i0", edit_success=7),
                                 rating("b", "i0", edit_success=1)])
    with pytest.raises(InputDataError, match="outside 1-5"):
        rater_agreement(out_of_range, items, axes=("edit_success",), n_boot=0)


def test_intra_rater_consistency() -> None:
    first = [rating("a", f"i{i}", edit_success=v) for i, v in enumerate([1, 2, 3, 4, 5, 5])]
    again = [rating("a", f"i{i}", repeat=True, edit_success=v)
             for i, v in enumerate([1, 2, 3, 4, 5, 4])]
    same = [rating("b", f"i{i}", edit_success=3) for i in range(3)]
    same_again = [rating("b", f"i{i}", repeat=True, edit_success=3) for i in range(3)]
    table = intra_rater_consistency(pd.DataFrame(first + again + same + same_again),
                                    axes=("edit_success", "skin_tone"))
    row = table[(table["axis"] == "edit_success") & (table["rater"] == "a")].iloc[0]
    assert row["n_pairs"] == 6
    assert row["share_identical"] == pytest.approx(5 / 6)
    assert 0.8 < row["weighted_kappa"] < 1.0
    pooled = table[(table["axis"] == "edit_success") & (table["rater"] == "all")].iloc[0]
    assert pooled["n_pairs"] == 9 and pooled["share_identical"] == pytest.approx(8 / 9)
    rater_b = table[(table["axis"] == "edit_success") & (table["rater"] == "b")].iloc[0]
    assert rater_b["share_identical"] == 1.0 and math.isnan(rater_b["weighted_kappa"])
    assert (table.loc[table["axis"] == "skin_tone", "n_pairs"] == 0).all()


def test_consensus_is_the_median_rounded_half_to_even() -> None:
    rows = [rating("a", "i0", edit_success=2), rating("b", "i0", edit_success=3),
            rating("a", "i1", edit_success=3), rating("b", "i1", edit_success=4),
            rating("a", "i2", edit_success=1), rating("b", "i2", edit_success=5),
            rating("c", "i2", edit_success=4),
            rating("a", "i3"), rating("a", "i3", repeat=True, edit_success=5)]
    consensus = human_consensus(pd.DataFrame(rows), axes=("edit_success",)).set_index(
        "item_id")
    assert consensus.loc["i0", "edit_success"] == 2  # 2.5 -> 2
    assert consensus.loc["i1", "edit_success"] == 4  # 3.5 -> 4
    assert consensus.loc["i2", "edit_success"] == 4  # median of 1, 4, 5
    assert math.isnan(consensus.loc["i3", "edit_success"])  # cannot tell; repeat left out
    assert consensus.loc["i2", "edit_success_n"] == 3
    mean = human_consensus(pd.DataFrame(rows), axes=("edit_success",), rule="mean").set_index(
        "item_id")
    assert mean.loc["i2", "edit_success"] == 3  # mean of 1, 4, 5 = 3.33 -> 3 (median 4)
    assert mean.loc["i0", "edit_success"] == 2


def lightening_study(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Items where people see lightening on half of them; the judge misses it on Black
    sources 60% of the time and on White sources never."""
    rng = np.random.default_rng(seed)
    ratings, items, verdicts = [], [], []
    for race, i in product(("Black", "White"), range(40)):
        name = f"{race}-{i}"
        items.append(item(name, race=race))
        lightened = i % 2 == 0
        truth = 5 if lightened else 3
        for rater in "abc":
            ratings.append(rating(rater, name, skin_tone=truth, edit_success=4))
        judge = truth
        if lightened and race == "Black" and rng.random() < 0.6:
            judge = 3
        verdicts.append({"request_id": f"req-{name}", "edit_success": 4.0,
                         "skin_tone": float(judge), "race_change": None,
                         "gender_change": None, "age_change": None})
    return pd.DataFrame(ratings), pd.DataFrame(items), pd.DataFrame(verdicts)


def test_judge_misses_lightening_more_on_darker_skin() -> None:
    ratings, items, verdicts = lightening_study()
    units = judge_human_units(ratings, items, verdicts)
    table = judge_misses(units, OutcomeRule(axis="skin_tone", at_least=4), "judge_lightening",
                         "race")
    assert list(table.columns) == list(MISS_COLUMNS)
    by_group = table.set_index("group")
    assert by_group.loc["White", "judge_missed"] == 0
    assert by_group.loc["Black", "human_positive"] == 20
    assert by_group.loc["Black", "miss_rate"] > 0.3
    assert by_group.loc["Black", "mean_difference"] < 0  # judge reads darker than people
    assert by_group.loc["Black", "p_value"] < 0.01
    assert set(table["group"]) == {"all", "Black", "White"}


def test_judge_human_agreement_per_group() -> None:
    ratings, items, verdicts = lightening_study()
    units = judge_human_units(ratings, items, verdicts)
    table = judge_human_agreement(units, axes=("skin_tone",))
    assert list(table.columns) == list(JUDGE_HUMAN_COLUMNS)
    rows = table.set_index(["dimension", "group"])
    assert rows.loc[("race", "White"), "weighted_kappa"] == pytest.approx(1.0)
    assert rows.loc[("race", "White"), "mean_difference"] == 0
    assert rows.loc[("race", "Black"), "weighted_kappa"] < 0.9
    assert rows.loc[("race", "Black"), "ci_high"] < 0
    assert rows.loc[("all", "all"), "n"] == 80
    assert rows.loc[("race", "Black"), "spearman"] > 0


def test_feature_output_joins_its_own_verdict() -> None:
    ratings = pd.DataFrame([rating("a", "i0", "edited", skin_tone=3),
                            rating("b", "i0", "edited", skin_tone=3),
                            rating("a", "i0", "feature", skin_tone=5),
                            rating("b", "i0", "feature", skin_tone=5)])
    items = pd.DataFrame([item("i0")])
    verdicts = pd.DataFrame([{"request_id": "req-i0", "skin_tone": 3.0},
                             {"request_id": "feat-i0", "skin_tone": 4.0}])
    units = judge_human_units(ratings, items, verdicts, axes=("skin_tone",)).set_index(
        "output")
    assert units.loc["edited", "judge_skin_tone"] == 3
    assert units.loc["feature", "judge_skin_tone"] == 4
    assert units.loc["feature", "human_skin_tone"] == 5


def test_arm_tests_see_a_shift_between_outputs() -> None:
    rows = []
    for i, rater in product(range(25), "abc"):
        rows.append(rating(rater, f"i{i}", "edited", edit_success=2, skin_tone=3))
        rows.append(rating(rater, f"i{i}", "feature", edit_success=4 if i % 5 else 2,
                           skin_tone=3))
    table = arm_tests(pd.DataFrame(rows), axes=("edit_success", "skin_tone"))
    by_axis = table.set_index("axis")
    assert by_axis.loc["edit_success", "n"] == 25  # one per item, not per rating
    assert by_axis.loc["edit_success", "p_adjusted"] < 0.001
    assert by_axis.loc["edit_success", "statistic"] == 2
    assert math.isnan(by_axis.loc["skin_tone", "p_value"])
    per_rating = arm_tests(pd.DataFrame(rows), axes=("edit_success",), unit="rating")
    assert per_rating["n"].iloc[0] == 75


def test_group_tests_kruskal_and_mann_whitney() -> None:
    rows, items = [], []
    for race, i in product(RACES, range(8)):
        name = f"{race}-{i}"
        items.append(item(name, race=race))
        shift = 2 if race == "Black" else 0
        for rater in "ab":
            rows.append(rating(rater, name, skin_tone=min(5, 1 + i % 3 + shift)))
    table = group_tests(pd.DataFrame(rows), pd.DataFrame(items), axes=("skin_tone",),
                        pair=("Black", "White"))
    by_test = table.set_index("test")
    assert by_test.loc["Kruskal-Wallis", "n"] == 56
    assert by_test.loc["Kruskal-Wallis", "p_value"] < 0.01
    assert by_test.loc["Mann-Whitney U", "p_value"] < 0.01
    assert by_test.loc["Mann-Whitney U", "groups"] == "Black vs White"
    same = group_tests(pd.DataFrame(rows), pd.DataFrame(items), axes=("skin_tone",),
                       pair=("White", "Indian"))
    assert same.set_index("test").loc["Mann-Whitney U", "p_value"] > 0.5
    with pytest.raises(InputDataError, match="pair"):
        group_tests(pd.DataFrame(rows), pd.DataFrame(items), pair=("Black", "Nobody"))


def test_white_against_every_other_race_pooled_is_scipys_mann_whitney() -> None:
    """The study's test on people's skin tone: White sources against all others pooled, the
    same U and p as scipy on the consensus scores (one per item)."""
    from scipy import stats

    rows, items = [], []
    for race, i in product(RACES, range(6)):
        name = f"{race}-{i}"
        items.append(item(name, race=race))
        score = 3 + (i % 2) if race == "White" else 3 + (i % 3)
        for rater in "ab":
            rows.append(rating(rater, name, skin_tone=min(5, score)))
    table = group_tests(pd.DataFrame(rows), pd.DataFrame(items), axes=("skin_tone",),
                        rest_of="White")
    row = table[table["test"] == "Mann-Whitney U"].iloc[0]
    white = [3 + (i % 2) for i in range(6)]
    other = [3 + (i % 3) for race in RACES if race != "White" for i in range(6)]
    expected = stats.mannwhitneyu(white, other, alternative="two-sided")
    assert row["groups"] == "White vs non-White" and row["n"] == 42
    assert row["statistic"] == pytest.approx(expected.statistic)
    assert row["p_value"] == pytest.approx(expected.pvalue)
    with pytest.raises(InputDataError, match="Nobody"):
        group_tests(pd.DataFrame(rows), pd.DataFrame(items), rest_of="Nobody")


def test_group_means_by_race_and_the_paired_change() -> None:
    from acrb.analysis.agreement.raters import ARM_DIFFERENCE, human_group_means

    rows, items = [], []
    for race, i in product(("Black", "White"), range(4)):
        name = f"{race}-{i}"
        items.append(item(name, race=race))
        edited = 4 if race == "Black" else 3
        for rater in "abc":
            rows.append(rating(rater, name, "edited", skin_tone=edited, race_change=1))
            if i < 2:  # two items of each race rated on both outputs
                rows.append(rating(rater, name, "feature", skin_tone=3, race_change=1))
    means = human_group_means(pd.DataFrame(rows), pd.DataFrame(items),
                              axes=("skin_tone", "race_change")).set_index(
                                  ["output", "group", "axis"])
    assert means.loc[("edited", "Black", "skin_tone"), "mean"] == 4
    assert means.loc[("edited", "all", "skin_tone"), "mean"] == 3.5
    assert means.loc[("edited", "all", "skin_tone"), "n"] == 8
    assert means.loc[(ARM_DIFFERENCE, "Black", "skin_tone"), "mean"] == -1
    assert means.loc[(ARM_DIFFERENCE, "White", "skin_tone"), "mean"] == 0
    assert means.loc[(ARM_DIFFERENCE, "all", "skin_tone"), "n"] == 4
    assert means.loc[(ARM_DIFFERENCE, "Black", "race_change"), "mean"] == 0
    assert means.loc[("edited", "Indian", "skin_tone"), "n"] == 0


@pytest.mark.parametrize("equal", [True, False])
def test_bootstrap_replicates_equal_the_statistics_on_copied_tables(equal: bool) -> None:
    # The bootstrap computes every replicate from unit weights in one product; each must equal
    # the statistic on the replicate's table built by copying units (the krippendorff package
    # and statsmodels / the unequal-count kappa), including units with one rating.
    from acrb.analysis.agreement.raters import (
        _alpha,
        _fleiss,
        replicate_alpha,
        replicate_fleiss,
    )

    rng = np.random.default_rng(7)
    units = 40
    sizes = np.full(units, 3) if equal else rng.integers(1, 7, size=units)
    counts = np.zeros((units, 5), dtype=np.int64)
    for row, size in enumerate(sizes):
        centre = rng.integers(1, 6)
        answers = np.clip(centre + rng.integers(-1, 2, size=size), 1, 5)
        np.add.at(counts[row], answers - 1, 1)
    weights = rng.multinomial(units, np.full(units, 1 / units), size=60)
    weights[0] = 0
    weights[0, :2] = 1  # a tiny replicate
    copies = [np.repeat(np.arange(units), w) for w in weights]
    for level in ("interval", "ordinal"):
        expected = [_alpha(counts[rows], level) for rows in copies]
        assert replicate_alpha(counts, weights, level) == pytest.approx(
            expected, rel=1e-9, abs=1e-12, nan_ok=True)
    assert equal or (counts.sum(axis=1) == 1).any()  # singletons, which kappa leaves out
    expected = [_fleiss(counts[rows]) for rows in copies]
    assert replicate_fleiss(counts, weights) == pytest.approx(
        expected, rel=1e-9, abs=1e-12, nan_ok=True)
