"""Random-weight CLIP models built offline from configs, saved as a folder the transformers
backend of :mod:`acrb.detect.clip_refusal` loads by path.

:func:`build_clip` writes what a hub snapshot of ``openai/clip-vit-base-patch32`` holds
(``config.json``, weights, tokenizer files, ``preprocessor_config.json``) with random weights:
``size="vit-b-32"`` has that model's architecture (vision: hidden 768, 12 layers, 12 heads,
patch 32, image 224; text: hidden 512, 12 layers, 8 heads; projection 512), so it costs what
the real model costs; ``size="tiny"`` keeps the image size, the patch size and the processor
and shrinks the transformer (hidden 32, 2 layers) for fast tests. The tokenizer is the local
byte-level BPE of :func:`tests.tiny_pipelines.make_clip_tokenizer`; nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np

from tests.tiny_pipelines import make_clip_tokenizer

ClipSize = Literal["tiny", "vit-b-32"]

_SIZES: dict[str, dict[str, dict[str, int]]] = {
    "vit-b-32": {
        "vision": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                   "num_attention_heads": 12},
        "text": {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
                 "num_attention_heads": 8},
        "model": {"projection_dim": 512},
    },
    "tiny": {
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 4},
        "text": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 4},
        "model": {"projection_dim": 16},
    },
}


def build_clip(folder: Path, size: ClipSize = "tiny", seed: int = 0) -> Path:
    """Save a random-weight ``CLIPModel`` with its tokenizer and PIL image processor in
    ``folder`` (created) and return it; the same ``seed`` gives the same weights."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

    dims = _SIZES[size]
    tokenizer = make_clip_tokenizer()
    assert len(tokenizer) > 100, "the local CLIP tokenizer came out empty"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    text = {**dims["text"], "vocab_size": len(tokenizer), "max_position_embeddings": 77,
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}
    vision = {**dims["vision"], "image_size": 224, "patch_size": 32}
    config = CLIPConfig(text_config=text, vision_config=vision, **dims["model"])
    torch.manual_seed(seed)
    model = CLIPModel(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    CLIPImageProcessorPil(size={"shortest_edge": 224},
                          crop_size={"height": 224, "width": 224}).save_pretrained(folder)
    return folder


def known_images(count: int, size: int = 64, seed: int = 1) -> list[np.ndarray]:
    """``count`` distinct uint8 RGB images: black, mid grey, then seeded noise and gradients."""
    rng = np.random.default_rng(seed)
    images: list[np.ndarray] = [np.zeros((size, size, 3), np.uint8),
                                np.full((size, size, 3), 128, np.uint8)]
    ramp = np.linspace(0, 255, size, dtype=np.float64)
    while len(images) < count:
        if len(images) % 2:
            images.append(rng.integers(0, 256, (size, size + 8 * len(images) % 24, 3),
                                       dtype=np.uint8))
        else:
            tint = rng.uniform(0.2, 1.0, 3)
            grad = np.stack([np.add.outer(ramp, ramp) / 2 * t for t in tint], axis=-1)
            images.append(grad.astype(np.uint8))
    return images[:count]


def clip_params(folder: Path, **changes: Any) -> dict[str, Any]:
    """``evaluate.clip`` params that load ``folder`` through the transformers backend on CPU."""
    return {"backend": "transformers", "model": str(folder), "pretrained": None,
            "device": "cpu", **changes}
