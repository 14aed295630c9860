"""FLUX.2 [dev] through diffusers' ``Flux2Pipeline``: an editor with reference images and a
text-to-image generator, from the same weights.

As an editor, a request's portraits are the pipeline's reference images (``image=[...]``). Black
Forest Labs recommend at most 6 reference images for FLUX.2 [dev] (docs.bfl.ai, "Image editing
overview", reference images per model), hence :attr:`Flux2Editor.max_source_images`. The
pipeline shares its reference images across every prompt of a call, so the editor runs one
request per call; the generator batches prompts (``config.batch_size``). Defaults follow the
model card: 50 steps, guidance 4.0 (FLUX.2 [dev] is guidance-distilled: no negative prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field

from acrb.models.base import EditRequest, ModelConfig
from acrb.models.diffusion import (
    DiffusersConfig,
    DiffusersEditor,
    DiffusersGenerator,
    to_pil,
)


class Flux2Config(DiffusersConfig):
    hub_id: str = Field(default="black-forest-labs/FLUX.2-dev",
                        description="Hugging Face repo id or local folder")
    steps: int = Field(default=50, ge=1, description="num_inference_steps")
    guidance_scale: float | None = Field(default=4.0, description="embedded guidance scale")


class Flux2Editor(DiffusersEditor):
    """FLUX.2 [dev] editing one or several portraits (reference images)."""

    Config: ClassVar[type[ModelConfig]] = Flux2Config
    pipeline_class: ClassVar[str] = "Flux2Pipeline"
    max_source_images: ClassVar[int] = 6
    max_batch: ClassVar[int | None] = 1
    quantized_components: ClassVar[tuple[str, ...]] = ("transformer", "text_encoder")

    def call_kwargs(self, batch: Sequence[Any]) -> dict[str, Any]:
        (request,) = batch
        assert isinstance(request, EditRequest)
        return {"image": [to_pil(image) for image in request.source_images],
                "prompt": [request.instruction], **self.common_kwargs()}


class Flux2Generator(DiffusersGenerator):
    """FLUX.2 [dev] generating from text alone."""

    Config: ClassVar[type[ModelConfig]] = Flux2Config
    pipeline_class: ClassVar[str] = "Flux2Pipeline"
    quantized_components: ClassVar[tuple[str, ...]] = ("transformer", "text_encoder")
