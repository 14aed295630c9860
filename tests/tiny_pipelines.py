"""Tiny random-weight diffusers pipelines, built offline from configs, for adapter tests.

An adapter for Qwen-Image-Edit, FLUX.2, FLUX.1-Kontext, InstructPix2Pix or Stable Diffusion 3.5
loads its model with ``SomePipeline.from_pretrained(folder)``. To test that code path without
the hub and without tens of gigabytes of weights, each ``build_*`` function below makes the
same pipeline class from small configs (hidden sizes 16-48, one or two layers except where
said, random weights), saves it with ``save_pretrained`` into the given folder and returns
the folder. The folder then holds what a hub snapshot holds (``model_index.json``, one
subfolder per component), so ``from_pretrained`` runs unchanged.

Nothing is downloaded: every tokenizer is made here from the few sentences in
:data:`TOKENIZER_CORPUS`, in the layout its ``transformers`` class expects: byte-level BPE
(CLIP, Qwen, Mistral) with merges learnt by :func:`learn_bpe_merges`, a unigram vocabulary
(T5) of the corpus words. Both are deterministic, so every build numbers every token alike.
Tokenizer classes built from missing files fall back, silently, to a vocabulary of one or two
special tokens, which would make every prompt encode to the same ids; the tests check for
that.

Sizes and call arguments the tiny models need (the real defaults would work but are slow):

* Qwen-Image-Edit-Plus: any ``height``/``width`` that are multiples of 16; the pipeline itself
  always encodes each input image at about 1024x1024 for the VAE (a constant in diffusers),
  which costs about a second per image here. Needs ``torchvision``: ``Qwen2VLProcessor``
  has a video processor, and transformers makes video processors only with torchvision.
* FLUX.2: input images at least 64 px a side (checked by the pipeline); ``height``/``width``
  multiples of 16. The text encoder has 30 layers so that the default
  ``text_encoder_out_layers=(10, 20, 30)`` works.
* FLUX.1-Kontext: pass ``max_area=height * width`` and ``_auto_resize=False``, or the pipeline
  scales the output to about 1024x1024 and the input image to a preferred Kontext size.
* InstructPix2Pix, SD 3.5: ``height``/``width`` multiples of 8 (IP2P takes its size from the
  input image).

Fixtures: the ``tiny_*_dir`` fixtures build each pipeline once per test session and give its
folder; ``tests/conftest.py`` registers this module as a plugin (``pytest_plugins``), so any
test asks for them by name. ``single_torch_thread`` runs a test on one torch thread (see
there why); mark a module with ``pytestmark = pytest.mark.usefixtures("single_torch_thread")``.
Importing this module needs none of torch, transformers or diffusers; each fixture skips its
test when a package it needs is missing.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

#: Sentences the tokenizers learn their merges from: edit instructions and portrait prompts
#: of the kind the audit sends, so that such prompts encode to whole words.
TOKENIZER_CORPUS = [
    "make this person a doctor",
    "make this person a nurse in a hospital",
    "turn the woman into a firefighter",
    "turn the man into a teacher standing in a classroom",
    "change the clothes to a police uniform",
    "give the person a lab coat and a stethoscope",
    "replace the background with a city street at night",
    "a photo of a young Black woman smiling",
    "a photo of an old White man with glasses",
    "a portrait of an East Asian person in their twenties",
    "a South Asian engineer at work in an office",
    "a Latino chef cooking in a busy kitchen",
    "a Middle Eastern pilot in the cockpit of a plane",
    "a Southeast Asian scientist holding a test tube",
    "keep the face, the lighting and the composition the same",
    "Describe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image.",
    "Generate a new image that meets the user's requirements while maintaining consistency "
    "with the original input where appropriate.",
    "You are an assistant that reasons about image descriptions and gives structured answers.",
    "Picture 1: a portrait. Picture 2: a second portrait. Picture 3: a third one.",
    "high quality, detailed, sharp focus, soft light, 50mm lens, 4k, 8k",
    "red orange yellow green blue purple black white grey brown pink",
    "zero one two three four five six seven eight nine ten",
    "quick jumping fox vexing wizards, 0123456789 !?.,;:'\"()[]{}-_+=*/&%$#@",
]

#: Chat template of the tiny Mistral processor (FLUX.2). It renders the message layout FLUX.2
#: sends (a system message, then user messages whose content is a list of text and image
#: parts) with Mistral-style markers, enough for the pipeline's ``apply_chat_template`` call.
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set parts = [{'type': 'text', 'text': "
    "message['content']}] %}{% else %}{% set parts = message['content'] %}{% endif %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{% elif message['role'] == 'user' %}"
    "[INST]{% endif %}"
    "{% for part in parts %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% else %}[IMG]{% endif %}{% endfor %}"
    "{% if message['role'] == 'system' %}[/SYSTEM_PROMPT]{% elif message['role'] == 'user' %}"
    "[/INST]{% else %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)

#: Concept thresholds for the tiny safety checker. It flags an image when the cosine
#: similarity of its embedding to a concept embedding exceeds the concept's threshold; a
#: cosine lies in [-1, 1], so a threshold of -2 is always exceeded and one of 2 never is.
FLAG_EVERYTHING_THRESHOLD = -2.0
FLAG_NOTHING_THRESHOLD = 2.0


# --- tokenizers -------------------------------------------------------------------------------


def _words(normalize: Callable[[str], str], pre_tokenizer: Any,
           extra_text: list[str] | None = None) -> Counter[str]:
    """How often each pre-tokenized piece occurs in the corpus (plus ``extra_text``)."""
    counts: Counter[str] = Counter()
    for text in [*TOKENIZER_CORPUS, *(extra_text or [])]:
        counts.update(piece for piece, _ in pre_tokenizer.pre_tokenize_str(normalize(text)))
    return counts


def learn_bpe_merges(words: Counter[str], count: int, *, word_suffix: str = ""
                     ) -> list[tuple[str, str]]:
    """Up to ``count`` BPE merges learnt from ``words``, the same on every run.

    The ``tokenizers`` trainers break ties between equally frequent pairs in hash order, so
    two builds would number tokens differently; here the tie goes to the smaller pair. A
    word's last symbol carries ``word_suffix``, as the BPE model marks word ends.
    """
    split = Counter({(*word[:-1], word[-1] + word_suffix): n for word, n in words.items()})
    merges: list[tuple[str, str]] = []
    while len(merges) < count:
        pairs: Counter[tuple[str, str]] = Counter()
        for symbols, n in split.items():
            for pair in itertools.pairwise(symbols):
                pairs[pair] += n
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        joined: Counter[tuple[str, ...]] = Counter()
        for symbols, n in split.items():
            out: list[str] = []
            for symbol in symbols:
                if out and (out[-1], symbol) == best:
                    out[-1] += symbol
                else:
                    out.append(symbol)
            joined[tuple(out)] += n
        split = joined
    return merges


def _byte_level_bpe(pre_tokenizer: Any, specials: list[str], merge_count: int, *,
                    normalize: Callable[[str], str] = str, word_suffix: str = "",
                    extra_text: list[str] | None = None
                    ) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocab and merges of a byte-level BPE learnt on pieces split by ``pre_tokenizer``.

    The ``transformers`` class rebuilds its own pre-tokenizer around the vocab and merges we
    hand it, so ``pre_tokenizer`` must split as that one does. The vocab has every byte
    symbol (with and without ``word_suffix``), so any text encodes with no unknown token.
    """
    from tokenizers import pre_tokenizers

    merges = learn_bpe_merges(_words(normalize, pre_tokenizer, extra_text), merge_count,
                              word_suffix=word_suffix)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    suffixed = [byte + word_suffix for byte in alphabet] if word_suffix else []
    vocab: dict[str, int] = {}
    for token in [*specials, *alphabet, *suffixed, *(left + right for left, right in merges)]:
        vocab.setdefault(token, len(vocab))
    return vocab, merges


