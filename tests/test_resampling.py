"""Cluster bootstrap and source permutation test (acrb.analysis.estimation.resampling), and the SCS
(acrb.analysis.experiments.congruence)."""

from __future__ import annotations

import inspect
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit, logit
from statsmodels.stats.multitest import multipletests

from acrb.analysis.estimation.disparity import DISPARITY_COLUMNS, disparities
from acrb.analysis.estimation.rates import wilson_interval
from acrb.analysis.estimation.resampling import (
    LOWER_SHARE,
    Block,
    _test_statistic,
    bootstrap_rates,
    clustered_disparities,
    delta_bootstrap,
    delta_inversion,
    delta_permutation_p,
    group_test_p,
    prepare_block,
    rate_bootstrap,
    resolve_resample,
)
from acrb.analysis.experiments.congruence import scs, scs_rows
from acrb.analysis.outputs.section import build_model_section
from acrb.analysis.tests.contingency import homogeneity_test
from acrb.config import AnalyzeParams
from acrb.demographics import AGES, GENDERS, RACES
from acrb.errors import InputDataError

pytestmark = pytest.mark.filterwarnings("error")


def simulate(
    seed: int,
    *,
    races: Sequence[str] = RACES,
    genders: Sequence[str] = GENDERS,
    ages: Sequence[str] = AGES,
    per_cell: int = 1,
    categories: str = "A",
    prompts: int = 10,
    seeds: int = 3,
    base: float = 0.3,
    source_sd: float = 0.0,
    prompt_sd: float = 0.0,
    shift: dict[str, float] | None = None,
    erasure: float = 0.2,
) -> pd.DataFrame:
    """Analysis frame of a simulated audit: one row per source x prompt x seed.

    P(refusal) = expit(logit(base) + a_source + b_prompt + shift[race/gender/age]) with
    a ~ N(0, source_sd²), b ~ N(0, prompt_sd²); erasure is Bernoulli(erasure) on requests not
    refused and NA on refused ones.
    """
    rng = np.random.default_rng(seed)
    cells = list(itertools.product(races, genders, ages, range(per_cell)))
    source_ids = [f"syn-{r}-{g}-{a}-{i}" for r, g, a, i in cells]
    prompt_ids = [f"{c}{j:02d}" for c in categories for j in range(prompts)]
    s_count, p_count = len(source_ids), len(prompt_ids)
    source_effect = rng.normal(0.0, source_sd, s_count)
    prompt_effect = rng.normal(0.0, prompt_sd, p_count)
    shift = shift or {}
    group_effect = np.array([sum(shift.get(v, 0.0) for v in cell[:3]) for cell in cells])
    s_index = np.repeat(np.arange(s_count), p_count * seeds)
    p_index = np.tile(np.repeat(np.arange(p_count), seeds), s_count)
    seed_index = np.tile(np.arange(seeds), s_count * p_count)
    eta = logit(base) + source_effect[s_index] + prompt_effect[p_index] + group_effect[s_index]
    refused = rng.random(len(s_index)) < expit(eta)
    erased = pd.array(rng.random(len(s_index)) < erasure, dtype="boolean")
    erased[refused] = pd.NA
    source_table = np.array([cell[:3] for cell in cells], dtype=object)
    prompt_array = np.array(prompt_ids, dtype=object)
    category = np.array([p[0] for p in prompt_ids], dtype=object)[p_index]
    congruence = np.where(
        category == "A",
        "neutral",
        np.where((s_index + p_index) % 2 == 0, "congruent", "incongruent"),
    )
    return pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(len(s_index))],
            "source_id": np.array(source_ids, dtype=object)[s_index],
            "prompt_id": prompt_array[p_index],
            "seed": seed_index,
            "category": category,
            "congruence": congruence,
            "race": source_table[s_index, 0],
            "gender": source_table[s_index, 1],
            "age": source_table[s_index, 2],
            "status": "ok",
            "hard_refusal": pd.array(refused, dtype="boolean"),
            "erasure": erased,
            "lightening": erased.copy(),
        }
    )


def row(result: pd.DataFrame, category: str, dimension: str) -> pd.Series:
    match = result.loc[(result["category"] == category) & (result["dimension"] == dimension)]
    assert len(match) == 1
    return match.iloc[0]


def binomial_sd(block: Block) -> np.ndarray:
    p = block.rates
    return np.sqrt(p * (1 - p) / block.group_n)


# --- the block --------------------------------------------------------------------------------


