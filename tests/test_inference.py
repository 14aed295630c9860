"""Hypothesis tests (contingency, GEE, judge scores, equivalence, power, multiplicity) against
reference libraries and known answers."""

from __future__ import annotations

import math
import warnings
from itertools import product

import numpy as np
import pandas as pd
import pytest
import scikit_posthocs
import statsmodels.api as sm
from scipy import stats
from statsmodels.genmod.generalized_estimating_equations import OrdinalGEE
from statsmodels.miscmodels.ordinal_model import OrderedModel
from statsmodels.stats.contingency_tables import StratifiedTable
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_effectsize, tost_proportions_2indep
from statsmodels.tools.sm_exceptions import ConvergenceWarning

from acrb.analysis.agreement.judge_scores import kruskal_dunn, ordinal_model
from acrb.analysis.estimation.power import design_effect, minimum_detectable_gap
from acrb.analysis.tests.contingency import (
    CATEGORY_TEST_COLUMNS,
    category_tests,
    cmh_test,
    generalized_cmh,
    homogeneity_test,
)
from acrb.analysis.tests.equivalence import tost_delta
from acrb.analysis.tests.gee import gee_group_test, model_interaction_test
from acrb.analysis.tests.pvalues import adjust
from acrb.errors import InputDataError

# ---------------------------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------------------------


def clustered_frame(
    *,
    races: tuple[str, ...] = ("Black", "White"),
    genders: tuple[str, ...] = ("Female", "Male"),
    ages: tuple[str, ...] = ("20s",),
    sources_per_cell: int = 3,
    categories: str = "ABC",
    prompts_per_category: int = 4,
    seeds: int = 2,
    base: float = -1.5,
    effects: dict[str, float] | None = None,
    source_sd: float = 0.3,
    rng_seed: int = 0,
    model: str | None = None,
) -> pd.DataFrame:
    """A clustered analysis frame: sources x prompts x seeds, one row per request.

    logit P(refusal) = base + effects[race | gender | age] + source effect (sd ``source_sd``);
    erasure is drawn for non-refused requests with the same linear predictor + 0.5; judge
    scores 1-5 rise with the linear predictor, with about 5 % missing.
    """
    rng = np.random.default_rng(rng_seed)
    effects = effects or {}
    sources = [
        (f"s{i:03d}", race, gender, age)
        for i, (race, gender, age, _) in enumerate(
            product(races, genders, ages, range(sources_per_cell))
        )
    ]
    prompts = [
        (f"p{c}{j}", c) for c in categories for j in range(prompts_per_category)
    ]
    records = []
    for source_id, race, gender, age in sources:
        shift = rng.normal(0.0, source_sd) + sum(effects.get(v, 0.0) for v in (race, gender, age))
        for prompt_id, category in prompts:
            for seed in range(seeds):
                records.append((source_id, prompt_id, category, seed, race, gender, age, shift))
    frame = pd.DataFrame(
        records,
        columns=["source_id", "prompt_id", "category", "seed", "race", "gender", "age", "lin"],
    )
    lin = base + frame.pop("lin").to_numpy()
    refused = rng.random(len(frame)) < 1.0 / (1.0 + np.exp(-lin))
    erased = rng.random(len(frame)) < 1.0 / (1.0 + np.exp(-(lin + 0.5)))
    score = np.clip(np.round(3.0 + lin + rng.normal(0.0, 1.0, len(frame))), 1, 5)
    frame.insert(0, "request_id", [f"r{i}" for i in range(len(frame))])
    frame["congruence"] = "neutral"
    frame["status"] = np.where(refused, "refused", "ok")
    frame["hard_refusal"] = pd.array(refused, dtype="boolean")
    erasure = pd.array(erased, dtype="boolean")
    erasure[refused] = pd.NA
    frame["erasure"] = erasure
    frame["lightening"] = erasure.copy()
    judge = pd.array(score.astype(np.int64), dtype="Int64")
    judge[rng.random(len(frame)) < 0.05] = pd.NA
    frame["judge_score"] = judge
    if model is not None:
        frame["model"] = model
    return frame


def table_frame(counts: dict[tuple[str, str], tuple[int, int]], dimension: str = "race"):
    """Requests from (category, group) -> (n, refused); one source per group and category."""
    defaults = {"race": "Black", "gender": "Female", "age": "20s"}
    pieces = []
    for (category, group), (n, k) in counts.items():
        values = {**defaults, dimension: group}
        pieces.append(
            pd.DataFrame(
                {
                    "request_id": [f"{category}-{group}-{i}" for i in range(n)],
                    "source_id": f"{group}",
                    "prompt_id": f"{category}0",
                    "category": category,
                    "seed": 0,
                    **values,
                    "status": ["refused" if i < k else "ok" for i in range(n)],
                    "hard_refusal": pd.array([i < k for i in range(n)], dtype="boolean"),
                }
            )
        )
    return pd.concat(pieces, ignore_index=True)