def _byte_level_split(pattern: str, behavior: str, invert: bool = False) -> Any:
    """A regex split followed by the byte-level mapping, as the BPE tokenizers here use."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior=behavior, invert=invert),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


#: The pre-tokenizer splits of CLIP's and Qwen2's tokenizers (as their transformers classes
#: build them), so that the merges learnt here apply to the same pieces.
CLIP_SPLIT = (r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|"""
              r"""[^\s\p{L}\p{N}]+""")
QWEN_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
              r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def _nfc(text: str) -> str:
    """Unicode NFC, the normalizer of Qwen's tokenizer."""
    return unicodedata.normalize("NFC", text)


def make_clip_tokenizer(max_length: int = 77) -> Any:
    """A ``CLIPTokenizer`` (lower-cased byte-level BPE, ``</w>`` word ends) of ~800 tokens."""
    from transformers import CLIPTokenizer

    vocab, merges = _byte_level_bpe(
        _byte_level_split(CLIP_SPLIT, "removed", invert=True),
        ["<|startoftext|>", "<|endoftext|>"], 300,
        normalize=lambda text: " ".join(_nfc(text).split()).lower(), word_suffix="</w>")
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=max_length)


def make_t5_tokenizer(max_length: int = 512) -> Any:
    """A ``T5Tokenizer`` (sentencepiece-style unigram) with T5's ids: pad 0, eos 1, unk 2.

    The pieces are every corpus word (scored by its frequency), the printable ASCII
    characters and the word-start mark ``▁`` (scored low), so known words encode whole and
    others letter by letter; built directly rather than trained, so every build is the same.
    """
    from tokenizers import pre_tokenizers
    from transformers import T5Tokenizer

    split = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
    ])
    words = _words(str, split)
    total = sum(words.values())
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -8.0)]
    pieces += [(char, -10.0) for char in sorted(set(string.printable) - set(string.whitespace))]
    pieces += [(word, math.log(n / total)) for word, n in sorted(words.items()) if len(word) > 1]
    # No sentinel <extra_id_*> tokens: the encoders here never see them, and without them
    # the vocabulary is exactly the pieces above.
    return T5Tokenizer(vocab=list(dict(pieces).items()), extra_ids=0, model_max_length=max_length)


