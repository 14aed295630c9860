"""A local vision-language model (Qwen3-VL, Qwen2.5-VL, ...) as a chat client, batched.

The model is loaded on the first uncached request with ``AutoProcessor`` and
``AutoModelForImageTextToText``; torch and transformers are imported only then, so importing
this module stays cheap. Conversations become the processor's chat format (text and image
parts, in order), and up to ``batch_size`` of them run in one ``generate`` call, left padded.

Greedy decoding (``temperature: 0``) makes a batched answer equal to the same request sent
alone, which the tests check; with sampling, a batch draws from one seeded generator and so
differs from one-at-a-time replies (still reproducible for the same batch). Judges use
temperature 0.

Qwen-VL processors also hold a video processor, which needs torchvision. Where it cannot be
built, the processor is assembled from the image processor and tokenizer alone
(:func:`image_text_processor`): the judges send images, never video.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acrb.clients._client import AnswerSchema, ChatClient, Conversation, RequestOutcome, log, short
from acrb.clients._messages import ImagePart, TextPart
from acrb.clients.transformers import (
    device_error,
    generation_options,
    load_error,
    resolve_device,
    seeded_generate,
)

if TYPE_CHECKING:
    from acrb.config import LLMBackendParams


def hf_conversation(messages: Conversation) -> tuple[list[dict[str, Any]], list[Any]]:
    """The conversation in transformers' multimodal chat format, and its images (PIL, RGB) in
    the order the template places them."""
    from PIL import Image

    turns: list[dict[str, Any]] = []
    images: list[Any] = []
    for message in messages:
        content: list[dict[str, Any]] = []
        for part in message.parts:
            if isinstance(part, TextPart):
                content.append({"type": "text", "text": part.text})
            else:
                assert isinstance(part, ImagePart)
                content.append({"type": "image"})
                images.append(Image.open(io.BytesIO(part.data)).convert("RGB"))
        turns.append({"role": message.role, "content": content})
    return turns, images


def image_text_processor(model: str, revision: str | None) -> Any:
    """The model's processor without its video part, from its image processor and tokenizer.

    The processor class comes from the model type's entry in transformers' processor mapping
    (``Qwen3VLProcessor`` for ``qwen3_vl``); a subclass whose constructor takes no video
    processor keeps everything else (image token expansion, chat template) as released.
    """
    import transformers
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    config = AutoConfig.from_pretrained(model, revision=revision)
    class_name = PROCESSOR_MAPPING_NAMES.get(config.model_type)
    base = getattr(transformers, class_name, None) if isinstance(class_name, str) else None
    if base is None:
        raise ValueError(f"no processor class is known for model type {config.model_type!r}")
    tokenizer = AutoTokenizer.from_pretrained(model, revision=revision)
    image_processor = AutoImageProcessor.from_pretrained(model, revision=revision)

    class ImageTextProcessor(base):  # type: ignore[misc, valid-type]
        # ProcessorMixin reads its parts from the constructor's parameter names.
        def __init__(self, image_processor: Any = None, tokenizer: Any = None,
                     chat_template: Any = None, **kwargs: Any) -> None:
            super().__init__(image_processor, tokenizer, chat_template=chat_template, **kwargs)

    ImageTextProcessor.__name__ = f"{base.__name__}WithoutVideo"
    return ImageTextProcessor(image_processor, tokenizer,
                              chat_template=getattr(tokenizer, "chat_template", None))


class TransformersVLMChatClient(ChatClient):
    """A local image-text-to-text model, loaded on the first uncached request.

    Uncached requests of :meth:`chat_many` go ``batch_size`` at a time into one ``generate``
    call under a lock; each call is seeded with ``params.seed`` inside a private RNG state, so
    replies are reproducible and the caller's random state is untouched.
    """

    def __init__(self, name: str, params: LLMBackendParams, cache_dir: Path) -> None:
        super().__init__(name, params, cache_dir)
        self._lock = threading.Lock()
        self._model: Any = None
        self._processor: Any = None
        self._device: str | None = None

    def _workers(self) -> int:
        return 1

    def _batch_size(self) -> int:
        return self.params.batch_size

    def _load(self) -> None:
        if self._model is not None:
            return
        from transformers import AutoModelForImageTextToText, AutoProcessor

        p = self.params
        device = resolve_device(p.device)
        try:
            try:
                processor = AutoProcessor.from_pretrained(p.model, revision=p.revision)
            except ImportError as exc:
                # The video processor needs torchvision; images need only the rest.
                log.info("chat backend %r: %s; building the processor without video",
                         self.name, short(str(exc), 120))
                processor = image_text_processor(p.model, p.revision)
            model: Any = AutoModelForImageTextToText.from_pretrained(
                p.model, revision=p.revision, dtype="auto")
        except (OSError, ValueError) as exc:
            raise load_error(self.name, p, exc) from exc
        try:
            model.to(device)
        except (RuntimeError, AssertionError) as exc:
            raise device_error(self.name, p, device, exc) from exc
        model.eval()
        tokenizer = processor.tokenizer
        # Left padding: every row's prompt then ends where generation starts.
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
            tokenizer.pad_token = tokenizer.eos_token
        self._processor, self._model, self._device = processor, model, device

    def _request(self, messages: Conversation, schema: AnswerSchema = None) -> RequestOutcome:
        return self._request_batch([(messages, schema)])[0]

    def _request_batch(self, batch: Sequence[tuple[Conversation, AnswerSchema]]
                       ) -> list[RequestOutcome]:
        # The schema is only in the prompt (no constrained decoding); the caller validates.
        with self._lock:
            self._load()
            p = self.params
            processor, model = self._processor, self._model
            device = self._device or "cpu"
            conversations, images = [], []
            for messages, _ in batch:
                turns, pictures = hf_conversation(messages)
                conversations.append(turns)
                images.extend(pictures)
            texts = processor.apply_chat_template(conversations, add_generation_prompt=True,
                                                  tokenize=False)
            encoded = processor(text=list(texts), images=images or None, padding=True,
                                return_tensors="pt")
            inputs = {key: value.to(device) for key, value in encoded.items()
                      if hasattr(value, "to")}
            options = generation_options(p, processor.tokenizer.pad_token_id)
            for _ in batch:
                self._count_request()
            try:
                output = seeded_generate(model, inputs, options, p.seed, device)
            except RuntimeError as exc:
                reason = f"generation failed: {short(str(exc), 200)}"
                return [RequestOutcome("error", "", reason, 1) for _ in batch]
            new_tokens = output[:, inputs["input_ids"].shape[1]:]
            replies = processor.batch_decode(new_tokens, skip_special_tokens=True)
        return [RequestOutcome("ok", text, "", 1) for text in replies]

    def close(self) -> None:
        with self._lock:
            self._model = None
            self._processor = None
