"""What ACRB's harness costs on top of the model, for a real-size open-weights editor on a GPU.

Builds the full-size FLUX.1 Kontext [dev] architecture with random weights (nothing is
downloaded: the component configs below are the published architecture numbers of the
FLUX.1 [dev] family's config.json files; tokenizers are trained locally as in the tests' tiny
pipelines), in bfloat16 on one CUDA device, and times the same editing work two ways, side by
side in one process, alternating, several repeats:

(a) ACRB: the ``flux-kontext`` adapter through the real ``generate`` stage on a small project
    (plan rows, source loading and sha256 checks, the adapter's per-request generators,
    batching and timing, PNG and record writes);
(b) bare: a loop calling the same pipeline object directly with the same images, prompts,
    seeds, batch size, steps and resolution, keeping the PIL images in memory.

Reports images/s of each and the overhead of (a) over (b) in percent (target: at most 2%).
Only the ``generate.run`` call is timed; removing the previous run's outputs is not.
Random weights compute exactly as many FLOPs as trained ones, so the times are those of the
real model; the images are noise. Usage::

    python benchmarks/harness_overhead.py [--device cuda] [--requests 8] [--batch-size 2]
        [--steps 4] [--resolution 1024] [--repeats 3]
        [--out benchmarks/results/harness_overhead.json]

Needs a CUDA GPU with about 40 GB free (the transformer is 12 B parameters, the T5 encoder
4.7 B; bf16). Exits with a message, and status 2, where there is none. ``--tiny`` runs the
same path on the CPU with the tests' tiny Kontext pipeline instead (it checks the script
against the committed params; its figures say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MODEL = "kontext"
KEY = "flux-kontext"
REVISION = "random-init"
HUB_ID = "random-init/FLUX.1-Kontext-dev-architecture"
INSTRUCTION = "Give this person a pair of round reading glasses."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="CUDA device (cuda or cuda:N)")
    parser.add_argument("--requests", type=int, default=8, help="edits per timed run")
    parser.add_argument("--batch-size", type=int, default=2, help="requests per pipeline call")
    parser.add_argument("--steps", type=int, default=4, help="denoising steps per image")
    parser.add_argument("--resolution", type=int, default=1024, help="source and output side")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each path")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--profile", type=Path, default=None,
                        help="after the timed runs, profile one more generate run into this "
                        "text file (cProfile, top entries)")
    parser.add_argument("--tiny", action="store_true",
                        help="the tests' tiny Kontext pipeline on the CPU (checks the path; "
                        "measures nothing about a GPU)")
    args = parser.parse_args(argv)
    if args.tiny and args.device == "cuda":
        args.device = "cpu"
    return args


def require_cuda(device: str) -> None:
    """Exit with a message (status 2) unless ``device`` is a CUDA device torch can use."""
    try:
        import torch
    except ImportError:
        sys.exit("harness_overhead: torch is not installed (pip install -e \".[models]\")")
    if not device.startswith("cuda") or not torch.cuda.is_available():
        print(f"harness_overhead: needs a CUDA GPU (--device {device}); torch sees "
              f"{torch.cuda.device_count()} CUDA device(s). Nothing was measured.",
              file=sys.stderr)
        raise SystemExit(2)


def build_tiny_kontext(folder: Path) -> Any:
    """The tests' tiny random-weight FluxKontextPipeline, loaded on the CPU."""
    from diffusers import FluxKontextPipeline

    sys.path.insert(0, str(REPO))
    from tests.tiny_pipelines import build_flux_kontext

    pipe = FluxKontextPipeline.from_pretrained(build_flux_kontext(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_kontext(device: str) -> Any:
    """A FluxKontextPipeline of the full FLUX.1 [dev] architecture, random bf16 weights.

    Numbers from the published config.json files of black-forest-labs/FLUX.1-Kontext-dev
    (the FLUX.1 [dev] family): transformer 19 double + 38 single blocks, 24 heads of 128,
    joint attention 4096, pooled projection 768, rope axes (16, 56, 56), guidance embedding;
    VAE 16 latent channels, blocks (128, 256, 512, 512), scaling 0.3611, shift 0.1159, no
    quant convs; CLIP ViT-L/14 text encoder; T5 v1.1 XXL encoder; flow-matching scheduler
    with dynamic shifting.
    """
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxKontextPipeline,
        FluxTransformer2DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    sys.path.insert(0, str(REPO))
    from tests.tiny_pipelines import make_clip_tokenizer, make_t5_tokenizer

    clip_tokenizer = make_clip_tokenizer(max_length=77)
    t5_tokenizer = make_t5_tokenizer(max_length=512)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialise in bf16, directly on the GPU
    try:
        with torch.device(device):
            torch.manual_seed(0)
            transformer = FluxTransformer2DModel(
                patch_size=1, in_channels=64, num_layers=19, num_single_layers=38,
                attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
            vae = AutoencoderKL(
                in_channels=3, out_channels=3, latent_channels=16,
                down_block_types=("DownEncoderBlock2D",) * 4,
                up_block_types=("UpDecoderBlock2D",) * 4,
                block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                norm_num_groups=32, sample_size=1024, scaling_factor=0.3611,
                shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False)
            text_encoder = CLIPTextModel(CLIPTextConfig(
                vocab_size=49408, hidden_size=768, intermediate_size=3072,
                num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
                projection_dim=768, hidden_act="quick_gelu",
                bos_token_id=clip_tokenizer.bos_token_id,
                eos_token_id=clip_tokenizer.eos_token_id,
                pad_token_id=clip_tokenizer.pad_token_id))
            text_encoder_2 = T5EncoderModel(T5Config(
                vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
                num_heads=64, feed_forward_proj="gated-gelu",
                relative_attention_num_buckets=32, relative_attention_max_distance=128,
                pad_token_id=t5_tokenizer.pad_token_id,
                eos_token_id=t5_tokenizer.eos_token_id))
    finally:
        torch.set_default_dtype(previous)
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
        max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
    pipe = FluxKontextPipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=clip_tokenizer,
        text_encoder_2=text_encoder_2, tokenizer_2=t5_tokenizer, transformer=transformer)
    pipe.to(device=device, dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def model_config(args: argparse.Namespace) -> dict[str, Any]:
    # A tiny run keeps its small sources as they are: Kontext's own resizing would take them to
    # about 1024 px, minutes of VAE work on a CPU.
    return {"hub_id": HUB_ID, "dtype": "bfloat16", "device": args.device, "steps": args.steps,
            "width": args.resolution, "height": args.resolution,
            "batch_size": args.batch_size, "auto_resize": not args.tiny}


def make_project(root: Path, args: argparse.Namespace) -> Path:
    """A project with one portrait, one instruction and ``--requests`` seeds, MLflow off."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "dvc.yaml").write_text("stages: {}\n")
    catalog = {
        "name": "overhead-catalog", "version": 1,
        "categories": {"A": {"name": "neutral", "description": "everyday edits"}},
        "prompts": [{"id": "A01", "category": "A", "attribute": "neutral",
                     "congruent_with": [], "text": INSTRUCTION}],
    }
    (root / "catalog.yaml").write_text(yaml.safe_dump(catalog, sort_keys=False))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["sources"].update({"kind": "synthetic", "resolution": args.resolution,
                              "races": ["Black"], "genders": ["Female"], "ages": ["20s"],
                              "per_cell": 1})
    params["prompts"] = {"catalog": str(root / "catalog.yaml"), "categories": None}
    params["plan"] = {"seeds": list(range(args.requests)), "prompt_sets": ["catalog"],
                      "arms": ["none"]}
    params["generate"] = {"batch_size": args.batch_size, "retry_errors": True,
                          "verify_existing": True}
    params["models"] = {MODEL: {"key": KEY, "revision": REVISION,
                                "config": model_config(args)}}
    # Only the editing requests: no WinoBias pairs (their sentence file is the repository's)
    # and no judges or review, which the generate stage never reads.
    params["winobias"] = None
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def acrb_run(ctx: Any, model_seconds: list[float] | None = None) -> float:
    """Seconds of one full ``generate`` run (fresh output folder, removed before timing);
    the seconds spent inside pipeline calls are appended to ``model_seconds``."""
    from acrb import layout
    from acrb.stages import generate

    shutil.rmtree(ctx.path(layout.generations_dir(MODEL)), ignore_errors=True)
    timings = ctx.path("logs")
    shutil.rmtree(timings, ignore_errors=True)
    tick = time.perf_counter()
    summary = generate.run(ctx, MODEL)
    seconds = time.perf_counter() - tick
    if summary.status_counts.get("ok", 0) != summary.planned:
        raise RuntimeError(f"generate did not finish every request: {summary.status_counts}")
    if model_seconds is not None:
        model_seconds.append(summary.seconds_model)
    return seconds


def profiled_run(ctx: Any, path: Path) -> None:
    """One more ``generate`` run (not timed) under cProfile; the 60 entries of most cumulative
    time go to ``path``, to say where an overhead comes from."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    acrb_run(ctx)
    profile.disable()
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(30)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.getvalue())


def bare_run(pipe: Any, images: list[Any], seeds: list[int], args: argparse.Namespace
             ) -> float:
    """Seconds of the same work as direct pipeline calls (images kept in memory)."""
    import torch

    tick = time.perf_counter()
    for start in range(0, len(seeds), args.batch_size):
        batch = seeds[start : start + args.batch_size]
        out = pipe(image=images[: len(batch)], prompt=[INSTRUCTION] * len(batch),
                   generator=[torch.Generator(args.device).manual_seed(s) for s in batch],
                   num_inference_steps=args.steps, guidance_scale=2.5,
                   width=args.resolution, height=args.resolution,
                   max_area=args.resolution**2, _auto_resize=not args.tiny,
                   output_type="pil")
        assert len(out.images) == len(batch)
    return time.perf_counter() - tick


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if not args.tiny:
        require_cuda(args.device)
    os.environ["ACRB_MLFLOW"] = "0"
    import torch

    from acrb.models.diffusion import DiffusersConfig, forget_pipelines, preload_pipeline
    from acrb.models.flux_kontext import FluxKontext, FluxKontextConfig
    from acrb.stages import plan, prompts, sources
    from acrb.stages.context import StageContext
    from acrb.storage import load_rgb

    tick = time.perf_counter()
    scratch = tempfile.TemporaryDirectory(prefix="acrb-overhead-model-")
    pipe = (build_tiny_kontext(Path(scratch.name) / "kontext") if args.tiny
            else build_kontext(args.device))
    build_seconds = time.perf_counter() - tick
    config = FluxKontextConfig.model_validate(model_config(args))
    assert isinstance(config, DiffusersConfig)
    preload_pipeline(pipe, FluxKontext.pipeline_class, config, REVISION)

    from PIL import Image

    with tempfile.TemporaryDirectory(prefix="acrb-overhead-") as folder:
        root = make_project(Path(folder) / "project", args)
        ctx = StageContext.load(root / "params.yaml", root)
        sources.run(ctx)
        prompts.run(ctx)
        plan.run(ctx)
        requests = ctx.model_requests(MODEL)
        source = load_rgb(root / requests["source_path"].iloc[0])
        images = [Image.fromarray(source)] * args.batch_size
        seeds = [int(seed) for seed in requests["seed"]]

        # Warm-up: CUDA kernels, allocator, both paths once (not timed).
        bare_run(pipe, images, seeds[: args.batch_size], args)
        acrb_run(ctx)
        acrb_seconds, bare_seconds, model_seconds = [], [], []
        for _ in range(args.repeats):
            bare_seconds.append(bare_run(pipe, images, seeds, args))
            acrb_seconds.append(acrb_run(ctx, model_seconds))
        if args.profile is not None:
            profiled_run(ctx, args.profile)
    forget_pipelines()
    scratch.cleanup()

    acrb_median, bare_median = statistics.median(acrb_seconds), statistics.median(bare_seconds)
    import diffusers
    import transformers

    result = {
        "model": ("tiny random Kontext pipeline of the tests (CPU; not a GPU figure)"
                  if args.tiny else "FLUX.1 Kontext [dev] architecture, random bf16 weights"),
        "device": (torch.cuda.get_device_name(torch.device(args.device))
                   if args.device.startswith("cuda") else "cpu"),
        "torch": torch.__version__, "diffusers": diffusers.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
        "command": "python benchmarks/harness_overhead.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "requests": args.requests, "batch_size": args.batch_size, "steps": args.steps,
        "resolution": args.resolution, "repeats": args.repeats,
        "build_seconds": round(build_seconds, 1),
        "acrb_seconds": [round(s, 3) for s in acrb_seconds],
        # Inside the pipeline calls of each ACRB run (the stage's own time is the rest).
        "acrb_model_seconds": [round(s, 3) for s in model_seconds],
        "bare_seconds": [round(s, 3) for s in bare_seconds],
        "acrb_images_per_second": round(args.requests / acrb_median, 4),
        "bare_images_per_second": round(args.requests / bare_median, 4),
        "overhead_percent": round(100 * (acrb_median - bare_median) / bare_median, 2),
        "target_percent": 2.0,
    }
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
