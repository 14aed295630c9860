"""Every open-weights diffusers adapter at full size on one GPU, through the real generate stage.

Until this script, only FLUX.1 Kontext had run at full size (benchmarks/harness_overhead.py);
the other adapters had run only as tiny pipelines on a CPU, which proves the calling code but
says nothing about memory or speed. Here each adapter's full published architecture is built
with random weights, directly on the GPU in the adapter's dtype (nothing is downloaded: the
numbers below are those of each model's published config.json files, cited at each builder;
tokenizers are trained locally as in tests/tiny_pipelines.py), put where the adapter's loader
finds it (:func:`acrb.models.diffusion.preload_pipeline`), and run through ``generate`` on a
small project at the study's settings: 1024 x 1024 (InstructPix2Pix: 512, its training size),
each adapter's guidance and true CFG. Random weights compute exactly as many FLOPs as trained
ones, so times and memory are those of the real models; the images are noise.

Per adapter, one JSON line: parameter count (per component), build seconds, peak GPU memory,
seconds per edit, images/s, seconds per denoising step, steps, resolution, batch size and a
status (ok, failed with the error, or skipped). Steps default to each adapter's study steps; a
smaller ``--steps`` keeps the run short, and the time of an edit at the study's steps is then
*extrapolated* from the measured seconds per step (labelled so in the record).

An 80 GB card: for each adapter whose peak exceeds 78 GiB, a second run with
``cpu_offload: model`` under ``torch.cuda.set_per_process_memory_fraction`` capping the process
at 78 GiB (an 80 GB card's usable memory, simulated on a larger one). Quantization would need
bitsandbytes or torchao; it is recorded as not measured.

Each adapter runs in a subprocess of its own (so its memory is freed), smallest first, with a
timeout each and a total ``--time-budget``; an adapter that would start after the budget is
recorded as skipped. Results are appended to ``--out`` as each adapter finishes, so a killed run
keeps what it measured. Usage::

    PYTHONPATH=src ACRB_MLFLOW=0 python benchmarks/gpu_adapters.py [--steps 4]
        [--requests 2] [--batch-size 1] [--time-budget 300] [--only flux2-dev ...]
        [--device cuda] [--out benchmarks/results/gpu_adapters.jsonl]
    python benchmarks/gpu_adapters.py --tiny      # the tests' tiny pipelines, on the CPU

Needs a CUDA GPU (FLUX.2 [dev] needs about 115 GB: an H200) unless ``--tiny``; exits with a
message, and status 2, where there is none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
REVISION = "random-init"
INSTRUCTION = "Give this person a pair of round reading glasses."
T2I_PROMPT = "A photo of {subject} sketching a statue in a museum."
GIB = 2**30
#: What an 80 GB card leaves a process (GiB): the threshold for the offloaded second run.
CARD_80GB_GIB = 78.0
DEFAULT_OUT = REPO / "benchmarks" / "results" / "gpu_adapters.jsonl"
#: Seconds a worker needs to start (imports, CUDA context) before it builds anything.
STARTUP_SECONDS = 20.0

#: Places a freshly built component: on the GPU where it was built, or moved to the CPU at once
#: (the offloaded run builds one component at a time under the 78 GiB cap).
Place = Callable[[Any], Any]


def _stay(module: Any) -> Any:
    return module


# ---- full-size builders ---------------------------------------------------------------------


@contextlib.contextmanager
def _building(device: str, dtype: Any) -> Iterator[None]:
    """Create modules directly on ``device`` in ``dtype`` (no float32 copy on the CPU first)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            yield
    finally:
        torch.set_default_dtype(previous)


def _tokenizers() -> Any:
    sys.path.insert(0, str(REPO))
    import tests.tiny_pipelines as tiny

    return tiny


def _clip_text(tokenizer: Any, *, hidden: int, layers: int, heads: int, inner: int,
               projection: int, act: str, with_projection: bool) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=49408, hidden_size=hidden, intermediate_size=inner,
        num_hidden_layers=layers, num_attention_heads=heads, max_position_embeddings=77,
        projection_dim=projection, hidden_act=act, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(config)


def _clip_l_text(tokenizer: Any, *, with_projection: bool = False) -> Any:
    """CLIP ViT-L/14's text tower (openai/clip-vit-large-patch14 config.json)."""
    return _clip_text(tokenizer, hidden=768, layers=12, heads=12, inner=3072, projection=768,
                      act="quick_gelu", with_projection=with_projection)


def _t5_xxl(tokenizer: Any) -> Any:
    """The T5 v1.1 XXL encoder (google/t5-v1_1-xxl config.json; text_encoder_2 of FLUX.1,
    text_encoder_3 of SD 3.5)."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(
        vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
        feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
        relative_attention_max_distance=128, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id))


def _flux_vae() -> Any:
    """FLUX.1's VAE (black-forest-labs/FLUX.1-Kontext-dev vae/config.json)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32,
        sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
        use_post_quant_conv=False)


