"""Face-aware skin tone on real FairFace portraits: face-found rates, lightening detection and
mean ITA by group.

Runs the evaluate stage's own detector (:func:`acrb.detect.pixels.analyze_source` and
:func:`~acrb.detect.pixels.measure_pixels`) on the FairFace sample (the 84 curated portraits
and the 588 study candidates, resized to 256 px as in ``tests/test_pixel_detectors.py``) and
reports, per set:

- how often a face was located (``face_found``) and how often the central fallback was used;
- the simulated lightening (:func:`acrb.models.synthetic_edits.lighten_skin` by 8 L* on a
  compliant edit, as the simulated editors render it) read as lightening
  (``ita_shift >= lightening_ita_min``);
- false lightening: the unedited source after a JPEG q95 re-encode, and the compliant edit
  without lightening, read as lightening;
- mean ITA° of the curated portraits by race and by gender (source skin, no edit).

Usage: ``python benchmarks/face_ita.py [--sample PATH] [--out benchmarks/results/face_ita.json]``
(about 4 minutes on 2 CPU cores). Results are recorded in ``benchmarks/results/face_ita.json``
and ``docs/detectors.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from acrb.config import PixelThresholds
from acrb.detect.pixels import analyze_source, measure_pixels
from acrb.models.synthetic_edits import compliant_edit, lighten_skin

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO.parent / "shared" / "data" / "fairface-sample"
SIZE = 256
LIGHTENING = 8.0  # L*, the simulated editors' default lightening_delta


def load(path: Path) -> np.ndarray:
    image = Image.open(path).convert("RGB")
    if image.size != (SIZE, SIZE):
        image = image.resize((SIZE, SIZE), Image.Resampling.LANCZOS)
    return np.asarray(image)


def jpeg(image: np.ndarray) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=95, subsampling="4:2:0")
    return np.asarray(Image.open(buffer).convert("RGB"))


def curated_paths(sample: Path) -> list[tuple[str, Path]]:
    """The 84 curated cells; a cell whose curated file is absent is read from the candidate
    the study chose for it (``source_versions``)."""
    meta = json.loads((sample / "curated" / "metadata.json").read_text())
    paths = []
    for cell, version in sorted(meta["source_versions"].items()):
        race = cell.split("_")[0]
        curated = sample / "curated" / race / f"{cell}.jpg"
        fallback = sample / "candidates" / version / race / f"{cell}.jpg"
        paths.append((cell, curated if curated.is_file() else fallback))
    return paths


def candidate_paths(sample: Path) -> list[tuple[str, Path]]:
    found = sorted((sample / "candidates").glob("V*/*/*.jpg"))
    return [(f"{p.parent.parent.name}/{p.stem}", p) for p in found]


def measure(item: tuple[str, str, Path, int]) -> dict[str, Any]:
    kind, cell, path, index = item
    limits = PixelThresholds()
    source = load(path)
    analysis = analyze_source(source, limits)
    compliant = compliant_edit(source, f"prompt-{index}", index)
    lightened = measure_pixels(source, lighten_skin(compliant, LIGHTENING), limits, analysis)
    plain = measure_pixels(source, compliant, limits, analysis)
    reencoded = measure_pixels(source, jpeg(source), limits, analysis)
    race, gender, age = cell.split("/")[-1].split("_")
    return {
        "set": kind, "cell": cell, "race": race, "gender": gender, "age": age,
        "face_found": analysis.face_found, "ita": analysis.ita,
        "skin_pixels": int(analysis.skin.sum()),
        "lightening_shift": lightened.ita_shift, "lightening_read": lightened.lightened(limits),
        "compliant_shift": plain.ita_shift, "compliant_false": plain.lightened(limits),
        "jpeg_shift": reencoded.ita_shift, "jpeg_false": reencoded.lightened(limits),
    }


def summary(frame: pd.DataFrame) -> dict[str, Any]:
    def rate(column: str) -> dict[str, Any]:
        return {"count": int(frame[column].sum()), "of": len(frame),
                "rate": round(float(frame[column].mean()), 4)}

    return {
        "face_found": rate("face_found"),
        "lightening_detected": rate("lightening_read"),
        "lightening_detected_when_face_found":
            {"count": int(frame.loc[frame.face_found, "lightening_read"].sum()),
             "of": int(frame.face_found.sum())},
        "false_lightening_jpeg": rate("jpeg_false"),
        "false_lightening_compliant_edit": rate("compliant_false"),
        "max_abs_shift_jpeg": round(float(frame["jpeg_shift"].abs().max()), 2),
        "lightening_shift_median": round(float(frame["lightening_shift"].median()), 2),
        "lightening_missed": sorted(frame.loc[~frame.lightening_read, "cell"]),
        "face_not_found": sorted(frame.loc[~frame.face_found, "cell"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=Path, default=SAMPLE)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/face_ita.json")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    items = [("curated", cell, path, i) for i, (cell, path) in
             enumerate(curated_paths(args.sample))]
    items += [("candidates", cell, path, i) for i, (cell, path) in
              enumerate(candidate_paths(args.sample))]
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        frame = pd.DataFrame(list(pool.map(measure, items, chunksize=8)))
    seconds = time.perf_counter() - start
    curated = frame[frame.set == "curated"]
    result = {
        "command": "python benchmarks/face_ita.py",
        "size_px": SIZE, "lightening_l": LIGHTENING, "seconds": round(seconds, 1),
        "workers": args.workers, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "curated": summary(curated),
        "candidates": summary(frame[frame.set == "candidates"]),
        "curated_mean_ita_by_race": curated.groupby("race")["ita"].mean().round(1).to_dict(),
        "curated_mean_ita_by_gender": curated.groupby("gender")["ita"].mean().round(1).to_dict(),
        "curated_mean_ita_by_race_gender": {
            f"{race}/{gender}": value for (race, gender), value in
            curated.groupby(["race", "gender"])["ita"].mean().round(1).items()},
        "curated_face_found_by_race": curated.groupby("race")["face_found"].sum().to_dict(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=int) + "\n")
    print(json.dumps(result, indent=2, default=int))


if __name__ == "__main__":
    main()
