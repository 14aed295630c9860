"""Gemini image generation and editing through the official ``google-genai`` SDK
(``client.models.generate_content`` with an image model such as gemini-2.5-flash-image, the
IMAGE response modality, and the source images as inline parts for an edit).

Gemini rarely rejects a request with an HTTP error; it answers 200 and says in the body why
there is no image. Outcomes (see ``docs/models.md``):

* ``refused``, kind ``policy``: the prompt was blocked, ``prompt_feedback.block_reason`` set
  (``SAFETY``, ``PROHIBITED_CONTENT``, ``IMAGE_SAFETY``, ...): ``refusal_code`` is the reason,
  ``message`` the ``block_reason_message``, verbatim.
* ``refused``, kind ``safety_filter``: a candidate stopped with a safety finish reason
  (:data:`SAFETY_FINISH_REASONS`: ``SAFETY``, ``IMAGE_SAFETY``, ``PROHIBITED_CONTENT``,
  ``IMAGE_PROHIBITED_CONTENT``, ``BLOCKLIST``, ``SPII``, ``RECITATION``, ``IMAGE_RECITATION``):
  the generated output was withheld. ``message`` is ``finish_message`` and any text, verbatim.
  Likewise a candidate without an image whose ``safety_ratings`` say ``blocked``.
* ``refused``, kind ``text_only``: the model answered in words and sent no image, with no
  safety signal. Google's image-generation guide notes the model may answer in text rather
  than draw; in an audit of refusals a written decline is what the study calls a refusal
  (the model declined, in words), but it is kept as its own kind, with the text as
  ``message`` and the finish reason as ``refusal_code``, so analyses can count it or not.
* ``error``: HTTP errors (429 / 5xx after the SDK's retries included), timeouts, a body the SDK
  cannot parse, and a reply with neither image nor text nor safety signal (``OTHER``,
  ``IMAGE_OTHER``, ``NO_IMAGE`` or ``MAX_TOKENS`` with nothing in it): nothing says the model
  declined, so it is retried rather than counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from acrb.models.base import Editor, EditRequest, GenerationRequest, Generator, Outcome
from acrb.models.image_api import (
    ApiImageConfig,
    ApiImageModel,
    decode_image,
    encode_png,
    per_million,
)

#: Candidate finish reasons that mean the output was withheld by a filter (google-genai
#: ``types.FinishReason``; https://ai.google.dev/api/generate-content#FinishReason).
SAFETY_FINISH_REASONS = frozenset({
    "SAFETY", "IMAGE_SAFETY", "PROHIBITED_CONTENT", "IMAGE_PROHIBITED_CONTENT", "BLOCKLIST",
    "SPII", "RECITATION", "IMAGE_RECITATION",
})


class GeminiPrices(BaseModel):
    """USD per million tokens; output tokens are split by modality where the API reports it."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0)
    text_output: float = Field(ge=0)
    image_output: float = Field(ge=0)
    as_of: str = ""


#: List prices of https://ai.google.dev/gemini-api/docs/pricing (gemini-2.5-flash-image, paid
#: tier, 2025-10: $0.30 per million input tokens, $2.50 text and $30 image output, i.e. about
#: $0.039 for a 1024x1024 image of 1290 tokens). Override with ``config.prices``.
DEFAULT_PRICES: dict[str, GeminiPrices] = {
    "gemini-2.5-flash-image": GeminiPrices(input=0.30, text_output=2.50, image_output=30.00,
                                           as_of="ai.google.dev/gemini-api/docs/pricing, 2025-10"),
}


