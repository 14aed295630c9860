"""A local vision-language model (Qwen3-VL, Qwen2.5-VL, ...) as a chat client, batched.

The model is loaded on the first uncached request with ``AutoProcessor`` and
``AutoModelForImageTextToText``; torch and transformers are imported only then, so importing
this module stays cheap. Conversations become the processor's chat format (text and image
parts, in order), and up to ``batch_size`` of them run in one ``generate`` call, left padded.

Greedy decoding (``temperature: 0``) makes a batched answer equal to the same request sent
alone, which the tests check; with sampling, a batch draws from one seeded generator and so
differs from one-at-a-time replies (still reproducible for the same batch). Judges use
temperature 0.

What keeps a GPU busy (each measured by ``benchmarks/judge_throughput.py``):

- images the judge built from arrays reach the processor as those pixels
  (:attr:`ImagePart.pixels`), not as PNG bytes decoded again; the PNG itself is still made,
  since a reply's cache key is the sha256 of those bytes;
- the processor call for batch k + 1 runs in a background thread (into pinned memory on a GPU)
  while ``generate`` runs batch k, and only the new tokens are decoded, in one ``batch_decode``;
- ``attn_implementation`` (default :data:`PACKED_SDPA`) picks the attention: with transformers'
  ``sdpa`` the Qwen2.5-VL vision tower calls SDPA once per 112 px window and image and layer
  (16 windows per 448 px image, 32 layers), while :data:`PACKED_SDPA` runs all windows of one
  length as one batched SDPA call (:func:`packed_sdpa_attention`) and leaves the text model on
  ``sdpa``;
- ``cache_implementation`` is ``generate``'s KV cache: ``dynamic`` (default) or ``static``.

Qwen-VL processors also hold a video processor, which needs torchvision. Where it cannot be
built, the processor is assembled from the image processor and tokenizer alone
(:func:`image_text_processor`): the judges send images, never video.
"""

from __future__ import annotations

import io
import itertools
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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
from acrb.errors import ConfigError

if TYPE_CHECKING:
    from acrb.sections import ChatBackendParams

#: The attention of :func:`packed_sdpa_attention` as registered with transformers'
#: ``AttentionInterface``. Qwen-VL vision attention hands ``cu_seq_lens_q`` (the window and image
#: boundaries) only to an implementation whose name contains "flash" and otherwise splits the
#: sequence itself, one call per window; "sdpa" in the name makes transformers check the model
#: supports SDPA, as it would for ``sdpa``.
PACKED_SDPA_KERNEL = "acrb_packed_sdpa_flash_varlen"
#: The backend's attention option: SDPA for the text model, packed SDPA for the vision tower.
PACKED_SDPA = "sdpa_packed"
#: Batches handed to the client at once, so that batch k + 1 is prepared while batch k runs.
PIPELINE_BATCHES = 8