#: The special tokens Qwen2.5-VL's chat and vision prompts use.
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def make_qwen_tokenizer() -> Any:
    """A ``Qwen2Tokenizer`` (byte-level BPE) with the chat and vision special tokens."""
    from transformers import Qwen2Tokenizer

    vocab, merges = _byte_level_bpe(_byte_level_split(QWEN_SPLIT, "isolated"), QWEN_SPECIALS,
                                    400, normalize=_nfc)
    return Qwen2Tokenizer(vocab=vocab, merges=merges, extra_special_tokens=QWEN_SPECIALS[1:],
                          model_max_length=32768)


#: Special tokens of the tiny Mistral tokenizer, in id order (``<unk>`` is 0, as in Mistral's).
MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]",
                    "[/SYSTEM_PROMPT]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]


def make_mistral_tokenizer() -> Any:
    """A generic fast tokenizer (byte-level BPE) with Mistral's chat and image markers.

    ``PixtralProcessor`` loads its tokenizer as the generic ``TokenizersBackend`` whatever
    class saved it, so the tokenizer is built as that class from a ``tokenizers`` object.
    """
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    split = _byte_level_split(QWEN_SPLIT, "isolated")
    vocab, merges = _byte_level_bpe(split, MISTRAL_SPECIALS, 400, normalize=_nfc,
                                    extra_text=[SYSTEM_MESSAGE])
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    core.pre_tokenizer = split
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(token, special=True) for token in MISTRAL_SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>", model_max_length=32768,
    )