class GeminiImageConfig(ApiImageConfig):
    """Options of ``generate_content`` for image models; None leaves the API default."""

    api_key_env: str = "GEMINI_API_KEY"
    response_modalities: list[str] = Field(
        default_factory=lambda: ["TEXT", "IMAGE"],
        description="what the model may answer with; keeping TEXT keeps a written decline")
    aspect_ratio: str | None = Field(default=None, description="e.g. 1:1, 3:4, 16:9")
    image_size: str | None = Field(default=None, description="models that take it: 1K, 2K, 4K")
    temperature: float | None = Field(default=None, ge=0)
    send_seed: bool = Field(default=True, description="send the request's seed to the API")
    safety_settings: dict[str, str] = Field(
        default_factory=dict,
        description="harm category -> block threshold (empty: the API's defaults)")
    max_input_images: int = Field(
        default=3, ge=1,
        description="source images one edit may carry (gemini-2.5-flash-image works best with "
        "up to 3)")
    retry_initial_delay_s: float = Field(
        default=1.0, ge=0, description="first back-off of the SDK's retries, in seconds")
    prices: GeminiPrices | None = None


def _name(value: Any) -> str | None:
    """An enum's name (``FinishReason.SAFETY`` -> ``"SAFETY"``), a string as is, None as None."""
    if value is None:
        return None
    return str(getattr(value, "value", value))


