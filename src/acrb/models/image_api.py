"""What the image-API adapters (OpenAI images, Gemini image generation) share.

* :class:`ApiImageConfig`: the typed settings every provider has (model name, the environment
  variable that holds the key, endpoint, timeout, retries, pacing, threads per batch).
* :func:`read_api_key`: keys come from the environment only; a missing one is a ConfigError
  that names the variable. The key is never put in a config, record, message or log.
* :class:`ApiImageModel`: runs a batch through a thread pool bounded by ``concurrency``, each
  request paced by :class:`~acrb.clients._client.RateLimiter`, and turns any exception an
  adapter did not classify into an ``error`` outcome (never a refusal). Every outcome's message
  passes through :meth:`ApiImageModel.redact`, so a provider error that echoes the key cannot
  carry it into a record.

What counts as refused and what as error is decided per provider, in
:mod:`acrb.models.openai_images` and :mod:`acrb.models.gemini_images`; ``docs/models.md`` has
the table.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar

import numpy as np
from pydantic import Field

from acrb.clients._client import RateLimiter
from acrb.errors import ConfigError
from acrb.models.base import ImageModel, ModelConfig, Outcome
from acrb.redaction import redact as redact_registered
from acrb.redaction import register_secret

R = TypeVar("R")

#: Shown instead of the key wherever the key would have appeared.
REDACTED = "[redacted]"


class ApiImageConfig(ModelConfig):
    """Settings every image API adapter has. Provider configs add their generation options."""

    model: str | None = Field(
        default=None,
        description="the provider's model name (default: the one the registry key names)")
    api_key_env: str = Field(
        default="", description="environment variable holding the API key (never the key)")
    base_url: str | None = Field(
        default=None, description="endpoint root; None for the provider's own")
    timeout_s: float = Field(default=180.0, gt=0, description="seconds per HTTP request")
    max_retries: int = Field(
        default=2, ge=0,
        description="retries of a timeout, 429 or 5xx by the provider's SDK before 'error'")
    requests_per_minute: float | None = Field(
        default=None, gt=0, description="pace request starts (None: no pacing)")
    concurrency: int = Field(default=4, ge=1, description="requests in flight per batch")


def read_api_key(env_var: str, model_key: str) -> str:
    """The API key in the environment variable ``env_var``; a ConfigError naming the variable
    (never a value) when it is unset or empty."""
    if not env_var:
        raise ConfigError(f"model '{model_key}' names no environment variable for its API key",
                          "set config.api_key_env, e.g. OPENAI_API_KEY")
    value = os.environ.get(env_var, "").strip()
    if not value:
        raise ConfigError(
            f"model '{model_key}' needs an API key in the environment variable {env_var}, "
            "which is not set",
            f"export {env_var}=... before running (keys are read from the environment only, "
            "never from params.yaml)",
        )
    register_secret(env_var, value)
    return value


def redact(text: str, secret: str) -> str:
    """``text`` with ``secret`` replaced by :data:`REDACTED`.

    Providers echo a wrong key partly masked (the start and the end kept); for a key long enough
    that its ends are not ordinary words, the first and last 8 characters are redacted too.
    """
    if not secret:
        return text
    text = text.replace(secret, REDACTED)
    if len(secret) >= 24:
        for fragment in (secret[:8], secret[-8:]):
            text = text.replace(fragment, REDACTED)
    return text


def decode_image(data: bytes) -> np.ndarray:
    """An encoded image (PNG, JPEG, WebP) as an RGB uint8 array; raises ValueError if the bytes
    are not an image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            if image.mode in ("RGBA", "LA", "P"):
                # Composite transparency over white, as a viewer would show it.
                rgba = image.convert("RGBA")
                background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                return np.asarray(Image.alpha_composite(background, rgba).convert("RGB")).copy()
            return np.asarray(image.convert("RGB")).copy()
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"the response's image could not be decoded ({exc})") from exc


def encode_png(pixels: np.ndarray) -> bytes:
    """An RGB uint8 array as PNG bytes (what the APIs take as input images)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8), "RGB").save(buffer, "PNG")
    return buffer.getvalue()


def per_million(tokens: int | None, usd_per_million: float) -> float:
    return (tokens or 0) * usd_per_million / 1_000_000


class ApiImageModel(ImageModel):
    """Base of the image API adapters: the key, pacing, the thread pool, redaction."""

    #: The environment variable the key is read from when the config names none.
    default_api_key_env: ClassVar[str] = ""
    #: Registry key -> the provider's model name, for configs that leave ``model`` unset.
    default_models: ClassVar[dict[str, str]] = {}

    def __init__(self, key: str, config: ModelConfig, pinned_revision: str | None = None) -> None:
        super().__init__(key, config, pinned_revision)
        settings = self.api_config
        self._api_key = read_api_key(settings.api_key_env or self.default_api_key_env, key)
        self.model_name = self.resolve_model_name(key, settings)
        self._limiter = (RateLimiter(settings.requests_per_minute)
                         if settings.requests_per_minute else None)

    @property
    def api_config(self) -> ApiImageConfig:
        assert isinstance(self.config, ApiImageConfig)
        return self.config

    @classmethod
    def resolve_model_name(cls, key: str, config: ApiImageConfig) -> str:
        """``config.model``, else the model the registry key names; a ConfigError otherwise."""
        name = config.model or cls.default_models.get(key)
        if not name:
            raise ConfigError(f"model '{key}' ({cls.__name__}) names no provider model",
                              "set config.model to the provider's model name")
        return name

    def redact(self, text: str) -> str:
        """``text`` with this adapter's key (and any other registered key) removed."""
        return redact_registered(redact(text, self._api_key))

    def _clean(self, outcome: Outcome) -> Outcome:
        message = self.redact(outcome.message)
        code = self.redact(outcome.refusal_code) if outcome.refusal_code else outcome.refusal_code
        if message == outcome.message and code == outcome.refusal_code:
            return outcome
        return Outcome(status=outcome.status, image=outcome.image,
                       refusal_kind=outcome.refusal_kind, message=message, refusal_code=code,
                       seconds=outcome.seconds, peak_gpu_memory_mb=outcome.peak_gpu_memory_mb,
                       cost_usd=outcome.cost_usd)

    def _timed(self, call: Callable[[R], Outcome], request: R) -> Outcome:
        if self._limiter is not None:
            self._limiter.acquire()
        started = time.perf_counter()
        try:
            outcome = call(request)
        except Exception as exc:  # an unclassified failure is an error, never a refusal
            outcome = Outcome(status="error", message=f"{type(exc).__name__}: {exc}")
        seconds = time.perf_counter() - started
        outcome = self._clean(outcome)
        if outcome.seconds is None:
            outcome = Outcome(status=outcome.status, image=outcome.image,
                              refusal_kind=outcome.refusal_kind, message=outcome.message,
                              refusal_code=outcome.refusal_code, seconds=round(seconds, 6),
                              peak_gpu_memory_mb=None, cost_usd=outcome.cost_usd)
        return outcome

    def run_batch(self, requests: Sequence[R], call: Callable[[R], Outcome]) -> list[Outcome]:
        """``call`` on each request, at most ``concurrency`` at a time, outcomes in order."""
        if not requests:
            return []
        workers = min(self.api_config.concurrency, len(requests))
        if workers == 1:
            return [self._timed(call, request) for request in requests]
        with ThreadPoolExecutor(max_workers=workers,
                                thread_name_prefix=f"acrb-{self.key}") as pool:
            return list(pool.map(lambda request: self._timed(call, request), requests))

    def library_versions(self) -> dict[str, Any]:
        return {}