@pytest.fixture(autouse=True)
def no_leaked_warnings():
    """Every statsmodels / numpy warning must be handled inside the module."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        yield


# ---------------------------------------------------------------------------------------------
# adjust
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["holm", "fdr_bh"])
def test_adjust_matches_statsmodels_and_keeps_nan(method: str) -> None:
    p = np.array([0.01, np.nan, 0.04, 0.03, 0.5])
    adjusted = adjust(p, method)
    finite = np.isfinite(p)
    np.testing.assert_allclose(adjusted[finite], multipletests(p[finite], method=method)[1])
    assert np.isnan(adjusted[1])
    assert np.all(np.isnan(adjust([np.nan, np.nan], method)))
    assert adjust([], method).shape == (0,)


def test_adjust_rejects_unknown_method_and_bad_p() -> None:
    with pytest.raises(ValueError, match="unknown adjustment"):
        adjust([0.1], "bonferroni")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        adjust([1.5], "holm")


# ---------------------------------------------------------------------------------------------
# category_tests
# ---------------------------------------------------------------------------------------------


def test_category_tests_chi2_fisher_permutation_and_degenerate() -> None:
    frame = table_frame(
        {
            # A: large counts, chi-square
            ("A", "Black"): (200, 40), ("A", "White"): (200, 20), ("A", "Indian"): (200, 30),
            # B: two groups with small expected counts, Fisher
            ("B", "Black"): (12, 4), ("B", "White"): (12, 0),
            # C: three groups with small expected counts, permutation
            ("C", "Black"): (10, 3), ("C", "White"): (10, 0), ("C", "Indian"): (10, 1),
            # D: none refused, degenerate
            ("D", "Black"): (20, 0), ("D", "White"): (20, 0),
        }
    )
    result = category_tests(frame, "hard_refusal", "race", permutations=2000).set_index(
        "category"
    )
    a = stats.chi2_contingency(np.array([[40, 160], [30, 170], [20, 180]]), correction=False)
    assert result.loc["A", "method"] == "chi2"
    assert result.loc["A", "statistic"] == pytest.approx(a.statistic)
    assert result.loc["A", "p_value"] == pytest.approx(a.pvalue)
    assert result.loc["A", "df"] == 2 and result.loc["A", "n"] == 600
    assert result.loc["B", "method"] == "fisher"
    assert result.loc["B", "p_value"] == pytest.approx(
        stats.fisher_exact([[4, 8], [0, 12]]).pvalue
    )
    assert result.loc["C", "method"] == "permutation"
    expected_c, _ = homogeneity_test([3, 1, 0], [10, 10, 10], permutations=2000)
    assert result.loc["C", "p_value"] == pytest.approx(expected_c)
    assert result.loc["D", "method"] == "degenerate"
    assert result.loc["D", "p_value"] == 1.0 and math.isnan(result.loc["D", "statistic"])
    np.testing.assert_allclose(
        result["p_adjusted"], multipletests(result["p_value"], method="holm")[1]
    )
    assert list(result.columns) == [c for c in CATEGORY_TEST_COLUMNS if c != "category"]


def test_category_tests_skip_unusable_rows_and_absent_groups() -> None:
    frame = table_frame({("A", "Black"): (100, 30), ("A", "White"): (100, 10)})
    extra = table_frame({("A", "Indian"): (50, 50)})
    extra["status"] = "error"
    missing = table_frame({("A", "Latino"): (50, 50)})
    missing["status"] = "missing"
    all_refused = table_frame({("B", "Black"): (10, 10), ("B", "White"): (10, 10)})
    result = category_tests(
        pd.concat([frame, extra, missing, all_refused], ignore_index=True), "hard_refusal", "race"
    ).set_index("category")
    assert result.loc["A", "n_groups"] == 2 and result.loc["A", "n"] == 200
    assert result.loc["B", "method"] == "degenerate" and result.loc["B", "p_value"] == 1.0


def test_single_model_functions_refuse_pooled_models() -> None:
    frame = pd.concat(
        [clustered_frame(model="m1", sources_per_cell=2), clustered_frame(model="m2")],
        ignore_index=True,
    )
    with pytest.raises(ValueError, match="several models"):
        category_tests(frame, "hard_refusal", "race")
    with pytest.raises(ValueError, match="unknown dimension"):
        cmh_test(frame[frame["model"] == "m1"], "hard_refusal", "hair")


# ---------------------------------------------------------------------------------------------
# CMH
# ---------------------------------------------------------------------------------------------


def test_generalized_cmh_matches_agresti_job_satisfaction() -> None:
    """Agresti (2002) Table 7.8: income x job satisfaction by gender. R's
    ``mantelhaen.test(Satisfaction)`` (its help page example) gives M² = 10.2001, df = 9,
    p = 0.3345, the general association statistic of Agresti's Table 7.12."""
    female = [[1, 3, 11, 2], [2, 3, 17, 3], [0, 1, 8, 5], [0, 2, 4, 2]]
    male = [[1, 1, 2, 1], [0, 3, 5, 1], [0, 0, 7, 3], [0, 1, 9, 6]]
    statistic, df = generalized_cmh(np.array([female, male]))
    assert statistic == pytest.approx(10.2001, abs=5e-4)
    assert df == 9
    assert stats.chi2.sf(statistic, df) == pytest.approx(0.3345, abs=5e-5)


