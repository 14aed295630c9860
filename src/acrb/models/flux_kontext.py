"""FLUX.1 Kontext [dev] through diffusers' ``FluxKontextPipeline``: one portrait and an
instruction in, one edited image out.

The pipeline conditions on a single image per prompt (a list of images is a batch, one per
prompt), so :attr:`FluxKontext.max_source_images` is 1 and requests are batched
``config.batch_size`` at a time. By default the pipeline resizes the source to the nearest of
the resolutions Kontext was trained on (``_auto_resize``); ``auto_resize: false`` keeps the
source's size. The output is about 1024 x 1024 pixels unless ``width`` and ``height`` are both
set (they are then passed with ``max_area = width * height``, which the pipeline would
otherwise rescale them to). Defaults follow the model card: 28 steps, guidance 2.5.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field

from acrb.models.base import ModelConfig
from acrb.models.diffusion import DiffusersConfig, DiffusersEditor, to_pil


class FluxKontextConfig(DiffusersConfig):
    hub_id: str = Field(default="black-forest-labs/FLUX.1-Kontext-dev",
                        description="Hugging Face repo id or local folder")
    steps: int = Field(default=28, ge=1, description="num_inference_steps")
    guidance_scale: float | None = Field(default=2.5, description="embedded guidance scale")
    true_cfg_scale: float = Field(default=1.0, ge=0, description="true classifier-free "
                                  "guidance (active above 1 with a negative prompt)")
    negative_prompt: str | None = Field(default=None, description="negative prompt")
    auto_resize: bool = Field(default=True, description="resize sources to Kontext's "
                              "preferred resolutions")


class FluxKontext(DiffusersEditor):
    """FLUX.1 Kontext [dev] as an ACRB editor; see the module docstring."""

    Config: ClassVar[type[ModelConfig]] = FluxKontextConfig
    pipeline_class: ClassVar[str] = "FluxKontextPipeline"
    quantized_components: ClassVar[tuple[str, ...]] = ("transformer", "text_encoder_2")

    def call_kwargs(self, batch: Sequence[Any]) -> dict[str, Any]:
        cfg = self.settings
        assert isinstance(cfg, FluxKontextConfig)
        kwargs = {"image": [to_pil(request.source_image) for request in batch],
                  "prompt": [request.instruction for request in batch],
                  "true_cfg_scale": cfg.true_cfg_scale, "_auto_resize": cfg.auto_resize,
                  **self.common_kwargs()}
        if cfg.width is not None and cfg.height is not None:
            # The pipeline rescales width x height to max_area (default 1024²) keeping the
            # aspect ratio; an explicit size is meant as given.
            kwargs["max_area"] = cfg.width * cfg.height
        if cfg.negative_prompt is not None:
            kwargs["negative_prompt"] = [cfg.negative_prompt] * len(batch)
        return kwargs
