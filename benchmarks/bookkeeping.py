"""Bookkeeping cost per request of `generate` (and `evaluate`), excluding the model itself.

Runs the real stages on a temporary copy of the embedded default (84 synthetic sources x 50
prompts = 4,200 requests for one simulated editor) and reports, per request:

- generate, first run: wall time minus the time spent inside ``Editor.edit`` (reading the plan,
  loading and checking sources, PNG encoding, atomic image and record writes, gathering the
  table, MLflow off);
- generate, rerun with everything finished (the resume check: reading and validating records,
  re-hashing images);
- evaluate: all pixel detectors plus record writes;
- PNG encoding of one output image, the part of the bookkeeping that grows with resolution
  (also reported subtracted from the generate bookkeeping).

Target (issue: backbone): at most 5 ms of bookkeeping per request. Usage::

    python benchmarks/bookkeeping.py [--resolution 128] [--out benchmarks/results/bookkeeping.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from acrb.stages import evaluate, generate, plan, prompts, sources
from acrb.stages.context import StageContext
from acrb.storage import encode_png

REPO = Path(__file__).resolve().parents[1]
MODEL = "synthetic-biased"


def measure(resolution: int) -> dict[str, float | int | str]:
    os.environ["ACRB_MLFLOW"] = "0"
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["sources"]["resolution"] = resolution
    params["prompts"]["catalog"] = str(REPO / params["prompts"]["catalog"])
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "dvc.yaml").write_text("stages: {}\n")
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        ctx = StageContext.load(root / "params.yaml", root)
        sources.run(ctx)
        prompts.run(ctx)
        plan.run(ctx)
        first = generate.run(ctx, MODEL)
        tick = time.perf_counter()
        rerun = generate.run(ctx, MODEL)
        rerun_seconds = time.perf_counter() - tick
        tick = time.perf_counter()
        judged = evaluate.run(ctx, MODEL)
        evaluate_seconds = time.perf_counter() - tick
        png_ms = _png_encode_ms(root)
    n = first.planned
    bookkeeping_ms = 1000 * (first.seconds_total - first.seconds_model) / n
    return {
        "resolution": resolution,
        "requests": n,
        "generate_total_ms_per_request": 1000 * first.seconds_total / n,
        "generate_model_ms_per_request": 1000 * first.seconds_model / n,
        "generate_bookkeeping_ms_per_request": bookkeeping_ms,
        "png_encode_ms_per_image": png_ms,
        "generate_bookkeeping_excluding_png_ms_per_request": bookkeeping_ms - png_ms,
        "resume_check_ms_per_request": 1000 * rerun_seconds / n,
        "resume_skipped": rerun.skipped,
        "evaluate_ms_per_request": 1000 * evaluate_seconds / judged.judged,
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count() or 0,
        "python": platform.python_version(),
    }


def _png_encode_ms(root: Path, sample: int = 200) -> float:
    """Mean time to PNG-encode one output image (the part of bookkeeping that scales with
    resolution), over a fixed sample of the generated images."""
    paths = sorted((root / "data" / "generations" / MODEL).rglob("*.png"))[:sample]
    images = [np.asarray(Image.open(path).convert("RGB")) for path in paths]
    tick = time.perf_counter()
    for image in images:
        encode_png(image)
    return 1000 * (time.perf_counter() - tick) / max(len(images), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = [measure(r) for r in args.resolution]
    for row in results:
        print(json.dumps(row))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
