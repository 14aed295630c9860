"""Chat clients shared by prompt synthesis, the VLM judges and the API editors.

One interface, :class:`ChatClient`, over three kinds of backend, chosen by ``kind`` through
:data:`acrb.registry.CHAT_BACKENDS`:

* ``openai``: any OpenAI-compatible ``/chat/completions`` endpoint (OpenAI, vLLM, Ollama,
  llama.cpp server), :mod:`acrb.clients.openai`;
* ``gemini``: Google's Gemini ``generateContent`` REST API, :mod:`acrb.clients.gemini`;
* ``transformers``: a local Hugging Face causal LM, text only (torch and transformers are
  imported only when it first generates), :mod:`acrb.clients.transformers`;
* ``transformers-vlm``: a local vision-language model (Qwen3-VL, Qwen2.5-VL and other
  image-text-to-text models), batched generation, :mod:`acrb.clients.transformers_vlm`.

A request is a sequence of :class:`ChatMessage`, whose parts are text and images (PNG or JPEG
bytes, or RGB arrays sent as PNG); ``complete(system, user)`` is the text shorthand. Replies are
cached on disk by a content hash of the request (images by their sha256), sends are rate
limited and retried (honouring ``Retry-After``), and refusals are recognised. Open a client
with :func:`acrb.registry.open_chat_client`.
"""

from acrb.clients._client import (
    AnswerSchema,
    ChatClient,
    ChatReply,
    ChatStatus,
    Conversation,
    RateLimiter,
)
from acrb.clients._messages import (
    ChatMessage,
    ImagePart,
    Part,
    TextPart,
    as_system_user,
    text_messages,
)
from acrb.clients._refusal import looks_like_refusal
from acrb.sections import ChatBackendParams

__all__ = [
    "AnswerSchema",
    "ChatBackendParams",
    "ChatClient",
    "ChatMessage",
    "ChatReply",
    "ChatStatus",
    "Conversation",
    "ImagePart",
    "Part",
    "RateLimiter",
    "TextPart",
    "as_system_user",
    "looks_like_refusal",
    "text_messages",
]
