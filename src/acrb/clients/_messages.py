"""Chat messages whose content is text and images, and the identity a reply is cached under.

A message is a role and a sequence of parts; a part is :class:`TextPart` or :class:`ImagePart`
(PNG or JPEG bytes; an RGB array is encoded to PNG first, and keeps its pixels beside the bytes
so a local model reads them without decoding the PNG again). Images go in user messages only: the
chat APIs take images in user turns, and a system prompt is text.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np

from acrb.errors import InputDataError
from acrb.storage import encode_png, sha256_bytes

Role = Literal["system", "user", "assistant"]
ImageType = Literal["image/png", "image/jpeg"]

_SIGNATURES: dict[bytes, ImageType] = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff":
                                       "image/jpeg"}


@dataclass(frozen=True)
class TextPart:
    """Text in a message."""

    text: str


def _sniff(data: bytes) -> ImageType | None:
    return next((kind for magic, kind in _SIGNATURES.items() if data.startswith(magic)), None)


@dataclass(frozen=True)
class ImagePart:
    """An image in a message: encoded PNG or JPEG ``data``, sent as is.

    Requests are cached under the sha256 of ``data``, so the same picture encoded differently
    (another compression level or encoder version) is a different request. ``pixels`` is the
    RGB array ``data`` was encoded from (:meth:`from_array`), read only, or None: a local
    model takes it as is instead of decoding ``data``. It is not part of the identity (equality,
    hash, cache key), which the bytes alone determine.
    """

    data: bytes = field(repr=False)
    pixels: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes):
            raise TypeError(f"ImagePart.data must be bytes, not {type(self.data).__name__}")
        if _sniff(self.data) is None:
            raise InputDataError(
                f"an image for a chat request is neither PNG nor JPEG (it starts with "
                f"{self.data[:8]!r})",
                "pass PNG or JPEG bytes, or an RGB uint8 array (sent as PNG)",
            )

    def __repr__(self) -> str:
        return f"ImagePart({self.mime_type}, {len(self.data)} bytes, sha256 {self.sha256[:12]})"

    @cached_property
    def mime_type(self) -> ImageType:
        """``image/png`` or ``image/jpeg``, read from the bytes' signature."""
        kind = _sniff(self.data)
        assert kind is not None  # checked in __post_init__
        return kind

    @classmethod
    def from_array(cls, pixels: np.ndarray) -> ImagePart:
        """A PNG of an RGB uint8 array of shape (height, width, 3)."""
        if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
            raise InputDataError(
                f"an image array for a chat request has dtype {pixels.dtype} and shape "
                f"{pixels.shape}",
                "pass RGB pixels as uint8 with shape (height, width, 3)",
            )
        # A private read-only copy: the caller changing its array afterwards must not make the
        # pixels differ from the bytes the request is cached under.
        kept = np.array(pixels, copy=True)
        kept.setflags(write=False)
        return cls(encode_png(kept), kept)

    @cached_property
    def sha256(self) -> str:
        """Hex sha256 of the encoded bytes."""
        return sha256_bytes(self.data)

    def base64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")

    def data_url(self) -> str:
        """``data:<mime type>;base64,<data>``, as OpenAI-compatible APIs take images."""
        return f"data:{self.mime_type};base64,{self.base64()}"


Part = TextPart | ImagePart
Content = str | bytes | np.ndarray | TextPart | ImagePart


def as_part(content: Content) -> Part:
    """A part from text, image bytes, an RGB array or a part."""
    if isinstance(content, (TextPart, ImagePart)):
        return content
    if isinstance(content, str):
        return TextPart(content)
    if isinstance(content, bytes):
        return ImagePart(content)
    if isinstance(content, np.ndarray):
        return ImagePart.from_array(content)
    raise TypeError(f"a chat message part must be text, image bytes or an array, "
                    f"not {type(content).__name__}")


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation: a role and its parts, in order."""

    role: Role
    parts: tuple[Part, ...]

    def __post_init__(self) -> None:
        if self.role not in ("system", "user", "assistant"):
            raise ValueError(f"unknown chat role {self.role!r}")
        object.__setattr__(self, "parts", tuple(as_part(p) for p in self.parts))
        if not self.parts:
            raise ValueError("a chat message needs at least one part")
        if self.role != "user" and self.images:
            raise ValueError(f"images go in user messages; this is a {self.role} message")

    @classmethod
    def system(cls, text: str) -> ChatMessage:
        return cls("system", (TextPart(text),))

    @classmethod
    def user(cls, *content: Content) -> ChatMessage:
        """A user turn from text, image bytes and RGB arrays, in order."""
        return cls("user", tuple(as_part(c) for c in content))

    @classmethod
    def assistant(cls, text: str) -> ChatMessage:
        return cls("assistant", (TextPart(text),))

    @property
    def images(self) -> list[ImagePart]:
        return [p for p in self.parts if isinstance(p, ImagePart)]

    @property
    def text(self) -> str:
        """The text parts, one per line (images left out)."""
        return "\n".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def single_text(self) -> str | None:
        """The text when the message is exactly one text part, else None."""
        if len(self.parts) == 1 and isinstance(self.parts[0], TextPart):
            return self.parts[0].text
        return None

    def identity(self) -> dict[str, Any]:
        """What determines a reply: role, texts, and each image's type and sha256 (not its
        bytes, so cache files and logs stay small)."""
        return {"role": self.role, "parts": [
            {"text": p.text} if isinstance(p, TextPart)
            else {"image_sha256": p.sha256, "mime_type": p.mime_type, "bytes": len(p.data)}
            for p in self.parts
        ]}


def text_messages(system: str, user: str) -> tuple[ChatMessage, ChatMessage]:
    """The (system, user) text request that prompt synthesis sends."""
    return ChatMessage.system(system), ChatMessage.user(user)


def as_system_user(messages: Sequence[ChatMessage]) -> tuple[str, str] | None:
    """(system, user) when ``messages`` is one system text and one user text, else None.

    Such requests keep the cache key they had before messages could carry images, so existing
    reply caches and synthesis logs stay valid.
    """
    if len(messages) != 2:
        return None
    system, user = messages
    if system.role != "system" or user.role != "user":
        return None
    system_text, user_text = system.single_text, user.single_text
    if system_text is None or user_text is None:
        return None
    return system_text, user_text