def test_prepare_block_sums_seeds_and_skips_errors_missing_and_na() -> None:
    frame = simulate(
        1,
        races=("White", "Black"),
        genders=("Male",),
        ages=("20s", "30s"),
        prompts=3,
        seeds=2,
        base=0.3,
    )
    frame.loc[frame.index[:2], "status"] = "error"  # source 0, prompt 0
    frame.loc[frame.index[2:4], "status"] = "missing"  # source 0, prompt 1
    refusal = prepare_block(frame, "hard_refusal", "race")
    assert refusal.y.shape == refusal.n.shape == (4, 3)
    first = list(refusal.source_ids).index(frame["source_id"].iloc[0])
    assert refusal.n[first].tolist() == [0, 0, 2]
    assert np.delete(refusal.n, first, axis=0).min() == 2  # two seeds summed per cell
    block = prepare_block(frame, "erasure", "race")
    assert block.groups == ("Black", "White")  # vocabulary order, not order of appearance
    counted = frame.loc[frame["status"] == "ok"]
    observed = counted["erasure"].notna()
    assert block.n.sum() == observed.sum()
    assert block.y.sum() == counted["erasure"].fillna(False).sum()
    by_race = counted.assign(k=counted["erasure"].fillna(False), n=observed).groupby("race")
    assert block.group_k.tolist() == by_race["k"].sum()[["Black", "White"]].tolist()
    assert block.group_n.tolist() == by_race["n"].sum()[["Black", "White"]].tolist()
    assert set(block.covariates) == {"gender", "age"}
    assert [block.groups[g] for g in block.group_index] == [
        s.split("-")[1] for s in block.source_ids
    ]


def test_a_source_with_two_races_is_an_input_error() -> None:
    frame = simulate(2, races=("White",), genders=("Male",), ages=("20s",), prompts=2)
    frame.loc[frame.index[0], "race"] = "Black"
    with pytest.raises(InputDataError, match="more than one race"):
        prepare_block(frame, "hard_refusal", "race")


# --- bootstrap SDs ----------------------------------------------------------------------------


def test_without_clustering_source_bootstrap_is_binomial_and_two_way_is_owen() -> None:
    # No source or prompt effect: requests are independent, so the binomial SD is the truth.
    # Resampling sources reproduces it (up to the bootstrap's (1 − 1/S_g) factor). The two-way
    # product-weight bootstrap counts the request-level noise three times (Owen 2007):
    # variance ≈ binomial x ((1 − 1/S_g) + (1 − 1/P) + (1 − 1/S_g)(1 − 1/P)).
    sources, two_way, owen = [], [], []
    for seed in range(4):
        block = prepare_block(simulate(seed), "hard_refusal", "race")
        binomial = binomial_sd(block)
        one = delta_bootstrap(block, n_boot=2000, seed=seed, resample="sources")
        both = delta_bootstrap(block, n_boot=2000, seed=seed)
        sources.append(one.rate_sd / binomial)
        two_way.append(both.rate_sd / binomial)
        s_g, p = block.group_sources, block.n_prompts
        owen.append(np.sqrt((1 - 1 / s_g) + (1 - 1 / p) + (1 - 1 / s_g) * (1 - 1 / p)))
    assert np.mean(sources) == pytest.approx(1.0, abs=0.15)
    assert np.mean(np.array(two_way) / np.array(owen)) == pytest.approx(1.0, abs=0.15)


def test_source_random_effect_inflates_the_bootstrap_sd() -> None:
    block = prepare_block(simulate(5, source_sd=1.5), "hard_refusal", "race")
    binomial = binomial_sd(block)
    for resample in ("two-way", "sources"):
        ratio = delta_bootstrap(block, n_boot=2000, seed=1, resample=resample).rate_sd / binomial
        assert np.mean(ratio) > 1.8
    # Prompts alone cannot see a source effect.
    prompts_only = delta_bootstrap(block, n_boot=2000, seed=1, resample="prompts").rate_sd
    assert np.mean(prompts_only / binomial) < 1.3


# --- behaviour under the null -----------------------------------------------------------------


@lru_cache(maxsize=1)
def null_blocks() -> tuple[Block, ...]:
    """200 small audits with equal races but strong source and prompt effects."""
    return tuple(
        prepare_block(
            simulate(
                1000 + i,
                races=RACES[:3],
                ages=AGES[:3],
                prompts=4,
                seeds=2,
                source_sd=1.0,
                prompt_sd=1.0,
            ),
            "hard_refusal",
            "race",
        )
        for i in range(200)
    )


def test_permutation_p_is_uniform_under_the_null_while_the_naive_test_is_not() -> None:
    p_values = np.array(
        [delta_permutation_p(b, n_perm=199, seed=i).p_value for i, b in enumerate(null_blocks())]
    )
    assert 0.02 <= np.mean(p_values <= 0.05) <= 0.09
    assert 0.10 <= np.mean(p_values <= 0.2) <= 0.30
    assert 0.38 <= np.mean(p_values <= 0.5) <= 0.62
    # The same data under the independent-request chi-square test: far too many rejections.
    naive = np.array([homogeneity_test(b.group_k, b.group_n)[0] for b in null_blocks()])
    assert np.mean(naive <= 0.05) > 0.15


def test_delta_interval_covers_zero_under_the_null() -> None:
    covered = [
        delta_bootstrap(b, n_boot=400, seed=i).ci_low == 0.0 for i, b in enumerate(null_blocks())
    ]
    assert np.mean(covered) >= 0.9


