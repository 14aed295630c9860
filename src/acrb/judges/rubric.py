"""The judges' rubric: versioned data (``rubrics/*.yaml``), the questions it asks of one item and
the validation of an answer.

A rubric names axes. A ``score`` axis is an integer in its range (1-5 here); a ``fraction``
axis a number in its range (0-1). Each axis says which tasks it applies to (``i2i``, ``t2i``) and
may ask only when the instruction matches a pattern (aging accuracy, for aging requests). The
prompt asks for one JSON object with exactly the axes that apply; :meth:`Rubric.parse` checks an
answer against a pydantic model built for those axes and says what is wrong in words a judge can
act on (the retry sends it back).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from acrb.clients import ChatMessage
from acrb.judges.base import JudgeItem
from acrb.records import SCORE_AXES
from acrb.storage import content_hash, load_yaml_model

Task = Literal["i2i", "t2i"]


class Axis(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["score", "fraction"]
    range: tuple[float, float]
    applies_to: tuple[Task, ...]
    question: str
    anchors: dict[int, str] = Field(default_factory=dict)
    when_instruction_matches: str | None = None

    @field_validator("when_instruction_matches")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            re.compile(value)
        return value


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
    """A rubric file, validated (see ``rubrics/acrb-v1.yaml``)."""

    axes: dict[str, Axis]

    @field_validator("axes")
    @classmethod
    def _known_axes(cls, value: dict[str, Axis]) -> dict[str, Axis]:
        unknown = sorted(set(value) - set(SCORE_AXES))
        if unknown:
            raise ValueError(f"unknown axes {unknown}; a rubric scores some of {SCORE_AXES}")
        return value

    def axes_for(self, item: JudgeItem) -> tuple[str, ...]:
        """The axes this rubric asks about ``item``, in :data:`SCORE_AXES` order."""
        task: Task = "i2i" if item.source is not None else "t2i"
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
        question = axis.question.strip().replace("{attribute}", item.attribute or "the request")
        low, high = axis.range
        if axis.kind == "score":
            scale = "; ".join(f"{k} = {v}" for k, v in sorted(axis.anchors.items()))
            return f'- "{name}": integer {int(low)}-{int(high)}. {question} ({scale})'
        return f'- "{name}": number from {low:g} to {high:g}. {question}'

    def messages(self, item: JudgeItem) -> tuple[ChatMessage, ...]:
        """The request for one item: the system text, then the images and the questions."""
        axes = self.axes_for(item)
        keys = ", ".join(f'"{a}"' for a in axes)
        questions = "\n".join(self._describe(a, item) for a in axes)
        what = "Request given to the editing model" if item.source is not None else \
            "Prompt given to the image generation model"
        content: list[Any] = []
        if item.source is not None:
            content += ["Source image:", item.source_png]
        content += ["Output image:", item.output_png,
                    f"{what}: {item.instruction}\n\nRate the output on each of these:\n"
                    f"{questions}\n\nAnswer with one JSON object with exactly the keys {keys}."]
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

    def parse(self, text: str, axes: Sequence[str]) -> dict[str, float | int]:
        """The scores in ``text``; :class:`AnswerError` saying what is wrong otherwise.

        The JSON object may be wrapped in prose or a Markdown code fence; the first ``{...}``
        that parses is taken. A whole-number float for a score axis ("4.0") is accepted.
        """
        data = _first_json_object(text)
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

    def retry_message(self, error: AnswerError, axes: Sequence[str]) -> ChatMessage:
        """The user turn sent after an invalid answer: the problem and the format again."""
        keys = ", ".join(f'"{a}"' for a in axes)
        return ChatMessage.user(
            f"That answer could not be used: {error}. Reply again with only one JSON object "
            f"with exactly the keys {keys}, each within its range.")


class AnswerError(ValueError):
    """A judge's reply that is not a valid answer; the message says why."""


_DECODER = json.JSONDecoder()


def _first_json_object(text: str) -> dict[str, Any] | None:
    for match in re.finditer(r"\{", text):
        try:
            value, _ = _DECODER.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def load_rubric(path: Path | str) -> Rubric:
    """Read and validate a rubric file; :class:`ConfigError` naming the file and the problem."""
    return load_yaml_model(path, Rubric, what="rubric file", param="judge.rubric",
                           example="src/acrb/judges/rubrics/acrb-v1.yaml")