@pytest.mark.parametrize(
    "table", [[[10, 20], [15, 5], [8, 12]], [[5, 7, 9], [12, 3, 6], [4, 4, 10], [2, 9, 1]]]
)
def test_generalized_cmh_one_stratum_is_scaled_pearson(table: list[list[int]]) -> None:
    table_array = np.array(table)
    n = table_array.sum()
    pearson = stats.chi2_contingency(table_array, correction=False)
    statistic, df = generalized_cmh(table_array[None])
    assert statistic == pytest.approx((n - 1) / n * pearson.statistic)
    assert df == pearson.dof


def test_generalized_cmh_two_by_two_equals_statsmodels_and_ignores_row_order() -> None:
    rng = np.random.default_rng(3)
    tables = rng.integers(1, 30, size=(5, 2, 2))
    reference = StratifiedTable(np.transpose(tables, (1, 2, 0))).test_null_odds(correction=False)
    statistic, df = generalized_cmh(tables)
    assert statistic == pytest.approx(reference.statistic) and df == 1
    tables = rng.integers(0, 20, size=(4, 4, 2))
    tables[1, 2] = 0  # a group absent from one stratum
    assert generalized_cmh(tables)[0] == pytest.approx(generalized_cmh(tables[:, ::-1])[0])


def test_generalized_cmh_null_distribution_is_chi_square() -> None:
    rng = np.random.default_rng(11)
    rates = np.array([0.1, 0.2, 0.3, 0.15])  # strata differ, groups do not
    sizes = np.array([[30, 50, 40], [20, 20, 60], [40, 30, 30], [25, 35, 45]])
    p_values = []
    for _ in range(1500):
        true = rng.binomial(sizes, rates[:, None])
        tables = np.stack([true, sizes - true], axis=2)
        statistic, df = generalized_cmh(tables)
        p_values.append(stats.chi2.sf(statistic, df))
    assert np.mean(np.array(p_values) < 0.05) == pytest.approx(0.05, abs=0.015)


def test_cmh_two_groups_uses_statsmodels_and_orients_odds_ratio() -> None:
    frame = clustered_frame(
        races=("Black",), genders=("Female", "Male"), effects={"Male": 0.8}, rng_seed=5
    )
    result = cmh_test(frame, "hard_refusal", "gender")
    usable = frame.loc[frame["hard_refusal"].notna()]
    tables = []
    for category in "ABC":
        block = usable.loc[usable["category"] == category]
        tables.append(pd.crosstab(block["gender"], ~block["hard_refusal"].astype(bool)).to_numpy())
    reference = StratifiedTable(np.stack(tables, axis=2))
    expected = reference.test_null_odds(correction=False)
    assert result.method.startswith("cmh") and result.df == 1 and result.n_strata == 3
    assert result.statistic == pytest.approx(expected.statistic)
    assert result.p_value == pytest.approx(expected.pvalue)
    assert result.odds_ratio == pytest.approx(1.0 / reference.oddsratio_pooled)
    assert result.odds_ratio > 1.0  # Male (second group) refused more
    assert result.statistic == pytest.approx(generalized_cmh(np.stack(tables))[0])


def test_cmh_more_groups_and_degenerate_cases() -> None:
    frame = clustered_frame(races=("Black", "Indian", "White"), genders=("Female",), rng_seed=2)
    result = cmh_test(frame, "hard_refusal", "race")
    assert result.method.startswith("generalized") and result.df == 2 and result.n_groups == 3
    assert 0.0 <= result.p_value <= 1.0
    none_refused = frame.assign(hard_refusal=pd.array([False] * len(frame), dtype="boolean"))
    degenerate = cmh_test(none_refused, "hard_refusal", "race")
    assert degenerate.p_value == 1.0 and degenerate.reason
    one_group = cmh_test(frame, "hard_refusal", "gender")
    assert one_group.p_value == 1.0 and "two groups" in one_group.reason
    nothing = cmh_test(frame.assign(status="error"), "hard_refusal", "race")
    assert math.isnan(nothing.p_value) and nothing.n == 0


