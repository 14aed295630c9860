"""A vision-language model judge behind any chat backend of :mod:`acrb.clients`.

Each item is asked the rubric's questions (:meth:`Rubric.messages`) with the source and output
images. All first requests of a batch go to the client together (:meth:`ChatClient.chat_many`:
concurrent for an API, batched ``generate`` calls for a local model), each with the JSON schema
of its answer so backends that can constrain their output do. A reply is validated with
:meth:`Rubric.parse`; an invalid one gets exactly one retry, the conversation so far plus the
validation error (:meth:`Rubric.retry_message`), again all together.

What an item's answer is:

- ``scored``: a valid answer (first or after the retry);
- ``abstained``: still invalid after the retry, or the judge declined (a policy refusal or a
  reply that reads as one). Abstentions are recorded with their reason and are never read as an
  erasure: a judge that abstains more for one group biases the audit, so they are counted;
- ``error``: the request failed (timeout, 5xx after all tries). Errors are not cached, so the
  next run asks again.

Every reply text is kept in order (``raw``), with its cache key (``call_ids``): replies are
cached by content hash, so a rerun with the same judge and rubric sends nothing.

The prompt options (params ``judges.<name>.prompt``, :class:`~acrb.config.JudgePromptParams`)
apply to the audit rubric, in its own wording: ``labels`` states the source's labels where the
item carries them (each answer records ``labels_given``); ``observations_first`` asks for
observations before the JSON object, sends no answer schema (a JSON-only constraint would forbid
the observations) and reads the last JSON object of the reply. Options that are on are part of
the judge's identity, and the requests they change have other cache keys, so answers given
without them are never reused. The WinoBias question is asked as always.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acrb.clients import ChatMessage, ChatReply
from acrb.config import JudgePromptParams
from acrb.judges.base import Judge
from acrb.judges.items import AnswerStatus, JudgeAnswer, JudgeItem
from acrb.judges.rubric import AnswerError, Rubric
from acrb.registry import open_chat_client

if TYPE_CHECKING:
    from acrb.clients import ChatClient
    from acrb.config import LLMBackendParams
    from acrb.judges.winobias import RoleRubric


class VLMJudge(Judge):
    """A judge answering the rubric through the chat backend ``backend`` (any
    :data:`~acrb.registry.CHAT_BACKENDS` kind that takes images: ``openai``, ``gemini``,
    ``transformers-vlm``), caching replies under ``cache_dir``, worded with the prompt options
    ``prompt`` (default: none)."""

    def __init__(self, name: str, backend: LLMBackendParams, rubric: Rubric | RoleRubric,
                 cache_dir: Path | str, prompt: JudgePromptParams | None = None) -> None:
        super().__init__(name, rubric)
        self.backend = backend
        # Only the audit rubric has the options' wording; the WinoBias question has none.
        self.prompt = (prompt or JudgePromptParams()) if isinstance(rubric, Rubric) \
            else JudgePromptParams()
        if isinstance(rubric, Rubric):
            rubric.check_prompt(self.prompt, f"judges.{name}.prompt")
        self.client: ChatClient = open_chat_client(name, backend, Path(cache_dir))

    def identity(self) -> dict[str, Any]:
        described = self.client.describe()
        # The endpoint is where the model is served, not what answers; the name is a label.
        described.pop("base_url", None)
        described.pop("backend", None)
        identity: dict[str, Any] = {"kind": "vlm", "backend": described,
                                    "structured_output": self.backend.structured_output}
        if self.prompt.enabled:
            # Only when on, so the id of a judge without options is what it always was.
            identity["prompt"] = self.prompt.model_dump(mode="json")
        return identity

    def _messages(self, item: JudgeItem) -> tuple[ChatMessage, ...]:
        if isinstance(self.rubric, Rubric):
            return self.rubric.messages(item, self.prompt)
        return self.rubric.messages(item)

    def _labels_given(self, item: JudgeItem) -> bool:
        return isinstance(self.rubric, Rubric) and self.rubric.states_labels(item, self.prompt)

    def judge_many(self, items: Sequence[JudgeItem]) -> list[JudgeAnswer]:
        rubric = self.rubric
        asked = [rubric.axes_for(item) for item in items]
        answers: list[JudgeAnswer | None] = [None] * len(items)
        to_ask = [i for i, axes in enumerate(asked) if axes]
        for i, axes in enumerate(asked):
            if not axes:
                # Nothing applies (a rubric without axes for this task): no call to make.
                answers[i] = JudgeAnswer("scored")
        first = {i: self._messages(items[i]) for i in to_ask}
        # Observations come before the JSON: a schema would constrain the reply to JSON only.
        schemas = {i: None if self.prompt.observations_first else rubric.json_schema(asked[i])
                   for i in to_ask}
        replies = self.client.chat_many([first[i] for i in to_ask], desc=f"judge {self.name}",
                                        schemas=[schemas[i] for i in to_ask])

        retries: dict[int, tuple[ChatMessage, ...]] = {}
        for i, reply in zip(to_ask, replies, strict=True):
            answer, error = self._read(reply, asked[i], ())
            if error is None:
                answers[i] = answer
                continue
            retries[i] = (*first[i], ChatMessage.assistant(reply.text or "(no answer)"),
                          rubric.retry_message(error, asked[i]))
        if retries:
            second = self.client.chat_many(list(retries.values()),
                                           desc=f"judge {self.name} (retry)",
                                           schemas=[schemas[i] for i in retries])
            by_index = dict(zip(to_ask, replies, strict=True))
            for i, reply in zip(retries, second, strict=True):
                answer, error = self._read(reply, asked[i], (by_index[i],))
                if error is not None:
                    answer = _answer("abstained", (by_index[i], reply),
                                     reason=f"no valid answer after one retry: {error}")
                answers[i] = answer
        assert all(answer is not None for answer in answers)
        sent = set(to_ask)
        return [replace(answer, labels_given=i in sent and self._labels_given(items[i]))
                for i, answer in enumerate(answers) if answer is not None]

    def _read(self, reply: ChatReply, axes: Sequence[str], before: tuple[ChatReply, ...]
              ) -> tuple[JudgeAnswer | None, AnswerError | None]:
        """The answer ``reply`` settles (with the replies ``before`` it), or the validation
        error that earns it a retry."""
        replies = (*before, reply)
        if reply.status == "error":
            return _answer("error", replies, reason=reply.reason), None
        if reply.status == "refused":
            return _answer("abstained", replies, reason=f"judge refused: {reply.reason}"), None
        try:
            scores = (self.rubric.parse(reply.text, axes, last=self.prompt.observations_first)
                      if isinstance(self.rubric, Rubric) else self.rubric.parse(reply.text, axes))
        except AnswerError as error:
            return None, error
        return _answer("scored", replies, scores=scores), None

    def close(self) -> None:
        self.client.close()


def _answer(status: AnswerStatus, replies: Sequence[ChatReply], *, reason: str = "",
            scores: Mapping[str, float | int | str] | None = None) -> JudgeAnswer:
    return JudgeAnswer(status=status, scores=scores or {}, reason=reason,
                       raw=tuple(r.text for r in replies),
                       call_ids=tuple(r.call_id for r in replies),
                       attempts=sum(r.attempts for r in replies))
