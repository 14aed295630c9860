"""CPU throughput of the CLIP refusal check: images/s batched vs one at a time, in one run.

The model is a random-weight CLIP of the ViT-B/32 architecture (vision 768 x 12 layers, patch
32, 224 px; text 512 x 12 layers; projection 512), built offline and loaded by folder path
through the transformers backend, i.e. the real compute cost of ``openai/clip-vit-base-patch32``
without its weights. The same images are scored both ways by the function the evaluate stage
calls (:meth:`acrb.detect.clip_refusal.ClipRefusalChecker.scores`), and the two score vectors
are compared. One warm-up call per checker (model load, template embeddings) is excluded.

    python benchmarks/clip_throughput.py --images 64 --batch-size 32 \
        --out benchmarks/results/clip_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the offline model builder lives with the tests

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--resolution", type=int, default=256,
                        help="side of the test images (the processor resizes them to 224)")
    parser.add_argument("--device", default="cpu", help="cpu (the figure recorded) or cuda")
    parser.add_argument("--out", type=Path,
                        default=REPO / "benchmarks" / "results" / "clip_throughput.json")
    args = parser.parse_args()

    import torch
    import transformers
    from tests.tiny_clip import build_clip, clip_params, known_images

    from acrb.config import ClipRefusalParams
    from acrb.detect.clip_refusal import ClipRefusalChecker

    images = known_images(args.images, size=args.resolution, seed=7)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_clip(Path(tmp) / "vit-b-32", "vit-b-32")

        def checker(batch_size: int) -> ClipRefusalChecker:
            params = ClipRefusalParams.model_validate(clip_params(folder, batch_size=batch_size,
                                                                   device=args.device))
            made = ClipRefusalChecker(params, REPO)
            made.scores(images[:1])  # warm-up: load the model, embed the templates
            return made

        batched_checker = checker(args.batch_size)
        start = time.perf_counter()
        batched = batched_checker.scores(images)
        batched_s = time.perf_counter() - start

        single_checker = checker(1)
        start = time.perf_counter()
        single = np.concatenate([single_checker.scores([image]) for image in images])
        single_s = time.perf_counter() - start

    result = {
        "model": "random-weight CLIP, ViT-B/32 architecture (transformers CLIPModel)",
        "images": args.images, "image_side_px": args.resolution,
        "batch_size": args.batch_size, "device": args.device,
        "load_average_1min": round(os.getloadavg()[0], 2),
        "batched_images_per_s": round(args.images / batched_s, 2),
        "one_at_a_time_images_per_s": round(args.images / single_s, 2),
        "speedup": round(single_s / batched_s, 2),
        "batched_seconds": round(batched_s, 3), "one_at_a_time_seconds": round(single_s, 3),
        "max_abs_score_difference": float(np.max(np.abs(batched - single))),
        "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "machine": platform.machine(), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "command": "python benchmarks/clip_throughput.py " + " ".join(sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