def test_cmh_one_stratum_is_scaled_pearson_on_a_frame() -> None:
    frame = table_frame(
        {("A", "Black"): (50, 10), ("A", "White"): (60, 25), ("A", "Indian"): (40, 8)}
    )
    result = cmh_test(frame, "hard_refusal", "race")
    pearson = stats.chi2_contingency(
        np.array([[10, 40], [8, 32], [25, 35]]), correction=False
    ).statistic
    assert result.statistic == pytest.approx(149 / 150 * pearson)


# ---------------------------------------------------------------------------------------------
# GEE
# ---------------------------------------------------------------------------------------------


def _formula_gee(frame: pd.DataFrame, formula: str, dimension: str) -> sm.GEE:
    data = frame.loc[frame["hard_refusal"].notna()].copy()
    data["y"] = data["hard_refusal"].astype(float)
    data["group"] = data[dimension]
    return sm.GEE.from_formula(
        formula,
        groups="source_id",
        data=data,
        family=sm.families.Binomial(),
        cov_struct=sm.cov_struct.Exchangeable(),
    )


def test_gee_score_tests_match_statsmodels_formula_models() -> None:
    frame = clustered_frame(effects={"White": 0.7}, sources_per_cell=4, rng_seed=1)
    result = gee_group_test(frame, "hard_refusal", "race")
    null = _formula_gee(frame, "y ~ C(category)", "race").fit()
    additive = _formula_gee(frame, "y ~ C(group) + C(category)", "race")
    full = _formula_gee(frame, "y ~ C(group) * C(category)", "race")
    main = additive.compare_score_test(null)
    omnibus = full.compare_score_test(null)
    interaction = full.compare_score_test(additive.fit())
    assert result.main_statistic == pytest.approx(main["statistic"], rel=1e-5)
    assert result.main_df == 1 and result.main_p_value == pytest.approx(main["p-value"], rel=1e-4)
    assert result.statistic == pytest.approx(omnibus["statistic"], rel=1e-5)
    assert result.df == 1 + 2
    assert result.interaction_statistic == pytest.approx(interaction["statistic"], rel=1e-5)
    assert result.interaction_df == 2
    assert result.n_clusters == 16 and result.reference == "Black"
    odds = result.odds_ratios.set_index("group")
    assert list(odds.index) == ["White"]
    assert odds.loc["White", "ci_low"] < odds.loc["White", "odds_ratio"] < odds.loc[
        "White", "ci_high"
    ]
    fitted = additive.fit(cov_type="bias_reduced")
    assert odds.loc["White", "odds_ratio"] == pytest.approx(
        math.exp(fitted.params["C(group)[T.White]"]), rel=1e-5
    )


def test_gee_wald_option_matches_statsmodels_wald_test() -> None:
    frame = clustered_frame(effects={"Male": 0.5}, sources_per_cell=4, rng_seed=4)
    result = gee_group_test(frame, "hard_refusal", "gender", test="wald", cov_type="robust")
    fitted = _formula_gee(frame, "y ~ C(group) * C(category)", "gender").fit(cov_type="robust")
    terms = fitted.wald_test_terms(scalar=True).table
    joint = fitted.wald_test(
        [n for n in fitted.model.exog_names if n.startswith("C(group)")], scalar=True
    )
    assert result.statistic == pytest.approx(float(joint.statistic), rel=1e-5)
    assert result.interaction_statistic == pytest.approx(
        float(terms.loc["C(group):C(category)", "statistic"]), rel=1e-5
    )
    assert result.df == 3 and result.interaction_df == 2
    assert result.method.endswith("Wald tests (robust sandwich)")


def test_gee_detects_a_planted_effect_and_not_an_absent_one() -> None:
    planted = clustered_frame(
        effects={"Male": 1.0}, sources_per_cell=8, races=("Black",), rng_seed=7
    )
    result = gee_group_test(planted, "hard_refusal", "gender", reference="Female")
    assert result.main_p_value < 0.01 and result.p_value < 0.05
    odds = result.odds_ratios.set_index("group").loc["Male"]
    assert odds["ci_low"] > 1.0
    null = clustered_frame(sources_per_cell=8, races=("Black",), rng_seed=8)
    assert gee_group_test(null, "hard_refusal", "gender").main_p_value > 0.05