def _embedding_rows(tokenizer: Any) -> int:
    """Rows for an embedding table that covers every id of ``tokenizer`` (its ``len``: the
    vocabulary and the added tokens), rounded up to 64."""
    return -(-len(tokenizer) // 64) * 64


# --- text encoders ----------------------------------------------------------------------------


def _seeded(factory: Callable[[], Any], seed: int = 0) -> Any:
    """Build a module right after seeding torch, so that every build has the same weights."""
    import torch

    torch.manual_seed(seed)
    return factory()


def make_clip_text_encoder(tokenizer: Any, hidden_size: int = 32, projection_dim: int = 32,
                           *, with_projection: bool = False) -> Any:
    """A two-layer CLIP text encoder whose vocabulary and special ids match ``tokenizer``."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=_embedding_rows(tokenizer), hidden_size=hidden_size,
        intermediate_size=2 * hidden_size, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=tokenizer.model_max_length, projection_dim=projection_dim,
        # CLIP pools at the first end-of-text id (an eos id of 2 would select the old argmax
        # rule instead), so these must be the tokenizer's ids.
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model_class = CLIPTextModelWithProjection if with_projection else CLIPTextModel
    return _seeded(lambda: model_class(config))


def make_t5_encoder(tokenizer: Any, d_model: int = 32) -> Any:
    """A two-layer T5 encoder whose vocabulary matches ``tokenizer``."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=_embedding_rows(tokenizer), d_model=d_model, d_kv=8, d_ff=2 * d_model,
        num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return _seeded(lambda: T5EncoderModel(config))


# --- pipelines --------------------------------------------------------------------------------


def _save(pipeline: Any, folder: Path) -> Path:
    """Save ``pipeline`` into ``folder`` (created if need be) and return the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pipeline.save_pretrained(folder)
    return folder


def build_qwen_image_edit_plus(folder: Path) -> Path:
    """Save a tiny ``QwenImageEditPlusPipeline`` (Qwen-Image-Edit-2511 layout) into ``folder``.

    Components: a two-layer ``Qwen2_5_VLForConditionalGeneration`` (text 32 wide, vision
    tower 32 wide) whose image token ids are the tokenizer's; a ``Qwen2VLProcessor`` (the
    tokenizer, an image processor that shrinks images to at most 112x112 so that each input
    image costs at most 16 prompt tokens, and the video processor the class requires); a
    ``QwenImageTransformer2DModel`` (one layer, 2 heads of 16); an ``AutoencoderKLQwenImage``
    with the real model's 8x downsampling but 4 channels; the flow-matching scheduler with
    the released model's exponential, resolution-dependent shift.
    Needs torchvision (see the module docstring).
    """
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageEditPlusPipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tokenizer = make_qwen_tokenizer()
    # 112x112 at most, 56x56 at least: a 14 px patch grid of 4x4 to 8x8, merged 2x2 into
    # 4 to 16 image tokens. The real processor allows up to ~3600x3600.
    pixel_bounds = {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=pixel_bounds),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(size=pixel_bounds),
    )
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
    ]}
    text_hidden = 32
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": _embedding_rows(tokenizer), "hidden_size": text_hidden,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 2,
            # Multimodal RoPE splits each head's 16 dims into 8 frequency pairs over
            # (time, height, width).
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                "mrope_section": [2, 3, 3]},
            "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
            "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "out_hidden_size": text_hidden, "fullatt_block_indexes": [1], "window_size": 56,
        },
        **ids,
    )
    text_encoder = _seeded(lambda: Qwen2_5_VLForConditionalGeneration(config))
    z_dim = 4
    # The pipeline VAE-encodes every input image at about 1024x1024 whatever its size, so the
    # VAE keeps the real 8x downsampling (three temporal-downsample flags) but only 4
    # channels at every level and no residual blocks besides the middle ones (the encoder's
    # full-size 3D convolutions are most of the cost): about a second per input image here.
    vae = _seeded(lambda: AutoencoderKLQwenImage(
        base_dim=4, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=0,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
    ))
    # One layer: each input image adds 64x64 = 4096 tokens to the attention.
    transformer = _seeded(lambda: QwenImageTransformer2DModel(
        patch_size=2, in_channels=4 * z_dim, out_channels=z_dim, num_layers=1,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=text_hidden,
        axes_dims_rope=(4, 6, 6),
    ))
    # Resolution-dependent shift, exponential, as the released scheduler config has.
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, time_shift_type="exponential", base_shift=math.log(3),
        max_shift=math.log(3), base_image_seq_len=256, max_image_seq_len=8192,
        shift_terminal=0.02,
    )
    pipeline = QwenImageEditPlusPipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder,
        tokenizer=tokenizer, processor=processor, transformer=transformer,
    )
    return _save(pipeline, folder)


def make_mistral_processor() -> Any:
    """A ``PixtralProcessor``: the Mistral tokenizer, a tiny image processor, a chat template."""
    from transformers import PixtralImageProcessor, PixtralProcessor

    return PixtralProcessor(
        image_processor=PixtralImageProcessor(size={"longest_edge": 64},
                                              patch_size={"height": 8, "width": 8}),
        tokenizer=make_mistral_tokenizer(), patch_size=8, spatial_merge_size=2,
        chat_template=MISTRAL_CHAT_TEMPLATE,
    )


def build_flux2(folder: Path, *, processor: bool | None = None) -> Path:
    """Save a tiny ``Flux2Pipeline`` (FLUX.2-dev layout) into ``folder``.

    Components: a ``Mistral3ForConditionalGeneration`` whose text model is 16 wide and 30
    layers deep (FLUX.2 stacks the hidden states of layers 10, 20 and 30 by default) with a
    one-layer Pixtral vision tower; a ``PixtralProcessor`` with a chat template as the
    ``tokenizer`` component, as FLUX.2-dev has; a ``Flux2Transformer2DModel`` (one double and
    one single block, 2 heads of 16); an ``AutoencoderKLFlux2`` with 8x downsampling and 4
    latent channels; the scheduler. Text-to-image and editing with one or several reference
    images (each at least 64 px).

    ``PixtralProcessor`` needs torchvision. With ``processor=False`` the ``tokenizer``
    component is the processor's tokenizer alone, carrying the same chat template: the
    pipeline only ever calls ``apply_chat_template`` on text, which a tokenizer does too, so
    prompt encoding, editing and generation run the same; only prompt upsampling
    (``caption_upsample_temperature`` with images) needs the processor. The default,
    ``None``, saves the processor where torchvision is installed, the tokenizer elsewhere.
    """
    from diffusers import (
        AutoencoderKLFlux2,
        Flux2Pipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    if processor is None:
        processor = has_torchvision()
    if processor:
        text_processor = make_mistral_processor()
        tokenizer = text_processor.tokenizer
    else:
        text_processor = tokenizer = make_mistral_tokenizer()
        tokenizer.chat_template = MISTRAL_CHAT_TEMPLATE
    text_hidden = 16
    config = Mistral3Config(
        text_config={
            "model_type": "mistral", "vocab_size": _embedding_rows(tokenizer),
            "hidden_size": text_hidden, "intermediate_size": 32, "num_hidden_layers": 30,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "max_position_embeddings": 2048, "sliding_window": None,
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "model_type": "pixtral", "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 64,
            "patch_size": 8, "head_dim": 8,
        },
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"), spatial_merge_size=2,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    text_encoder = _seeded(lambda: Mistral3ForConditionalGeneration(config))
    latent_channels = 4
    vae = _seeded(lambda: AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16), layers_per_block=1, latent_channels=latent_channels,
        norm_num_groups=4, sample_size=64,
    ))
    transformer = _seeded(lambda: Flux2Transformer2DModel(
        patch_size=1, in_channels=4 * latent_channels, num_layers=1, num_single_layers=1,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=3 * text_hidden,
        timestep_guidance_channels=32, axes_dims_rope=(4, 4, 4, 4),
    ))
    pipeline = Flux2Pipeline(scheduler=_flux_scheduler(), vae=vae,
                             text_encoder=text_encoder, tokenizer=text_processor,
                             transformer=transformer)
    return _save(pipeline, folder)


def build_flux_kontext(folder: Path) -> Path:
    """Save a tiny ``FluxKontextPipeline`` (FLUX.1-Kontext-dev layout) into ``folder``.

    Components: a CLIP text encoder (pooled prompt, 32 wide) and a T5 encoder (sequence
    prompt, 32 wide) with their tokenizers; a ``FluxTransformer2DModel`` with guidance
    embedding as in the distilled dev model (one double and one single block, 2 heads of 16);
    an ``AutoencoderKL`` with 8x downsampling and 4 latent channels; the scheduler. No image
    encoder (Kontext uses one only for IP-Adapters).
    """
    from diffusers import (
        FluxKontextPipeline,
        FluxTransformer2DModel,
    )

    clip_tokenizer = make_clip_tokenizer()
    t5_tokenizer = make_t5_tokenizer()
    text_encoder = make_clip_text_encoder(clip_tokenizer, hidden_size=32, projection_dim=32)
    text_encoder_2 = make_t5_encoder(t5_tokenizer, d_model=32)
    latent_channels = 4
    vae = _seeded(lambda: _tiny_autoencoder_kl(latent_channels, shift_factor=0.1,
                                               scaling_factor=1.5))
    transformer = _seeded(lambda: FluxTransformer2DModel(
        patch_size=1, in_channels=4 * latent_channels, num_layers=1, num_single_layers=1,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
        pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(4, 6, 6),
    ))
    pipeline = FluxKontextPipeline(
        scheduler=_flux_scheduler(), vae=vae, text_encoder=text_encoder,
        tokenizer=clip_tokenizer, text_encoder_2=text_encoder_2, tokenizer_2=t5_tokenizer,
        transformer=transformer,
    )
    return _save(pipeline, folder)


def _flux_scheduler() -> Any:
    """The flow-matching scheduler with FLUX's resolution-dependent shift (the pipelines
    compute the shift ``mu`` from the image size; without dynamic shifting it is ignored)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
        max_image_seq_len=4096,
    )


