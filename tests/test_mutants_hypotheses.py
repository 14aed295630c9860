"""The verdict of a hypothesis (``acrb.analysis.hypotheses._verdict``, the rule
``evaluate_hypotheses`` applies to every row after Holm): tests that kill the mutants the other
tests let survive (see docs/mutation.md)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from acrb.analysis.hypotheses import _verdict

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