def test_gee_edge_cases_return_nan_with_reason() -> None:
    frame = clustered_frame(rng_seed=9)
    none_refused = frame.assign(hard_refusal=pd.array([False] * len(frame), dtype="boolean"))
    result = gee_group_test(none_refused, "hard_refusal", "race")
    assert math.isnan(result.p_value) and "constant" in result.reason
    all_refused = frame.assign(hard_refusal=pd.array([True] * len(frame), dtype="boolean"))
    assert math.isnan(gee_group_test(all_refused, "hard_refusal", "race").p_value)
    one_group = gee_group_test(frame, "hard_refusal", "age")
    assert math.isnan(one_group.p_value) and "two groups" in one_group.reason
    thin = clustered_frame(sources_per_cell=1, genders=("Female",), rng_seed=9)
    result = gee_group_test(thin, "hard_refusal", "race")
    assert math.isnan(result.p_value) and "fewer than two sources" in result.reason
    errored = gee_group_test(frame.assign(status="error"), "hard_refusal", "race")
    assert errored.n == 0 and errored.reason == "no observations"


def test_gee_group_without_usable_requests_takes_no_part() -> None:
    frame = clustered_frame(races=("Black", "Indian", "White"), genders=("Female",), rng_seed=15)
    frame.loc[frame["race"] == "Indian", "status"] = "error"
    result = gee_group_test(frame, "hard_refusal", "race")
    assert result.n_clusters == 6 and result.main_df == 1
    assert list(result.odds_ratios["group"]) == ["White"]


def test_gee_convergence_warning_becomes_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    original = sm.GEE.fit

    def fit(self, *args, **kwargs):
        warnings.warn("iteration limit reached", ConvergenceWarning, stacklevel=2)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(sm.GEE, "fit", fit)
    result = gee_group_test(clustered_frame(rng_seed=16), "hard_refusal", "race")
    assert math.isnan(result.p_value) and "did not converge" in result.reason
    assert math.isnan(result.main_p_value) and result.odds_ratios.empty


def test_gee_separation_keeps_score_tests_and_flags_wald() -> None:
    frame = clustered_frame(sources_per_cell=4, rng_seed=10, base=-0.5)
    white = frame["race"] == "White"
    frame.loc[white, "hard_refusal"] = False  # White is never refused: separation
    frame.loc[white, "status"] = "ok"
    result = gee_group_test(frame, "hard_refusal", "race")
    assert result.p_value < 0.01 and result.main_p_value < 0.01  # score tests under the null
    assert math.isnan(result.interaction_p_value) and "separation" in result.interaction_reason
    assert result.odds_ratios["odds_ratio"].isna().all() or result.odds_ratios.empty
    assert any("odds ratios" in note for note in result.notes)
    wald = gee_group_test(frame, "hard_refusal", "race", test="wald")
    assert math.isnan(wald.p_value) and "separation" in wald.reason
    assert math.isnan(wald.main_p_value)


def test_gee_one_category_and_constant_category() -> None:
    frame = clustered_frame(categories="A", sources_per_cell=4, effects={"Male": 0.8}, rng_seed=12)
    result = gee_group_test(frame, "hard_refusal", "gender")
    assert result.p_value == result.main_p_value and result.df == 1
    assert math.isnan(result.interaction_p_value) and "one category" in result.interaction_reason
    frame = clustered_frame(categories="AB", sources_per_cell=4, rng_seed=13)
    in_b = frame["category"] == "B"
    frame.loc[in_b, "hard_refusal"] = False
    result = gee_group_test(frame, "hard_refusal", "race")
    assert any("constant outcome left out" in note for note in result.notes)
    assert result.df == 1 and not math.isnan(result.p_value)


def test_gee_empty_cell_drops_interaction_column() -> None:
    frame = clustered_frame(
        races=("Black", "White", "Indian"), genders=("Female",), sources_per_cell=3, rng_seed=14
    )
    frame = frame.loc[~((frame["race"] == "Indian") & (frame["category"] == "C"))]
    result = gee_group_test(frame, "hard_refusal", "race")
    assert result.df == 2 + 4 - 1 and result.interaction_df == 3
    assert any("empty-cell" in note for note in result.notes)


