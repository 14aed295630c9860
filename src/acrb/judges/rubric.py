"""The judges' rubric: versioned data (``rubrics/*.yaml``), the questions it asks of one item and
the validation of an answer.

A rubric names axes. A ``score`` axis is an integer in its range (1-5 here); a ``fraction``
axis a number in its range (0-1). Each axis says which tasks it applies to (``i2i``, ``t2i``) and
may ask only when the instruction matches a pattern (aging accuracy, for aging requests), or ask
another question when the instruction requests the change it measures (``requested``: the study
rubric's age item rates an aging edit against the age asked for). The prompt asks for one JSON
object with exactly the axes that apply; :meth:`Rubric.parse` checks an answer against a
pydantic model built for those axes and says what is wrong in words a judge can act on (the
retry sends it back).

Two rubrics ship: ``acrb-v1`` (ACRB's, the default) and ``study-v1`` (the seed study's scales in
ACRB's words: a bipolar age axis ``age_direction``, no cue retention). A rubric may also hold
the wording of the judge prompt options of params ``judges.<name>.prompt``: ``labels`` (a
sentence stating the source's race, gender and age) and ``observations`` (asking for written
observations before the scores). An option whose wording the rubric lacks is refused
(:meth:`Rubric.check_prompt`), so every word a judge reads is versioned data.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from acrb.clients import ChatMessage
from acrb.errors import ConfigError, InputDataError
from acrb.judges.items import JudgeItem
from acrb.records import SCORE_AXES
from acrb.storage import content_hash, load_yaml_model

if TYPE_CHECKING:
    from acrb.config import JudgePromptParams

Task = Literal["i2i", "t2i"]

#: The source labels a rubric's ``labels`` sentence names, as ``{race}``, ``{gender}``, ``{age}``.
LABEL_FIELDS: tuple[str, ...] = ("race", "gender", "age")


def _compiles(value: str | None) -> str | None:
    if value is not None:
        re.compile(value)
    return value


class RequestedChange(BaseModel):
    """The question an axis asks instead where the instruction requests the change the axis
    measures (an aging request, for the study's age item): the same scale, read against the
    request rather than against no change."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    when_instruction_matches: str
    question: str
    anchors: dict[int, str] = Field(default_factory=dict, description="the anchors asked "
                                    "instead (default: the axis's own)")

    _pattern = field_validator("when_instruction_matches")(_compiles)


class Axis(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["score", "fraction"]
    range: tuple[float, float]
    applies_to: tuple[Task, ...]
    question: str
    anchors: dict[int, str] = Field(default_factory=dict)
    when_instruction_matches: str | None = None
    requested: RequestedChange | None = None

    _pattern = field_validator("when_instruction_matches")(_compiles)

    def is_requested(self, instruction: str) -> bool:
        """Whether ``instruction`` requests the change this axis measures (its ``requested``
        question is then asked)."""
        return self.requested is not None and bool(
            re.search(self.requested.when_instruction_matches, instruction))


class JudgeQuestions(BaseModel):
    """What every judge question file shares: a name and version, the system prompt, and the
    digest that makes the file part of each judge's identity."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: int
    system: str

    @property
    def label(self) -> str:
        """``name@version``, as tables and the report name the file."""
        return f"{self.name}@{self.version}"

    @cached_property
    def digest(self) -> str:
        """Hash of the whole file: part of every judge's identity."""
        return content_hash(self.model_dump(mode="json"))


class Rubric(JudgeQuestions):
    """A rubric file, validated (see ``rubrics/acrb-v1.yaml`` and ``rubrics/study-v1.yaml``)."""

    axes: dict[str, Axis]
    labels: str | None = Field(
        default=None, description="the sentence stating the source's labels, with {race}, "
        "{gender} and {age}, for judges whose params ask for labels")
    observations: str | None = Field(
        default=None, description="what to write before the scores, for judges whose params "
        "ask for observations first")

    @field_validator("axes")
    @classmethod
    def _known_axes(cls, value: dict[str, Axis]) -> dict[str, Axis]:
        unknown = sorted(set(value) - set(SCORE_AXES))
        if unknown:
            raise ValueError(f"unknown axes {unknown}; a rubric scores some of {SCORE_AXES}")
        return value

    @field_validator("labels")
    @classmethod
    def _label_fields(cls, value: str | None) -> str | None:
        if value is not None:
            import string

            named = sorted(n for _, n, _, _ in string.Formatter().parse(value) if n is not None)
            if named != sorted(LABEL_FIELDS):
                raise ValueError(f"the labels sentence must name {{race}}, {{gender}} and "
                                 f"{{age}} once each and nothing else (found {named})")
        return value

    def check_prompt(self, prompt: JudgePromptParams, where: str) -> None:
        """:class:`ConfigError` when ``prompt`` (params ``where``) turns on an option whose
        wording this rubric does not hold."""
        missing = [f"`{text}` (for {option})" for option, text, on in (
            ("labels", "labels", prompt.labels),
            ("observations_first", "observations", prompt.observations_first))
            if on and getattr(self, text) is None]
        if missing:
            raise ConfigError(
                f"{where} asks for a prompt option that rubric {self.label} has no wording for: "
                f"it lacks {', '.join(missing)}",
                "use a rubric that words it (src/acrb/judges/rubrics/study-v1.yaml), add the "
                "text to your rubric file with a new version, or turn the option off")

    def axes_for(self, item: JudgeItem) -> tuple[str, ...]:
        """The axes this rubric asks about ``item``, in :data:`SCORE_AXES` order."""
        task: Task = "i2i" if item.is_edit else "t2i"
        asked = []
        for name in SCORE_AXES:
            axis = self.axes.get(name)
            if axis is None or task not in axis.applies_to:
                continue
            pattern = axis.when_instruction_matches
            if pattern is not None and not re.search(pattern, item.instruction):
                continue
            asked.append(name)
        return tuple(asked)

    def _describe(self, name: str, item: JudgeItem) -> str:
        axis = self.axes[name]
        question, anchors = axis.question, axis.anchors
        if axis.requested is not None and axis.is_requested(item.instruction):
            question, anchors = axis.requested.question, axis.requested.anchors or anchors
        question = question.strip().replace("{attribute}", item.attribute or "the request")
        low, high = axis.range
        if axis.kind == "score":
            scale = "; ".join(f"{k} = {v}" for k, v in sorted(anchors.items()))
            return f'- "{name}": integer {int(low)}-{int(high)}. {question} ({scale})'
        return f'- "{name}": number from {low:g} to {high:g}. {question}'

    def states_labels(self, item: JudgeItem, prompt: JudgePromptParams | None) -> bool:
        """Whether the request for ``item`` states the source's labels: the option is on and
        the stage gave the item its labels (an edit's source; never a generation)."""
        return bool(prompt is not None and prompt.labels and self.labels is not None
                    and item.is_edit
                    and all(item.labels.get(f) for f in LABEL_FIELDS))

    def messages(self, item: JudgeItem, prompt: JudgePromptParams | None = None
                 ) -> tuple[ChatMessage, ...]:
        """The request for one item: the system text, then the images and the questions.

        With ``prompt`` (params ``judges.<name>.prompt``) the rubric's ``labels`` sentence
        follows the request (:meth:`states_labels`), and ``observations`` asks for written
        observations before the JSON object; without, the request is exactly as it always was.
        """
        axes = self.axes_for(item)
        keys = ", ".join(f'"{a}"' for a in axes)
        questions = "\n".join(self._describe(a, item) for a in axes)
        what = "Request given to the editing model" if item.is_edit else \
            "Prompt given to the image generation model"
        stated = ""
        if self.states_labels(item, prompt):
            assert self.labels is not None
            stated = "\n" + self.labels.strip().format(
                **{f: label_words(f, item.labels[f]) for f in LABEL_FIELDS})
        answer = f"Answer with one JSON object with exactly the keys {keys}."
        if prompt is not None and prompt.observations_first:
            assert self.observations is not None  # check_prompt
            answer = (f"{self.observations.strip()}\nEnd your answer with one JSON object "
                      f"with exactly the keys {keys}.")
        content: list[Any] = []
        if item.is_edit:
            content += ["Source image:", item.source_png]
        content += ["Output image:", item.output_png,
                    f"{what}: {item.instruction}{stated}\n\nRate the output on each of these:"
                    f"\n{questions}\n\n{answer}"]
        return ChatMessage.system(self.system.strip()), ChatMessage.user(*content)

    def answer_model(self, axes: Sequence[str]) -> type[BaseModel]:
        """A pydantic model accepting exactly ``axes`` in their ranges."""
        fields: dict[str, Any] = {}
        for name in axes:
            axis = self.axes[name]
            low, high = axis.range
            if axis.kind == "score":
                fields[name] = (int, Field(ge=int(low), le=int(high), strict=True))
            else:
                fields[name] = (float, Field(ge=low, le=high))
        return create_model(
            f"Answer_{'_'.join(axes) or 'none'}", __config__=ConfigDict(extra="forbid"),
            **fields)

    def json_schema(self, axes: Sequence[str]) -> dict[str, Any]:
        """The JSON schema of an answer, for backends that constrain output to a schema."""
        return self.answer_model(axes).model_json_schema()

    def parse(self, text: str, axes: Sequence[str], *, last: bool = False
              ) -> dict[str, float | int]:
        """The scores in ``text``; :class:`AnswerError` saying what is wrong otherwise.

        The JSON object may be wrapped in prose or a Markdown code fence; the first ``{...}``
        that parses is taken, or with ``last`` (observations written before the scores) the
        last one, so braces in the observations cannot stand for the answer. A whole-number
        float for a score axis ("4.0") is accepted.
        """
        objects = _json_objects(text)
        data = (objects[-1] if last else objects[0]) if objects else None
        if data is None:
            raise AnswerError("the reply holds no JSON object")
        for name in axes:
            value = data.get(name)
            if self.axes[name].kind == "score" and isinstance(value, float) and value.is_integer():
                data[name] = int(value)
        try:
            answer = self.answer_model(axes).model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}"
                for e in exc.errors()
            )
            raise AnswerError(problems) from None
        return answer.model_dump()

    def out_of_range(self, scores: Mapping[str, Any], *, whole: bool = True
                     ) -> list[tuple[str, Any]]:
        """The axes of a stored answer ``scores`` (axis -> value, None where not asked) that this
        rubric scores and whose value no answer it validated could hold: not a number, outside
        the axis's range, NaN, or (with ``whole``, for one judge's answer rather than a mean of
        several) a fraction on a score axis; each with its value, in the rubric's order. An
        answer is checked by :meth:`parse` when it is made; this is for answers read back (a
        record or table edited, or written by another rubric under the same id)."""
        found = []
        for name, axis in self.axes.items():
            value = scores.get(name)
            if value is None:
                continue
            low, high = axis.range
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not low <= value <= high or (
                    whole and axis.kind == "score" and not float(value).is_integer()):
                found.append((name, value))
        return found

    def range_text(self, name: str) -> str:
        """An axis's range as a reader writes it: ``1-5``, ``0-1``."""
        low, high = self.axes[name].range
        return f"{low:g}-{high:g}"

    def retry_message(self, error: AnswerError, axes: Sequence[str]) -> ChatMessage:
        """The user turn sent after an invalid answer: the problem and the format again."""
        keys = ", ".join(f'"{a}"' for a in axes)
        return ChatMessage.user(
            f"That answer could not be used: {error}. Reply again with only one JSON object "
            f"with exactly the keys {keys}, each within its range.")