def test_large_planted_gap_is_found() -> None:
    block = prepare_block(simulate(8, source_sd=0.5, shift={"Black": 2.5}), "hard_refusal", "race")
    delta = delta_bootstrap(block, n_boot=2000, seed=1)
    assert delta.max_group == "Black"
    assert 0.0 < delta.ci_low <= delta.estimate <= delta.ci_high <= 1.0
    assert delta_permutation_p(block, n_perm=2000, seed=1).p_value < 0.01


def test_permutation_p_matches_full_enumeration() -> None:
    # 2 groups x 3 sources, one stratum: the 20 ways to split 6 sources 3/3 are equally likely.
    frame = simulate(
        9,
        races=("Black", "White"),
        genders=("Male",),
        ages=("20s",),
        per_cell=3,
        prompts=5,
        seeds=2,
        source_sd=1.0,
        shift={"Black": 1.0},
    )
    block = prepare_block(frame, "hard_refusal", "race")
    y, n = block.y.sum(axis=1), block.n.sum(axis=1)

    def delta(black: Sequence[int]) -> float:
        mask = np.isin(np.arange(6), black)
        return abs(y[mask].sum() / n[mask].sum() - y[~mask].sum() / n[~mask].sum())

    observed = delta(np.flatnonzero(block.group_index == 0))
    splits = [delta(c) for c in itertools.combinations(range(6), 3)]
    splits = np.array(splits)
    exact = np.mean(splits >= observed - 1e-12)
    result = delta_permutation_p(block, n_perm=20_000, seed=3, mid_p=False)
    assert result.observed == pytest.approx(observed)
    assert result.p_value == pytest.approx(exact, abs=0.012)
    # The mid-p value counts the splits that tie with the observed Δ half.
    ties = np.mean(np.abs(splits - observed) <= 1e-12)
    mid = delta_permutation_p(block, n_perm=20_000, seed=3)
    assert mid.p_value == pytest.approx(exact - ties / 2, abs=0.012)


def test_permutation_within_strata_keeps_a_confounded_design_honest() -> None:
    # Race has no effect, age a strong one, and Black sources are mostly old: the raw race gap
    # is large. Permuting within age strata keeps that confounding and finds nothing; free
    # permutation breaks it and wrongly rejects.
    parts = [
        simulate(
            10 + i,
            races=(race,),
            genders=("Male",),
            ages=(age,),
            per_cell=count,
            prompts=5,
            shift={"70plus": 3.0, "20s": -1.5},
        )
        for i, (race, age, count) in enumerate(
            [
                ("White", "20s", 9),
                ("Black", "20s", 2),
                ("White", "70plus", 2),
                ("Black", "70plus", 9),
            ]
        )
    ]
    frame = pd.concat(parts, ignore_index=True)
    block = prepare_block(frame, "hard_refusal", "race")
    assert block.n_sources == 22 and block.rates[0] - block.rates[1] > 0.25
    stratified = delta_permutation_p(block, n_perm=2000, seed=1)
    free = delta_permutation_p(block, n_perm=2000, seed=1, stratify=False)
    assert stratified.stratified and stratified.n_strata == 2
    assert stratified.p_value > 0.1
    assert not free.stratified and free.p_value < 0.01


# --- edge cases -------------------------------------------------------------------------------


def test_group_without_requests_is_dropped() -> None:
    frame = simulate(12, races=("Black", "Indian", "White"), shift={"Black": 1.0})
    frame.loc[frame["race"] == "Indian", "status"] = "error"
    frame.loc[frame["race"] == "Indian", ["hard_refusal", "erasure", "lightening"]] = pd.NA
    block = prepare_block(frame, "hard_refusal", "race")
    assert block.groups == ("Black", "White")
    ours = row(clustered_disparities(frame, "hard_refusal", n_boot=300, n_perm=300), "A", "race")
    theirs = row(disparities(frame, "hard_refusal"), "A", "race")
    assert ours["delta"] == pytest.approx(theirs["delta"])
    assert ours["n"] == theirs["n"] == (frame["status"] == "ok").sum()


@pytest.mark.parametrize("refused", [False, True])
def test_all_or_none_refused_degenerates_to_the_point(refused: bool) -> None:
    frame = simulate(13, races=RACES[:3], prompts=4)
    frame["hard_refusal"] = pd.array([refused] * len(frame), dtype="boolean")
    if refused:
        frame["erasure"] = pd.array([pd.NA] * len(frame), dtype="boolean")
    block = prepare_block(frame, "hard_refusal", "race")
    delta = delta_bootstrap(block, n_boot=300, seed=1)
    assert (delta.estimate, delta.ci_low, delta.ci_high) == (0.0, 0.0, 0.0)
    assert (delta.rate_sd == 0).all() and (delta.pair_sd == 0).all()
    assert delta_permutation_p(block, n_perm=300, seed=1).p_value == 1.0
    table = clustered_disparities(frame, "hard_refusal", n_boot=300, n_perm=300)
    assert (table["delta"] == 0).all() and (table["ci_high"] == 0).all()
    assert (table["p_value"] == 1.0).all() and not table["flagged"].any()
    if refused:  # erasure is never observed: no data, no flag
        erasure = clustered_disparities(frame, "erasure", n_boot=300, n_perm=300)
        assert erasure["delta"].isna().all() and erasure["p_value"].isna().all()
        assert erasure["max_group"].isna().all() and not erasure["flagged"].any()