class _GeminiImages(ApiImageModel):
    """What the generator and the editor share: the client, the request, the outcomes."""

    Config: ClassVar[type[GeminiImageConfig]] = GeminiImageConfig
    default_api_key_env: ClassVar[str] = "GEMINI_API_KEY"

    def __init__(self, key: str, config: GeminiImageConfig,
                 pinned_revision: str | None = None) -> None:
        super().__init__(key, config, pinned_revision)
        from google import genai  # lazily: only a run that uses this adapter needs the SDK
        from google.genai import errors, types

        self._genai, self._errors, self._types = genai, errors, types
        retry = types.HttpRetryOptions(attempts=config.max_retries + 1,
                                       initial_delay=config.retry_initial_delay_s,
                                       max_delay=max(config.retry_initial_delay_s * 8, 0.01))
        http = types.HttpOptions(base_url=config.base_url, timeout=int(config.timeout_s * 1000),
                                 retry_options=retry)
        self._client = genai.Client(api_key=self._api_key, http_options=http)

    @property
    def settings(self) -> GeminiImageConfig:
        assert isinstance(self.config, GeminiImageConfig)
        return self.config

    def request_config(self, seed: int) -> Any:
        s, types = self.settings, self._types
        image_config = None
        if s.aspect_ratio or s.image_size:
            image_config = types.ImageConfig(aspect_ratio=s.aspect_ratio, image_size=s.image_size)
        safety = [types.SafetySetting(category=category, threshold=threshold)
                  for category, threshold in s.safety_settings.items()] or None
        return types.GenerateContentConfig(
            response_modalities=list(s.response_modalities), image_config=image_config,
            temperature=s.temperature, seed=seed if s.send_seed else None,
            safety_settings=safety, candidate_count=1)

    def cost(self, response: Any) -> float | None:
        prices = self.settings.prices or DEFAULT_PRICES.get(self.model_name)
        usage = getattr(response, "usage_metadata", None)
        if prices is None or usage is None:
            return None
        output = per_million(usage.candidates_token_count, prices.image_output)
        details = usage.candidates_tokens_details or []
        if details:
            output = sum(per_million(d.token_count, prices.text_output
                                     if _name(d.modality) == "TEXT" else prices.image_output)
                         for d in details)
        return round(per_million(usage.prompt_token_count, prices.input) + output, 8)

    def outcome(self, response: Any) -> Outcome:
        """Classify one ``GenerateContentResponse`` (see the module docstring)."""
        cost = self.cost(response)
        feedback = getattr(response, "prompt_feedback", None)
        block = _name(getattr(feedback, "block_reason", None))
        if block:
            return Outcome(status="refused", refusal_kind="policy", refusal_code=block,
                           message=getattr(feedback, "block_reason_message", None) or "",
                           cost_usd=cost)
        candidates = getattr(response, "candidates", None) or []
        if not candidates:
            return Outcome(status="error", message="malformed response: no candidates and no "
                           "prompt feedback")
        candidate = candidates[0]
        finish = _name(candidate.finish_reason)
        parts = (candidate.content.parts if candidate.content is not None else None) or []
        texts = [part.text for part in parts if getattr(part, "text", None)]
        blobs = [part.inline_data for part in parts
                 if getattr(part, "inline_data", None) is not None and part.inline_data.data]
        said = "\n".join(texts)
        if finish in SAFETY_FINISH_REASONS:
            message = "\n".join(m for m in (candidate.finish_message, said) if m)
            return Outcome(status="refused", refusal_kind="safety_filter", refusal_code=finish,
                           message=message, cost_usd=cost)
        blocked = [_name(rating.category) or "unknown category"
                   for rating in candidate.safety_ratings or [] if rating.blocked]
        if blocked and not blobs:
            # Withheld by a safety rating although the finish reason does not say so.
            return Outcome(status="refused", refusal_kind="safety_filter",
                           refusal_code=finish or "SAFETY", cost_usd=cost,
                           message="\n".join([*(m for m in (candidate.finish_message, said) if m),
                                              "blocked: " + ", ".join(blocked)]))
        if blobs:
            try:
                image = decode_image(blobs[0].data)
            except ValueError as exc:
                return Outcome(status="error", message=f"malformed response: {exc}")
            return Outcome(status="ok", image=image, cost_usd=cost)
        if said:
            return Outcome(status="refused", refusal_kind="text_only", refusal_code=finish,
                           message=said, cost_usd=cost)
        detail = f": {candidate.finish_message}" if candidate.finish_message else ""
        return Outcome(status="error",
                       message=f"no image and no text (finish_reason={finish}){detail}")

    def call(self, contents: list[Any], seed: int) -> Outcome:
        errors = self._errors
        try:
            response = self._client.models.generate_content(
                model=self.model_name, contents=contents, config=self.request_config(seed))
        except errors.APIError as exc:
            retried = (f" after {self.settings.max_retries} retries"
                       if exc.code == 429 or (exc.code or 0) >= 500 else "")
            said = f"{exc.status or ''} {exc.message or ''}".strip()
            return Outcome(status="error", message=f"HTTP {exc.code}{retried}: {said}")
        except Exception as exc:
            if "timeout" in type(exc).__name__.lower() or "timed out" in str(exc).lower():
                return Outcome(status="error", message=f"timeout after {self.settings.timeout_s} "
                               f"s ({self.settings.max_retries} retries): {type(exc).__name__}")
            return Outcome(status="error", message=f"request failed: {type(exc).__name__}: {exc}")
        return self.outcome(response)

    def library_versions(self) -> dict[str, Any]:
        from google.genai import version

        return {"google-genai": version.__version__}


class GeminiImageGenerator(_GeminiImages, Generator):
    """Text to image: the prompt as the only part."""

    default_models: ClassVar[dict[str, str]] = {"gemini:image": "gemini-2.5-flash-image"}

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Outcome]:
        return self.run_batch(requests, lambda r: self.call([r.prompt], r.seed))


class GeminiImageEditor(_GeminiImages, Editor):
    """Editing: the instruction, then every source image (PNG), primary first."""

    max_source_images: ClassVar[int] = 3
    default_models: ClassVar[dict[str, str]] = {"gemini:image:edit": "gemini-2.5-flash-image"}

    @classmethod
    def source_image_limit(cls, config: Any) -> int:
        return int(getattr(config, "max_input_images", cls.max_source_images))

    def edit(self, requests: Sequence[EditRequest]) -> list[Outcome]:
        types = self._types

        def one(request: EditRequest) -> Outcome:
            parts = [request.instruction] + [
                types.Part.from_bytes(data=encode_png(pixels), mime_type="image/png")
                for pixels in request.source_images]
            return self.call(parts, request.seed)

        return self.run_batch(requests, one)
