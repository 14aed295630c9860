"""The verdict of a hypothesis (``acrb.analysis.tests.hypotheses._verdict``, the rule
``evaluate_hypotheses`` applies to every row after Holm): tests that kill the mutants the other
tests let survive (see docs/mutation.md)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from acrb.analysis.tests.hypotheses import _verdict

ALPHA = 0.05


def _row(test: str = "disparity", p_adjusted: float = 0.01, p_value: float = 0.01,
         note: str = "", mde: float = math.nan, **extra: Any) -> dict[str, Any]:
    return {"test": test, "p_adjusted": p_adjusted, "p_value": p_value, "note": note,
            "mde": mde, **extra}


def test_the_verdict_reads_the_adjusted_p_not_the_raw_one() -> None:
    assert _verdict(_row(p_value=0.01, p_adjusted=0.2), ALPHA)[0] is False
    assert _verdict(_row(p_value=0.2, p_adjusted=0.01), ALPHA) == (True, "supported")


def test_p_equal_to_alpha_is_not_significant() -> None:
    assert _verdict(_row(p_adjusted=ALPHA), ALPHA)[0] is False
    assert _verdict(_row(p_adjusted=0.0499), ALPHA)[0] is True
    assert _verdict(_row(p_adjusted=0.02), 0.01)[0] is False


def test_not_testable() -> None:
    assert _verdict(_row(p_adjusted=math.nan, note="too few sources"), ALPHA) == (
        None, "not testable (too few sources)")
    assert _verdict(_row(p_adjusted=math.nan), ALPHA) == (None, "not testable")
    assert _verdict(_row(p_adjusted=math.inf), ALPHA)[0] is None


def test_disparity_not_supported_says_the_detectable_gap() -> None:
    assert _verdict(_row(p_adjusted=0.3, mde=0.12), ALPHA) == (
        False, "not supported: no significant difference (detectable gap at this design: "
        "12.0 pp)")
    assert _verdict(_row(p_adjusted=0.3), ALPHA) == (
        False, "not supported: no significant difference")


def test_equivalence_verdicts_name_the_margin() -> None:
    assert _verdict(_row("equivalence", p_adjusted=0.01, margin=0.05), ALPHA) == (
        True, "supported: every group gap is below 5.0 pp")
    assert _verdict(_row("equivalence", p_adjusted=0.2, margin=0.05), ALPHA) == (
        False, "not shown: a gap of 5.0 pp or more cannot be excluded")
    assert _verdict(_row("equivalence", p_adjusted=0.2), ALPHA) == (
        False, "not shown: a gap of — or more cannot be excluded")


@pytest.mark.parametrize(("p", "expected"), [
    (0.01, (True, "supported: SCS > 0")),
    (0.5, (False, "not supported: SCS not significantly above 0")),
])
def test_scs_verdicts(p: float, expected: tuple[bool, str]) -> None:
    assert _verdict(_row("scs", p_adjusted=p, mde=0.1), ALPHA) == expected


# ---- evaluate_hypotheses: one row per hypothesis and model, in declaration order -----------

def _table(specs: dict, frames: dict | None = None):
    import pandas as pd

    from acrb.analysis.estimation.resampling import clustered_disparities
    from acrb.analysis.tests.hypotheses import evaluate_hypotheses
    from acrb.config import AnalyzeParams
    from tests.test_hypotheses import audit

    frames = frames or {"first": audit({}, seed=11), "second": audit({}, seed=12)}
    gaps = {m: clustered_disparities(f, "hard_refusal", n_boot=100, n_perm=100, seed=1)
            for m, f in frames.items()}
    cfg = AnalyzeParams(bootstrap=100, permutations=100, hypotheses=specs)
    table = evaluate_hypotheses(frames, gaps, cfg)
    assert isinstance(table, pd.DataFrame)
    return table


def test_every_hypothesis_and_model_gets_its_own_named_row_in_order() -> None:
    from acrb.config import HypothesisSpec

    specs = {
        "I": HypothesisSpec(claim="models differ", test="model_interaction", category="B"),
        "Z": HypothesisSpec(claim="no such category", test="disparity", category="Z"),
        "D": HypothesisSpec(claim="B differs", test="disparity", category="B"),
        "E": HypothesisSpec(claim="A is equal", test="equivalence", category="A", margin=0.4),
        "S": HypothesisSpec(claim="C gatekeeping", test="scs", category="C"),
    }
    table = _table(specs)
    assert list(zip(table["hypothesis"], table["model"], table["test"], strict=True)) == [
        ("I", "first, second", "model_interaction"),
        ("Z", "first", "disparity"), ("Z", "second", "disparity"),
        ("D", "first", "disparity"), ("D", "second", "disparity"),
        ("E", "first", "equivalence"), ("E", "second", "equivalence"),
        ("S", "first", "scs"), ("S", "second", "scs"),
    ]
    keys = zip(table["hypothesis"], table["model"], strict=True)
    verdicts = dict(zip(keys, table["verdict"], strict=True))
    # Each test ran its own rule: the equivalence verdict names its margin, the SCS one SCS.
    assert verdicts[("E", "first")] == verdicts[("E", "second")] == (
        "supported: every group gap is below 40.0 pp")
    assert all("SCS" in verdicts[("S", m)] for m in ("first", "second"))
    assert str(table["supported"].dtype) == "boolean"


def test_a_category_missing_for_one_model_only_skips_that_model() -> None:
    from acrb.config import HypothesisSpec
    from tests.test_hypotheses import audit

    first = audit({}, seed=13)
    frames = {"first": first[first["category"] != "B"], "second": audit({}, seed=14)}
    table = _table({"D": HypothesisSpec(claim="B differs", test="disparity", category="B")},
                   frames)
    assert list(table["model"]) == ["first", "second"]
    assert list(table["verdict"].str.startswith("not testable (no requests")) == [True, False]


def test_a_table_with_no_verdict_keeps_the_boolean_column_and_nan_p_values() -> None:
    import math

    from acrb.config import HypothesisSpec

    table = _table({"Z": HypothesisSpec(claim="no such category", test="disparity",
                                        category="Z")})
    assert str(table["supported"].dtype) == "boolean" and table["supported"].isna().all()
    assert all(math.isnan(p) for p in table["p_adjusted"])


def test_an_empty_table_keeps_the_boolean_column() -> None:
    table = _table({})
    assert table.empty and str(table["supported"].dtype) == "boolean"


def test_an_unknown_dimension_is_named_with_its_hypothesis() -> None:
    from acrb.config import HypothesisSpec

    spec = HypothesisSpec.model_construct(claim="c", test="disparity", outcome="hard_refusal",
                                          category=None, dimension="shoe size", margin=None)
    with pytest.raises(ValueError, match=r"^hypothesis H7: unknown dimension shoe size$"):
        _table({"H7": spec})