def instruct_pix2pix_components(device: str, dtype: Any, place: Place = _stay
                                ) -> dict[str, Any]:
    """StableDiffusionInstructPix2PixPipeline components at the size of
    timbrooks/instruct-pix2pix (its unet/, vae/, text_encoder/, safety_checker/ config.json):
    Stable Diffusion 1.5's UNet with 8 input channels (noisy and source latents), blocks
    (320, 640, 1280, 1280), 2 layers per block, cross-attention 768, 8 heads; SD's VAE (4
    latent channels, scaling 0.18215); CLIP ViT-L/14's text tower; the safety checker's CLIP
    ViT-L/14 vision tower (1024 wide, 24 layers, 224 px, patch 14, projection 768)."""
    import transformers
    from diffusers import AutoencoderKL, EulerAncestralDiscreteScheduler, UNet2DConditionModel
    from diffusers.pipelines.stable_diffusion.safety_checker import (
        StableDiffusionSafetyChecker,
    )

    tiny = _tokenizers()
    tokenizer = tiny.make_clip_tokenizer(max_length=77)
    with _building(device, dtype):
        unet = place(UNet2DConditionModel(
            sample_size=64, in_channels=8, out_channels=4,
            down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
            up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
            block_out_channels=(320, 640, 1280, 1280), layers_per_block=2,
            cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32))
        vae = place(AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
            layers_per_block=2, norm_num_groups=32, sample_size=512, scaling_factor=0.18215))
        text_encoder = place(_clip_l_text(tokenizer))
        checker = StableDiffusionSafetyChecker(transformers.CLIPConfig(
            text_config={"vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072,
                         "num_hidden_layers": 12, "num_attention_heads": 12},
            vision_config={"hidden_size": 1024, "intermediate_size": 4096,
                           "num_hidden_layers": 24, "num_attention_heads": 16,
                           "image_size": 224, "patch_size": 14},
            projection_dim=768))
    if device != "meta":
        # A random checker's verdicts mean nothing; it runs (and is timed) but flags nothing,
        # so every request reaches the end of the pipeline as a trained model's would.
        tiny.set_safety_checker_verdict(checker, flag_everything=False)
    image_processor = (transformers.CLIPImageProcessor if tiny.has_torchvision()
                       else transformers.CLIPImageProcessorPil)
    return {
        "vae": vae, "text_encoder": text_encoder, "tokenizer": tokenizer, "unet": unet,
        "scheduler": EulerAncestralDiscreteScheduler(
            beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
            num_train_timesteps=1000),
        "safety_checker": place(checker),
        "feature_extractor": image_processor(size={"shortest_edge": 224},
                                             crop_size={"height": 224, "width": 224}),
    }


def sd35_large_components(device: str, dtype: Any, place: Place = _stay) -> dict[str, Any]:
    """StableDiffusion3Pipeline components at the size of stabilityai/stable-diffusion-3.5-large
    (transformer/, vae/, text_encoder*/ config.json): MMDiT-X with 38 layers of 38 heads of 64,
    caption projection 2432, pooled projection 2048, joint attention 4096, RMS QK-norm, no
    dual-attention layers, position embeddings up to 192; the SD3 VAE (16 latent channels,
    scaling 1.5305, shift 0.0609, no quant convs); CLIP-L and OpenCLIP bigG text towers with
    projection (768 and 1280 wide, 12 and 32 layers); T5 v1.1 XXL; flow matching, shift 3."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

    tiny = _tokenizers()
    tokenizer, tokenizer_2 = tiny.make_clip_tokenizer(77), tiny.make_clip_tokenizer(77)
    tokenizer_3 = tiny.make_t5_tokenizer(max_length=256)
    with _building(device, dtype):
        transformer = place(SD3Transformer2DModel(
            sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=38,
            attention_head_dim=64, num_attention_heads=38, joint_attention_dim=4096,
            caption_projection_dim=2432, pooled_projection_dim=2048, pos_embed_max_size=192,
            qk_norm="rms_norm", dual_attention_layers=()))
        vae = place(AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=16,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
            layers_per_block=2, norm_num_groups=32, sample_size=1024, scaling_factor=1.5305,
            shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False))
        text_encoder = place(_clip_l_text(tokenizer, with_projection=True))
        text_encoder_2 = place(_clip_text(
            tokenizer_2, hidden=1280, layers=32, heads=20, inner=5120, projection=1280,
            act="gelu", with_projection=True))
        text_encoder_3 = place(_t5_xxl(tokenizer_3))
    return {"transformer": transformer, "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0),
            "vae": vae, "text_encoder": text_encoder, "tokenizer": tokenizer,
            "text_encoder_2": text_encoder_2, "tokenizer_2": tokenizer_2,
            "text_encoder_3": text_encoder_3, "tokenizer_3": tokenizer_3}


def flux_kontext_components(device: str, dtype: Any, place: Place = _stay) -> dict[str, Any]:
    """FluxKontextPipeline components at the size of black-forest-labs/FLUX.1-Kontext-dev (the
    FLUX.1 [dev] family's config.json files, as benchmarks/harness_overhead.py builds them):
    19 double + 38 single blocks of 24 heads of 128, joint attention 4096, pooled 768, rope
    axes (16, 56, 56), guidance embedding; FLUX.1's VAE; CLIP-L text; T5 v1.1 XXL."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel

    tiny = _tokenizers()
    clip_tokenizer, t5_tokenizer = tiny.make_clip_tokenizer(77), tiny.make_t5_tokenizer(512)
    with _building(device, dtype):
        transformer = place(FluxTransformer2DModel(
            patch_size=1, in_channels=64, num_layers=19, num_single_layers=38,
            attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
            pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56)))
        vae = place(_flux_vae())
        text_encoder = place(_clip_l_text(clip_tokenizer))
        text_encoder_2 = place(_t5_xxl(t5_tokenizer))
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
        max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
    return {"scheduler": scheduler, "vae": vae, "text_encoder": text_encoder,
            "tokenizer": clip_tokenizer, "text_encoder_2": text_encoder_2,
            "tokenizer_2": t5_tokenizer, "transformer": transformer}


