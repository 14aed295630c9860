"""Google's Gemini ``generateContent`` REST API, images included.

System messages become ``systemInstruction``; user and assistant turns become ``contents`` with
roles ``user`` and ``model``; an image is an ``inline_data`` part (mime type and base64 data).
The key travels in the ``x-goog-api-key`` header, never in the URL. A request with an answer
schema asks for JSON (``responseMimeType: application/json``) unless ``structured_output`` is
off; the keys and ranges are in the prompt, and the answer is validated on our side.
"""

from __future__ import annotations

from typing import Any

from acrb.clients._client import AnswerSchema, ChatStatus, Conversation
from acrb.clients._http import HTTPChatClient, MalformedResponse
from acrb.clients._messages import ChatMessage, TextPart

GEMINI_BASE_URL = "https://generativelanguage.googleapis.com"
#: Gemini finish reasons that mean the answer was withheld for policy reasons.
GEMINI_REFUSAL_FINISH = frozenset({"SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII",
                                   "RECITATION"})


def gemini_parts(message: ChatMessage) -> list[dict[str, Any]]:
    """The ``parts`` of one message in the generateContent format."""
    return [{"text": part.text} if isinstance(part, TextPart)
            else {"inline_data": {"mime_type": part.mime_type, "data": part.base64()}}
            for part in message.parts]


class GeminiChatClient(HTTPChatClient):
    """Google's Gemini REST API (``generateContent``)."""

    default_base_url = GEMINI_BASE_URL

    def _endpoint(self) -> str:
        model = self.params.model.removeprefix("models/")
        return f"{self._base_url}/v1beta/models/{model}:generateContent"

    def _auth_headers(self) -> dict[str, str]:
        # A header rather than ?key=...: URLs end up in logs, headers do not.
        return {"x-goog-api-key": self._key} if self._key else {}

    def response_format(self, schema: AnswerSchema) -> dict[str, Any] | None:
        if schema is None or not self.params.structured_output:
            return None
        return {"responseMimeType": "application/json"}

    def _payload(self, messages: Conversation, schema: AnswerSchema = None) -> dict[str, Any]:
        p = self.params
        system = [part for m in messages if m.role == "system" for part in gemini_parts(m)]
        payload: dict[str, Any] = {"systemInstruction": {"parts": system}} if system else {}
        payload["contents"] = [{"role": "model" if m.role == "assistant" else "user",
                                "parts": gemini_parts(m)}
                               for m in messages if m.role != "system"]
        payload["generationConfig"] = {"temperature": p.temperature,
                                       "maxOutputTokens": p.max_tokens, "seed": p.seed,
                                       **(self.response_format(schema) or {})}
        return payload

    def _parse(self, data: Any) -> tuple[ChatStatus, str, str]:
        if not isinstance(data, dict):
            raise MalformedResponse("body is not a JSON object")
        candidates = data.get("candidates")
        feedback = data.get("promptFeedback")
        block = feedback.get("blockReason") if isinstance(feedback, dict) else None
        if not candidates:
            if block:
                return "refused", "", f"blockReason={block}"
            raise MalformedResponse("no candidates")
        if not isinstance(candidates, list) or not isinstance(candidates[0], dict):
            raise MalformedResponse("candidates is not a list of objects")
        candidate = candidates[0]
        content = candidate.get("content") or {}
        parts = content.get("parts") if isinstance(content, dict) else None
        if parts is not None and not isinstance(parts, list):
            raise MalformedResponse("candidates[0].content.parts is not a list")
        # "thought" parts are a thinking model's scratchpad, not its answer.
        text = "".join(
            part["text"] for part in parts or []
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            and not part.get("thought")
        )
        finish = candidate.get("finishReason")
        if finish in GEMINI_REFUSAL_FINISH:
            return "refused", text, f"finishReason={finish}"
        return "ok", text, ""