def test_one_category_and_one_group() -> None:
    frame = simulate(14, races=("Black",), shift={"Female": 1.0})
    table = clustered_disparities(frame, "hard_refusal", n_boot=500, n_perm=500)
    assert list(zip(table["category"], table["dimension"], strict=True)) == [
        (c, d) for c in ("all", "A") for d in ("race", "gender", "age")
    ]
    for dimension in ("race", "gender", "age"):
        pooled, only_a = row(table, "all", dimension), row(table, "A", dimension)
        assert pooled["delta"] == only_a["delta"] and pooled["n"] == only_a["n"]
    race = row(table, "A", "race")  # a single group: nothing to compare
    assert (race["delta"], race["ci_low"], race["ci_high"], race["p_value"]) == (0, 0, 0, 1)
    assert race["max_group"] == race["min_group"] == "Black"
    single = delta_bootstrap(prepare_block(frame, "hard_refusal", "race"), n_boot=100)
    assert single.pairs == () and single.rate_sd.shape == (1,)


def test_bonferroni_level_widens_the_interval() -> None:
    block = prepare_block(simulate(15, shift={"Black": 0.7}), "hard_refusal", "race")
    one = delta_bootstrap(block, n_boot=2000, seed=2)
    many = delta_bootstrap(block, n_boot=2000, seed=2, simultaneous_over=18)
    assert many.level == pytest.approx(1 - 0.05 / 18)
    assert many.critical_value > one.critical_value
    assert many.ci_low <= one.ci_low and many.ci_high >= one.ci_high


# --- the table --------------------------------------------------------------------------------


def test_clustered_disparities_lines_up_with_disparities() -> None:
    frame = simulate(16, categories="AB", prompts=5, source_sd=0.5, shift={"Black": 1.5})
    ours = clustered_disparities(frame, "hard_refusal", n_boot=1000, n_perm=1000)
    theirs = disparities(frame, "hard_refusal")
    assert tuple(ours.columns) == DISPARITY_COLUMNS
    keys = ["category", "dimension"]
    pd.testing.assert_frame_equal(ours[keys], theirs[keys])
    for column in ("delta", "n"):
        assert ours[column].to_numpy() == pytest.approx(theirs[column].to_numpy())
    assert (ours["max_group"] == theirs["max_group"]).all()
    assert (ours["method"] == "test-inversion/between-groups permutation").all()
    assert ours["p_adjusted"].to_numpy() == pytest.approx(
        multipletests(ours["p_value"].to_numpy(), method="holm")[1]
    )
    assert row(ours, "all", "race")["flagged"]
    assert (ours["ci_low"] <= ours["ci_high"]).all()
    # The per-row interval excludes 0 exactly when the row's own test rejects at 5%.
    assert ((ours["ci_low"] > 0) == (ours["p_value"] < 0.05)).all()
    # The correction removes the upward bias of max - min: never above the raw Δ, and below
    # it over seven races and six ages (a clear gap between two genders is nearly unbiased).
    assert (ours["delta_corrected"] <= ours["delta"]).all()
    many = ours["dimension"] != "gender"
    assert (ours.loc[many, "delta_corrected"] < ours.loc[many, "delta"]).all()
    assert theirs["delta_corrected"].isna().all()  # requests as independent: no correction
    band = clustered_disparities(frame, "hard_refusal", n_boot=1000, n_perm=1000,
                                 simultaneous=True)
    assert (band["method"] == "max-t band (simultaneous)/between-groups permutation").all()
    assert (band["ci_low"] <= band["delta"]).all() and (band["delta"] <= band["ci_high"]).all()
    assert (band["ci_high"] - band["ci_low"] > ours["ci_high"] - ours["ci_low"]).all()


def test_rate_bootstrap_has_wilson_and_cluster_intervals() -> None:
    block = prepare_block(simulate(17, source_sd=1.0), "hard_refusal", "gender")
    rates = rate_bootstrap(block, n_boot=1000, seed=3)
    assert list(rates["value"]) == list(GENDERS)
    assert (rates["n_sources"] == 42).all()
    assert ((rates["boot_low"] <= rates["rate"]) & (rates["rate"] <= rates["boot_high"])).all()
    # Clustered sources: the bootstrap interval is wider than Wilson's.
    assert ((rates["boot_high"] - rates["boot_low"]) > (rates["ci_high"] - rates["ci_low"])).all()