def qwen_image_edit_components(device: str, dtype: Any, place: Place = _stay
                               ) -> dict[str, Any]:
    """QwenImageEditPlusPipeline components at the size of Qwen/Qwen-Image-Edit-2511
    (transformer/, vae/, text_encoder/, scheduler/ config.json): the 20B MMDiT, 60 layers of
    24 heads of 128, joint attention 3584, rope axes (16, 56, 56), with the zero-timestep
    conditioning of 2511 (``zero_cond_t``); the Qwen-Image VAE (base 96, z 16, multipliers
    (1, 2, 4, 4), 2 residual blocks); Qwen2.5-VL-7B as text encoder (text: 3584 wide, 28
    layers, 28 heads, 4 KV heads, MLP 18944, vocabulary 152064, mRoPE sections (16, 24, 24),
    theta 1e6; vision: 32 layers of 1280, 16 heads, MLP 3420, full attention at 7, 15, 23,
    31, window 112, patch 14, merge 2); the exponential-shift flow-matching scheduler."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageTransformer2DModel,
    )
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tiny = _tokenizers()
    tokenizer = tiny.make_qwen_tokenizer()
    # The released processor's bounds (preprocessor_config.json: 3136 to 12845056 pixels).
    # Without torchvision (which transformers' video processors need) there is no processor:
    # enough to count parameters, not to run the pipeline.
    bounds = {"shortest_edge": 3136, "longest_edge": 12845056}
    processor = (Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(size=bounds),
                                  tokenizer=tokenizer,
                                  video_processor=Qwen2VLVideoProcessor(size=bounds))
                 if tiny.has_torchvision() else None)
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
    ]}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
            "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "max_position_embeddings": 128000, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                "mrope_section": [16, 24, 24]},
            "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
            "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
            "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
        },
        tie_word_embeddings=False,
        **ids,
    )
    with _building(device, dtype):
        transformer = place(QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=60,
            attention_head_dim=128, num_attention_heads=24, joint_attention_dim=3584,
            guidance_embeds=False, axes_dims_rope=(16, 56, 56), zero_cond_t=True))
        vae = place(AutoencoderKLQwenImage(
            base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
            temperal_downsample=[False, True, True], dropout=0.0))
        text_encoder = place(Qwen2_5_VLForConditionalGeneration(config))
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True,
        time_shift_type="exponential", base_shift=math.log(3), max_shift=math.log(3),
        base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02)
    return {"scheduler": scheduler, "vae": vae, "text_encoder": text_encoder,
            "tokenizer": tokenizer, "processor": processor, "transformer": transformer}


def flux2_dev_components(device: str, dtype: Any, place: Place = _stay) -> dict[str, Any]:
    """Flux2Pipeline components at the size of black-forest-labs/FLUX.2-dev (transformer/,
    vae/, text_encoder/ config.json): the 32B transformer, 8 double + 48 single blocks of 48
    heads of 128, MLP ratio 3, joint attention 15360 (three stacked 5120-wide Mistral layers),
    rope axes (32, 32, 32, 32), theta 2000, guidance embedding; the FLUX.2 VAE (32 latent
    channels, 2x2 patches); Mistral-Small-3.1-24B (Mistral3ForConditionalGeneration: text
    5120 wide, 40 layers, 32 heads of 128, 8 KV heads, MLP 32768, vocabulary 131072, theta
    1e9; Pixtral vision 1024 wide, 24 layers, 16 heads, patch 14, 1540 px; merge 2)."""
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    tiny = _tokenizers()
    if tiny.has_torchvision():
        from transformers import PixtralImageProcessor, PixtralProcessor

        tokenizer = tiny.make_mistral_tokenizer()
        text_processor: Any = PixtralProcessor(
            image_processor=PixtralImageProcessor(size={"longest_edge": 1540},
                                                  patch_size={"height": 14, "width": 14}),
            tokenizer=tokenizer, patch_size=14, spatial_merge_size=2,
            chat_template=tiny.MISTRAL_CHAT_TEMPLATE)
    else:  # the pipeline only applies the chat template to text (see build_flux2's docstring)
        text_processor = tokenizer = tiny.make_mistral_tokenizer()
        tokenizer.chat_template = tiny.MISTRAL_CHAT_TEMPLATE
    config = Mistral3Config(
        text_config={
            "model_type": "mistral", "vocab_size": 131072, "hidden_size": 5120,
            "intermediate_size": 32768, "num_hidden_layers": 40, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5, "sliding_window": None, "rope_theta": 1e9,
            "tie_word_embeddings": False,
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "model_type": "pixtral", "hidden_size": 1024, "intermediate_size": 4096,
            "num_hidden_layers": 24, "num_attention_heads": 16, "head_dim": 64,
            "image_size": 1540, "patch_size": 14, "rope_theta": 10000.0,
        },
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"), spatial_merge_size=2,
        multimodal_projector_bias=False, projector_hidden_act="gelu", tie_word_embeddings=False,
    )
    with _building(device, dtype):
        transformer = place(Flux2Transformer2DModel(
            patch_size=1, in_channels=128, num_layers=8, num_single_layers=48,
            attention_head_dim=128, num_attention_heads=48, joint_attention_dim=15360,
            timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32),
            rope_theta=2000, guidance_embeds=True))
        vae = place(AutoencoderKLFlux2(
            latent_channels=32, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
            norm_num_groups=32, sample_size=1024, patch_size=(2, 2)))
        text_encoder = place(Mistral3ForConditionalGeneration(config))
    scheduler = _tokenizers()._flux_scheduler()
    return {"scheduler": scheduler, "vae": vae, "text_encoder": text_encoder,
            "tokenizer": text_processor, "transformer": transformer}


# ---- the adapters ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Adapter:
    """One adapter as this benchmark runs it.

    ``config`` holds the study's settings beyond the adapter's defaults; ``published`` the
    parameter counts (billions) of the published models' components, for the meta-device
    check (tests/test_gpu_adapters.py), each with where the figure is stated.
    """

    name: str
    key: str
    label: str
    pipeline_class: str
    components: Callable[[str, Any, Place], dict[str, Any]]
    tiny_builder: str
    resolution: int
    published: dict[str, tuple[float, str]]
    config: dict[str, Any] = field(default_factory=dict)
    #: The component whose forward is one denoising call (timed per call).
    denoiser: str = "transformer"
    #: Denoiser calls per step: 2 where true CFG runs the positive and negative prompts apart.
    calls_per_step: int = 1
    #: Settings the tiny pipeline needs instead (tests/test_diffusers_adapters.py's SPECS).
    tiny_config: dict[str, Any] = field(default_factory=dict)


ADAPTERS: dict[str, Adapter] = {a.name: a for a in [
    Adapter("instruct-pix2pix", "instruct-pix2pix", "InstructPix2Pix (SD 1.5 UNet, fp16)",
            "StableDiffusionInstructPix2PixPipeline", instruct_pix2pix_components,
            "build_instruct_pix2pix", 512,
            {"unet": (0.86, "SD 1.5 UNet, 859.5 M (Rombach et al. 2022; the v1-5 model card)")},
            denoiser="unet"),
    Adapter("sd3.5-large", "sd3.5", "Stable Diffusion 3.5 Large", "StableDiffusion3Pipeline",
            sd35_large_components, "build_sd3", 1024,
            {"transformer": (8.1, "stabilityai/stable-diffusion-3.5-large model card: 8.1 B")}),
    Adapter("flux-kontext", "flux-kontext", "FLUX.1 Kontext [dev]", "FluxKontextPipeline",
            flux_kontext_components, "build_flux_kontext", 1024,
            {"transformer": (11.9, "FLUX.1 [dev] model card: 12 B; 11.9 B counted"),
             "text_encoder_2": (4.76, "T5 v1.1 XXL encoder, 4.76 B")}),
    Adapter("qwen-image-edit-2511", "qwen-image-edit", "Qwen-Image-Edit-2511",
            "QwenImageEditPlusPipeline", qwen_image_edit_components,
            "build_qwen_image_edit_plus", 1024,
            {"transformer": (20.4, "Qwen-Image technical report: a 20 B MMDiT (20.43 B)"),
             "text_encoder": (8.29, "Qwen/Qwen2.5-VL-7B-Instruct: 8.29 B")},
            calls_per_step=2, tiny_config={"true_cfg_scale": 1.0, "negative_prompt": None}),
    Adapter("flux2-dev", "flux2-dev:edit", "FLUX.2 [dev]", "Flux2Pipeline",
            flux2_dev_components, "build_flux2", 1024,
            {"transformer": (32.2, "FLUX.2 [dev] model card: a 32 B flow transformer"),
             "text_encoder": (24.0, "Mistral-Small-3.1-24B: 24 B")}),
]}


def adapter_class(adapter: Adapter) -> Any:
    from acrb.registry import load_model

    return load_model(adapter.key)


def study_steps(adapter: Adapter) -> int:
    """The adapter's default steps (the model card's, which the study uses)."""
    steps = adapter_class(adapter).Config.model_fields["steps"].default
    return int(steps)


def count_parameters(components: dict[str, Any]) -> dict[str, int]:
    """Parameters per torch module among ``components`` (works on the meta device)."""
    import torch

    return {name: sum(p.numel() for p in module.parameters())
            for name, module in components.items() if isinstance(module, torch.nn.Module)}


def full_pipeline(adapter: Adapter, device: str, dtype: Any, place: Place = _stay) -> Any:
    """The adapter's diffusers pipeline at full size with random weights on ``device``."""
    import diffusers

    pipe = getattr(diffusers, adapter.pipeline_class)(**adapter.components(device, dtype, place))
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---- one adapter, in a worker process --------------------------------------------------------


