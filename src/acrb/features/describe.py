"""Feature prompts: the VLM describer, the describers' ids, and p_feat from seven descriptions.

The VLM describer shows each source portrait to a vision-language model through the judges'
client layer (:mod:`acrb.clients`: reply cache by content hash, rate limit, retries on 429/5xx)
and asks for one JSON object with the seven :data:`~acrb.records.FEATURE_DIMENSIONS` as short
noun phrases (instructions: ``data/describer-v1.yaml``). An answer is used only if it is a JSON
object with exactly those keys, each a string within the instructions' length bounds, and no
description names a race, ethnicity or nationality (:mod:`acrb.features.labels`). Otherwise
the conversation goes on with the reason, up to ``retries`` more requests; every refused
answer's reason is kept (``rejected``). A source still without a usable answer stops the stage:
a labelled feature prompt is never used. All sources' requests of one round go to the client
together (concurrent for an API), and a rerun sends nothing: the answers come from the cache.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from acrb.errors import InputDataError
from acrb.features.labels import label_check
from acrb.records import FEATURE_DIMENSIONS
from acrb.storage import content_hash, load_yaml_model, sha256_file

if TYPE_CHECKING:
    from acrb.clients import ChatClient, ChatMessage, ChatReply


class Instructions(BaseModel):
    """The describer's instructions file (versioned data)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: int
    system: str
    dimensions: dict[str, str]
    user: str
    retry: str
    min_chars: int = Field(ge=1)
    max_chars: int = Field(ge=8)
    sha256: str = ""

    def messages(self, image: bytes) -> tuple[ChatMessage, ...]:
        """The first request for one portrait (PNG or JPEG bytes)."""
        from acrb.clients import ChatMessage

        questions = "\n".join(f"- {name}: {' '.join(what.split())}"
                              for name, what in self.dimensions.items())
        text = self.user.strip().format(keys=_keys(), questions=questions)
        return ChatMessage.system(self.system.strip()), ChatMessage.user(image, text)

    def retry_message(self, reason: str) -> ChatMessage:
        from acrb.clients import ChatMessage

        return ChatMessage.user(self.retry.strip().format(reason=reason, keys=_keys()))

    def answer_model(self) -> type[BaseModel]:
        """A pydantic model accepting exactly the seven dimensions as bounded strings."""
        fields: dict[str, Any] = {
            name: (str, Field(min_length=self.min_chars, max_length=self.max_chars))
            for name in FEATURE_DIMENSIONS}
        return create_model("FeatureAnswer", __config__=ConfigDict(
            extra="forbid", str_strip_whitespace=True, strict=True), **fields)

    def json_schema(self) -> dict[str, Any]:
        return self.answer_model().model_json_schema()


def _keys() -> str:
    return ", ".join(f'"{name}"' for name in FEATURE_DIMENSIONS)


def load_instructions(path: Path | str) -> Instructions:
    """Read and check an instructions file; errors name the file and the problem."""
    path = Path(path)
    instructions = load_yaml_model(path, Instructions, what="feature describer instructions",
                                   param="features.instructions",
                                   example="src/acrb/features/data/describer-v1.yaml",
                                   extra={"sha256": sha256_file(path)} if path.is_file()
                                   else None)
    if tuple(instructions.dimensions) != FEATURE_DIMENSIONS:
        raise InputDataError(f"{path}: `dimensions` must list {list(FEATURE_DIMENSIONS)} in "
                             f"order, found {list(instructions.dimensions)}",
                             "describe each of the seven dimensions once")
    return instructions


class AnswerRejected(ValueError):
    """A describer answer that cannot be used; the message says why (sent back to the model)."""


def parse_answer(text: str, instructions: Instructions) -> dict[str, str]:
    """The seven descriptions in a reply, or :class:`AnswerRejected` saying what is wrong:
    no JSON object, a missing, extra, empty or too long key, or a demographic label."""
    data = _first_json_object(text)
    if data is None:
        raise AnswerRejected("the reply holds no JSON object")
    try:
        answer = instructions.answer_model().model_validate(data)
    except ValidationError as exc:
        raise AnswerRejected("; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}"
            for e in exc.errors())) from None
    described: dict[str, str] = answer.model_dump()
    check = label_check()
    named = {name: check.find(value) for name, value in described.items()}
    named = {name: labels for name, labels in named.items() if labels}
    if named:
        raise AnswerRejected("it names a demographic group (" + "; ".join(
            f"{name}: {', '.join(labels)}" for name, labels in named.items()) + ")")
    return {name: described[name] for name in FEATURE_DIMENSIONS}