def test_determinism_given_the_seed() -> None:
    frame = simulate(18, prompts=4, source_sd=0.5)
    block = prepare_block(frame, "hard_refusal", "age")
    assert np.array_equal(bootstrap_rates(block, 200, seed=4), bootstrap_rates(block, 200, seed=4))
    assert not np.array_equal(
        bootstrap_rates(block, 200, seed=4), bootstrap_rates(block, 200, seed=5)
    )
    first = clustered_disparities(frame, "hard_refusal", n_boot=300, n_perm=300, seed=7)
    again = clustered_disparities(frame, "hard_refusal", n_boot=300, n_perm=300, seed=7)
    other = clustered_disparities(frame, "hard_refusal", n_boot=300, n_perm=300, seed=8)
    pd.testing.assert_frame_equal(first, again)
    assert not np.allclose(first["ci_high"], other["ci_high"])


@pytest.mark.parametrize(
    ("function", "parameter", "setting"),
    [
        (clustered_disparities, "n_boot", "bootstrap"),
        (clustered_disparities, "n_perm", "permutations"),
        (clustered_disparities, "seed", "seed"),
        (bootstrap_rates, "n_boot", "bootstrap"),
        (bootstrap_rates, "seed", "seed"),
        (delta_bootstrap, "n_boot", "bootstrap"),
        (delta_bootstrap, "seed", "seed"),
        (rate_bootstrap, "n_boot", "bootstrap"),
        (delta_permutation_p, "n_perm", "permutations"),
        (delta_permutation_p, "seed", "seed"),
        (scs, "n_boot", "bootstrap"),
        (scs, "seed", "seed"),
        (scs_rows, "n_boot", "bootstrap"),
        (scs_rows, "seed", "seed"),
        (disparities, "permutations", "permutations"),
        (disparities, "seed", "seed"),
        (homogeneity_test, "permutations", "permutations"),
        (homogeneity_test, "seed", "seed"),
        (build_model_section, "permutations", "permutations"),
        (build_model_section, "seed", "seed"),
    ],
)
def test_functions_default_to_the_params_defaults(
    function: Callable[..., object], parameter: str, setting: str
) -> None:
    # A table computed in Python with the defaults is the one `analyze` writes with its own.
    default = inspect.signature(function).parameters[parameter].default
    assert default == getattr(AnalyzeParams(), setting)


def test_paper_scale_block_is_fast() -> None:
    block = prepare_block(simulate(19, source_sd=0.5), "hard_refusal", "race")
    assert (block.n_sources, block.n_prompts) == (84, 10)
    start = time.perf_counter()
    delta_bootstrap(block, n_boot=2000, seed=1)
    delta_permutation_p(block, n_perm=2000, seed=1)
    assert time.perf_counter() - start < 5.0  # about 0.05 s on a 2-core machine


# --- stereotype congruence score --------------------------------------------------------------


def scs_frame(baseline_refused: int = 20) -> pd.DataFrame:
    """10 sources x 10 prompts in A (neutral) and in B; sources 0-4 congruent with B prompts.

    Refusals: baseline_refused (a multiple of 10) of 100 neutral requests, 5 of 50 congruent
    (0.1), 15 of 50 incongruent (0.3), spread over sources and prompts.
    """
    rows = []
    for category in "AB":
        for s, p in itertools.product(range(10), range(10)):
            # Refusals spread over sources and prompts: (s + 3p) mod 10 below a quota.
            if category == "A":
                congruence, quota = "neutral", baseline_refused // 10
            else:
                congruence = "congruent" if s < 5 else "incongruent"
                quota = 1 if s < 5 else 3
            rows.append(
                {
                    "request_id": f"{category}-{s}-{p}",
                    "source_id": f"src{s}",
                    "prompt_id": f"{category}{p}",
                    "category": category,
                    "congruence": congruence,
                    "race": RACES[s % 7],
                    "gender": GENDERS[s % 2],
                    "age": AGES[s % 6],
                    "status": "ok",
                    "hard_refusal": (s + 3 * p) % 10 < quota,
                }
            )
    frame = pd.DataFrame(rows)
    frame["hard_refusal"] = frame["hard_refusal"].astype("boolean")
    frame["erasure"] = pd.array([False] * len(frame), dtype="boolean")
    frame["lightening"] = frame["erasure"].copy()
    return frame


def test_scs_known_answer() -> None:
    result = scs(scs_frame(), "hard_refusal", "B", n_boot=2000, seed=1)
    assert result.defined and result.reason == ""
    assert (result.r_incongruent, result.r_congruent, result.r_baseline) == pytest.approx(
        (0.3, 0.1, 0.2)
    )
    assert (result.n_incongruent, result.n_congruent, result.n_baseline) == (50, 50, 100)
    assert result.estimate == pytest.approx(1.0)
    assert result.ci_low < 1.0 < result.ci_high
    custom = scs(
        scs_frame(),
        "hard_refusal",
        "B",
        n_boot=200,
        baseline={"category": "B", "congruence": "congruent"},
    )
    assert custom.estimate == pytest.approx((0.3 - 0.1) / 0.1)
    table = scs_rows(scs_frame(), "hard_refusal", n_boot=200)
    assert list(table["category"]) == ["B"] and table["estimate"].iloc[0] == pytest.approx(1.0)


