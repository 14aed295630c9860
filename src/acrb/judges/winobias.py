"""The judges' WinoBias question: for each of a sentence's two occupations, who holds it?

A WinoBias output (:mod:`acrb.prompts.winobias`) shows the two people of its two input
portraits; the question (``rubrics/winobias-v1.yaml``, data) asks, for the male-coded and the
female-coded occupation in turn, whether the person of the first input image holds it, the
person of the second, both, neither, or whether it cannot be told. :class:`RoleRubric` offers
what a judge uses of the audit rubric (:class:`acrb.judges.rubric.Rubric`): the questions of one
item (the two inputs and the output as images), the JSON schema of an answer and its
validation, so a VLM judge asks it through the same retry-once flow. Answers are recorded per
judge in the score records and combined by :func:`combine_roles`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from acrb.clients import ChatMessage
from acrb.judges.items import JudgeItem
from acrb.judges.rubric import AnswerError, JudgeQuestions, _first_json_object
from acrb.records import RoleHolder
from acrb.storage import load_yaml_model

#: The two questions, in the order records list them.
ROLE_QUESTIONS: tuple[str, ...] = ("male_role_holder", "female_role_holder")
ROLE_ANSWERS: tuple[str, ...] = get_args(RoleHolder)


class RoleRubric(JudgeQuestions):
    """A WinoBias question file, validated (see ``rubrics/winobias-v1.yaml``)."""

    question: str
    roles: dict[str, str]
    answers: dict[str, str]

    def model_post_init(self, context: Any) -> None:
        if set(self.roles) != set(ROLE_QUESTIONS):
            raise ValueError(f"roles must be exactly {list(ROLE_QUESTIONS)}")
        if set(self.answers) != set(ROLE_ANSWERS):
            raise ValueError(f"answers must be exactly {list(ROLE_ANSWERS)}")

    def axes_for(self, item: JudgeItem) -> tuple[str, ...]:
        """Both questions, for every item."""
        return ROLE_QUESTIONS

    def messages(self, item: JudgeItem) -> tuple[ChatMessage, ...]:
        """The two input portraits, the output, and the two questions."""
        roles = dict(item.roles)
        lines = [self.roles[q].format(male_role=roles.get("male", "?"),
                                      female_role=roles.get("female", "?"))
                 for q in ROLE_QUESTIONS]
        choices = "; ".join(f'"{k}" = {v}' for k, v in self.answers.items())
        questions = "\n".join(f'- "{q}": {line}' for q, line in zip(ROLE_QUESTIONS, lines,
                                                                     strict=True))
        keys = ", ".join(f'"{q}"' for q in ROLE_QUESTIONS)
        content: list[Any] = []
        if item.source is not None:
            content += ["First input image:", item.source_png]
        for image in item.extra_sources:
            from acrb.storage import encode_png

            content += ["Second input image:", encode_png(image)]
        content += ["Output image:", item.output_png,
                    self.question.strip().replace("{instruction}", item.instruction)
                    + f"\n\n{questions}\n\nAnswer each with one of: {choices}.\n"
                    f"Answer with one JSON object with exactly the keys {keys}."]
        return ChatMessage.system(self.system.strip()), ChatMessage.user(*content)

    def answer_model(self, axes: Sequence[str]) -> type[BaseModel]:
        fields: dict[str, Any] = {name: (RoleHolder, ...) for name in axes}
        return create_model("RoleAnswer", __config__=ConfigDict(extra="forbid"), **fields)

    def json_schema(self, axes: Sequence[str]) -> dict[str, Any]:
        return self.answer_model(axes).model_json_schema()

    def parse(self, text: str, axes: Sequence[str]) -> dict[str, str]:
        """The answers in ``text`` (the first JSON object in it); :class:`AnswerError` saying
        what is wrong otherwise. Answers are matched without regard to case, and "cannot tell"
        is read as ``cannot_tell``."""
        data = _first_json_object(text)
        if data is None:
            raise AnswerError("the reply holds no JSON object")
        for name in axes:
            value = data.get(name)
            if isinstance(value, str):
                data[name] = value.strip().lower().replace(" ", "_")
        try:
            answer = self.answer_model(axes).model_validate(data)
        except ValidationError as exc:
            raise AnswerError("; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}"
                for e in exc.errors())) from None
        return {k: str(v) for k, v in answer.model_dump().items()}

    def retry_message(self, error: AnswerError, axes: Sequence[str]) -> ChatMessage:
        keys = ", ".join(f'"{a}"' for a in axes)
        return ChatMessage.user(
            f"That answer could not be used: {error}. Reply again with only one JSON object "
            f"with exactly the keys {keys}, each one of: {', '.join(ROLE_ANSWERS)}.")


def load_role_rubric(path: Path | str) -> RoleRubric:
    """Read and validate a WinoBias question file; errors name the file and the problem."""
    return load_yaml_model(path, RoleRubric, what="WinoBias question file",
                           param="winobias.rubric",
                           example="src/acrb/judges/rubrics/winobias-v1.yaml")


def combine_roles(per_judge: Sequence[Mapping[str, str | None]]
                  ) -> tuple[dict[str, str | None], tuple[str, ...]]:
    """The combined answer to each question and the questions marked for review.

    The judges agree: that answer. They differ, or only some answered: the first judge's
    answer (the first that answered, when the first did not) and the question needs review,
    as the study rule treats two scores more than one step apart. No judge answered: None.
    """
    combined: dict[str, str | None] = {}
    review = []
    for question in ROLE_QUESTIONS:
        answers = [j.get(question) for j in per_judge]
        given = [a for a in answers if a]
        combined[question] = given[0] if given else None
        if given and (len(given) < len(answers) or len(set(given)) > 1):
            review.append(question)
    return combined, tuple(review)
