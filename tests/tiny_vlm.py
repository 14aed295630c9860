"""Random-weight Qwen3-VL and Qwen2.5-VL checkpoints written to a folder, nothing from a hub.

A checkpoint folder holds what a released one does for the judges' path: ``config.json`` and
weights, a tokenizer (word level, built here, with the Qwen chat special tokens and a Qwen-style
chat template that places image parts), and the PIL image processor's ``preprocessor_config``.
No video processor is written (it needs torchvision); the ``transformers-vlm`` backend builds the
processor without it. The model dimensions are parameters, so the GPU benchmark writes a
random-weight model of the real Qwen2.5-VL-7B size with the same code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

Family = Literal["qwen3_vl", "qwen2_5_vl"]

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>"]
WORDS = ["system", "user", "assistant", "source", "output", "image", "edit", "the", "a", "of",
         "skin", "tone", "race", "gender", "age", "change", "request", "score", "yes", "no",
         "person", "photo", "darker", "lighter", "same", "answer", "rate", "with", "keys"]
# Qwen's template, reduced to what the judges send: roles, text parts and image parts in order.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Tiny dimensions: a forward pass costs milliseconds on a CPU.
TINY_TEXT: dict[str, Any] = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                             "mrope_section": [2, 1, 1]}
TINY_VISION: dict[str, Any] = {"depth": 2, "hidden_size": 32, "intermediate_size": 64,
                               "num_heads": 4}


def build_tokenizer(extra_words: int = 100) -> Any:
    """A word-level fast tokenizer with the Qwen chat special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for word in [*WORDS, *(f"w{i}" for i in range(extra_words))]:
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece()  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="w0", pad_token="<|endoftext|>",
        eos_token="<|im_end|>", additional_special_tokens=SPECIALS[1:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def write_vlm(folder: Path, family: Family = "qwen3_vl", *, text: dict[str, Any] | None = None,
              vision: dict[str, Any] | None = None, vocab_size: int | None = None,
              max_pixels: int = 64 * 64, seed: int = 0, save_weights: bool = True,
              device: str = "cpu", dtype: Any = None) -> Any:
    """Write a random-weight ``family`` checkpoint to ``folder``; returns the model.

    ``text`` and ``vision`` override the tiny dimensions (``mrope_section`` sums to half the
    head size); ``vocab_size`` defaults to the tokenizer's. Images are resized to at most
    ``max_pixels`` pixels, with the family's real patch settings (Qwen3-VL 16 px patches,
    Qwen2.5-VL 14 px, both merged 2 x 2). The model is built on ``device`` in ``dtype``
    (default float32); ``save_weights=False`` writes everything but the weights (a model of the
    real size is then used in memory rather than written and read back).
    """
    import torch
    from transformers import Qwen2VLImageProcessorPil

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(folder)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIALS}
    patch = 16 if family == "qwen3_vl" else 14
    unit = patch * 2
    Qwen2VLImageProcessorPil(patch_size=patch, temporal_patch_size=2, merge_size=2,
                             min_pixels=unit * unit, max_pixels=max_pixels).save_pretrained(folder)

    text_dims = {**TINY_TEXT, **(text or {})}
    vision_dims = {**TINY_VISION, **(vision or {})}
    mrope = text_dims.pop("mrope_section")
    text_config = {**text_dims, "vocab_size": vocab_size or len(tokenizer),
                   "max_position_embeddings": 4096, "bos_token_id": ids["<|endoftext|>"],
                   "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}
    tokens = {"image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
              "vision_start_token_id": ids["<|vision_start|>"],
              "vision_end_token_id": ids["<|vision_end|>"]}
    if family == "qwen3_vl":
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

        text_config["rope_parameters"] = {"rope_type": "default", "rope_theta": 5_000_000.0,
                                          "mrope_section": mrope, "mrope_interleaved": True}
        vision_config = {"patch_size": patch, "spatial_merge_size": 2, "temporal_patch_size": 2,
                         "out_hidden_size": text_config["hidden_size"],
                         "num_position_embeddings": 64,
                         "deepstack_visual_indexes": [vision_dims["depth"] - 1], **vision_dims}
        config: Any = Qwen3VLConfig(text_config=text_config, vision_config=vision_config,
                                    **tokens)
        model_class: Any = Qwen3VLForConditionalGeneration
    else:
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        text_config["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0,
                                          "mrope_section": mrope}
        depth = vision_dims["depth"]
        vision_config = {"patch_size": patch, "spatial_merge_size": 2, "temporal_patch_size": 2,
                         "out_hidden_size": text_config["hidden_size"], "window_size": 112,
                         "fullatt_block_indexes": [depth - 1], **vision_dims}
        config = Qwen2_5_VLConfig(text_config=text_config, vision_config=vision_config, **tokens)
        model_class = Qwen2_5_VLForConditionalGeneration
    config.eos_token_id = ids["<|im_end|>"]
    config.pad_token_id = ids["<|endoftext|>"]
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float32)
    try:
        with torch.device(device):
            model = model_class(config).eval()
    finally:
        torch.set_default_dtype(previous)
    config.save_pretrained(folder)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    if save_weights:
        model.save_pretrained(folder)
    return model
