"""Stable Diffusion 3.5 through diffusers' ``StableDiffusion3Pipeline``: text to image.

Prompts are batched ``config.batch_size`` per call. Defaults follow the SD 3.5 Large model
card's diffusers example: 28 steps, guidance 3.5, 1024 x 1024 (the pipeline's default size).
SD 3.5 Medium and Large Turbo load through the same class (set ``hub_id``, and for Turbo
``steps: 4`` and ``guidance_scale: 0``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field

from acrb.models.base import ModelConfig
from acrb.models.diffusion import DiffusersConfig, DiffusersGenerator


class SD35Config(DiffusersConfig):
    hub_id: str = Field(default="stabilityai/stable-diffusion-3.5-large",
                        description="Hugging Face repo id or local folder")
    steps: int = Field(default=28, ge=1, description="num_inference_steps")
    guidance_scale: float | None = Field(default=3.5, description="classifier-free guidance")
    negative_prompt: str | None = Field(default=None, description="negative prompt")


class SD35(DiffusersGenerator):
    """Stable Diffusion 3.5 as an ACRB generator; see the module docstring."""

    Config: ClassVar[type[ModelConfig]] = SD35Config
    pipeline_class: ClassVar[str] = "StableDiffusion3Pipeline"
    quantized_components: ClassVar[tuple[str, ...]] = ("transformer", "text_encoder_3")

    def call_kwargs(self, batch: Sequence[Any]) -> dict[str, Any]:
        kwargs = super().call_kwargs(batch)
        cfg = self.settings
        assert isinstance(cfg, SD35Config)
        if cfg.negative_prompt is not None:
            kwargs["negative_prompt"] = [cfg.negative_prompt] * len(batch)
        return kwargs