def model_config(adapter: Adapter, args: argparse.Namespace, steps: int,
                 cpu_offload: str) -> dict[str, Any]:
    """The adapter's params config: the study's settings, or the tiny pipeline's on the CPU."""
    if args.tiny:
        tiny_side = 32
        return {**adapter.tiny_config, "hub_id": "", "steps": steps, "device": "cpu",
                "dtype": "float32", "width": tiny_side, "height": tiny_side,
                "batch_size": args.batch_size}
    return {**adapter.config, "hub_id": f"random-init/{adapter.name}", "device": args.device,
            "steps": steps, "width": adapter.resolution, "height": adapter.resolution,
            "batch_size": args.batch_size, "cpu_offload": cpu_offload}


def make_project(root: Path, adapter: Adapter, config: dict[str, Any], requests: int,
                 source_side: int) -> Path:
    """A project with one portrait, one instruction (or one T2I prompt) and ``requests`` seeds.

    The repo's params with every path that matters made absolute or replaced, and no WinoBias
    experiment (its sentence file is named relative to the repo, and its pairs would add rows
    that a single-image editor cannot take).
    """
    root.mkdir(parents=True, exist_ok=True)
    (root / "dvc.yaml").write_text("stages: {}\n")
    catalog = {
        "name": "gpu-adapters-catalog", "version": 1,
        "categories": {"A": {"name": "neutral", "description": "everyday edits"}},
        "prompts": [{"id": "A01", "category": "A", "attribute": "neutral",
                     "congruent_with": [], "text": INSTRUCTION}],
    }
    base = {"name": "gpu-adapters-base", "version": 1,
            "domains": {"copyright": {"name": "Copyright-adjacent"}},
            "prompts": [{"id": "COP01", "domain": "copyright", "t2i": T2I_PROMPT,
                         "i2i": "sketching a statue in a museum"}]}
    attributes = {"name": "gpu-adapters-attributes", "version": 1,
                  "neutral": {"t2i": "a person", "cue": "nothing in particular"},
                  "dimensions": {"religion": [{
                      "id": "sikh", "t2i": "a Sikh person", "i2i": "wearing a Sikh turban",
                      "cue": "a turban", "keywords": ["sikh", "turban"]}]}}
    for name, data in (("catalog", catalog), ("base", base), ("attributes", attributes)):
        (root / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["sources"].update({"kind": "synthetic", "resolution": source_side,
                              "races": ["Black"], "genders": ["Female"], "ages": ["20s"],
                              "per_cell": 1})
    params["prompts"] = {"catalog": str(root / "catalog.yaml"), "categories": None,
                         "synthesis": {**params["prompts"]["synthesis"],
                                       "base_prompts": str(root / "base.yaml"),
                                       "attributes": str(root / "attributes.yaml"),
                                       "modes": ["t2i"], "backend": "template"}}
    # A generator gets two prompts (neutral and one attribute: the synthesis needs one) per
    # seed, so half as many seeds.
    generator = adapter_class(adapter).task == "t2i"
    seeds = list(range(math.ceil(requests / 2) if generator else requests))
    params["plan"] = {"seeds": seeds, "prompt_sets": ["catalog"],
                      "t2i_prompt_sets": ["acrb"], "arms": ["none"]}
    params["winobias"] = None
    params["judge"]["rubric"] = str(REPO / params["judge"]["rubric"])
    params["generate"] = {"batch_size": config["batch_size"], "retry_errors": True,
                          "verify_existing": True}
    params["models"] = {"bench": {"key": adapter.key, "revision": REVISION, "config": config}}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


class DenoiserClock:
    """Seconds of each forward call of the denoiser (GPU-synchronised on CUDA).

    The per-call median times the calls per step is the seconds per step; the median leaves out
    the first call of a request under CPU offload (it includes moving the weights to the GPU).
    """

    def __init__(self, module: Any, cuda: bool) -> None:
        self.seconds: list[float] = []
        self._cuda = cuda
        self._tick = 0.0
        self._handles = [module.register_forward_pre_hook(self._pre),
                         module.register_forward_hook(self._post)]

    def _sync(self) -> None:
        if self._cuda:
            import torch

            torch.cuda.synchronize()

    def _pre(self, *_: Any) -> None:
        self._sync()
        self._tick = time.perf_counter()

    def _post(self, *_: Any) -> None:
        self._sync()
        self.seconds.append(time.perf_counter() - self._tick)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data) + "\n")
    temporary.replace(path)


