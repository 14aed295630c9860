"""The permutation test of Δ and the bootstrap weights (``acrb.analysis.estimation.resampling``) at
the edges the statistical tests do not reach: the result of a block with no group or one group, the
automatic rule that decides whether labels are permuted within strata (each clause at its boundary),
strata of several source dimensions, a group no source carries, the float tolerance that makes
near-equal Δ ties (the boundary included), and the one-way bootstrap over prompts. Tests that kill
the mutants the other tests let survive (docs/mutation.md).

Blocks are built by hand (as :mod:`acrb.analysis.experiments.attributes` builds its own), so every
count and every permuted Δ is known; expected values are worked out in the comments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from acrb.analysis.estimation.resampling import Block, bootstrap_weights, delta_permutation_p

pytestmark = pytest.mark.filterwarnings("error")

TOLERANCE = 1e-12  # the documented tie tolerance of the permutation comparison


def block(
    groups: Sequence[str],
    group_index: Sequence[int],
    y: Sequence[float],
    n: Sequence[float] | None = None,
    **covariates: Sequence[str],
) -> Block:
    """One prompt; source s has ``y[s]`` outcomes True out of ``n[s]`` (1 each by default)."""
    count = len(group_index)
    trials = [1.0] * count if n is None else list(n)
    return Block(
        outcome="hard_refusal",
        dimension="race",
        groups=tuple(groups),
        source_ids=np.array([f"s{i}" for i in range(count)], dtype=object),
        prompt_ids=np.array(["p0"], dtype=object),
        group_index=np.asarray(group_index, dtype=np.int64),
        prompt_stratum=np.zeros(1, np.int64),
        y=np.asarray(y, dtype=float).reshape(count, 1),
        n=np.asarray(trials, dtype=float).reshape(count, 1),
        covariates={k: np.asarray(v, dtype=object) for k, v in covariates.items()},
    )


# --- no group, one group ----------------------------------------------------------------------


def test_a_block_without_groups_has_no_p_value_and_no_strata() -> None:
    empty = Block(
        outcome="hard_refusal", dimension="race", groups=(),
        source_ids=np.array([], dtype=object), prompt_ids=np.array(["p0"], dtype=object),
        group_index=np.zeros(0, np.int64), prompt_stratum=np.zeros(1, np.int64),
        y=np.zeros((0, 1)), n=np.zeros((0, 1)),
    )
    result = delta_permutation_p(empty, n_perm=50, seed=0)
    assert math.isnan(result.p_value) and math.isnan(result.observed)
    assert result.n_perm == 50
    assert result.stratified is False and result.n_strata == 0


@pytest.mark.parametrize(
    ("stratify", "stratified", "n_strata"),
    # Forced: the two genders are two strata. Automatic: one group cannot move within a
    # stratum, so the rule falls back to one free stratum.
    [(True, True, 2), (None, False, 1)],
)
def test_one_group_has_no_gap_and_p_one(
    stratify: bool | None, stratified: bool, n_strata: int
) -> None:
    one = block(["White"], [0, 0, 0, 0], [1, 0, 1, 1], gender=["Male", "Male", "Female", "Female"])
    result = delta_permutation_p(one, n_perm=40, seed=0, stratify=stratify)
    assert result.p_value == 1.0
    assert result.observed == 0.0
    assert result.n_perm == 40
    assert result.stratified is stratified
    assert result.n_strata == n_strata


# --- the automatic stratification rule --------------------------------------------------------
# "Stratify by the combination of the other source dimensions when every stratum holds more
# than one source and at least one stratum holds two groups; else permute freely."


def test_strata_of_two_sources_with_both_groups_are_used() -> None:
    # Gender strata of exactly two sources each; the Male one holds both races.
    two = block(["Black", "White"], [0, 0, 1, 1], [1, 1, 0, 0],
                gender=["Male", "Female", "Male", "Female"])
    result = delta_permutation_p(two, n_perm=40, seed=0)
    assert result.stratified is True and result.n_strata == 2
    assert result.n_perm == 40


def test_a_stratum_of_one_source_makes_the_permutation_free() -> None:
    # Gender strata Male {s0 Black, s2 White} and Female {s1}: one stratum holds both races,
    # the other a single source, so not every stratum holds more than one source.
    lone = block(["Black", "White"], [0, 0, 1], [1, 1, 0], gender=["Male", "Female", "Male"])
    automatic = delta_permutation_p(lone, n_perm=40, seed=0)
    assert automatic.stratified is False and automatic.n_strata == 1
    forced = delta_permutation_p(lone, n_perm=40, seed=0, stratify=True)
    assert forced.stratified is True and forced.n_strata == 2


def test_strata_that_each_hold_one_group_make_the_permutation_free() -> None:
    # Race and gender fully confounded (Black sources all Male, White all Female): within
    # gender no label could move, so the test permutes freely and can see the gap.
    confounded = block(["Black", "White"], [0, 0, 1, 1], [1, 1, 0, 0],
                       gender=["Male", "Male", "Female", "Female"])
    result = delta_permutation_p(confounded, n_perm=40, seed=0)
    assert result.stratified is False and result.n_strata == 1
    # Free: only the observed split (and its mirror), 2 of the 6, give Δ = 1, so p < 1.
    assert result.p_value < 1.0


def test_every_combination_of_the_other_dimensions_is_its_own_stratum() -> None:
    # Three ages x two genders, two sources (one per race) in each of the six cells.
    ages = ["20s", "30s", "40s"] * 4
    genders = ["Male"] * 6 + ["Female"] * 6
    races = [0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0]
    cells = block(["Black", "White"], races, [1.0] * 12, age=ages, gender=genders)
    assert len(set(zip(ages, genders, strict=True))) == 6
    result = delta_permutation_p(cells, n_perm=40, seed=0)
    assert result.stratified is True and result.n_strata == 6


def test_the_p_value_does_not_depend_on_how_the_strata_are_spelled() -> None:
    # Age bands spelled in the opposite sort order number the strata the other way round;
    # the strata, and so the permutations a seed draws and the p-value, are the same.
    # Four age strata of ten sources (five of each race), interleaved; no real gap.
    races = np.repeat([0, 1], 20)
    ages = np.tile(np.arange(4), 10)
    y = np.random.default_rng(8).integers(0, 7, 40)
    spelled = block(["Black", "White"], races, y, [6] * 40, age=[f"{a}0s" for a in 2 + ages])
    reversed_ = block(["Black", "White"], races, y, [6] * 40, age=[f"x{9 - a}" for a in ages])
    first = delta_permutation_p(spelled, n_perm=200, seed=6)
    second = delta_permutation_p(reversed_, n_perm=200, seed=6)
    assert first.stratified and second.stratified and first.n_strata == second.n_strata == 4
    assert second.observed == first.observed
    assert second.p_value == first.p_value


# --- a group no source carries ----------------------------------------------------------------


def test_a_group_without_sources_is_left_out_of_delta() -> None:
    # An attribute never observed (acrb.analysis.experiments.attributes lists every attribute of the
    # family): its rate is undefined and Δ is taken over the others, here 4/8 - 1/8.
    y, n = [3, 1, 0, 1], [4, 4, 4, 4]
    listed = delta_permutation_p(block(["a", "b", "c"], [0, 0, 1, 1], y, n), n_perm=60, seed=2)
    present = delta_permutation_p(block(["a", "b"], [0, 0, 1, 1], y, n), n_perm=60, seed=2)
    assert listed.observed == present.observed == 0.375
    assert listed.p_value == present.p_value


# --- the tie tolerance ------------------------------------------------------------------------
# One Black source (y[0]) against two White ones (y[1], y[2] = 0), one request each: a
# permutation either keeps the Black label on s0 (Δ = y0 - 0) or moves it to s1 or s2
# (Δ = y0/2 - 0).


def test_permuted_gaps_within_the_tolerance_are_ties_the_boundary_included() -> None:
    # Δ_obs = 2e-12; a moved label gives Δ* = 1e-12, exactly the tolerance away: every
    # permutation ties, so the mid-p value is (1 + n/2)/(1 + n) and the plain one 1.
    assert abs(1e-12 - 2e-12) == TOLERANCE  # the float arithmetic is exact here
    tiny = block(["Black", "White"], [0, 1, 1], [2e-12, 0.0, 0.0])
    mid = delta_permutation_p(tiny, n_perm=30, seed=1)
    assert mid.observed == 2e-12
    assert mid.p_value == pytest.approx((1 + 15) / 31, rel=1e-12)
    assert delta_permutation_p(tiny, n_perm=30, seed=1, mid_p=False).p_value == 1.0


def test_an_observed_gap_of_the_tolerance_is_no_evidence() -> None:
    # Δ_obs = 1e-12 is float noise: p = 1 whatever the permutations give.
    noise = block(["Black", "White"], [0, 1, 1], [1e-12, 0.0, 0.0])
    result = delta_permutation_p(noise, n_perm=30, seed=1)
    assert result.observed == TOLERANCE
    assert result.p_value == 1.0


def test_a_permuted_gap_larger_by_float_noise_is_a_tie_not_more_extreme() -> None:
    # Two sources per race, one request each, y = (p, q, r, 0); Black = s0, s1. Every split
    # gives Δ* = |sum(y of Black) - sum(y of White)| / 2:
    #   exact: y = (1/2, 1/8, 1/8, 0): Δ = 1/4 for s0s1, s0s2 (and their mirrors), 1/8 else;
    #   noisy: p = 1/2 + e, q = 1/8 - e with e = 9007 * 2**-53 (< 1e-12, all dyadic, so every
    #   sum is exact): Δ_obs = 1/4 and s0s2 gives 1/4 + e, which is the float 1/4 + 1e-12.
    # The same seed draws the same permutations for both, and a tie within the tolerance
    # counts as a tie, so both p-values are equal.
    e = 9007 * 2.0**-53
    assert e < TOLERANCE and 0.25 + e == 0.25 + TOLERANCE
    races = [0, 0, 1, 1]
    exact = delta_permutation_p(block(["Black", "White"], races, [0.5, 0.125, 0.125, 0.0]),
                                n_perm=60, seed=4)
    noisy = delta_permutation_p(
        block(["Black", "White"], races, [0.5 + e, 0.125 - e, 0.125, 0.0]), n_perm=60, seed=4
    )
    assert exact.observed == noisy.observed == 0.25
    assert noisy.p_value == exact.p_value
    assert exact.p_value < 1.0  # the splits with Δ* = 1/8 count for nothing


# --- bootstrap weights ------------------------------------------------------------------------


def test_prompt_only_bootstrap_resamples_prompts_within_category_and_keeps_sources() -> None:
    sources, prompts = np.zeros(3, np.int64), np.array([0, 0, 0, 0, 1, 1])
    w, v = bootstrap_weights(np.random.default_rng(5), sources, prompts, 50, "prompts")
    assert (w == 1).all()
    # Each category keeps its prompt count in every replicate, and the counts vary.
    assert (v[:, :4].sum(axis=1) == 4).all() and (v[:, 4:].sum(axis=1) == 2).all()
    assert not (v == 1).all()


def test_an_unknown_resampling_scheme_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(ValueError) as error:
        bootstrap_weights(np.random.default_rng(0), np.zeros(2), np.zeros(2), 10, "both")  # type: ignore[arg-type]
    assert str(error.value) == (
        "resample must be 'auto', 'two-way', 'sources' or 'prompts', not 'both'")


# --- a seed gives the same draws on every machine ---------------------------------------------


def test_a_seed_gives_the_same_bootstrap_draws_on_every_machine() -> None:
    # A reproducibility contract, not a statistical property: `dvc repro` of a published audit
    # must give its intervals again, so the draws of a seed are pinned. Units are put in
    # stratum order with a stable sort; an unstable one (numpy's default may dispatch to a
    # SIMD sort on some CPUs) would reorder the units of a stratum and change the draws.
    strata = np.array([1, 0, 1, 0, 2, 2, 0, 1, 2, 0, 1, 0])
    w, _ = bootstrap_weights(np.random.default_rng(3), strata, np.zeros(2, np.int64), 3,
                             "sources")
    assert w.astype(int).tolist() == [[1, 2, 2, 1, 1, 2, 1, 1, 0, 0, 0, 1],
                                      [1, 0, 1, 1, 2, 0, 2, 2, 1, 1, 0, 1],
                                      [1, 1, 1, 0, 1, 1, 2, 2, 1, 1, 0, 1]]
    for s in np.unique(strata):  # each stratum keeps its size in every replicate
        assert (w[:, strata == s].sum(axis=1) == (strata == s).sum()).all()


def test_a_seed_gives_the_same_permutation_p_on_every_machine() -> None:
    # Pinned like the bootstrap draws above: 50 permutations within three age strata.
    races, ages = np.repeat([0, 1], 6), np.tile([0, 1, 2], 4)
    y = [1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1]
    result = delta_permutation_p(block(["Black", "White"], races, y,
                                       age=[f"{a}0s" for a in ages]),
                                 n_perm=50, seed=4, stratify=True)
    assert (result.stratified, result.n_strata) == (True, 3)
    assert result.observed == pytest.approx(1 / 3, abs=1e-12)
    assert result.p_value == 15 / 51  # mid-p: (1 + more extreme + ties / 2) / (50 + 1)
