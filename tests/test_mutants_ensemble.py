"""The rule that combines judges (``acrb.judges.ensemble``): tests that kill the mutants the
other tests let survive (see docs/mutation.md). The rubric is built here, with made-up
questions, so that each axis kind and range is the one the assertion needs."""

from __future__ import annotations

import pytest

from acrb.errors import ConfigError
from acrb.judges.ensemble import check_rule, combine, combine_axis
from acrb.judges.rubric import Axis, Rubric

RUBRIC = Rubric(
    name="made-up", version=1, system="Rate the edit.",
    axes={
        # A score axis agrees within 1 whatever its range ((10 - 0) / 4 would be 2.5).
        "edit_success": Axis(kind="score", range=(0, 10), applies_to=("i2i",),
                             question="Was it done?"),
        # A fraction on 1..3: agreement step (3 - 1) / 4 = 0.5.
        "cue_retention": Axis(kind="fraction", range=(1, 3), applies_to=("i2i",),
                              question="How much was kept?"),
    },
)


def test_the_study_rule_takes_at_most_two_judges() -> None:
    check_rule("study", ["a", "b"])
    check_rule("study", ["a"])
    with pytest.raises(ConfigError) as caught:
        check_rule("study", ["a", "b", "c"])
    assert caught.value.problem == ("the study ensemble rule combines two judges; judge.use "
                                    "lists 3 (a, b, c)")
    assert caught.value.fix == ("list two judges in judge.use (the first is the study's first "
                                "judge), or set judge.ensemble to mean or median")


def test_agreeing_scores_are_averaged_and_rounded_on_score_axes() -> None:
    combined = combine([{"edit_success": 3, "cue_retention": 1.5},
                        {"edit_success": 4, "cue_retention": 2.0}], RUBRIC, "study")
    # 3.5 rounds to 4 on an integer score axis; a fraction axis keeps the mean.
    assert combined.scores["edit_success"] == 4.0
    assert combined.scores["cue_retention"] == 1.75
    assert combined.review_axes == ()


def test_the_agreement_step_comes_from_the_axis_range() -> None:
    # 0.75 apart on the fraction axis is more than its step of 0.5; 2 apart on the score axis
    # is more than its step of 1: both take the first judge and go to review, in axis order.
    combined = combine([{"edit_success": 2, "cue_retention": 1.5},
                        {"edit_success": 4, "cue_retention": 2.25}], RUBRIC, "study")
    assert combined.scores["edit_success"] == 2.0
    assert combined.scores["cue_retention"] == 1.5
    assert combined.review_axes == ("edit_success", "cue_retention")
    # 0.5 apart is within the fraction axis's step.
    within = combine([{"cue_retention": 1.0}, {"cue_retention": 1.5}], RUBRIC, "study")
    assert within.scores["cue_retention"] == 1.25 and within.review_axes == ()


def test_combine_applies_the_rule_it_is_given() -> None:
    per_judge = [{"edit_success": 2}, {"edit_success": 6}]
    assert combine(per_judge, RUBRIC, "mean").scores["edit_success"] == 4.0
    assert combine(per_judge, RUBRIC, "first").scores["edit_success"] == 2.0
    assert combine(per_judge, RUBRIC, "mean").review_axes == ()


def test_the_first_rule_takes_the_first_judge() -> None:
    assert combine_axis([3, 5], "first", 1.0, True) == (3.0, False)
    assert combine_axis([], "first", 1.0, True) == (None, False)
    assert combine_axis([float("nan"), 5], "first", 1.0, True) == (None, False)


def test_an_axis_outside_the_rubric_is_not_scored() -> None:
    combined = combine([{"skin_tone": 5, "edit_success": 2}, {"skin_tone": 5, "edit_success": 2}],
                       RUBRIC, "mean")
    assert combined.scores["skin_tone"] is None
    assert combined.scores["edit_success"] == 2.0
    assert set(combined.scores) >= {"skin_tone", "edit_success", "cue_retention", "race_change"}
    assert combined.scores["race_change"] is None
    assert combined.review_axes == ()


def test_one_judge_missing_an_axis_goes_to_review() -> None:
    combined = combine([{"edit_success": 2}, {"edit_success": 2, "cue_retention": 1.0}],
                       RUBRIC, "study")
    assert combined.scores["cue_retention"] == 1.0
    assert combined.review_axes == ("cue_retention",)
