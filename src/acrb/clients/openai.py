"""OpenAI-compatible chat completions (OpenAI, vLLM, Ollama, llama.cpp server), images included.

A message that is one text part is sent as a plain string, as every compatible server takes; a
message with images is sent as a list of content parts, each image an ``image_url`` part whose
URL is a base64 ``data:`` URL (OpenAI's vision input, also what vLLM and Ollama take). A request
with an answer schema asks for it as ``response_format`` of type ``json_schema`` (OpenAI's
structured outputs; vLLM's guided decoding takes the same field) unless ``structured_output``
is off.
"""

from __future__ import annotations

from typing import Any

from acrb.clients._client import AnswerSchema, ChatStatus, Conversation
from acrb.clients._http import HTTPChatClient, MalformedResponse
from acrb.clients._messages import ChatMessage, TextPart

OPENAI_BASE_URL = "https://api.openai.com/v1"


def openai_content(message: ChatMessage) -> str | list[dict[str, Any]]:
    """The ``content`` of one message in the chat-completions format."""
    text = message.single_text
    if text is not None:
        return text
    return [{"type": "text", "text": part.text} if isinstance(part, TextPart)
            else {"type": "image_url", "image_url": {"url": part.data_url()}}
            for part in message.parts]


class OpenAIChatClient(HTTPChatClient):
    """An OpenAI-compatible ``/chat/completions`` endpoint."""

    default_base_url = OPENAI_BASE_URL

    def _endpoint(self) -> str:
        return f"{self._base_url}/chat/completions"

    def _auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"} if self._key else {}

    def response_format(self, schema: AnswerSchema) -> dict[str, Any] | None:
        if schema is None or not self.params.structured_output:
            return None
        # The name is any [A-Za-z0-9_-]{1,64}; strict holds because the rubric's schema lists
        # every key as required and forbids others.
        return {"type": "json_schema",
                "json_schema": {"name": "answer", "strict": True, "schema": dict(schema)}}

    def _payload(self, messages: Conversation, schema: AnswerSchema = None) -> dict[str, Any]:
        p = self.params
        payload: dict[str, Any] = {
            "model": p.model,
            "messages": [{"role": m.role, "content": openai_content(m)} for m in messages],
            "temperature": p.temperature,
            "max_tokens": p.max_tokens,
            "seed": p.seed,
        }
        options = self.response_format(schema)
        if options is not None:
            payload["response_format"] = options
        return payload

    def _parse(self, data: Any) -> tuple[ChatStatus, str, str]:
        if not isinstance(data, dict):
            raise MalformedResponse("body is not a JSON object")
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise MalformedResponse("no choices")
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise MalformedResponse("choices[0].message missing")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise MalformedResponse("choices[0].message.content is not a string")
        text = content or ""
        refusal = message.get("refusal")
        if isinstance(refusal, str) and refusal.strip():
            return "refused", refusal, "message.refusal"
        if choice.get("finish_reason") == "content_filter":
            return "refused", text, "finish_reason=content_filter"
        return "ok", text, ""
