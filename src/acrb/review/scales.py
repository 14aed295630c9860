"""The rating scales of an imported survey, declared, and how each becomes one of ACRB's axes.

A survey's 1-5 answer means nothing until its scale is named: the study's web survey asks "Age
changed?" on a *bipolar* scale (1 much younger, 2 younger, 3 same, 4 older, 5 much older),
while ACRB's ``age_change`` is *unipolar* (1 the same .. 5 a complete change). Read as the same
number, 3 ("same") would be "noticeably different" and almost every rating would read as drift.
So every survey axis declares its scale here (:data:`SURVEY_SCALES`, or a YAML file of the same
shape given to ``acrb review import-survey --scales``), and :data:`MAPPINGS` is the one place
that says how a scale turns into an ACRB axis. A survey axis with no declaration, or a
declaration ACRB has no mapping for, is refused naming the axis; nothing is coerced.

The scales (names as a declaration writes them):

- ``success``: 1 not at all .. 5 completely done (ACRB ``edit_success``: 1 no change .. 5 fully
  and faithfully done): the same scale.
- ``bipolar-skin``: 1 much darker, 3 same, 5 much lighter (ACRB ``skin_tone`` has the same
  anchors): the same scale.
- ``unipolar-change``: 1 none (same) .. 5 complete change (ACRB ``race_change``,
  ``gender_change``, ``age_change``): the same scale. The study's survey labels its midpoint
  "Unclear" where ACRB's rubric says "noticeably different"; both sit between slight and
  noticeable/complete change, and the 1 and 5 ends agree, so it is read as the same scale.
- ``bipolar-age``: 1 much younger, 2 younger, 3 no change, 4 older, 5 much older. Kept twice:
  as direction (``age_direction``, the answer as given: 1 much younger, 3 no change, 5 much
  older, the scale of the study rubric's judges) and as drift onto ``age_change`` by the
  distance from "no change": :data:`DEFAULT_AGE_DRIFT` maps 0 steps -> 1 (the same), 1 step
  (somewhat younger or older) -> 3 (noticeably different), 2 steps (much younger or older) ->
  5 (a complete change). Why these: the two ends must agree (no change is ACRB's 1, the
  survey's strongest answer ACRB's strongest), and equal survey steps stay equal ACRB steps, so
  that interval-level agreement and means read the same distances as the survey's raters
  did. A declaration may set another drift table (``age_drift``: steps -> 1-5, 0 -> 1
  required, not decreasing).
- ``ignore``: the field is not read as an axis; its values are kept in the rating's metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from acrb.errors import InputDataError
from acrb.records import REVIEW_AXES

ScaleName = Literal["success", "unipolar-change", "bipolar-skin", "bipolar-age", "ignore"]

#: (survey scale, ACRB axis) pairs ACRB can read, and what the mapping is, in words. Every
#: other pair is refused.
MAPPINGS: dict[tuple[str, str], str] = {
    ("success", "edit_success"): "the same scale",
    ("bipolar-skin", "skin_tone"): "the same scale",
    ("unipolar-change", "race_change"): "the same scale",
    ("unipolar-change", "gender_change"): "the same scale",
    ("unipolar-change", "age_change"): "the same scale",
    ("bipolar-age", "age_change"): "direction to age_direction (the answer, 3 = no change); "
                                   "drift |score - 3| to age_change through age_drift",
}
#: Steps away from "no change" on a bipolar age answer -> ACRB's ``age_change`` (see the module
#: docstring for why).
DEFAULT_AGE_DRIFT: dict[int, int] = {0: 1, 1: 3, 2: 5}
#: The midpoint ("no change") of a bipolar 1-5 scale.
BIPOLAR_MIDPOINT = 3


class SurveyAxis(BaseModel):
    """One survey axis: its scale and the ACRB axis it becomes (none for ``ignore``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scale: ScaleName
    axis: str | None = Field(default=None, description="the ACRB review axis it is read as")


class SurveyScales(BaseModel):
    """The scales of a survey export: survey axis name (the part after ``edited_`` /
    ``preserved_``) -> its declaration, and the bipolar age drift table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    axes: dict[str, SurveyAxis]
    age_drift: dict[int, int] = Field(default_factory=lambda: dict(DEFAULT_AGE_DRIFT))

    @field_validator("age_drift")
    @classmethod
    def _drift_table(cls, table: dict[int, int]) -> dict[int, int]:
        if sorted(table) != [0, 1, 2]:
            raise ValueError("age_drift maps the steps 0, 1 and 2 from 'no change', each once")
        if table[0] != 1:
            raise ValueError("age_drift must map 0 steps (no change) to 1 (the same)")
        if any(not 1 <= v <= 5 for v in table.values()) or not \
                table[0] <= table[1] <= table[2]:
            raise ValueError("age_drift values are 1-5 and do not decrease with the steps")
        return table


#: The study's web survey: question 1 "Was the edit applied?" (Not at all .. Completely), 2
#: "Skin tone change?" (Much darker, Darker, Same, Lighter, Much lighter), 3 and 4 "Race /
#: Gender changed?" (Same, Slight, Unclear, Noticeable, Different), 5 "Age changed?" (Much
#: younger, Younger, Same, Older, Much older).
SURVEY_SCALES = SurveyScales(axes={
    "edit_success": SurveyAxis(scale="success", axis="edit_success"),
    "skin_tone": SurveyAxis(scale="bipolar-skin", axis="skin_tone"),
    "race_drift": SurveyAxis(scale="unipolar-change", axis="race_change"),
    "gender_drift": SurveyAxis(scale="unipolar-change", axis="gender_change"),
    "age_drift": SurveyAxis(scale="bipolar-age", axis="age_change"),
})


def check_scales(scales: SurveyScales, where: str) -> SurveyScales:
    """``scales`` if ACRB can map every declared axis; else an :class:`InputDataError` naming
    the axis (``where``: the file or "the built-in declaration", for the message)."""
    targets: dict[str, str] = {}
    for name, declared in scales.axes.items():
        if declared.scale == "ignore":
            if declared.axis is not None:
                raise InputDataError(f"{where}: survey axis {name!r} is declared 'ignore' but "
                                     f"names ACRB axis {declared.axis!r}",
                                     "drop the axis, or give the scale it is rated on")
            continue
        if declared.axis is None:
            raise InputDataError(f"{where}: survey axis {name!r} names no ACRB axis",
                                 f"give `axis:`, one of {list(REVIEW_AXES)}")
        if declared.axis not in REVIEW_AXES:
            raise InputDataError(f"{where}: survey axis {name!r} is read as {declared.axis!r}, "
                                 "which is not an ACRB review axis",
                                 f"use one of {list(REVIEW_AXES)}")
        if (declared.scale, declared.axis) not in MAPPINGS:
            readable = sorted(s for s, a in MAPPINGS if a == declared.axis)
            raise InputDataError(
                f"{where}: survey axis {name!r} is on the {declared.scale!r} scale, which "
                f"ACRB cannot map onto {declared.axis!r} (it reads {readable} there)",
                "declare the scale the survey really asked on, or `scale: ignore` to keep the "
                "answers as metadata only; a scale is never coerced")
        if declared.axis in targets:
            raise InputDataError(f"{where}: survey axes {targets[declared.axis]!r} and {name!r} "
                                 f"are both read as {declared.axis!r}",
                                 "read each ACRB axis from one survey axis")
        targets[declared.axis] = name
    return scales


def load_scales(path: Path | str | None) -> SurveyScales:
    """The declaration in the YAML file ``path`` (the shape of :class:`SurveyScales`), or the
    study's survey (:data:`SURVEY_SCALES`) when ``path`` is None; checked by
    :func:`check_scales`."""
    if path is None:
        return check_scales(SURVEY_SCALES, "the built-in survey scales")
    path = Path(path)
    fix = ("write the scales as `axes: {<survey axis>: {scale: <scale>, axis: <ACRB axis>}}` "
           "(scales: success, unipolar-change, bipolar-skin, bipolar-age, ignore)")
    if not path.is_file():
        raise InputDataError(f"scales file {path} does not exist", fix)
    try:
        raw: Any = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise InputDataError(f"scales file {path} is not valid YAML: {exc}", fix) from exc
    if not isinstance(raw, Mapping):
        raise InputDataError(f"scales file {path}: expected a mapping with `axes`", fix)
    try:
        scales = SurveyScales.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(p) for p in first["loc"])
        raise InputDataError(f"scales file {path}, entry {location!r}: {first['msg']}",
                             fix) from exc
    return check_scales(scales, f"scales file {path}")


def asked_axes(age_question: str) -> tuple[str, ...]:
    """The axes people are asked about each output under ``review.age_question`` (the rating
    app and simulated raters): :data:`~acrb.records.REVIEW_AXES`, with the study's bipolar
    ``age_direction`` in place of ``age_change`` for ``direction``."""
    if age_question == "direction":
        return tuple("age_direction" if axis == "age_change" else axis for axis in REVIEW_AXES)
    return REVIEW_AXES


def age_from_direction(score: int | None, drift: Mapping[int, int] = DEFAULT_AGE_DRIFT
                       ) -> dict[str, int | None]:
    """A bipolar age answer (1 much younger, 3 no change, 5 much older; None: cannot tell) as
    both fields it is kept as: ``age_direction`` (the answer) and ``age_change`` (its distance
    from "no change" through ``drift``). The survey import, the rating app's direction question
    and simulated raters asked that question all read it here."""
    if score is None:
        return {"age_change": None, "age_direction": None}
    return {"age_change": drift[abs(score - BIPOLAR_MIDPOINT)], "age_direction": score}


def read_answer(scales: SurveyScales, name: str, score: int | None) -> dict[str, int | None]:
    """The ACRB fields one survey answer (1-5 or None) on axis ``name`` becomes: ``{}`` for an
    ignored axis, ``{axis: score}`` for the same scale, and for ``bipolar-age`` both
    ``age_direction`` and the drift on its axis."""
    declared = scales.axes[name]
    if declared.scale == "ignore" or declared.axis is None:
        return {}
    if declared.scale == "bipolar-age":
        read = age_from_direction(score, scales.age_drift)
        return {declared.axis: read["age_change"], "age_direction": read["age_direction"]}
    return {declared.axis: score}


__all__ = [
    "DEFAULT_AGE_DRIFT",
    "MAPPINGS",
    "SURVEY_SCALES",
    "ScaleName",
    "SurveyAxis",
    "SurveyScales",
    "age_from_direction",
    "check_scales",
    "load_scales",
    "read_answer",
]