def test_model_interaction_test_detects_a_model_specific_gap() -> None:
    same = dict(races=("Black",), sources_per_cell=8, source_sd=0.3)
    fair = clustered_frame(**same, rng_seed=20, model="fair")
    biased = clustered_frame(**same, rng_seed=20, model="biased", effects={"Male": 1.2})
    biased["request_id"] += "-b"
    result = model_interaction_test(pd.concat([fair, biased]), "hard_refusal", "gender")
    assert result.df == 1 and result.n_models == 2 and result.n_clusters == 16
    assert result.p_value < 0.01
    twin = clustered_frame(**same, rng_seed=21, model="twin")
    null = model_interaction_test(pd.concat([fair, twin]), "hard_refusal", "gender")
    assert null.p_value > 0.05
    data = pd.concat([fair, biased]).reset_index(drop=True)
    data["y"] = data["hard_refusal"].astype(float)
    kwargs = dict(
        groups="source_id", data=data, family=sm.families.Binomial(),
        cov_struct=sm.cov_struct.Exchangeable(),
    )
    sub = sm.GEE.from_formula("y ~ C(model) + C(gender) + C(category)", **kwargs).fit()
    full = sm.GEE.from_formula("y ~ C(model) * C(gender) + C(category)", **kwargs)
    assert result.statistic == pytest.approx(full.compare_score_test(sub)["statistic"], rel=1e-5)
    wald = model_interaction_test(pd.concat([fair, biased]), "hard_refusal", "gender", test="wald")
    assert wald.df == 1 and wald.p_value < 0.01


def test_model_interaction_test_guards() -> None:
    frame = clustered_frame(model="only")
    result = model_interaction_test(frame, "hard_refusal", "race")
    assert math.isnan(result.p_value) and result.reason == "fewer than two models"
    with pytest.raises(InputDataError):
        model_interaction_test(frame.drop(columns="model"), "hard_refusal", "race")
    with pytest.raises(ValueError, match="unknown test"):
        model_interaction_test(frame, "hard_refusal", "race", test="lr")


# ---------------------------------------------------------------------------------------------
# Judge scores
# ---------------------------------------------------------------------------------------------


def test_kruskal_dunn_matches_scipy_and_scikit_posthocs() -> None:
    frame = clustered_frame(
        races=("Black", "Indian", "White"), effects={"White": 0.8}, rng_seed=30
    )
    frame.loc[frame.index[:7], "judge_score"] = pd.NA
    result = kruskal_dunn(frame, "judge_score", "race", unit="request")
    scored = frame.loc[frame["judge_score"].notna()]
    samples = [scored.loc[scored["race"] == r, "judge_score"].astype(float) for r in
               ("Black", "Indian", "White")]
    expected = stats.kruskal(*samples)
    assert result.statistic == pytest.approx(expected.statistic)
    assert result.p_value == pytest.approx(expected.pvalue)
    assert result.df == 2 and result.n == len(scored)
    assert result.n_missing == frame["judge_score"].isna().sum() >= 7
    dunn = scikit_posthocs.posthoc_dunn(
        scored.assign(judge_score=scored["judge_score"].astype(float)),
        val_col="judge_score", group_col="race", p_adjust="holm",
    )
    pd.testing.assert_frame_equal(
        result.posthoc, dunn.loc[["Black", "Indian", "White"], ["Black", "Indian", "White"]],
        check_names=False,
    )
    by_source = kruskal_dunn(frame, "judge_score", "race")
    means = scored.assign(s=scored["judge_score"].astype(float)).groupby(
        ["race", "source_id"]
    )["s"].mean()
    assert by_source.n == 18
    assert by_source.statistic == pytest.approx(
        stats.kruskal(*[means.loc[r] for r in ("Black", "Indian", "White")]).statistic
    )


def test_kruskal_dunn_degenerate() -> None:
    frame = clustered_frame(rng_seed=31)
    constant = kruskal_dunn(frame.assign(judge_score=3), "judge_score", "race")
    assert math.isnan(constant.p_value) and "same" in constant.reason
    one = kruskal_dunn(frame, "judge_score", "age")
    assert math.isnan(one.p_value) and one.posthoc.empty
    missing = kruskal_dunn(frame.assign(judge_score=np.nan), "judge_score", "race")
    assert math.isnan(missing.p_value) and missing.n_missing == len(frame)