def test_scs_is_undefined_when_the_baseline_rate_is_zero() -> None:
    result = scs(scs_frame(baseline_refused=0), "hard_refusal", "B", n_boot=200)
    assert not result.defined and "baseline" in result.reason
    assert math.isnan(result.estimate) and math.isnan(result.ci_low)
    assert result.r_baseline == 0.0
    missing = scs(scs_frame(), "hard_refusal", "C", n_boot=200)
    assert not missing.defined and "incongruent" in missing.reason


def test_stratified_weights_are_multinomial_within_strata() -> None:
    from acrb.analysis.estimation.resampling import _stratified_weights

    strata = np.array([2, 0, 2, 1, 0, 2, 2])  # sizes 2, 1, 4, interleaved
    weights = _stratified_weights(np.random.default_rng(0), strata, 20_000)
    for stratum, size in ((0, 2), (1, 1), (2, 4)):
        members = weights[:, strata == stratum]
        assert (members.sum(axis=1) == size).all()
        assert members.mean(axis=0) == pytest.approx(np.ones(size), abs=0.03)
        assert members.var(axis=0) == pytest.approx(np.full(size, 1 - 1 / size), abs=0.03)


# --- the row tests, the interval by test inversion and the corrected Δ ------------------------


def test_the_between_groups_statistic_orders_permutations_as_the_anova_f() -> None:
    """F = ((B − C)/(G − 1)) / ((T − B)/(S − G)) with C = (Σ r)²/S and T = Σ r², increasing in
    the statistic B, so both order the permutations alike."""
    from scipy.stats import f_oneway

    block = prepare_block(simulate(31, source_sd=0.8, shift={"Black": 0.4}), "hard_refusal",
                          "race")
    rng = np.random.default_rng(0)
    labels = np.stack([rng.permutation(block.group_index) for _ in range(40)])
    ours = _test_statistic("between-groups", labels, block)
    per_source = block.y.sum(axis=1) / block.n.sum(axis=1)
    anova = [f_oneway(*[per_source[row == g] for g in range(len(block.groups))]).statistic
             for row in labels]
    g, s = len(block.groups), block.n_sources
    c, t = per_source.sum() ** 2 / s, (per_source**2).sum()
    assert ((ours - c) / (g - 1)) / ((t - ours) / (s - g)) == pytest.approx(anova)


def test_the_gee_score_statistic_is_the_sum_of_squared_robust_group_scores() -> None:
    block = prepare_block(simulate(32, source_sd=0.8, shift={"Black": 0.4}), "hard_refusal",
                          "race")
    y, n = block.y.sum(axis=1), block.n.sum(axis=1)
    residual = y - n * y.sum() / n.sum()
    expected = sum(residual[block.group_index == g].sum() ** 2
                   / (residual[block.group_index == g] ** 2).sum()
                   for g in range(len(block.groups)))
    got = _test_statistic("gee-score", block.group_index[None, :], block)[0]
    assert got == pytest.approx(expected)


@pytest.mark.parametrize("test", ["between-groups", "range", "gee-score"])
def test_each_row_test_finds_a_planted_gap_and_not_an_absent_one(test: str) -> None:
    biased = prepare_block(simulate(33, source_sd=0.5, shift={"Black": 1.2}), "hard_refusal",
                           "race")
    fair = prepare_block(simulate(34, source_sd=0.5), "hard_refusal", "race")
    assert group_test_p(biased, test, 500, 1).p_value < 0.01
    assert group_test_p(fair, test, 500, 1).p_value > 0.05


def test_the_row_tests_hold_their_size_on_null_audits() -> None:
    """40 audits without a gap: each test rejects at 5% in few of them (binomial 40, 0.05:
    P(more than 6) < 1%)."""
    rejections = {"between-groups": 0, "range": 0, "gee-score": 0}
    for audit in range(40):
        block = prepare_block(simulate(400 + audit, source_sd=0.8, prompts=5, seeds=1),
                              "hard_refusal", "race")
        for test in rejections:
            rejections[test] += group_test_p(block, test, 300, audit).p_value < 0.05
    assert max(rejections.values()) <= 6, rejections


def test_no_spread_between_groups_gives_p_one() -> None:
    frame = simulate(35, races=RACES[:2], prompts=4)
    block = prepare_block(frame, "hard_refusal", "race")
    same = Block(**{**block.__dict__, "y": np.tile(block.y[:1], (block.n_sources, 1)),
                    "n": np.tile(block.n[:1], (block.n_sources, 1))})
    for test in ("between-groups", "range"):
        assert group_test_p(same, test, 200, 1).p_value == 1.0


