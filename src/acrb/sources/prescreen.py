"""Automatic pre-screen of candidate portraits: measurements and flags for the curator.

For each candidate image :func:`prescreen` measures

- **face**: OpenCV's Haar cascades with their fallbacks (:mod:`acrb.detect.face`); which one
  found the face is stored in ``face_detector``. The subject's face is the largest one over
  the image centre (FairFace crops are centred on the face), else the largest. Its box is
  reported in the original image's pixels, ``face_fraction`` is its width over the image
  width and ``face_offset`` the distance of its centre from the image centre, with x and y in
  fractions of the image width and height.
- **sharpness**: the variance of the Laplacian of the grey image (Pech-Pacheco et al., "Diatom
  autofocusing in brightfield microscopy: a comparative study", ICPR 2000).
- **brightness**: mean luma, 0-255 (ITU-R BT.601 weights, as PIL's ``L`` mode);
  **contrast**: RMS contrast, the standard deviation of luma / 255;
  **clipped_dark** / **clipped_bright**: the share of pixels with luma <= 5 / >= 250.
- **phash**: a 64-bit DCT perceptual hash (Zauner, "Implementation and Benchmarking of
  Perceptual Image Hash Functions", 2010; the pHash library's ``ph_dct_imagehash``): grey
  image resized to 32x32, 2-D DCT-II, the 8x8 coefficients of frequencies 1..8 in each
  direction (the DC term and the zero-frequency row and column, which carry mean brightness
  and little structure, are left out), each compared with their median, read row by row as
  16 hex digits. :func:`prescreen_all` compares all hashes pairwise and lists the candidates
  within ``near_duplicate_bits`` Hamming distance in ``near_duplicate_of``, across cells.

Face detection and sharpness run on a copy resized to :data:`WORK_SIZE` px on its longest
side: the Laplacian variance depends strongly on resolution, and this way one threshold means
the same for FairFace's 224 px hub copy, its 448 px release and 1024 px upscales. Luma
statistics use the full image.

Failed checks are ``;``-joined in ``flags`` (names in :data:`FLAGS`). Nothing is dropped or
rejected here: the flags are advice for the person who curates the cells.

The measurements depend on an image's bytes alone (the thresholds only set the flags), so
:func:`prescreen_all` can keep them in a cache folder (the sources stage uses
``.acrb-cache/prescreen/``), keyed by the image's sha256 under a name that holds
:data:`MEASURES_VERSION` and OpenCV's version: a rerun of the stage (after curating, or under
``dvc repro``, which deletes the stage's outputs first) measures only images it has not seen.

Face detection is the check most likely to fail unevenly across groups. On the 588 study
candidates (84 per race; see ``tests/test_prescreen.py``) it missed 4 Black faces and 1-2 of
every other group, mostly turned or tilted heads: too few to show a difference, and a reason
to read ``no_face`` as "look at this one", not as evidence of a bad photo.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from PIL import Image, ImageOps, UnidentifiedImageError
from pydantic import Field
from scipy.fft import dctn
from tqdm import tqdm

from acrb.config import PrescreenThresholds
from acrb.detect.face import (
    WORK_SIZE,
    cv2,
    detect_faces,
    main_face,
    require_opencv,
    resize_longest,
)
from acrb.errors import InputDataError
from acrb.records import Record, write_table
from acrb.storage import atomic_write_text, canonical_json, plain_value, sha256_bytes

#: Names of the checks, in the order they are listed in ``flags``.
FLAGS: tuple[str, ...] = (
    "no_face", "small_face", "off_centre", "blurry", "dark", "bright", "low_contrast",
    "clipped_dark", "clipped_bright", "near_duplicate",
)

# Luma at or beyond these levels counts as clipped (crushed shadows, blown highlights).
_DARK_LEVEL = 5
_BRIGHT_LEVEL = 250

# Columns of the candidate table carried into the pre-screen table.
_ID_COLUMNS = ("candidate_id", "cell", "race", "gender", "age", "origin")
#: The version of what :func:`prescreen` measures, in the cache's file name: raise it when a
#: measurement changes, so that no cached value of the old one is reused.
MEASURES_VERSION = 1

log = logging.getLogger(__name__)

ImageInput = Image.Image | str | Path | bytes


class PrescreenRecord(Record):
    """The pre-screen of one candidate portrait."""

    table: ClassVar[str] = "prescreen"
    key: ClassVar[str] = "candidate_id"

    candidate_id: str
    face_found: bool
    face_count: int
    face_detector: str = Field(description="the cascade (and rotation) that found the face")
    face_box: str = Field(description="`x,y,w,h` of the subject's face in original pixels; "
                          "empty if none")
    face_fraction: float | None
    face_offset: float | None
    sharpness: float
    brightness: float
    contrast: float
    clipped_dark: float
    clipped_bright: float
    phash: str
    nearest_bits: int | None = Field(description="Hamming distance to the closest other "
                                     "candidate's phash")
    near_duplicate_of: str = Field(description="`;`-joined candidate ids within the threshold")
    flags: str = Field(description="`;`-joined failed checks; empty if none")
    thresholds: str = Field(description="canonical JSON of the PrescreenThresholds used")


# ----------------------------------------------------------------------------- one image


def prescreen(image: ImageInput, thresholds: PrescreenThresholds | None = None) -> dict[str, Any]:
    """Measure one image and flag the checks it fails (all but ``near_duplicate``, which needs
    the other candidates: see :func:`prescreen_all`)."""
    require_opencv()
    limits = thresholds or PrescreenThresholds()
    rgb = _load_rgb(image)
    width, height = rgb.size
    luma = np.asarray(rgb.convert("L"))
    work = resize_longest(luma, WORK_SIZE)
    # Separate x and y scales: rounding the work size makes them differ by up to a pixel.
    scale_x, scale_y = work.shape[1] / width, work.shape[0] / height
    faces, detector = detect_faces(work)
    result: dict[str, Any] = {
        "face_found": bool(faces), "face_count": len(faces), "face_detector": detector,
        "face_box": None, "face_fraction": None, "face_offset": None,
    }
    if faces:
        work_h, work_w = work.shape
        x, y, w, h = main_face(faces, work_w, work_h)
        result["face_box"] = (round(x / scale_x), round(y / scale_y), round(w / scale_x),
                              round(h / scale_y))
        result["face_fraction"] = float(w / work_w)
        result["face_offset"] = float(np.hypot((x + w / 2) / work_w - 0.5,
                                               (y + h / 2) / work_h - 0.5))
    result.update(
        sharpness=float(cv2.Laplacian(work, cv2.CV_64F).var()),
        brightness=float(luma.mean()),
        contrast=float(luma.std() / 255.0),
        clipped_dark=float((luma <= _DARK_LEVEL).mean()),
        clipped_bright=float((luma >= _BRIGHT_LEVEL).mean()),
        phash=phash(luma),
    )
    result["flags"] = ";".join(failed_checks(result, limits))
    return result


def failed_checks(measures: dict[str, Any], limits: PrescreenThresholds) -> list[str]:
    """The names of the checks that ``measures`` (a :func:`prescreen` result) fail."""
    failed = {
        "no_face": not measures["face_found"],
        "small_face": measures["face_found"]
        and measures["face_fraction"] < limits.min_face_fraction,
        "off_centre": measures["face_found"] and measures["face_offset"] > limits.max_face_offset,
        "blurry": measures["sharpness"] < limits.min_sharpness,
        "dark": measures["brightness"] < limits.min_brightness,
        "bright": measures["brightness"] > limits.max_brightness,
        "low_contrast": measures["contrast"] < limits.min_contrast,
        "clipped_dark": measures["clipped_dark"] > limits.max_clipped,
        "clipped_bright": measures["clipped_bright"] > limits.max_clipped,
        "near_duplicate": bool(measures.get("near_duplicate_of")),
    }
    return [name for name in FLAGS if failed[name]]


def phash(gray: np.ndarray | Image.Image) -> str:
    """The 64-bit DCT perceptual hash of an image, as 16 hex digits (see module docstring)."""
    pixels = np.asarray(gray.convert("L") if isinstance(gray, Image.Image) else gray)
    # Area averaging low-passes before subsampling, the job of pHash's 7x7 mean filter.
    small = cv2.resize(pixels, (32, 32), interpolation=cv2.INTER_AREA).astype(np.float64)
    block = dctn(small, type=2)[1:9, 1:9]
    bits = (block > np.median(block)).ravel()
    return f"{int(''.join('1' if b else '0' for b in bits), 2):016x}"


def hamming(a: str, b: str) -> int:
    """Number of differing bits between two hex hashes."""
    return (int(a, 16) ^ int(b, 16)).bit_count()


def _load_rgb(image: ImageInput) -> Image.Image:
    try:
        if isinstance(image, Image.Image):
            loaded = image
        elif isinstance(image, bytes):
            loaded = Image.open(io.BytesIO(image))
            loaded.load()
        else:
            with Image.open(image) as opened:
                opened.load()
                loaded = opened.copy()
    except FileNotFoundError as exc:
        raise InputDataError(f"image {image!s} not found", "restore the file") from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        what = "(given as bytes)" if isinstance(image, bytes) else str(image)
        raise InputDataError(f"image {what} is corrupt or not an image ({exc})",
                             "replace the file, or remove the candidate") from exc
    # Orient as a viewer shows it (EXIF), which is what a curator and an editor see.
    return ImageOps.exif_transpose(loaded).convert("RGB")


# ------------------------------------------------------------------------ all candidates


def prescreen_all(candidates: pd.DataFrame, *, thresholds: PrescreenThresholds | None = None,
                  loader: Callable[[str], bytes] | None = None, root: Path | None = None,
                  workers: int | None = None, progress: bool = False,
                  cache: Path | None = None) -> pd.DataFrame:
    """Pre-screen every candidate and cross-check them for near-duplicates.

    Images come from ``loader(image_ref)`` (default: :func:`acrb.sources.fairface.
    read_image_bytes`) when the table has ``image_ref``, otherwise from ``root / file``.
    Returns one row per candidate, in input order: its id columns (``candidate_id``, and
    ``cell, race, gender, age, origin`` where present), the measurements of
    :func:`prescreen`, ``nearest_bits``, ``near_duplicate_of`` and ``flags``. No row is
    dropped. ``workers`` threads screen images in parallel (default: one per core, up to 8).
    With ``cache`` (a folder), an image measured before (the same bytes) is not measured
    again (:func:`_cache_file`).
    """
    from acrb.sources.fairface import read_image_bytes

    limits = thresholds or PrescreenThresholds()
    if "candidate_id" not in candidates.columns:
        raise InputDataError("the candidate table has no candidate_id column",
                             "pass the table from draw_candidates or load_study_candidates")
    load = loader or read_image_bytes
    records: list[dict[str, Any]] = candidates.to_dict(orient="records")  # type: ignore[assignment]
    for row in records:
        if "image_ref" not in row and (root is None or "file" not in row):
            raise InputDataError("the candidate table has neither image_ref nor file",
                                 "pass root= with a table that has a file column")

    known = _read_cache(cache)
    new: dict[str, dict[str, Any]] = {}

    def screen(row: dict[str, Any]) -> dict[str, Any]:
        image: bytes | Path = (load(row["image_ref"]) if "image_ref" in row
                               else Path(root or ".") / row["file"])
        keep: dict[str, Any] = {c: row[c] for c in _ID_COLUMNS if c in row}
        if cache is None:
            return {**keep, **prescreen(image, limits)}
        data = image if isinstance(image, bytes) else Path(image).read_bytes()
        digest = sha256_bytes(data)
        measures = known.get(digest)
        if measures is None:
            measures = {k: v for k, v in prescreen(data, limits).items() if k != "flags"}
            new[digest] = measures
        else:
            measures = {**measures, "face_box": None if measures["face_box"] is None
                        else tuple(measures["face_box"])}
        return {**keep, **measures, "flags": ";".join(failed_checks(measures, limits))}

    # OpenCV and PIL release the GIL while they work, so threads use all cores.
    with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
        rows = list(tqdm(pool.map(screen, records), total=len(records), desc="prescreen",
                         unit="img", disable=not progress))
    if cache is not None and new:
        _write_cache(cache, {**known, **new})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    ids = frame["candidate_id"].tolist()
    distances = _pairwise_hamming(frame["phash"].tolist())
    np.fill_diagonal(distances, 65)
    frame["nearest_bits"] = distances.min(axis=1) if len(ids) > 1 else None
    frame["near_duplicate_of"] = [
        ";".join(sorted(ids[j] for j in np.flatnonzero(line <= limits.near_duplicate_bits)))
        for line in distances
    ]
    measured: list[dict[str, Any]] = frame.to_dict(orient="records")  # type: ignore[assignment]
    frame["flags"] = [";".join(failed_checks(measures, limits)) for measures in measured]
    frame.attrs["thresholds"] = limits.model_dump()
    return frame


def _cache_file(cache: Path) -> Path:
    """The file of measurements in the cache folder: image sha256 -> :func:`prescreen`'s
    measurements (without flags), for this :data:`MEASURES_VERSION` and OpenCV version."""
    import cv2

    return cache / f"measures-v{MEASURES_VERSION}-opencv{cv2.__version__}.json"


def _read_cache(cache: Path | None) -> dict[str, dict[str, Any]]:
    if cache is None:
        return {}
    path = _cache_file(cache)
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("pre-screen cache %s cannot be read (%s): every image is measured again",
                    path, exc)
        return {}
    if not isinstance(loaded, dict) or not all(isinstance(v, dict) for v in loaded.values()):
        log.warning("pre-screen cache %s is not a mapping of measurements: every image is "
                    "measured again", path)
        return {}
    return loaded


def _write_cache(cache: Path, measures: dict[str, dict[str, Any]]) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    # Python's own floats, bools, ints, strings, None and the face box: JSON keeps each exactly.
    atomic_write_text(_cache_file(cache), json.dumps(dict(sorted(measures.items())), indent=0)
                      + "\n")


def _pairwise_hamming(hashes: list[str]) -> np.ndarray:
    values = np.array([int(h, 16) for h in hashes], dtype=np.uint64)
    return np.bitwise_count(values[:, None] ^ values[None, :]).astype(np.int64)


def write_prescreen(path: Path, frame: pd.DataFrame,
                    thresholds: PrescreenThresholds | None = None) -> int:
    """Write a :func:`prescreen_all` result as a ``prescreen`` Parquet table (atomically),
    recording the thresholds it was flagged with (``thresholds``, else those it carries)."""
    used = thresholds.model_dump() if thresholds else frame.attrs.get("thresholds")
    limits = canonical_json(used or PrescreenThresholds().model_dump())
    fields = PrescreenRecord.model_fields
    rows = []
    for measures in frame.to_dict(orient="records"):
        box = measures.get("face_box")
        row = {name: plain_value(measures.get(name)) for name in fields}
        row["face_box"] = ",".join(str(v) for v in box) if box else ""
        row["thresholds"] = limits
        rows.append(row)
    return write_table(path, rows, PrescreenRecord)