def packed_sdpa_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                          *, scaling: float | None = None, dropout: float = 0.0,
                          cu_seq_lens_q: Any = None, cu_seq_lens_k: Any = None,
                          is_causal: bool = False, **_: Any) -> tuple[Any, None]:
    """Variable-length attention over packed sequences as a few batched SDPA calls.

    ``query``, ``key`` and ``value`` are (1, heads, tokens, head size), the sequences (windows or
    images) packed along the tokens at the boundaries ``cu_seq_lens_q`` (as flash-attn's
    varlen kernel takes them). Sequences of one length are gathered into one
    (sequences, heads, length, head size) batch, so a 448 px image's 16 windows and all images
    of a batch cost one SDPA call instead of one each. Each sequence attends to itself only, as
    in the per-window loop of transformers' ``sdpa`` path, so the result equals it.
    Returns (1, tokens, heads, head size), the layout transformers' attention functions return.
    """
    import torch
    import torch.nn.functional as F

    if cu_seq_lens_q is None:
        # Not a packed call (a caller outside the vision tower): plain SDPA.
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                             dropout_p=dropout, scale=scaling,
                                             is_causal=is_causal and attention_mask is None)
        return out.transpose(1, 2).contiguous(), None
    if cu_seq_lens_k is not None and cu_seq_lens_k is not cu_seq_lens_q \
            and not torch.equal(cu_seq_lens_q, cu_seq_lens_k):
        raise ValueError("packed SDPA needs the same query and key boundaries")
    heads, tokens, size = query.shape[1], query.shape[2], query.shape[3]
    bounds = cu_seq_lens_q.tolist()  # one host sync per layer, not one per window
    starts, lengths = bounds[:-1], [b - a for a, b in itertools.pairwise(bounds)]
    q, k, v = (t[0] for t in (query, key, value))  # (heads, tokens, size)
    out = query.new_empty(tokens, heads, size)
    for length in sorted(set(lengths)):
        if length == 0:
            continue
        first = [s for s, n in zip(starts, lengths, strict=True) if n == length]
        index = (torch.tensor(first, device=query.device)[:, None]
                 + torch.arange(length, device=query.device)[None, :]).reshape(-1)

        def gather(t: Any, index: Any = index, length: int = length) -> Any:
            # (heads, n * length, size) -> (n, heads, length, size)
            return t.index_select(1, index).reshape(heads, -1, length, size).transpose(0, 1)

        attended = F.scaled_dot_product_attention(gather(q), gather(k), gather(v),
                                                  dropout_p=dropout, scale=scaling,
                                                  is_causal=is_causal)
        out.index_copy_(0, index, attended.transpose(1, 2).reshape(-1, heads, size))
    return out.unsqueeze(0), None


