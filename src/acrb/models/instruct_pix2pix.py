"""InstructPix2Pix (Brooks, Holynski and Efros, CVPR 2023) through diffusers'
``StableDiffusionInstructPix2PixPipeline``: one portrait and an instruction in.

The pipeline keeps Stable Diffusion's safety checker: when it flags an output it replaces the
image with a black one and reports ``nsfw_content_detected`` for it. That is an explicit refusal
signal, so the outcome is ``refused`` with ``refusal_kind`` ``safety_filter`` (and no image), not
an ``ok`` black frame. The pipeline has no width/height: the output has the source's size, so
``width`` and ``height`` (both) resize the source first. Requests are batched
``config.batch_size`` at a time. Defaults are the pipeline's: 100 steps, guidance 7.5, image
guidance 1.5.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field

from acrb.models.base import ModelConfig, Outcome
from acrb.models.diffusion import (
    DiffusersConfig,
    DiffusersEditor,
    DType,
    to_pil,
    to_rgb_array,
)

#: The message of a refusal by the safety checker.
SAFETY_MESSAGE = ("the pipeline's safety checker flagged this output as NSFW and blanked it "
                  "(nsfw_content_detected)")


class InstructPix2PixConfig(DiffusersConfig):
    hub_id: str = Field(default="timbrooks/instruct-pix2pix",
                        description="Hugging Face repo id or local folder")
    dtype: DType = Field(default="float16", description="weights and compute dtype")
    steps: int = Field(default=100, ge=1, description="num_inference_steps")
    guidance_scale: float | None = Field(default=7.5, description="text guidance scale")
    image_guidance_scale: float = Field(default=1.5, ge=1, description="how closely the "
                                        "output follows the source image")
    negative_prompt: str | None = Field(default=None, description="negative prompt")


class InstructPix2Pix(DiffusersEditor):
    """InstructPix2Pix as an ACRB editor, safety checker on; see the module docstring."""

    Config: ClassVar[type[ModelConfig]] = InstructPix2PixConfig
    pipeline_class: ClassVar[str] = "StableDiffusionInstructPix2PixPipeline"
    quantized_components: ClassVar[tuple[str, ...]] = ("unet",)

    def call_kwargs(self, batch: Sequence[Any]) -> dict[str, Any]:
        cfg = self.settings
        assert isinstance(cfg, InstructPix2PixConfig)
        size = self.source_size()
        kwargs: dict[str, Any] = {
            "image": [to_pil(request.source_image, size) for request in batch],
            "prompt": [request.instruction for request in batch],
            "num_inference_steps": cfg.steps, "image_guidance_scale": cfg.image_guidance_scale}
        if cfg.guidance_scale is not None:
            kwargs["guidance_scale"] = cfg.guidance_scale
        if cfg.negative_prompt is not None:
            kwargs["negative_prompt"] = [cfg.negative_prompt] * len(batch)
        return kwargs

    def outcomes(self, output: Any, batch: Sequence[Any]) -> list[Outcome]:
        flags = getattr(output, "nsfw_content_detected", None) or [False] * len(batch)
        return [
            Outcome(status="refused", refusal_kind="safety_filter", message=SAFETY_MESSAGE)
            if flagged else Outcome(status="ok", image=to_rgb_array(image))
            for image, flagged in zip(output.images, flags, strict=True)
        ]