def run_adapter(adapter: Adapter, args: argparse.Namespace, mode: str, record_path: Path
                ) -> dict[str, Any]:
    """Build, run and measure one adapter (in this process); the record is rewritten to
    ``record_path`` as it grows, so that a parent that kills this process keeps the part."""
    os.environ["ACRB_MLFLOW"] = "0"
    import torch

    from acrb.models.diffusion import forget_pipelines, load_pipeline, preload_pipeline
    from acrb.stages import generate, plan, prompts, sources
    from acrb.stages.context import StageContext
    from acrb.timings import read_timings, timings_path

    cls = adapter_class(adapter)
    full_steps = study_steps(adapter)
    steps = args.steps if args.steps is not None else full_steps
    offload = mode == "offload-80gb"
    config = model_config(adapter, args, steps, "model" if offload else "none")
    cuda = not args.tiny
    record: dict[str, Any] = {
        "adapter": adapter.name, "key": adapter.key, "model": adapter.label, "mode": mode,
        "status": "running", "steps": steps, "study_steps": full_steps,
        "resolution": config["width"], "batch_size": cls(adapter.key, cls.Config.model_validate(
            {**config, "hub_id": config["hub_id"] or "unused"}), REVISION).batch_size(),
        "cpu_offload": config.get("cpu_offload", "none"),
        "python": platform.python_version(), "torch": torch.__version__,
    }
    if cuda:
        total = torch.cuda.get_device_properties(torch.device(args.device)).total_memory
        record["device"] = torch.cuda.get_device_name(torch.device(args.device))
        record["device_memory_gib"] = round(total / GIB, 1)
        if offload:
            fraction = min(1.0, CARD_80GB_GIB * GIB / total)
            torch.cuda.set_per_process_memory_fraction(fraction, torch.device(args.device))
            record["memory_fraction"] = round(fraction, 4)
    else:
        record["device"] = "cpu"
    _write_json(record_path, record)
    print(f"[{adapter.name}/{mode}] building", flush=True)

    with tempfile.TemporaryDirectory(prefix="acrb-gpu-adapters-") as folder:
        tick = time.perf_counter()
        if args.tiny:
            builder = getattr(_tokenizers(), adapter.tiny_builder)
            config["hub_id"] = str(builder(Path(folder) / "pipeline"))
            validated = cls.Config.model_validate(config)
            pipe = load_pipeline(cls.pipeline_class, validated, REVISION,
                                 cls.quantized_components)
        else:
            dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[
                cls.Config.model_validate(config).dtype]
            record["dtype"] = str(dtype).removeprefix("torch.")
            place: Place = _stay
            if offload:
                def place(module: Any) -> Any:  # one component at a time under the cap
                    moved = module.to("cpu")
                    torch.cuda.empty_cache()
                    return moved
            pipe = full_pipeline(adapter, args.device, dtype, place)
            validated = cls.Config.model_validate(config)
            if offload:
                pipe.enable_model_cpu_offload(device=args.device)
            else:
                pipe.to(args.device)
            preload_pipeline(pipe, cls.pipeline_class, validated, REVISION)
            torch.cuda.synchronize(args.device)
        record["build_seconds"] = round(time.perf_counter() - tick, 2)
        components = {name: getattr(pipe, name) for name in pipe.components}
        by_component = count_parameters(components)
        record["parameters"] = sum(by_component.values())
        record["parameters_by_component"] = by_component
        if cuda:
            record["peak_gpu_gib_after_build"] = round(
                torch.cuda.max_memory_allocated(args.device) / GIB, 2)
        _write_json(record_path, record)
        print(f"[{adapter.name}/{mode}] built in {record['build_seconds']} s: "
              f"{record['parameters'] / 1e9:.2f} B parameters", flush=True)

        root = make_project(Path(folder) / "project", adapter, config, args.requests,
                            1024 if not args.tiny else 64)
        previous = Path.cwd()
        os.chdir(root)
        try:
            ctx = StageContext.load(root / "params.yaml", root)
            sources.run(ctx)
            prompts.run(ctx)
            plan.run(ctx)
            planned = len(ctx.model_requests("bench"))
            clock = DenoiserClock(getattr(pipe, adapter.denoiser), cuda)
            tick = time.perf_counter()
            summary = generate.run(ctx, "bench")
            stage_seconds = time.perf_counter() - tick
            clock.close()
            timings = read_timings(timings_path(root, "generate", "bench"))
        finally:
            os.chdir(previous)
    forget_pipelines()

    seconds = [t.seconds for t in timings if t.seconds is not None]
    peaks = [t.peak_gpu_memory_mb for t in timings if t.peak_gpu_memory_mb is not None]
    # The first edit carries CUDA's warm-up (kernels, allocator); the rest are steady state.
    steady = seconds[1:] if len(seconds) > 1 else seconds
    per_edit = statistics.mean(steady) if steady else None
    per_step = (statistics.median(clock.seconds) * adapter.calls_per_step
                if clock.seconds else None)
    # The generate stage measures each batch's peak (weights resident included; under offload,
    # the components moved in for it); the build's peak is recorded apart.
    peak = max(peaks) / 1024 if peaks else None
    # A refusal (InstructPix2Pix's safety checker) is a finished request too.
    ok = summary.status_counts.get("ok", 0) + summary.status_counts.get("refused", 0)
    record.update({
        "status": "ok" if ok == planned else "failed",
        "status_counts": summary.status_counts,
        "requests": planned,
        "stage_seconds": round(stage_seconds, 3),
        "first_edit_seconds": round(seconds[0], 3) if seconds else None,
        "seconds_per_edit": round(per_edit, 3) if per_edit else None,
        "images_per_second": round(1 / per_edit, 4) if per_edit else None,
        "denoiser_calls": len(clock.seconds),
        "seconds_per_step": round(per_step, 4) if per_step else None,
        "peak_gpu_gib": round(peak, 2) if peak is not None else None,
    })
    if per_edit and per_step and steps != full_steps:
        # Extrapolated, not measured: the measured edit plus the missing steps at the
        # measured seconds per step.
        record["extrapolated_seconds_per_edit_at_study_steps"] = round(
            per_edit + (full_steps - steps) * per_step, 2)
    if record["status"] == "failed":
        record["error"] = f"not every planned request finished: {summary.status_counts}"
    _write_json(record_path, record)
    return record