def register_packed_sdpa() -> None:
    """Register :func:`packed_sdpa_attention` with transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_SDPA_KERNEL, packed_sdpa_attention)


def apply_attention(model: Any, choice: str) -> None:
    """Set ``model``'s attention: :data:`PACKED_SDPA` (text ``sdpa``, vision tower packed),
    or any ``attn_implementation`` name transformers takes (``sdpa``, ``eager``, ...) for the
    whole model."""
    if choice == PACKED_SDPA:
        register_packed_sdpa()
        model.set_attn_implementation({"": "sdpa", "text_config": "sdpa",
                                       "vision_config": PACKED_SDPA_KERNEL})
    else:
        model.set_attn_implementation(choice)


def attention_summary(model: Any) -> dict[str, str | None]:
    """The attention implementation of ``model`` and of each of its sub-configs."""
    config = model.config
    summary: dict[str, str | None] = {"": config._attn_implementation}
    for key in config.sub_configs:
        sub = getattr(config, key, None)
        if sub is not None:
            summary[key] = sub._attn_implementation
    return summary


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
                # Pixels the judge already holds go in as they are; only bytes get decoded.
                images.append(Image.fromarray(part.pixels) if part.pixels is not None
                              else Image.open(io.BytesIO(part.data)).convert("RGB"))
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
    replies are reproducible and the caller's random state is untouched. With ``batch_size`` over
    1 the base class hands over up to :data:`PIPELINE_BATCHES` batches at once, so the processor
    prepares the next batch while the current one generates (replies are then cached per hand-over,
    so an interrupted run loses at most that many batches).

    ``attn_implementation`` and ``cache_implementation`` come from the params (defaults
    :data:`PACKED_SDPA` and ``dynamic``); they can be set on the instance before the first
    request.
    """

    def __init__(self, name: str, params: ChatBackendParams, cache_dir: Path) -> None:
        super().__init__(name, params, cache_dir)
        self._lock = threading.Lock()
        # A fast tokenizer must not be used from two threads at once (the processor sets its
        # padding while encoding; a concurrent decode fails with "Already borrowed").
        self._tokenizer_lock = threading.Lock()
        self._model: Any = None
        self._processor: Any = None
        self._device: str | None = None
        self.attn_implementation: str = params.attn_implementation
        self.cache_implementation: str = params.cache_implementation

    def _workers(self) -> int:
        return 1

    def _batch_size(self) -> int:
        # One at a time stays one request per call, as a baseline and for the cache's sake.
        size = self.params.batch_size
        return size if size == 1 else size * PIPELINE_BATCHES

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
            apply_attention(model, self.attn_implementation)
        except (ValueError, ImportError) as exc:
            raise ConfigError(
                f"LLM backend {self.name!r}: attention implementation "
                f"{self.attn_implementation!r} cannot be used: {short(str(exc), 200)}",
                f"use {PACKED_SDPA} (the default), sdpa or eager") from exc
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

    def _prepare(self, batch: Sequence[tuple[Conversation, AnswerSchema]]) -> dict[str, Any]:
        """The processor's tensors for ``batch``, in pinned memory when the model is on a GPU
        (so the copy to the device does not block the host)."""
        processor = self._processor
        conversations, images = [], []
        for messages, _ in batch:
            turns, pictures = hf_conversation(messages)
            conversations.append(turns)
            images.extend(pictures)
        with self._tokenizer_lock:
            texts = processor.apply_chat_template(conversations, add_generation_prompt=True,
                                                  tokenize=False)
            encoded = processor(text=list(texts), images=images or None, padding=True,
                                return_tensors="pt")
        pin = (self._device or "cpu").startswith("cuda")
        return {key: value.pin_memory() if pin else value for key, value in encoded.items()
                if hasattr(value, "to")}

    def _generate(self, prepared: dict[str, Any], size: int) -> list[RequestOutcome]:
        """One ``generate`` call on prepared inputs; the replies, or an error for each row."""
        device = self._device or "cpu"
        inputs = {key: value.to(device, non_blocking=True) for key, value in prepared.items()}
        with self._tokenizer_lock:
            pad_token_id = self._processor.tokenizer.pad_token_id
        options = generation_options(self.params, pad_token_id)
        if self.cache_implementation != "dynamic":
            options["cache_implementation"] = self.cache_implementation
        for _ in range(size):
            self._count_request()
        try:
            output = seeded_generate(self._model, inputs, options, self.params.seed, device)
        except RuntimeError as exc:
            reason = f"generation failed: {short(str(exc), 200)}"
            return [RequestOutcome("error", "", reason, 1) for _ in range(size)]
        # The new tokens only, moved to the host once and decoded in one call.
        new_tokens = output[:, inputs["input_ids"].shape[1]:].cpu()
        with self._tokenizer_lock:
            replies = self._processor.batch_decode(new_tokens, skip_special_tokens=True)
        return [RequestOutcome("ok", text, "", 1) for text in replies]

    def _request(self, messages: Conversation, schema: AnswerSchema = None) -> RequestOutcome:
        return self._request_batch([(messages, schema)])[0]

    def _request_batch(self, batch: Sequence[tuple[Conversation, AnswerSchema]]
                       ) -> list[RequestOutcome]:
        # The schema is only in the prompt (no constrained decoding); the caller validates.
        size = self.params.batch_size
        chunks = [batch[start:start + size] for start in range(0, len(batch), size)]
        outcomes: list[RequestOutcome] = []
        with self._lock:
            self._load()
            if len(chunks) == 1:
                return self._generate(self._prepare(chunks[0]), len(chunks[0]))
            # One thread prepares chunk k + 1 while generate runs chunk k.
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"vlm-{self.name}") as pool:
                upcoming: Future[dict[str, Any]] = pool.submit(self._prepare, chunks[0])
                for index, chunk in enumerate(chunks):
                    prepared = upcoming.result()
                    if index + 1 < len(chunks):
                        upcoming = pool.submit(self._prepare, chunks[index + 1])
                    outcomes.extend(self._generate(prepared, len(chunk)))
        return outcomes

    def close(self) -> None:
        with self._lock:
            self._model = None
            self._processor = None