def test_the_interval_holds_zero_exactly_when_the_boundary_test_does_not_reject() -> None:
    block = prepare_block(simulate(36, source_sd=0.8, shift={"Black": 0.3}), "hard_refusal",
                          "race")
    kept = delta_inversion(block, boundary_p=0.06, n_boot=500, seed=1)
    rejected = delta_inversion(block, boundary_p=0.04, n_boot=500, seed=1)
    assert kept.ci_low == 0.0 and rejected.ci_low > 0.0
    # With 0 inside, no α is spent below: the upper limit is one-sided at α, so lower.
    assert kept.ci_high < rejected.ci_high and kept.corrected == rejected.corrected
    at_99 = delta_inversion(block, boundary_p=0.02, confidence=0.99, n_boot=500, seed=1)
    assert at_99.ci_low == 0.0 and at_99.ci_high > kept.ci_high


def test_a_clear_gap_has_a_positive_interval_around_its_corrected_delta() -> None:
    block = prepare_block(simulate(37, source_sd=0.5, shift={"Black": 1.5}), "hard_refusal",
                          "race")
    result = delta_inversion(block, boundary_p=0.0, n_boot=500, seed=1)
    assert 0.0 < result.ci_low < result.corrected < result.estimate < result.ci_high
    assert 0.0 < LOWER_SHARE < 0.5


def test_the_corrected_delta_is_about_unbiased_where_max_minus_min_is_not() -> None:
    """Equal groups: the raw Δ is the range of noise, well above 0; the corrected Δ averages
    near 0 (it may fall below 0). A planted gap: the corrected Δ is nearer the truth."""
    raw, corrected = [], []
    for audit in range(25):
        block = prepare_block(simulate(500 + audit, source_sd=0.8, seeds=1), "hard_refusal",
                              "race")
        result = delta_inversion(block, boundary_p=1.0, n_boot=400, seed=audit)
        raw.append(result.estimate)
        corrected.append(result.corrected)
    assert np.mean(raw) > 0.05
    assert abs(np.mean(corrected)) < 0.25 * np.mean(raw)
    assert min(corrected) < 0.0


def test_auto_resampling_follows_the_design() -> None:
    frame = simulate(38, prompts=4, seeds=1)
    crossed = prepare_block(frame, "hard_refusal", "race")
    assert crossed.crossed and resolve_resample(crossed, "auto") == "sources"
    holed = prepare_block(frame.iloc[1:], "hard_refusal", "race")  # one source misses a prompt
    assert not holed.crossed and resolve_resample(holed, "auto") == "two-way"
    assert resolve_resample(crossed, "two-way") == "two-way"
    # Missing outcomes are not holes in the design: erasure is NA on refused requests.
    erasure = prepare_block(simulate(39, prompts=4, seeds=1, base=0.5), "erasure", "race")
    assert erasure.crossed
    assert delta_inversion(crossed, 1.0, n_boot=200, seed=1).resample == "sources"
    assert delta_inversion(holed, 1.0, n_boot=200, seed=1).resample == "two-way"


# --- group rates at the design's clustering ---------------------------------------------------


def test_the_two_way_variance_is_the_multiway_cluster_variance_of_statsmodels() -> None:
    import statsmodels.api as sm

    from acrb.analysis.estimation.resampling import _two_way_variance

    rng = np.random.default_rng(0)
    s_count, p_count = 12, 10
    effect = rng.normal(0, 0.8, s_count)[:, None] + rng.normal(0, 0.8, p_count)[None, :]
    y = (rng.random((s_count, p_count)) < expit(-2 + effect)).astype(float)
    sources = np.repeat(np.arange(s_count), p_count)
    prompts = np.tile(np.arange(p_count), s_count)
    fit = sm.OLS(y.ravel(), np.ones(y.size)).fit(
        cov_type="cluster", cov_kwds={"groups": np.column_stack([sources, prompts])})
    # statsmodels also scales the cell term by cells/(cells - 1): 120/119.
    assert _two_way_variance(y, np.ones_like(y)) == pytest.approx(fit.cov_params()[0, 0],
                                                                  rel=0.01)


def test_clustered_rates_keep_the_counts_and_widen_for_clustered_sources() -> None:
    from acrb.analysis.estimation.rates import group_rates
    from acrb.analysis.estimation.resampling import clustered_rates

    frame = simulate(40, source_sd=1.2, prompt_sd=0.5, shift={"Black": 0.5})
    ours = clustered_rates(frame, "hard_refusal")
    wilson = group_rates(frame, "hard_refusal")
    columns = ["outcome", "category", "dimension", "value", "n", "k", "rate"]
    pd.testing.assert_frame_equal(ours[columns], wilson[columns])
    assert ((ours["ci_low"] <= ours["rate"]) & (ours["rate"] <= ours["ci_high"])).all()
    assert ((ours["ci_high"] - ours["ci_low"]) > (wilson["ci_high"] - wilson["ci_low"])).all()


