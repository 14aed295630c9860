"""Throughput of the CLIP refusal check: images/s batched vs one at a time, on CPU or GPU.

The model is a random-weight CLIP of the ViT-B/32 architecture (vision 768 x 12 layers, patch
32, 224 px; text 512 x 12 layers; projection 512), built offline and loaded by folder path
through the transformers backend, i.e. the real compute cost of ``openai/clip-vit-base-patch32``
without its weights; ``--architecture tiny`` swaps in the small test model (a smoke run of this
script, not a figure). The same images are scored by the function the evaluate stage calls
(:meth:`acrb.detect.clip_refusal.ClipRefusalChecker.scores`):

1. batched, pixels prepared on the device (the default path), all ``--images``;
2. one image per call, the first ``--single-images``;
3. batched through the library's own per-image (PIL) processor, the first
   ``--processor-images`` (``via_processor=True``): the path before preprocessing moved to the
   device, and the reference the device path's scores are compared with.

One warm-up call per checker (model load, template embeddings, the first batches) is excluded.
The result file is rewritten after every measurement (``"complete": false`` until the last),
so a run stopped early keeps what it measured. On a GPU:

    PYTHONPATH=src ACRB_MLFLOW=0 python benchmarks/clip_throughput.py --device cuda \
        --images 256 --batch-size 64 --resolution 1024 \
        --out benchmarks/results/clip_throughput_cuda.json

On CPU (the figure in ``benchmarks/results/clip_throughput.json``):

    python benchmarks/clip_throughput.py --images 64 --batch-size 32 \
        --out benchmarks/results/clip_throughput.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the offline model builder lives with the tests

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = {
    "vit-b-32": "random-weight CLIP, ViT-B/32 architecture (transformers CLIPModel)",
    "tiny": "random-weight tiny CLIP (hidden 32, 2 layers; smoke run, not a figure)",
}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _write(out: Path, result: dict[str, Any]) -> None:
    """Atomically (temp file, then rename), so a kill mid-write leaves the last whole result."""
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_suffix(out.suffix + ".tmp")
    temporary.write_text(json.dumps(result, indent=2) + "\n")
    temporary.replace(out)


def _timed(run: Any, device: str) -> tuple[Any, float]:
    import torch

    start = time.perf_counter()
    value = run()
    if device.startswith("cuda"):
        torch.cuda.synchronize()  # scores() reads its result back; this is belt and braces
    return value, time.perf_counter() - start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--images", type=int, default=64, help="images scored batched")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--resolution", type=int, default=256,
                        help="side of the test images in px (the model sees 224 px crops)")
    parser.add_argument("--single-images", type=int, default=None,
                        help="images scored one per call (default: --images, at most 64)")
    parser.add_argument("--processor-images", type=int, default=None,
                        help="images scored through the library's PIL processor for the "
                             "comparison (default: --images, at most 64; 0 skips it)")
    parser.add_argument("--architecture", choices=sorted(MODELS), default="vit-b-32")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--out", type=Path,
                        default=REPO / "benchmarks" / "results" / "clip_throughput.json")
    args = parser.parse_args(argv)
    for name in ("images", "batch_size", "resolution"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    single_n = min(args.images, 64) if args.single_images is None else args.single_images
    processor_n = (min(args.images, 64) if args.processor_images is None
                   else args.processor_images)
    single_n, processor_n = min(single_n, args.images), min(processor_n, args.images)

    import torch
    import transformers
    from tests.tiny_clip import build_clip, clip_params, known_images

    from acrb.config import ClipRefusalParams
    from acrb.detect.clip_refusal import ClipRefusalChecker

    cuda = args.device.startswith("cuda")
    result: dict[str, Any] = {
        "model": MODELS[args.architecture], "complete": False,
        "images": args.images, "image_side_px": args.resolution,
        "batch_size": args.batch_size, "device": args.device,
        "device_name": torch.cuda.get_device_name(args.device) if cuda else platform.processor()
        or platform.machine(),
        "preprocessing": "on the device, batched (acrb.detect.clip_refusal.device_pixels)",
        "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "machine": platform.machine(), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "torchvision": _version("torchvision"), "pillow": _version("pillow"),
        "command": "python benchmarks/clip_throughput.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
    }

    def progress(message: str) -> None:
        print(f"[clip_throughput] {message}", flush=True)

    start = time.perf_counter()
    images = known_images(args.images, size=args.resolution, seed=7)
    progress(f"{args.images} images of {args.resolution} px made in "
             f"{time.perf_counter() - start:.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_clip(Path(tmp) / args.architecture, args.architecture)

        def checker(batch_size: int) -> ClipRefusalChecker:
            params = ClipRefusalParams.model_validate(clip_params(folder, batch_size=batch_size,
                                                                   device=args.device))
            made = ClipRefusalChecker(params, REPO)
            # Warm-up: load the model, embed the templates, run the first batches (kernel
            # selection, page-locked buffers).
            made.scores(images[:min(len(images), 2 * batch_size)])
            return made

        batched_checker = checker(args.batch_size)
        batched, batched_s = _timed(lambda: batched_checker.scores(images), args.device)
        result.update({"batched_images_per_s": round(args.images / batched_s, 2),
                       "batched_seconds": round(batched_s, 3)})
        result["load_average_1min"] = round(os.getloadavg()[0], 2)
        _write(args.out, result)
        progress(f"batched: {result['batched_images_per_s']} images/s")

        if single_n:
            single_checker = checker(1)
            single, single_s = _timed(lambda: np.concatenate(
                [single_checker.scores([image]) for image in images[:single_n]]), args.device)
            result.update({
                "one_at_a_time_images": single_n,
                "one_at_a_time_images_per_s": round(single_n / single_s, 2),
                "one_at_a_time_seconds": round(single_s, 3),
                "speedup": round((single_s / single_n) / (batched_s / args.images), 2),
                "max_abs_score_difference": float(np.max(np.abs(batched[:single_n] - single))),
            })
            _write(args.out, result)
            progress(f"one at a time: {result['one_at_a_time_images_per_s']} images/s")

        if processor_n:
            reference, processor_s = _timed(lambda: batched_checker.scores(
                images[:processor_n], via_processor=True), args.device)
            result.update({
                "processor_path_images": processor_n,
                "processor_path_images_per_s": round(processor_n / processor_s, 2),
                "processor_path_seconds": round(processor_s, 3),
                "speedup_over_processor_path": round(
                    (processor_s / processor_n) / (batched_s / args.images), 2),
                "max_abs_score_difference_vs_processor": float(
                    np.max(np.abs(batched[:processor_n] - reference))),
            })
            _write(args.out, result)
            progress(f"processor path: {result['processor_path_images_per_s']} images/s")

    result["complete"] = True
    result["load_average_1min"] = round(os.getloadavg()[0], 2)
    _write(args.out, result)
    print(json.dumps(result, indent=2), flush=True)
    return result


if __name__ == "__main__":
    main()
