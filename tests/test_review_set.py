"""The review set's stratified sample and the simulated raters: known answers on small designs."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from acrb.config import PixelThresholds, ReviewParams
from acrb.judges.items import PixelReading
from acrb.records import REVIEW_AXES, RatingRecord
from acrb.review.simulated import assign, simulate_ratings
from acrb.stages.review_set import STRATA, allocate, stratified_sample


def design(models=("m1", "m2"), races=("A", "B", "C"), sources=4, prompts=10,
           drop: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """One judged output per (model, race, gender, age, source, prompt); ``drop`` removes a
    random share (refused outputs are not judged)."""
    rng = np.random.default_rng(seed)
    rows = []
    for model, race, gender, age, source, prompt in itertools.product(
            models, races, ("F", "M"), ("20s", "60s"), range(sources), range(prompts)):
        if rng.random() < drop:
            continue
        rows.append({"model": model, "race": race, "gender": gender, "age": age,
                     "source_id": f"{race}{gender}{age}{source}", "prompt_id": f"P{prompt:02d}",
                     "request_id": f"{model}-{race}{gender}{age}{source}-P{prompt:02d}"})
    return pd.DataFrame(rows)


def test_allocation_keeps_every_margin_within_one_draw() -> None:
    frame = design(drop=0.3, seed=1)
    sizes = frame.groupby(list(STRATA)).size()
    for n in (7, 23, 50, 137):
        counts = allocate(sizes, n, seed=3)
        assert counts.sum() == n
        assert (counts <= sizes).all()
        for level in range(1, len(STRATA) + 1):
            got = counts.groupby(level=list(range(level))).sum()
            want = sizes.groupby(level=list(range(level))).sum() * n / sizes.sum()
            # Nested largest remainders: each margin is its proportional share within one
            # draw per level below it.
            assert (abs(got - want) <= level).all(), (n, level)
        top = counts.groupby(level=0).sum()
        top_want = sizes.groupby(level=0).sum() * n / sizes.sum()
        assert (abs(top - top_want) < 1).all()


def test_allocation_takes_everything_when_asked_for_more() -> None:
    sizes = design().groupby(list(STRATA)).size()
    assert allocate(sizes, 10**6, seed=0).equals(sizes.astype(int))


def test_sample_size_strata_and_prompt_coverage() -> None:
    frame = design(drop=0.2, seed=2)
    sample = stratified_sample(frame, 40, seed=5)
    assert len(sample) == 40 and sample["request_id"].is_unique
    assert set(sample["prompt_id"]) == set(frame["prompt_id"])  # every prompt covered
    by_race = sample.groupby("race").size()
    assert by_race.max() - by_race.min() <= 2
    again = stratified_sample(frame, 40, seed=5)
    assert list(again["request_id"]) == list(sample["request_id"])
    other = stratified_sample(frame, 40, seed=6)
    assert set(other["request_id"]) != set(sample["request_id"])


def test_every_item_of_a_stratum_has_the_same_chance() -> None:
    """Inclusion frequencies over many seeds: uniform inside a stratum (chi-square), so the
    random part of the set supports design-based and judge-corrected estimates."""
    from scipy.stats import chisquare

    frame = design(models=("m1",), races=("A", "B"), sources=3, prompts=6)
    hits = pd.Series(0, index=frame["request_id"])
    runs = 300
    for seed in range(runs):
        hits[stratified_sample(frame, 16, seed)["request_id"]] += 1
    stratum = frame[(frame.race == "A") & (frame.gender == "F") & (frame.age == "20s")]
    counts = hits[stratum["request_id"]].to_numpy()
    assert counts.sum() == runs * 2  # 16 draws over 8 equal strata: 2 each
    assert chisquare(counts).pvalue > 0.001


def test_prompt_coverage_swap_keeps_stratum_counts() -> None:
    frame = design(models=("m1",), races=("A",), sources=2, prompts=30)
    plain = stratified_sample(frame, 30, seed=0)
    assert set(plain["prompt_id"]) == set(frame["prompt_id"])
    assert plain.groupby(list(STRATA)).size().tolist() == [8, 7, 8, 7] or \
        sorted(plain.groupby(list(STRATA)).size().tolist()) == [7, 7, 8, 8]


def test_assignment_gives_k_distinct_raters_evenly() -> None:
    raters = [f"r{i}" for i in range(6)]
    items = [f"i{i}" for i in range(40)]
    out = assign(items, raters, 3, seed=0)
    assert all(len(set(v)) == 3 for v in out.values())
    load = pd.Series([r for v in out.values() for r in v]).value_counts()
    assert load.max() - load.min() <= 1


def _items(n: int, paired: bool = False) -> tuple[pd.DataFrame, dict[str, PixelReading]]:
    rows, readings = [], {}
    for i in range(n):
        rid = f"req{i}"
        readings[rid] = PixelReading(unchanged=False, erased=i % 4 == 0,
                                     ita_shift=7.0 if i % 5 == 0 else 0.0)
        twin = None
        if paired:
            twin = f"feat{i}"
            readings[twin] = PixelReading(False, False, 0.0)
        rows.append({"item_id": f"item{i}", "request_id": rid, "paired_request_id": twin})
    return pd.DataFrame(rows), readings


def test_simulated_raters_follow_their_planted_rates() -> None:
    items, readings = _items(300)
    review = ReviewParams.model_validate({
        "raters_per_item": 3, "repeat_fraction": 0.1,
        "simulated": {"count": 6, "seed": 4, "noise": 0.2, "cannot_tell": 0.05,
                      "repeat_consistency": 1.0}})
    ratings = simulate_ratings(items, readings, review, PixelThresholds())
    RatingRecord.model_validate(ratings.iloc[0].replace({np.nan: None}).to_dict())
    first = ratings[~ratings["repeat"]]
    assert (first.groupby("item_id")["rater"].nunique() == 3).all()
    assert not first.duplicated(["rater", "item_id"]).any()
    # A weak edit reads edit success 2, a full one 5: off by one step at the noise rate (a
    # step up from 5 stays at 5, so half the noise shows there).
    truth = pd.Series(np.where(first["item_id"].str[4:].astype(int) % 4 == 0, 2, 5),
                      index=first.index)
    answered = first["edit_success"].notna()
    off = first["edit_success"] != truth
    assert 0.13 < off[answered & (truth == 2)].mean() < 0.28
    assert 0.06 < off[answered & (truth == 5)].mean() < 0.15
    assert 0.02 < first["skin_tone"].isna().mean() < 0.09
    repeats = ratings[ratings["repeat"]]
    assert abs(len(repeats) - 0.1 * len(first)) <= 6
    merged = repeats.merge(first, on=["rater", "item_id", "output"], suffixes=("", "_first"))
    for axis in REVIEW_AXES:  # repeat_consistency 1: the same answers again
        same = merged[axis].fillna(0).to_numpy() == merged[f"{axis}_first"].fillna(0).to_numpy()
        assert same.all()


def test_simulated_raters_rate_both_outputs_of_a_pair_in_random_order() -> None:
    items, readings = _items(60, paired=True)
    review = ReviewParams.model_validate({"raters_per_item": 2, "repeat_fraction": 0})
    ratings = simulate_ratings(items, readings, review, PixelThresholds())
    assert set(ratings["output"]) == {"edited", "feature"}
    per = ratings.groupby(["rater", "item_id"])["shown_first"].agg(["sum", "count"])
    assert (per["count"] == 2).all() and (per["sum"] == 1).all()
    edited_first = ratings[(ratings["output"] == "edited")]["shown_first"].mean()
    assert 0.3 < edited_first < 0.7


@pytest.mark.parametrize("k", [1, 3])
def test_items_without_a_reading_are_left_unrated(k: int) -> None:
    items, readings = _items(10)
    del readings["req3"]
    review = ReviewParams.model_validate({"raters_per_item": k, "repeat_fraction": 0})
    ratings = simulate_ratings(items, readings, review, PixelThresholds())
    assert "item3" not in set(ratings["item_id"])
    assert ratings["item_id"].nunique() == 9


def test_simulated_raters_asked_the_bipolar_age_item_answer_it_as_a_survey_is_read() -> None:
    from acrb.review.scales import age_from_direction

    items, readings = _items(200)
    settings = {"raters_per_item": 3, "repeat_fraction": 0.1,
                "simulated": {"count": 6, "seed": 4, "noise": 0.3, "cannot_tell": 0.05}}
    change = simulate_ratings(items, readings, ReviewParams.model_validate(settings),
                              PixelThresholds())
    assert change["age_direction"].isna().all() and change["age_change"].notna().any()
    direction = simulate_ratings(
        items, readings, ReviewParams.model_validate({**settings, "age_question": "direction"}),
        PixelThresholds())
    answered = direction["age_direction"].notna()
    # From the detectors' 3 ("no change"), a noisy step to 2 or 4 is seen.
    assert set(direction.loc[answered, "age_direction"]) == {2, 3, 4}
    for score, drift in zip(direction["age_direction"], direction["age_change"], strict=True):
        expected = age_from_direction(None if pd.isna(score) else int(score))["age_change"]
        assert (pd.isna(drift) and expected is None) or drift == expected
    # The other axes are asked in the same order: the same answers either way.
    assert direction["edit_success"].equals(change["edit_success"])


@pytest.mark.parametrize(("score", "drift"), [(1, 5), (2, 3), (3, 1), (4, 3), (5, 5),
                                              (None, None)])
def test_age_from_direction(score: int | None, drift: int | None) -> None:
    from acrb.review.scales import age_from_direction

    assert age_from_direction(score) == {"age_change": drift, "age_direction": score}