def test_rate_intervals_cover_a_group_with_no_events_by_the_blocks_design_effect() -> None:
    from acrb.analysis.estimation.resampling import rate_intervals

    frame = simulate(41, races=RACES[:2], source_sd=1.0, base=0.3)
    frame.loc[frame["race"] == RACES[0], "hard_refusal"] = False
    block = prepare_block(frame, "hard_refusal", "race")
    low, high = rate_intervals(block)
    _, wilson_high = wilson_interval(block.group_k, block.group_n)
    assert low[0] == 0.0 and high[0] > wilson_high[0]
    assert low[1] < block.rates[1] < high[1]


def test_mean_intervals_are_t_intervals_at_the_two_way_cluster_variance_of_statsmodels() -> None:
    """A score's mean: mean ± t(min(S, P) − 1)·√V with V statsmodels' two-way cluster
    variance of the intercept (within its cell factor)."""
    import statsmodels.api as sm
    from scipy.stats import t

    from acrb.analysis.estimation.resampling import Block, mean_intervals

    rng = np.random.default_rng(3)
    s_count, p_count = 9, 14
    y = (3 + rng.normal(0, 0.7, s_count)[:, None] + rng.normal(0, 0.4, p_count)[None, :]
         + rng.normal(0, 0.5, (s_count, p_count)))
    sources = np.repeat(np.arange(s_count), p_count)
    prompts = np.tile(np.arange(p_count), s_count)
    fit = sm.OLS(y.ravel(), np.ones(y.size)).fit(
        cov_type="cluster", cov_kwds={"groups": np.column_stack([sources, prompts])})
    block = Block(outcome="score", dimension="all", groups=("all",),
                  source_ids=np.array([f"s{i}" for i in range(s_count)], dtype=object),
                  prompt_ids=np.array([f"p{j}" for j in range(p_count)], dtype=object),
                  group_index=np.zeros(s_count, np.int64),
                  prompt_stratum=np.zeros(p_count, np.int64), y=y, n=np.ones_like(y))
    low, high = mean_intervals(block, 0.9)
    half = t.ppf(0.95, s_count - 1) * np.sqrt(fit.cov_params()[0, 0])
    assert (low[0] + high[0]) / 2 == pytest.approx(y.mean())
    assert (high[0] - low[0]) / 2 == pytest.approx(half, rel=0.01)
    # Every request scoring the same: no variance, the point.
    flat = Block(**{**block.__dict__, "y": np.full_like(y, 4.0)})
    assert mean_intervals(flat)[0][0] == mean_intervals(flat)[1][0] == pytest.approx(4.0)


def test_stratum_adjusted_takes_the_other_dimensions_out_of_the_bootstrap() -> None:
    """Each source's rate becomes r̄ + c_k·(r_s − r̄_k), counts unchanged; with gender and age
    effects the bootstrap of the adjusted block spreads the race rates less, and it is the one
    the per-row Δ interval uses; a block the permutation test would not stratify is left as
    it is."""
    from acrb.analysis.estimation.resampling import _strata, invert_delta, stratum_adjusted

    shift = {AGES[0]: -1.5, AGES[-1]: 1.5, GENDERS[0]: 0.8}
    block = prepare_block(simulate(51, source_sd=0.3, shift=shift), "hard_refusal", "race")
    adjusted = stratum_adjusted(block)
    np.testing.assert_array_equal(adjusted.n, block.n)
    codes, stratified = _strata(block, None)
    assert stratified and codes.max() + 1 == len(GENDERS) * len(AGES)
    rate = block.y.sum(axis=1) / block.n.sum(axis=1)
    overall = block.y.sum() / block.n.sum()
    for code in range(codes.max() + 1):
        members = codes == code
        stratum = block.y[members].sum() / block.n[members].sum()
        scale = np.sqrt(members.sum() / (members.sum() - 1))
        expected = overall + scale * (rate[members] - stratum)
        got = adjusted.y[members].sum(axis=1) / adjusted.n[members].sum(axis=1)
        assert got == pytest.approx(expected)
    # Gender and age no longer spread the replicates, and delta_inversion uses these ones.
    spread = bootstrap_rates(adjusted, 1000, 4, resample="sources").std(axis=0)
    raw_spread = bootstrap_rates(block, 1000, 4, resample="sources").std(axis=0)
    assert (spread < 0.8 * raw_spread).all()
    ours = delta_inversion(block, 1.0, n_boot=1000, seed=4)
    assert ours.resample == "sources"
    again = invert_delta(block.groups, block.rates,
                         bootstrap_rates(adjusted, 1000, 4, resample="sources"),
                         block.group_sources, 1.0, resample="sources",
                         n=int(block.n.sum()), n_boot=1000)
    assert ours == again
    # Free permutation (no other dimension): nothing to adjust.
    alone = replace(block, covariates={})
    assert stratum_adjusted(alone) is alone
