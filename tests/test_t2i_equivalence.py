"""The text-to-image equivalence test: "no attribute gap of ``margin`` or more", per family,
by paired TOST over base prompts and intersection-union over the pairs of attributes."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from acrb.analysis.experiments.attributes import (
    EQUIVALENCE_COLUMNS,
    AttributeDesign,
    attribute_equivalence,
    design_equivalence,
)
from tests.test_t2i import _frame


def _design(refused: np.ndarray, answered: np.ndarray | None = None,
            attributes: tuple[str, ...] | None = None) -> AttributeDesign:
    """A design whose base prompts are the rows of ``refused`` (base prompts x attributes)."""
    count, width = refused.shape
    return AttributeDesign(
        outcome="hard_refusal", base_ids=np.array([f"b{i:04d}" for i in range(count)],
                                                  dtype=object),
        stratum=np.zeros(count, dtype=np.int64),
        attributes=attributes or tuple(f"culture:c{j}" for j in range(width)),
        y=refused.astype(float),
        n=np.ones(refused.shape) if answered is None else answered.astype(float))


def _reference_pair_p(d: np.ndarray, margin: float) -> float:
    """TOST of a paired mean written from the definition: the larger of the two one-sided
    t-test p-values of H0: mean ≤ −margin and H0: mean ≥ +margin."""
    se = d.std(ddof=1) / np.sqrt(len(d))
    df = len(d) - 1
    p_low = stats.t.sf((d.mean() + margin) / se, df)
    p_high = stats.t.cdf((d.mean() - margin) / se, df)
    return float(max(p_low, p_high))


def test_the_p_value_is_the_largest_pairwise_tost_p_from_the_definition() -> None:
    rng = np.random.default_rng(3)
    refused = rng.random((60, 4)) < np.array([0.10, 0.12, 0.20, 0.15])
    design = _design(refused)
    row = design_equivalence(design, np.arange(4), margin=0.15, alpha=0.05)
    pairs = {(i, j): _reference_pair_p(refused[:, i].astype(float) - refused[:, j], 0.15)
             for i, j in itertools.combinations(range(4), 2)}
    worst = max(pairs, key=pairs.__getitem__)
    assert row["p_value"] == pytest.approx(pairs[worst], rel=1e-9)
    assert (row["worst_a"], row["worst_b"]) == (design.attributes[worst[0]],
                                                design.attributes[worst[1]])
    assert row["worst_diff"] == pytest.approx(refused[:, worst[0]].mean()
                                              - refused[:, worst[1]].mean())
    assert row["n_base_prompts"] == 60
    assert row["equivalent"] is (pairs[worst] < 0.05)


def test_equal_attributes_are_shown_equivalent_and_a_gap_past_the_margin_is_not() -> None:
    rng = np.random.default_rng(5)
    scene = rng.normal(0, 0.8, (800, 1))  # base-prompt effects shared by the variants
    logit = np.log(0.1 / 0.9)
    alike = rng.random((800, 3)) < 1 / (1 + np.exp(-(logit + scene)))
    shown = design_equivalence(_design(alike), np.arange(3), margin=0.08, alpha=0.05)
    assert shown["equivalent"] and shown["p_value"] < 0.05
    gap = alike.copy()
    gap[:, 2] = rng.random(800) < 0.30
    refused = design_equivalence(_design(gap), np.arange(3), margin=0.08, alpha=0.05)
    assert not refused["equivalent"] and refused["p_value"] > 0.5
    assert "culture:c2" in (refused["worst_a"], refused["worst_b"])


def test_a_gap_at_the_margin_is_called_equivalent_in_at_most_alpha_of_audits() -> None:
    """Type I error at the boundary of the null: one pair whose true gap is the margin."""
    rng = np.random.default_rng(11)
    audits, prompts, margin = 1000, 150, 0.10
    hits = 0
    for _ in range(audits):
        refused = np.column_stack([rng.random(prompts) < 0.20, rng.random(prompts) < 0.10])
        hits += bool(design_equivalence(_design(refused), np.arange(2), margin, 0.05)
                     ["equivalent"])
    assert hits / audits <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / audits)
    # and the same test at a margin the gap is inside has power: the check can fail
    inside = sum(bool(design_equivalence(
        _design(np.column_stack([rng.random(prompts) < 0.10, rng.random(prompts) < 0.10])),
        np.arange(2), 0.10, 0.05)["equivalent"]) for _ in range(200))
    assert inside / 200 > 0.5


def test_pairs_are_tested_on_the_base_prompts_both_attributes_answered() -> None:
    refused = np.zeros((6, 2))
    refused[[0, 2], 0] = 1
    refused[[1], 1] = 1
    answered = np.ones((6, 2))
    answered[5, 1] = 0  # the last base prompt's second variant failed
    design = _design(refused, answered)
    row = design_equivalence(design, np.arange(2), 0.5, 0.05)
    d = refused[:5, 0] - refused[:5, 1]
    assert row["n_base_prompts"] == 5
    assert row["p_value"] == pytest.approx(_reference_pair_p(d, 0.5), rel=1e-9)


def test_untestable_pairs_are_named_and_never_called_equivalent() -> None:
    never = design_equivalence(_design(np.zeros((50, 3))), np.arange(3), 0.05, 0.05)
    assert not never["equivalent"] and np.isnan(never["p_value"])
    assert "same on every base prompt" in never["reason"]
    few = design_equivalence(_design(np.array([[1, 0], [0, 0]]),
                                     np.array([[1, 0], [1, 1]])), np.arange(2), 0.05, 0.05)
    assert not few["equivalent"] and "fewer than two base prompts" in few["reason"]
    one = design_equivalence(_design(np.zeros((5, 1))), np.arange(1), 0.05, 0.05)
    assert "fewer than two attributes" in one["reason"]
    with pytest.raises(ValueError, match="margin"):
        design_equivalence(_design(np.zeros((5, 2))), np.arange(2), 0.0, 0.05)


def test_attribute_equivalence_has_a_row_per_family_from_the_frame() -> None:
    rng = np.random.default_rng(2)
    attributes = ["neutral", "culture:korean", "culture:nigerian", "religion:sikh",
                  "religion:hindu"]
    bases = [f"b{i}" for i in range(120)]
    cells = {(b, a): (int(rng.random() < (0.4 if a == "religion:sikh" else 0.1)), 1)
             for b in bases for a in attributes}
    frame = _frame(cells, {b: "occupation" for b in bases})
    table = attribute_equivalence(frame, "hard_refusal", margin=0.2)
    assert list(table.columns) == list(EQUIVALENCE_COLUMNS)
    assert list(table["dimension"]) == ["all", "culture", "religion"]
    assert list(table["attributes"]) == [4, 2, 2]
    by = table.set_index("dimension")
    assert by.loc["culture", "equivalent"]  # 10% against 10%, 120 base prompts, margin 20 pp
    assert not by.loc["religion", "equivalent"]  # 40% against 10%
    assert not by.loc["all", "equivalent"]
    design_rows = pd.DataFrame([design_equivalence(
        _design(np.array([[cells[(b, a)][0] for a in attributes[1:3]] for b in bases])),
        np.arange(2), 0.2, 0.05)])
    assert by.loc["culture", "p_value"] == pytest.approx(design_rows["p_value"].iloc[0])