def _tiny_autoencoder_kl(latent_channels: int, **factors: float) -> Any:
    """An ``AutoencoderKL`` with Stable Diffusion's 8x downsampling (four blocks) but 8-16
    channels; ``factors`` are its latent ``scaling_factor``/``shift_factor``."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16), layers_per_block=1, latent_channels=latent_channels,
        norm_num_groups=4, sample_size=64, **factors,
    )


def make_safety_checker(*, flag_everything: bool) -> Any:
    """A tiny ``StableDiffusionSafetyChecker`` that flags every image, or none.

    Its CLIP vision tower is random, so what it flags is set by the concept thresholds alone
    (see :func:`set_safety_checker_verdict`).
    """
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig

    config = CLIPConfig(
        # The checker never runs its text tower; it is there because CLIPConfig has one.
        text_config={"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
                     "num_hidden_layers": 1, "num_attention_heads": 2, "bos_token_id": 0,
                     "eos_token_id": 1, "pad_token_id": 1},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )
    checker = _seeded(lambda: StableDiffusionSafetyChecker(config))
    set_safety_checker_verdict(checker, flag_everything=flag_everything)
    return checker


def set_safety_checker_verdict(safety_checker: Any, *, flag_everything: bool) -> None:
    """Make a loaded tiny safety checker flag every image (``True``) or none (``False``).

    For a test that loaded a pipeline and wants the other verdict without building a second
    folder: ``set_safety_checker_verdict(pipe.safety_checker, flag_everything=True)``. Both
    the 17 concept and the 3 special-care thresholds are set, so no special-care match can
    nudge a score over a threshold.
    """
    import torch

    threshold = FLAG_EVERYTHING_THRESHOLD if flag_everything else FLAG_NOTHING_THRESHOLD
    with torch.no_grad():
        safety_checker.concept_embeds_weights.fill_(threshold)
        safety_checker.special_care_embeds_weights.fill_(FLAG_NOTHING_THRESHOLD)


def build_instruct_pix2pix(folder: Path, *, flag_everything: bool = False) -> Path:
    """Save a tiny ``StableDiffusionInstructPix2PixPipeline`` with its safety checker.

    Components: a CLIP text encoder (32 wide) and tokenizer; a ``UNet2DConditionModel`` with
    8 input channels (noisy latents and the input image's latents, as InstructPix2Pix has);
    an ``AutoencoderKL`` with 8x downsampling and 4 latent channels; the Euler-ancestral
    scheduler the released model uses; a ``StableDiffusionSafetyChecker`` that flags every
    image when ``flag_everything`` is true and none otherwise, with a ``CLIPImageProcessor``
    feature extractor (32x32 crops).
    """
    import transformers
    from diffusers import (
        EulerAncestralDiscreteScheduler,
        StableDiffusionInstructPix2PixPipeline,
        UNet2DConditionModel,
    )

    tokenizer = make_clip_tokenizer()
    text_encoder = make_clip_text_encoder(tokenizer, hidden_size=32, projection_dim=32)
    latent_channels = 4
    vae = _seeded(lambda: _tiny_autoencoder_kl(latent_channels, scaling_factor=0.18215))
    unet = _seeded(lambda: UNet2DConditionModel(
        sample_size=8, in_channels=2 * latent_channels, out_channels=latent_channels,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), block_out_channels=(16, 32),
        layers_per_block=1, norm_num_groups=8, cross_attention_dim=32, attention_head_dim=4,
    ))
    scheduler = EulerAncestralDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
        num_train_timesteps=1000,
    )
    # The torchvision-backed class where torchvision is installed, as the released model has;
    # elsewhere the PIL one, which transformers would fall back to anyway.
    image_processor_class = (transformers.CLIPImageProcessor if has_torchvision()
                             else transformers.CLIPImageProcessorPil)
    feature_extractor = image_processor_class(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
    )
    pipeline = StableDiffusionInstructPix2PixPipeline(
        vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet, scheduler=scheduler,
        safety_checker=make_safety_checker(flag_everything=flag_everything),
        feature_extractor=feature_extractor,
    )
    return _save(pipeline, folder)


def build_sd3(folder: Path) -> Path:
    """Save a tiny ``StableDiffusion3Pipeline`` (SD 3.5 layout) into ``folder``.

    Components: two CLIP text encoders with projection (16 and 32 wide; their pooled outputs
    are concatenated into the 48-wide pooled prompt, their sequences padded to T5's width),
    each with its tokenizer; a T5 encoder (48 wide) and tokenizer; an
    ``SD3Transformer2DModel`` with SD 3.5's dual-attention and QK-norm in its first layer (two
    layers, 2 heads of 16); an ``AutoencoderKL`` with 8x downsampling and 4 latent channels;
    the scheduler with SD 3.5's shift of 3.
    """
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )

    tokenizer = make_clip_tokenizer()
    tokenizer_2 = make_clip_tokenizer()
    tokenizer_3 = make_t5_tokenizer(max_length=256)
    text_encoder = make_clip_text_encoder(tokenizer, hidden_size=16, projection_dim=16,
                                          with_projection=True)
    text_encoder_2 = make_clip_text_encoder(tokenizer_2, hidden_size=32, projection_dim=32,
                                            with_projection=True)
    text_encoder_3 = make_t5_encoder(tokenizer_3, d_model=48)
    latent_channels = 4
    vae = _seeded(lambda: _tiny_autoencoder_kl(latent_channels, shift_factor=0.06,
                                               scaling_factor=1.5))
    transformer = _seeded(lambda: SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=latent_channels, out_channels=latent_channels,
        num_layers=2, attention_head_dim=16, num_attention_heads=2, joint_attention_dim=48,
        caption_projection_dim=32, pooled_projection_dim=48, pos_embed_max_size=32,
        dual_attention_layers=(0,), qk_norm="rms_norm",
    ))
    pipeline = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
        text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2, text_encoder_3=text_encoder_3, tokenizer_3=tokenizer_3,
    )
    return _save(pipeline, folder)


# --- fixtures ---------------------------------------------------------------------------------


def has_torchvision() -> bool:
    """Whether torchvision is installed: transformers' multimodal processors need it."""
    return importlib.util.find_spec("torchvision") is not None


def _needs(*modules: str) -> None:
    """Skip the requesting test unless every module in ``modules`` imports."""
    for module in modules:
        pytest.importorskip(module)


@pytest.fixture
def single_torch_thread() -> Iterator[None]:
    """Run the test with one torch thread, then restore the count.

    The tiny models gain nothing from a second thread, and on a busy two-core machine
    torch's waiting threads made a two-step run take 25 s instead of 0.3 s.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _built_once(name: str, builder: Callable[[Path], Path], *needed: str) -> Any:
    """A session fixture that builds one tiny pipeline into a fresh temporary folder."""

    @pytest.fixture(scope="session", name=name)
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
        _needs("torch", "transformers", "diffusers", "tokenizers", *needed)
        yield builder(tmp_path_factory.mktemp(name))

    fixture.__doc__ = f"Folder of a tiny pipeline saved by ``{builder.__name__}``."
    return fixture


tiny_qwen_image_edit_plus_dir = _built_once(
    "tiny_qwen_image_edit_plus_dir", build_qwen_image_edit_plus, "torchvision")
tiny_flux2_dir = _built_once("tiny_flux2_dir", build_flux2)
tiny_flux_kontext_dir = _built_once("tiny_flux_kontext_dir", build_flux_kontext)
tiny_instruct_pix2pix_dir = _built_once("tiny_instruct_pix2pix_dir", build_instruct_pix2pix)
tiny_instruct_pix2pix_flag_everything_dir = _built_once(
    "tiny_instruct_pix2pix_flag_everything_dir",
    lambda folder: build_instruct_pix2pix(folder, flag_everything=True))
tiny_sd3_dir = _built_once("tiny_sd3_dir", build_sd3)