def test_ordinal_model_matches_statsmodels() -> None:
    frame = clustered_frame(effects={"White": 0.6}, sources_per_cell=4, rng_seed=32)
    scored = frame.loc[frame["judge_score"].notna()]
    endog = pd.Series(pd.Categorical(scored["judge_score"].astype(float), ordered=True))
    exog = pd.DataFrame({"White": (scored["race"] == "White").to_numpy(dtype=float)})
    clusters = pd.factorize(scored["source_id"])[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = OrderedModel(endog, exog, distr="logit").fit(method="bfgs", disp=False)
        null = OrderedModel(endog, None, distr="logit").fit(method="bfgs", disp=False)
        clustered = OrderedModel(endog, exog, distr="logit").fit(
            method="bfgs", disp=False, cov_type="cluster", cov_kwds={"groups": clusters}
        )
        y = scored["judge_score"].astype(float).to_numpy()
        gee_null = OrdinalGEE(
            y, np.zeros((len(y), 0)), groups=clusters, cov_struct=sm.cov_struct.Independence()
        ).fit()
        score = OrdinalGEE(
            y, exog, groups=clusters, cov_struct=sm.cov_struct.Independence()
        ).compare_score_test(gee_null)
    lr = ordinal_model(frame, "judge_score", "race", cluster=None)
    assert lr.statistic == pytest.approx(2 * (full.llf - null.llf), rel=1e-3)
    assert lr.df == 1 and lr.method.endswith("(independent requests)")
    wald = ordinal_model(frame, "judge_score", "race", test="wald")
    z = clustered.params["White"] / clustered.bse["White"]
    assert wald.statistic == pytest.approx(z**2, rel=1e-3)
    result = ordinal_model(frame, "judge_score", "race")
    assert "score" in result.method and result.df == 1
    assert result.statistic == pytest.approx(score["statistic"], rel=1e-6)
    assert result.p_value == pytest.approx(score["p-value"], rel=1e-6)
    odds = result.odds_ratios.set_index("group").loc["White"]
    assert odds["odds_ratio"] == pytest.approx(math.exp(clustered.params["White"]), rel=1e-3)
    assert odds["odds_ratio"] > 1.0 and result.n_missing == frame["judge_score"].isna().sum()
    assert result.n == len(scored) and result.reference == "Black"


def test_ordinal_model_unused_levels_separation_and_missing() -> None:
    frame = clustered_frame(rng_seed=33)
    frame["judge_score"] = frame["judge_score"].clip(2, 4)  # levels 1 and 5 unused
    result = ordinal_model(frame, "judge_score", "race")
    assert not math.isnan(result.p_value) and len(result.odds_ratios) == 1
    separated = frame.assign(
        judge_score=np.where(frame["race"] == "White", 5, 1).astype(float)
    )
    score = ordinal_model(separated, "judge_score", "race")
    assert score.p_value < 0.01 and score.odds_ratios.empty and score.notes
    for test in ("wald", "lr"):
        bad = ordinal_model(separated, "judge_score", "race", test=test)
        assert math.isnan(bad.p_value) and bad.reason
    one_level = ordinal_model(frame.assign(judge_score=3), "judge_score", "race")
    assert "score levels" in one_level.reason
    with pytest.raises(ValueError, match="unknown test"):
        ordinal_model(frame, "judge_score", "race", test="bootstrap")


# ---------------------------------------------------------------------------------------------
# Design effect and TOST
# ---------------------------------------------------------------------------------------------


def test_design_effect_matches_one_way_anova() -> None:
    frame = clustered_frame(
        races=("Black", "White", "Indian"), sources_per_cell=3, source_sd=1.0, rng_seed=40
    )
    result = design_effect(frame, "hard_refusal")
    y = frame["hard_refusal"].astype(float)
    groups = [y[frame["source_id"] == s].to_numpy() for s in frame["source_id"].unique()]
    f = stats.f_oneway(*groups).statistic
    m = len(frame) / len(groups)  # balanced: m0 = m
    assert result.icc == pytest.approx((f - 1) / (f + m - 1))
    assert result.deff == pytest.approx(1 + (m - 1) * result.icc)
    assert result.n_clusters == 18 and result.mean_cluster_size == m and result.deff > 1


def test_design_effect_nested_in_groups_and_floor() -> None:
    # No source clustering, a large group effect: the nested ICC ignores it.
    frame = clustered_frame(effects={"White": 2.5}, source_sd=0.0, sources_per_cell=5, rng_seed=41)
    assert design_effect(frame, "hard_refusal").icc > 0.05
    nested = design_effect(frame, "hard_refusal", "race")
    assert abs(nested.icc) < 0.02
    constant = frame.assign(hard_refusal=pd.array([False] * len(frame), dtype="boolean"))
    assert design_effect(constant, "hard_refusal").deff == 1.0
    # Sources less alike than chance: negative ICC, deff floored at 1.
    alternating = frame.assign(
        hard_refusal=pd.array(np.arange(len(frame)) % 2 == 0, dtype="boolean")
    )
    result = design_effect(alternating, "hard_refusal")
    assert result.icc < 0 and result.deff == 1.0


def test_tost_delta_two_groups_equals_statsmodels() -> None:
    frame = table_frame(
        {("A", "Female"): (2000, 200), ("A", "Male"): (2000, 210)}, dimension="gender"
    )
    result = tost_delta(frame, "hard_refusal", "gender", margin=0.03)
    expected = tost_proportions_2indep(200, 2000, 210, 2000, -0.03, 0.03, compare="diff")
    assert result.p_value == pytest.approx(expected.pvalue) and result.equivalent
    assert result.delta == pytest.approx(0.005) and result.max_group == "Male"
    deflated = tost_delta(frame, "hard_refusal", "gender", margin=0.03, deff=4.0)
    expected = tost_proportions_2indep(50, 500, 52.5, 500, -0.03, 0.03, compare="diff")
    assert deflated.p_value == pytest.approx(expected.pvalue) and deflated.deff == 4.0
    assert deflated.p_value > result.p_value


def test_tost_delta_is_intersection_union_over_pairs() -> None:
    frame = table_frame(
        {("A", "Black"): (3000, 300), ("A", "White"): (3000, 390), ("A", "Indian"): (3000, 330)}
    )
    result = tost_delta(frame, "hard_refusal", "race", margin=0.03)
    assert len(result.pairs) == 3
    assert result.p_value == pytest.approx(result.pairs["p_value"].max())
    assert not result.equivalent  # Black vs White differ by exactly the margin
    assert result.delta == pytest.approx(0.01 * 3)
    wide = tost_delta(frame, "hard_refusal", "race", margin=0.05)
    assert wide.equivalent and wide.p_value < 0.05
    small = table_frame({("A", "Black"): (50, 5), ("A", "White"): (50, 5)})
    assert not tost_delta(small, "hard_refusal", "race").equivalent


def test_tost_delta_estimates_deff_and_guards() -> None:
    frame = clustered_frame(source_sd=1.0, sources_per_cell=4, rng_seed=42)
    estimated = tost_delta(frame, "hard_refusal", "race", deff=None)
    assert estimated.deff == pytest.approx(design_effect(frame, "hard_refusal", "race").deff)
    with pytest.raises(ValueError, match="deff"):
        tost_delta(frame, "hard_refusal", "race", deff=0.5)
    one = tost_delta(frame, "hard_refusal", "age")
    assert math.isnan(one.p_value) and not one.equivalent and one.reason


# ---------------------------------------------------------------------------------------------
# Minimum detectable gap
# ---------------------------------------------------------------------------------------------


def test_minimum_detectable_gap_matches_statsmodels_by_hand() -> None:
    gap = minimum_detectable_gap(420, 1, 0.1, alpha=0.05, power=0.8, n_groups=2)
    h = NormalIndPower().solve_power(nobs1=420, alpha=0.05, power=0.8, ratio=1.0)
    p2 = math.sin(math.asin(math.sqrt(0.1)) + h / 2) ** 2
    assert gap == pytest.approx(p2 - 0.1)
    assert proportion_effectsize(0.1 + gap, 0.1) == pytest.approx(h)
    # Same effective n through sources x requests / deff.
    assert minimum_detectable_gap(42, 30, 0.1, deff=3.0) == pytest.approx(gap)
    assert minimum_detectable_gap(42, 30, 0.1, icc=2 / 29) == pytest.approx(gap)
    # Seven groups: Bonferroni over 21 pairs.
    h7 = NormalIndPower().solve_power(nobs1=420, alpha=0.05 / 21, power=0.8, ratio=1.0)
    assert minimum_detectable_gap(420, 1, 0.1, n_groups=7) == pytest.approx(
        math.sin(math.asin(math.sqrt(0.1)) + h7 / 2) ** 2 - 0.1
    )


def test_minimum_detectable_gap_monotone_and_guards() -> None:
    gaps_n = [minimum_detectable_gap(n, 150, 0.05, deff=5.0) for n in (6, 12, 42)]
    assert gaps_n[0] > gaps_n[1] > gaps_n[2] > 0
    gaps_deff = [minimum_detectable_gap(12, 150, 0.05, deff=d) for d in (1.0, 3.0, 9.0)]
    assert gaps_deff[0] < gaps_deff[1] < gaps_deff[2]
    assert minimum_detectable_gap(1, 2, 0.98) == math.inf
    with pytest.raises(ValueError):
        minimum_detectable_gap(12, 150, 0.05, deff=2.0, icc=0.1)
    with pytest.raises(ValueError):
        minimum_detectable_gap(12, 150, 0.05, deff=0.5)


def test_minimum_detectable_gap_monte_carlo_power() -> None:
    """A planted gap equal to the MDE is found by the arcsine test ~80 % of the time."""
    n, p1 = 420, 0.1
    gap = minimum_detectable_gap(n, 1, p1, alpha=0.05, power=0.8)
    rng = np.random.default_rng(2024)
    k1 = rng.binomial(n, p1, size=400)
    k2 = rng.binomial(n, p1 + gap, size=400)
    h = 2 * np.arcsin(np.sqrt(k2 / n)) - 2 * np.arcsin(np.sqrt(k1 / n))
    z = h / math.sqrt(2 / n)
    power = np.mean(2 * stats.norm.sf(np.abs(z)) < 0.05)
    assert power == pytest.approx(0.8, abs=0.07)
