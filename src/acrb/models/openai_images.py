"""OpenAI's Images API through the official ``openai`` SDK: gpt-image-1 and DALL-E 3
generation (``client.images.generate``), gpt-image-1 editing (``client.images.edit``).

Outcomes (see ``docs/models.md``):

* ``refused``, kind ``policy``: HTTP 400 whose error code is ``moderation_blocked`` (GPT image
  models) or ``content_policy_violation`` (DALL-E); ``refusal_code`` is that code and
  ``message`` the API's own message, verbatim.
* ``error``: any other HTTP error, a timeout or a 429 / 5xx still failing after the SDK's
  ``max_retries`` retries, a connection failure, a body without a decodable image.
* ``ok``: an image (decoded from ``b64_json``), with its cost: gpt-image-1 reports token
  ``usage`` (priced with :class:`TokenPrices`), DALL-E 3 is priced per image.

The Images API takes no seed, so repeated seeds of a request are independent samples; the seed
is part of the request id only. An edit sends every source image of the request, the primary
first, as ``image[]`` parts of one multipart request (up to 16 for GPT image models; see
https://platform.openai.com/docs/api-reference/images/createEdit).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from acrb.models.base import (
    Editor,
    EditRequest,
    GenerationRequest,
    Generator,
    Outcome,
)
from acrb.models.image_api import (
    ApiImageConfig,
    ApiImageModel,
    decode_image,
    encode_png,
    per_million,
)

if TYPE_CHECKING:
    import openai

#: Error codes with which the Images API rejects a request on content policy grounds.
POLICY_CODES = frozenset({"moderation_blocked", "content_policy_violation"})
#: How many input images one edit may carry, by model family (OpenAI API reference,
#: images/createEdit: "You can provide up to 16 images" for GPT image models; DALL-E 2 takes one).
GPT_IMAGE_MAX_INPUTS = 16


class TokenPrices(BaseModel):
    """USD per million tokens, for models that report ``usage`` (GPT image models)."""

    model_config = ConfigDict(extra="forbid")

    text_input: float = Field(ge=0)
    image_input: float = Field(ge=0)
    image_output: float = Field(ge=0)


class OpenAIPrices(BaseModel):
    """A model's list prices: per token where the API reports usage, else per image keyed
    ``"<quality>:<size>"`` (``standard:1024x1024``)."""

    model_config = ConfigDict(extra="forbid")

    tokens: TokenPrices | None = None
    per_image: dict[str, float] = Field(default_factory=dict)
    as_of: str = Field(default="", description="when these prices were read, and where")


#: List prices from https://openai.com/api/pricing/ as published when gpt-image-1 launched
#: (April 2025) and for DALL-E 3 (unchanged from November 2023 to its retirement). Override
#: with ``config.prices``; a model not listed here gets ``cost_usd`` None.
DEFAULT_PRICES: dict[str, OpenAIPrices] = {
    "gpt-image-1": OpenAIPrices(
        tokens=TokenPrices(text_input=5.00, image_input=10.00, image_output=40.00),
        as_of="openai.com/api/pricing, 2025-04"),
    "dall-e-3": OpenAIPrices(
        per_image={"standard:1024x1024": 0.040, "standard:1024x1792": 0.080,
                   "standard:1792x1024": 0.080, "hd:1024x1024": 0.080,
                   "hd:1024x1792": 0.120, "hd:1792x1024": 0.120},
        as_of="openai.com/api/pricing, 2023-11"),
}


class OpenAIImagesConfig(ApiImageConfig):
    """Options of the Images API (``size``, ``quality``, ...); None leaves the API default."""

    api_key_env: str = "OPENAI_API_KEY"
    size: str | None = Field(default="1024x1024", description="output size, e.g. 1024x1024")
    quality: str | None = Field(
        default=None, description="gpt-image-1: low, medium, high, auto; DALL-E 3: standard, hd")
    moderation: str | None = Field(
        default=None, description="GPT image models: 'auto' (default) or 'low'")
    input_fidelity: str | None = Field(
        default=None, description="edits with models that take it: 'low' or 'high'")
    style: str | None = Field(default=None, description="DALL-E 3: 'vivid' or 'natural'")
    output_format: str | None = Field(
        default=None, description="GPT image models: png (default), jpeg, webp")
    prices: OpenAIPrices | None = Field(
        default=None, description="list prices (None: the documented table for the model)")


def is_dall_e(model_name: str) -> bool:
    return model_name.startswith("dall-e")


def error_body(exc: openai.APIStatusError) -> dict[str, Any]:
    """The ``error`` object of an API error response ({} when the body is not one)."""
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    return body if isinstance(body, dict) else {}


class _OpenAIImages(ApiImageModel):
    """What the generator and the editor share: the client, the options, the outcomes."""

    Config: ClassVar[type[OpenAIImagesConfig]] = OpenAIImagesConfig
    default_api_key_env: ClassVar[str] = "OPENAI_API_KEY"

    def __init__(self, key: str, config: OpenAIImagesConfig,
                 pinned_revision: str | None = None) -> None:
        super().__init__(key, config, pinned_revision)
        import openai  # lazily: only a run that uses this adapter needs the SDK

        self._openai = openai
        self._client = openai.OpenAI(api_key=self._api_key, base_url=config.base_url,
                                     timeout=config.timeout_s, max_retries=config.max_retries)

    @property
    def settings(self) -> OpenAIImagesConfig:
        assert isinstance(self.config, OpenAIImagesConfig)
        return self.config

    @property
    def prices(self) -> OpenAIPrices | None:
        return self.settings.prices or DEFAULT_PRICES.get(self.model_name)

    def options(self, *, edit: bool) -> dict[str, Any]:
        """The keyword arguments of the SDK call besides the prompt and images."""
        s = self.settings
        chosen: dict[str, Any] = {"model": self.model_name, "n": 1, "size": s.size,
                                  "quality": s.quality}
        if is_dall_e(self.model_name):
            # DALL-E answers with URLs unless asked; GPT image models always send b64_json
            # and reject response_format.
            chosen.update(response_format="b64_json", style=s.style)
        else:
            chosen.update(moderation=None if edit else s.moderation,
                          output_format=s.output_format)
            if edit:
                chosen["input_fidelity"] = s.input_fidelity
        return {name: value for name, value in chosen.items() if value is not None}

    def cost(self, response: Any) -> float | None:
        """USD for one response: reported token usage x prices, else the per-image price."""
        prices = self.prices
        if prices is None:
            return None
        usage = getattr(response, "usage", None)
        if usage is not None and prices.tokens is not None:
            details = getattr(usage, "input_tokens_details", None)
            text_in = getattr(details, "text_tokens", None)
            image_in = getattr(details, "image_tokens", None)
            if text_in is None and image_in is None:
                text_in, image_in = usage.input_tokens, 0
            return round(per_million(text_in, prices.tokens.text_input)
                         + per_million(image_in, prices.tokens.image_input)
                         + per_million(usage.output_tokens, prices.tokens.image_output), 8)
        quality = self.settings.quality or "standard"
        return prices.per_image.get(f"{quality}:{self.settings.size}")

    def outcome(self, response: Any) -> Outcome:
        """An ``ok`` outcome from a successful response, or ``error`` if it holds no image."""
        data = getattr(response, "data", None)
        if not data:
            return Outcome(status="error", message="malformed response: no image in 'data'")
        encoded = getattr(data[0], "b64_json", None)
        if not encoded:
            return Outcome(status="error", message="malformed response: no b64_json image")
        try:
            image = decode_image(base64.b64decode(encoded, validate=True))
        except (ValueError, binascii.Error) as exc:
            return Outcome(status="error", message=f"malformed response: {exc}")
        return Outcome(status="ok", image=image, cost_usd=self.cost(response))

    def call(self, send: Any) -> Outcome:
        """Run ``send()`` (one SDK call) and classify what happened."""
        openai = self._openai
        try:
            response = send()
        except openai.APIStatusError as exc:
            body = error_body(exc)
            code = body.get("code") or body.get("type")
            message = body.get("message")
            if exc.status_code == 400 and code in POLICY_CODES:
                return Outcome(status="refused", refusal_kind="policy", refusal_code=str(code),
                               message=str(message or ""))
            retried = f" after {self.settings.max_retries} retries" if exc.status_code == 429 \
                or exc.status_code >= 500 else ""
            return Outcome(status="error",
                           message=f"HTTP {exc.status_code}{retried}: "
                                   f"{code or 'no code'}: {message or exc.message}")
        except openai.APITimeoutError:
            return Outcome(status="error", message=f"timeout after {self.settings.timeout_s} s "
                                                   f"({self.settings.max_retries} retries)")
        except openai.APIConnectionError as exc:
            return Outcome(status="error", message=f"connection failed: {exc}")
        except openai.APIError as exc:  # e.g. a body that is not JSON
            return Outcome(status="error", message=f"malformed response: {exc}")
        return self.outcome(response)

    def library_versions(self) -> dict[str, Any]:
        return {"openai": self._openai.__version__}


class OpenAIImageGenerator(_OpenAIImages, Generator):
    """Text to image through ``client.images.generate`` (gpt-image-1, DALL-E 3)."""

    default_models: ClassVar[dict[str, str]] = {"openai:gpt-image-1": "gpt-image-1",
                                                "openai:dall-e-3": "dall-e-3"}

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Outcome]:
        options = self.options(edit=False)

        def one(request: GenerationRequest) -> Outcome:
            return self.call(lambda: self._client.images.generate(prompt=request.prompt,
                                                                  **options))

        return self.run_batch(requests, one)


class OpenAIImageEditor(_OpenAIImages, Editor):
    """Image editing through ``client.images.edit`` with one or several input images."""

    max_source_images: ClassVar[int] = GPT_IMAGE_MAX_INPUTS
    default_models: ClassVar[dict[str, str]] = {"openai:gpt-image-1:edit": "gpt-image-1"}

    @classmethod
    def source_image_limit(cls, config: Any) -> int:
        model = getattr(config, "model", None) or "gpt-image-1"
        return 1 if model == "dall-e-2" else GPT_IMAGE_MAX_INPUTS

    def edit(self, requests: Sequence[EditRequest]) -> list[Outcome]:
        options = self.options(edit=True)

        def one(request: EditRequest) -> Outcome:
            images = [(f"source-{index}.png", encode_png(pixels), "image/png")
                      for index, pixels in enumerate(request.source_images)]
            return self.call(lambda: self._client.images.edit(
                image=images if len(images) > 1 else images[0], prompt=request.instruction,
                **options))

        return self.run_batch(requests, one)