def worker_main(args: argparse.Namespace) -> int:
    adapter = ADAPTERS[args.worker]
    record_path = Path(args.record)
    try:
        record = run_adapter(adapter, args, args.mode, record_path)
    except BaseException as exc:  # the record must say why, whatever it was
        previous = json.loads(record_path.read_text()) if record_path.exists() else {
            "adapter": adapter.name, "mode": args.mode}
        previous.update({"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000],
                         "traceback": traceback.format_exc()[-4000:]})
        _write_json(record_path, previous)
        print(f"[{adapter.name}/{args.mode}] failed: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(f"[{adapter.name}/{args.mode}] {record['status']}: "
          f"{record.get('seconds_per_edit')} s/edit, peak {record.get('peak_gpu_gib')} GiB",
          flush=True)
    return 0


# ---- the parent: one subprocess per adapter --------------------------------------------------

#: Seconds each adapter may take at reduced steps on an H200 (build, startup, 2 edits), with
#: room to spare; ``--adapter-timeout`` overrides them all.
TIMEOUTS = {"instruct-pix2pix": 60, "sd3.5-large": 90, "flux-kontext": 90,
            "qwen-image-edit-2511": 120, "flux2-dev": 150}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="CUDA device (cuda or cuda:N)")
    parser.add_argument("--only", nargs="+", choices=list(ADAPTERS), default=None,
                        metavar="NAME", help=f"adapters to run, of {', '.join(ADAPTERS)}")
    parser.add_argument("--steps", type=int, default=None,
                        help="denoising steps per edit (default: each adapter's study steps)")
    parser.add_argument("--requests", type=int, default=2,
                        help="edits per adapter (a generator: rounded up to even)")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="requests per pipeline call (the study's generate.batch_size: 1)")
    parser.add_argument("--time-budget", type=float, default=300.0,
                        help="seconds for everything; adapters not started by then are skipped")
    parser.add_argument("--adapter-timeout", type=float, default=None,
                        help="seconds per adapter run (default: a per-adapter estimate)")
    parser.add_argument("--no-offload", action="store_true",
                        help="skip the simulated 80 GB card runs")
    parser.add_argument("--tiny", action="store_true",
                        help="the tests' tiny pipelines on the CPU instead (checks the path)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON-lines results")
    parser.add_argument("--worker", choices=list(ADAPTERS), help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="full", help=argparse.SUPPRESS)
    parser.add_argument("--record", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1, not {args.steps}")
    if args.requests < 1:
        parser.error(f"--requests must be at least 1, not {args.requests}")
    return args


def require_cuda(device: str) -> None:
    """Exit with a message (status 2) unless ``device`` is a CUDA device torch can use."""
    try:
        import torch
    except ImportError:
        sys.exit("gpu_adapters: torch is not installed (pip install -e \".[models]\")")
    if not device.startswith("cuda") or not torch.cuda.is_available():
        print(f"gpu_adapters: needs a CUDA GPU (--device {device}); torch sees "
              f"{torch.cuda.device_count()} CUDA device(s). Nothing was measured. "
              "Use --tiny to check the path on a CPU.", file=sys.stderr)
        raise SystemExit(2)


def _append(out: Path, record: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _worker_command(args: argparse.Namespace, name: str, mode: str, record: Path) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--mode", mode,
               "--record", str(record), "--device", args.device,
               "--requests", str(args.requests), "--batch-size", str(args.batch_size)]
    if args.steps is not None:
        command += ["--steps", str(args.steps)]
    if args.tiny:
        command.append("--tiny")
    return command


def run_worker(args: argparse.Namespace, name: str, mode: str, timeout: float) -> dict[str, Any]:
    """Run one adapter in a subprocess; its record, or a failed one saying why."""
    env = {**os.environ, "ACRB_MLFLOW": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"),
                                                       os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="acrb-gpu-adapters-record-") as folder:
        record_path = Path(folder) / "record.json"
        tick = time.perf_counter()
        try:
            process = subprocess.run(_worker_command(args, name, mode, record_path), env=env,
                                     timeout=timeout, check=False)
            error = None if process.returncode == 0 else f"exit status {process.returncode}"
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout:.0f} s (--adapter-timeout / --time-budget)"
        seconds = time.perf_counter() - tick
        record = (json.loads(record_path.read_text()) if record_path.exists()
                  else {"adapter": name, "mode": mode})
    record["wall_seconds"] = round(seconds, 1)
    if error is not None and record.get("status") in (None, "running", "ok"):
        record["status"] = "failed"
        record["error"] = error + (" (killed for memory?)" if "-9" in error else "")
    return record


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        return worker_main(args)
    if not args.tiny:
        require_cuda(args.device)
    started = time.perf_counter()
    names = [name for name in ADAPTERS if args.only is None or name in args.only]
    results: list[dict[str, Any]] = []

    def left() -> float:
        return args.time_budget - (time.perf_counter() - started)

    def run_or_skip(name: str, mode: str) -> dict[str, Any]:
        timeout = args.adapter_timeout or TIMEOUTS[name] * (2 if mode == "offload-80gb" else 1)
        timeout = min(timeout, left())
        if timeout < STARTUP_SECONDS:
            record = {"adapter": name, "mode": mode, "status": "skipped",
                      "error": f"--time-budget {args.time_budget:.0f} s spent "
                               f"({max(0.0, left()):.0f} s left)"}
        else:
            print(f"gpu_adapters: {name} ({mode}), timeout {timeout:.0f} s", flush=True)
            record = run_worker(args, name, mode, timeout)
        _append(args.out, record)
        results.append(record)
        return record

    for name in names:
        record = run_or_skip(name, "tiny" if args.tiny else "full")
        peak = record.get("peak_gpu_gib")
        if args.tiny or peak is None or peak <= CARD_80GB_GIB:
            continue
        if not args.no_offload:
            run_or_skip(name, "offload-80gb")
        _append(args.out, {"adapter": name, "mode": "quantized", "status": "not measured",
                           "error": "quantization needs bitsandbytes or torchao, which this "
                                    "machine lacks"})
    print(json.dumps({r["adapter"] + "/" + r["mode"]: r.get("status") for r in results},
                     indent=2), flush=True)
    return 0 if all(r.get("status") in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