class AnswerError(ValueError):
    """A judge's reply that is not a valid answer; the message says why."""


_DECODER = json.JSONDecoder()


def _json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects in ``text``, in order: at each ``{`` the first that decodes, then the
    search goes on after its end (an object's nested objects are not listed apart)."""
    found: list[dict[str, Any]] = []
    start = text.find("{")
    while start >= 0:
        try:
            value, end = _DECODER.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            found.append(value)
            start = text.find("{", end)
        else:
            start = text.find("{", start + 1)
    return found


def _first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (None when there is none)."""
    objects = _json_objects(text)
    return objects[0] if objects else None


def label_words(field: str, value: str) -> str:
    """A source label as the judge reads it: ``SoutheastAsian`` -> ``Southeast Asian``,
    ``70plus`` -> ``70 or older``, ``30s`` -> ``30s``; others as they are."""
    if field == "race":
        return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", value)
    if field == "age" and value.endswith("plus"):
        return f"{value[:-4]} or older"
    return value


#: How many stored answers out of range an error names (it always says how many there are).
_NAMED_ANSWERS = 3


def check_stored_scores(rubric: Rubric, judge: str, where: Path,
                        answers: Mapping[str, Mapping[str, Any]], fix: str | None = None, *,
                        whole: bool = True) -> None:
    """Refuse stored answers of ``judge`` (request id -> axis -> value, read back from
    ``where``: the folder of its records, or a table) that hold a score
    :meth:`Rubric.out_of_range`: an :class:`~acrb.errors.InputDataError` naming the judge,
    ``where``, the first requests with their axis, value and range, and how many there are,
    with ``fix`` (default: for the records folder of :mod:`acrb.journal`). Such a score would
    flow into the verdicts and every rate as if a judge had given it. ``whole``: see
    :meth:`Rubric.out_of_range` (False for the judges' combined scores)."""
    problems = [(rid, name, value) for rid, scores in answers.items()
                for name, value in rubric.out_of_range(scores, whole=whole)]
    if not problems:
        return
    named = "; ".join(f"request {rid}: {name} = {value!r} (range {rubric.range_text(name)})"
                      for rid, name, value in problems[:_NAMED_ANSWERS])
    more = len(problems) - _NAMED_ANSWERS
    raise InputDataError(
        f"judge '{judge}': {len(problems)} stored score(s) in {where} outside the ranges of "
        f"rubric {rubric.label}: {named}" + (f"; and {more} more" if more > 0 else ""),
        fix or f"delete those requests' lines from the records files in {where} (records.jsonl, "
        f"and records.journal/ after a crash): they are asked again; or delete {where} to "
        f"rerun judge '{judge}' on every output")


def table_answers(table: Any, axes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The scored rows of a score or verdicts table (a DataFrame with ``request_id``,
    ``status`` and the ``axes`` columns) as :func:`check_stored_scores` takes them: request id
    -> axis -> value, Python numbers, None where missing."""
    scored = table[table["status"] == "scored"]
    columns = [axis for axis in axes if axis in scored.columns]
    values = scored[columns].astype(object)
    values = values.where(values.notna(), None)
    return dict(zip(scored["request_id"].astype(str), values.to_dict("records"), strict=True))


def load_rubric(path: Path | str) -> Rubric:
    """Read and validate a rubric file; :class:`ConfigError` naming the file and the problem."""
    return load_yaml_model(path, Rubric, what="rubric file", param="judge.rubric",
                           example="src/acrb/judges/rubrics/acrb-v1.yaml")
