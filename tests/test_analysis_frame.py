"""One model's analysis frame is checked once, where it is made, and handed on as a type known
to be valid (acrb.analysis.frame.AnalysisFrame): the statistics take it as it is, and check a
plain frame someone built by hand."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from acrb.analysis import frame as frame_module
from acrb.analysis.frame import AnalysisFrame, checked_frame
from acrb.analysis.outputs.section import build_model_section
from acrb.errors import InputDataError


def design(n: int = 240) -> pd.DataFrame:
    """Two prompt categories, 24 sources of two races, two genders and two ages."""
    rows = pd.Series(range(n))
    return pd.DataFrame({
        "request_id": [f"r{i}" for i in rows],
        "source_id": [f"s{i % 24}" for i in rows],
        "prompt_id": [f"p{i // 24}" for i in rows],
        "category": ["A" if i // 24 < 5 else "B" for i in rows],
        "status": "ok",
        "race": ["Black" if i % 24 < 12 else "White" for i in rows],
        "gender": ["Female" if i % 2 else "Male" for i in rows],
        "age": ["20s" if i % 4 < 2 else "70plus" for i in rows],
        "hard_refusal": pd.array([(i * 7) % 10 < (4 if i % 24 < 12 else 2) for i in rows],
                                 dtype="boolean"),
    })


def test_a_checked_frame_is_the_same_data_and_is_not_checked_again() -> None:
    plain = design()
    checked = checked_frame(plain)
    assert isinstance(checked, AnalysisFrame)
    pd.testing.assert_frame_equal(pd.DataFrame(checked), plain)
    assert checked_frame(checked) is checked
    # A subset of one model's rows, or the frame with a column added, is still one model's.
    assert isinstance(checked[checked["category"] == "A"], AnalysisFrame)
    assert isinstance(checked.assign(extra=1), AnalysisFrame)


def test_a_plain_frame_is_refused_naming_what_is_wrong() -> None:
    with pytest.raises(InputDataError, match="status"):
        checked_frame(design().drop(columns=["status"]))
    pooled = design().assign(model=["a", "b"] * 120)
    with pytest.raises(ValueError, match="pools several models"):
        checked_frame(pooled)


def test_a_models_section_checks_its_frame_once(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = frame_module.check_single_model

    def counted(frame: pd.DataFrame) -> None:
        calls.append(len(frame))
        real(frame)

    monkeypatch.setattr(frame_module, "check_single_model", counted)
    settings = {"bootstrap": 50, "permutations": 50, "power": 0.8, "draw_figures": False}
    checked = checked_frame(design())
    assert calls == [240]
    on_checked = build_model_section(checked, "m", "k", False, tmp_path, **settings)
    assert calls == [240], "a statistic checked the frame the section was given again"
    on_plain = build_model_section(design(), "m", "k", False, tmp_path, **settings)
    # Handed a plain frame, the statistics check what they are given (each power row's
    # subset among them); the numbers are the same either way.
    assert len(calls) > 2
    pd.testing.assert_frame_equal(on_checked.disparities, on_plain.disparities)
    pd.testing.assert_frame_equal(on_checked.rates, on_plain.rates)
