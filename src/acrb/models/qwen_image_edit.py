"""Qwen-Image-Edit-2511 through diffusers' ``QwenImageEditPlusPipeline``: one or several portraits
and an instruction in, one edited image out.

The "Plus" pipeline takes a list of input images per request (the multi-image editing added in
Qwen-Image-Edit-2509 and kept in 2511); the model card gives 1 to 3 input images as the range
it works best in, so :attr:`QwenImageEdit.max_source_images` is 3. The pipeline takes one
prompt per call (``QwenImageEditPlusPipeline.__call__`` raises for more), so requests are run one
per call whatever ``batch_size`` says. Defaults follow the 2511 model card's diffusers example:
40 steps, ``true_cfg_scale`` 4.0 with a blank negative prompt, ``guidance_scale`` 1.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field

from acrb.models.base import EditRequest, ModelConfig
from acrb.models.diffusion import DiffusersConfig, DiffusersEditor, to_pil


class QwenImageEditConfig(DiffusersConfig):
    hub_id: str = Field(default="Qwen/Qwen-Image-Edit-2511",
                        description="Hugging Face repo id or local folder")
    steps: int = Field(default=40, ge=1, description="num_inference_steps")
    guidance_scale: float | None = Field(default=1.0, description="guidance_scale")
    true_cfg_scale: float = Field(default=4.0, ge=0, description="classifier-free guidance "
                                  "scale (active above 1 with a negative prompt)")
    negative_prompt: str | None = Field(default=" ", description="negative prompt (None: none)")


class QwenImageEdit(DiffusersEditor):
    """Qwen-Image-Edit (2509/2511) as an ACRB editor; see the module docstring."""

    Config: ClassVar[type[ModelConfig]] = QwenImageEditConfig
    pipeline_class: ClassVar[str] = "QwenImageEditPlusPipeline"
    max_source_images: ClassVar[int] = 3
    max_batch: ClassVar[int | None] = 1
    quantized_components: ClassVar[tuple[str, ...]] = ("transformer", "text_encoder")

    def call_kwargs(self, batch: Sequence[Any]) -> dict[str, Any]:
        (request,) = batch
        assert isinstance(request, EditRequest)
        cfg = self.settings
        assert isinstance(cfg, QwenImageEditConfig)
        kwargs = {"image": [to_pil(image) for image in request.source_images],
                  "prompt": [request.instruction], "true_cfg_scale": cfg.true_cfg_scale,
                  **self.common_kwargs()}
        if cfg.negative_prompt is not None:
            kwargs["negative_prompt"] = [cfg.negative_prompt]
        return kwargs