def _first_json_object(text: str) -> dict[str, Any] | None:
    """The first ``{...}`` in ``text`` that parses as a JSON object (prose or a Markdown fence
    around it is allowed)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


def feature_text(dimensions: Mapping[str, str], template: str) -> str:
    """p_feat: ``template`` filled with the descriptions."""
    return " ".join(template.format(**dimensions).split())


def dimensions_json(dimensions: Mapping[str, str]) -> str:
    """The canonical JSON of the descriptions, in dimension order."""
    return json.dumps({name: dimensions[name] for name in FEATURE_DIMENSIONS},
                      ensure_ascii=False)


@dataclass
class Description:
    """One portrait's outcome: its descriptions (None when no usable answer came), the
    requests sent (0 when every reply was cached), the reasons earlier answers were refused,
    and, for a failure, why the last one was."""

    source_id: str
    dimensions: dict[str, str] | None = None
    attempts: int = 0
    rejected: list[str] = field(default_factory=list)
    failure: str = ""


class VLMDescriber:
    """Describes portraits with a vision-language model behind ``client``."""

    def __init__(self, client: ChatClient, instructions: Instructions, retries: int,
                 structured_output: bool = True) -> None:
        self.client = client
        self.instructions = instructions
        self.retries = retries
        self.structured_output = structured_output

    @property
    def describer_id(self) -> str:
        """``vlm:<model>@<hash>``: the hash covers the backend's identity (not its endpoint),
        the instructions file and the label lists."""
        described = self.client.describe()
        described.pop("base_url", None)
        described.pop("backend", None)
        digest = content_hash({"backend": described, "structured_output": self.structured_output,
                               "instructions": self.instructions.sha256,
                               "labels": label_check().sha256, "retries": self.retries}, 12)
        return f"vlm:{described.get('model')}@{digest}"

    def describe_many(self, images: Mapping[str, bytes]) -> list[Description]:
        """Describe each portrait (source id -> PNG/JPEG bytes), in order."""
        from acrb.clients import ChatMessage

        schema = self.instructions.json_schema()
        outcomes = {source_id: Description(source_id) for source_id in images}
        conversations: dict[str, tuple[ChatMessage, ...]] = {
            source_id: self.instructions.messages(image) for source_id, image in images.items()}
        for round_index in range(self.retries + 1):
            if not conversations:
                break
            desc = "features" if round_index == 0 else f"features (retry {round_index})"
            replies = self.client.chat_many(list(conversations.values()), desc=desc,
                                            schemas=[schema] * len(conversations))
            following: dict[str, tuple[ChatMessage, ...]] = {}
            for (source_id, conversation), reply in zip(conversations.items(), replies,
                                                        strict=True):
                outcome = outcomes[source_id]
                outcome.attempts += reply.attempts
                reason = self._read(reply, outcome)
                if reason is None:
                    continue
                outcome.failure = reason
                if reply.status == "error":
                    continue  # not cached and not the model's answer: the next run asks again
                outcome.rejected.append(reason)
                following[source_id] = (*conversation,
                                        ChatMessage.assistant(reply.text or "(no answer)"),
                                        self.instructions.retry_message(reason))
            conversations = following if round_index < self.retries else {}
        return list(outcomes.values())

    def _read(self, reply: ChatReply, outcome: Description) -> str | None:
        """None when ``reply`` settles ``outcome`` (its descriptions set), else the reason."""
        if reply.status == "error":
            return f"request failed: {reply.reason}"
        if reply.status == "refused":
            return f"the model declined ({reply.reason})"
        try:
            outcome.dimensions = parse_answer(reply.text, self.instructions)
        except AnswerRejected as exc:
            return str(exc)
        outcome.failure = ""
        return None


def simulated_describer_id() -> str:
    """``simulated:pixels-v<N>@<hash>`` for the pixel describer: its rule version and the
    label lists."""
    from acrb.features.simulated import VERSION

    return f"simulated:pixels-v{VERSION}@" + content_hash(
        {"version": VERSION, "labels": label_check().sha256}, 12)


def failures_message(failed: Sequence[Description], retries: int) -> InputDataError:
    """The stage error for sources left without a usable description."""
    listed = "; ".join(f"{d.source_id}: {d.failure}" for d in failed[:10])
    more = f" (and {len(failed) - 10} more)" if len(failed) > 10 else ""
    return InputDataError(
        f"{len(failed)} source(s) have no usable feature description after {retries + 1} "
        f"request(s) each: {listed}{more}",
        "rerun `acrb features` (answers so far are cached; failed requests are asked again), "
        "raise features.retries, use another features.vlm model, or import a mapping "
        "(features.describer: mapping)")
