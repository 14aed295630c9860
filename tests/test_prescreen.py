"""The candidate pre-screen: known answers on synthetic images, then all 588 real FairFace
candidates of the curation study (when the shared sample is present)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image, ImageFilter
from pydantic import ValidationError

from acrb.records import read_table
from acrb.sources.fairface import load_study_candidates
from acrb.sources.prescreen import (
    FLAGS,
    PrescreenRecord,
    PrescreenThresholds,
    hamming,
    phash,
    prescreen,
    prescreen_all,
    write_prescreen,
)
from tests.conftest import FAIRFACE_SAMPLE


def smooth_field(seed: int, size: int = 256) -> Image.Image:
    """A random image with structure at all scales (like a photo, unlike white noise): coarse
    noise upscaled, plus fine texture so that it is also sharp."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    base = np.asarray(coarse.resize((size, size), Image.Resampling.BICUBIC), dtype=np.float64)
    texture = rng.normal(0, 18, (size, size, 1))
    return Image.fromarray(np.clip(base + texture, 0, 255).astype(np.uint8))


def encode(image: Image.Image, fmt: str = "PNG", **options: int) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def flags(result: dict) -> set[str]:
    return set(filter(None, result["flags"].split(";")))


# --------------------------------------------------------------------- known answers


def test_blur_lowers_laplacian_variance_and_is_flagged() -> None:
    sharp = smooth_field(1)
    blurred = sharp.filter(ImageFilter.GaussianBlur(radius=4))
    sharp_result, blurred_result = prescreen(sharp), prescreen(blurred)
    assert blurred_result["sharpness"] < sharp_result["sharpness"] / 10
    assert "blurry" in flags(blurred_result) and "blurry" not in flags(sharp_result)


def test_dark_bright_and_low_contrast_are_flagged() -> None:
    field = np.asarray(smooth_field(2), dtype=np.float64)
    dark = Image.fromarray((field * 0.15).astype(np.uint8))
    bright = Image.fromarray((235 + field * 0.08).astype(np.uint8))
    flat = Image.fromarray((110 + (field - field.mean()) * 0.1).astype(np.uint8))
    dark_result = prescreen(dark)
    assert dark_result["brightness"] < 40 and "dark" in flags(dark_result)
    assert "clipped_dark" not in flags(dark_result)
    assert "bright" in flags(prescreen(bright))
    flat_result = prescreen(flat)
    assert flat_result["contrast"] < 0.12 and "low_contrast" in flags(flat_result)
    assert {"dark", "bright"}.isdisjoint(flags(flat_result))


def test_black_corners_are_clipped_dark_but_not_dark() -> None:
    """FairFace's alignment rotates tilted faces and fills the corners with black."""
    pixels = np.array(smooth_field(8))
    rows, cols = np.indices(pixels.shape[:2])
    pixels[rows + cols < 150] = 0
    pixels[rows + (255 - cols) < 150] = 0
    result = prescreen(Image.fromarray(pixels))
    assert result["clipped_dark"] > 0.25 and result["brightness"] > 40
    assert "clipped_dark" in flags(result) and "dark" not in flags(result)


def test_luma_statistics_are_exact_on_a_two_level_image() -> None:
    pixels = np.zeros((100, 100, 3), dtype=np.uint8)
    pixels[:, 50:] = 255
    result = prescreen(Image.fromarray(pixels))
    assert result["brightness"] == pytest.approx(127.5)
    assert result["contrast"] == pytest.approx(0.5)
    assert result["clipped_dark"] == pytest.approx(0.5)
    assert result["clipped_bright"] == pytest.approx(0.5)


def test_blank_image_has_no_face() -> None:
    result = prescreen(Image.new("RGB", (300, 300), (128, 128, 128)))
    assert result["face_found"] is False and result["face_count"] == 0
    assert result["face_box"] is None and result["face_fraction"] is None
    assert "no_face" in flags(result)
    assert {"small_face", "off_centre"}.isdisjoint(flags(result))


def test_images_are_read_from_paths_and_bytes(tmp_path: Path) -> None:
    image = smooth_field(3)
    path = tmp_path / "a.png"
    path.write_bytes(encode(image))
    by_path, by_bytes, by_image = prescreen(path), prescreen(encode(image)), prescreen(image)
    assert by_path == by_bytes == by_image


def test_near_duplicates_survive_resizing_and_recompression() -> None:
    original = smooth_field(4)
    copy = Image.open(io.BytesIO(encode(original.resize((230, 230), Image.Resampling.LANCZOS),
                                        "JPEG", quality=70)))
    other = smooth_field(5)
    assert hamming(phash(original), phash(copy)) <= 6
    assert hamming(phash(original), phash(other)) > 6
    store = {"a": encode(original), "b": encode(copy, "JPEG", quality=90), "c": encode(other)}
    candidates = pd.DataFrame({"candidate_id": ["X_c1", "Y_c1", "X_c2"],
                               "image_ref": ["a", "b", "c"]})
    frame = prescreen_all(candidates, loader=store.__getitem__)
    assert list(frame["near_duplicate_of"]) == ["Y_c1", "X_c1", ""]
    assert ["near_duplicate" in f.split(";") for f in frame["flags"]] == [True, True, False]
    assert frame["nearest_bits"].iloc[2] > 6


def test_phash_is_64_bits_and_ignores_brightness_shift() -> None:
    image = smooth_field(6)
    brighter = Image.fromarray(np.clip(np.asarray(image, dtype=np.int16) + 30, 0, 255)
                               .astype(np.uint8))
    assert len(phash(image)) == 16
    assert hamming(phash(image), phash(brighter)) <= 4


def test_thresholds_are_strict_and_change_the_flags() -> None:
    with pytest.raises(ValidationError):
        PrescreenThresholds(min_sharpnes=10)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        PrescreenThresholds(min_brightness=200, max_brightness=100)
    image = smooth_field(7)
    assert "blurry" in flags(prescreen(image, PrescreenThresholds(min_sharpness=1e9)))


def test_nothing_is_dropped_and_the_table_round_trips(tmp_path: Path) -> None:
    store = {str(i): encode(smooth_field(10 + i)) for i in range(3)}
    store["blank"] = encode(Image.new("RGB", (64, 64)))
    candidates = pd.DataFrame({"candidate_id": [f"c{k}" for k in store], "image_ref": list(store),
                               "cell": "Black_Female_20s"})
    frame = prescreen_all(candidates, loader=store.__getitem__, workers=2)
    assert list(frame["candidate_id"]) == list(candidates["candidate_id"])
    assert all(set(filter(None, f.split(";"))) <= set(FLAGS) for f in frame["flags"])
    path = tmp_path / "prescreen.parquet"
    assert write_prescreen(path, frame) == 4
    table = read_table(path, PrescreenRecord)
    blank = table.set_index("candidate_id").loc["cblank"]
    assert blank["face_box"] == "" and pd.isna(blank["face_fraction"])
    assert blank["flags"].startswith("no_face")


# ---------------------------------------------------------------------- real FairFace


@pytest.mark.real_faces
def test_real_fairface_candidates() -> None:
    candidates = load_study_candidates(FAIRFACE_SAMPLE / "candidates")
    # The sampler side: the study's 84 cells x 7 versions, each cell once per version.
    assert len(candidates) == 588 and candidates["candidate_id"].is_unique
    assert candidates["cell"].nunique() == 84
    assert set(candidates.groupby("cell").size()) == {7}
    assert set(candidates.groupby("cell")["rank"].apply(frozenset)) == {frozenset(range(1, 8))}
    assert set(zip(candidates["width"], candidates["height"], strict=True)) == {(448, 448)}
    # Their pre-screen (about 45 s) is checked by check_real_prescreen below, on the table the
    # sources stage writes in tests/test_curation.py, so that it runs once in the suite.


def check_real_prescreen(table: pd.DataFrame) -> None:
    """What the pre-screen of the study's 588 real candidates (``prescreen.parquet``, as the
    sources stage writes it with the default thresholds) must show. Called by
    tests/test_curation.py::test_study_candidates_prescreen_import_and_finalize, which runs
    the stage on them."""
    candidates = load_study_candidates(FAIRFACE_SAMPLE / "candidates")
    assert list(table["candidate_id"]) == list(candidates["candidate_id"])
    found = table["face_found"].mean()
    centred = (table["face_offset"] <= 0.2).mean()
    counts = table["flags"].str.split(";").explode().value_counts().drop("", errors="ignore")
    print(f"\nfaces found on {found:.1%} of {len(table)} FairFace candidates "
          f"({centred:.1%} over the image centre); no flag on "
          f"{(table['flags'] == '').mean():.1%}; flags: {counts.to_dict()}")
    print(table[["face_fraction", "face_offset", "sharpness", "brightness", "contrast"]]
          .describe(percentiles=[0.05, 0.5, 0.95]).round(3).to_string())
    assert found >= 0.95
    assert len(table) == 588
    for column in ("sharpness", "brightness", "contrast", "clipped_dark", "clipped_bright"):
        assert table[column].map(math.isfinite).all(), column
    assert table["phash"].str.fullmatch(r"[0-9a-f]{16}").all()
    # Face geometry is in the original 448 px frame, not the 256 px detection copy.
    boxes = [tuple(int(v) for v in box.split(",")) for box in table["face_box"] if box]
    assert len(boxes) == table["face_found"].sum()
    assert max(x + w for x, _, w, _ in boxes) > 256
    assert all(x >= 0 and x + w <= 448 + 2 and y >= 0 and y + h <= 448 + 2
               for x, y, w, h in boxes)
    # Most of these good face-centred photos pass (the defaults are calibrated on them).
    assert (table["flags"] == "").mean() > 0.6
    # The study drew some photos into two versions of a cell: every byte-identical pair must
    # be flagged as near-duplicates, and nothing else in this set is that close.
    same = candidates.groupby("sha256")["candidate_id"].apply(sorted)
    pairs = {tuple(ids) for ids in same if len(ids) > 1}
    flagged = {tuple(sorted([row.candidate_id, *row.near_duplicate_of.split(";")]))
               for row in table.itertuples() if row.near_duplicate_of}
    print(f"near-duplicate pairs: {len(flagged)} (byte-identical: {len(pairs)})")
    assert pairs and flagged == pairs


def test_a_rerun_measures_only_the_images_it_has_not_seen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from pandas.testing import assert_frame_equal

    from acrb.sources import prescreen as module

    store = {str(i): encode(smooth_field(20 + i)) for i in range(3)}
    store["blank"] = encode(Image.new("RGB", (64, 64)))
    faces = sorted((FAIRFACE_SAMPLE / "candidates").rglob("*.jpg"))[:2]
    for i, face in enumerate(faces):  # a found face's box goes through the cache too
        store[f"face{i}"] = face.read_bytes()
    candidates = pd.DataFrame({"candidate_id": [f"c{k}" for k in store],
                               "image_ref": list(store)})
    cache = tmp_path / "cache"
    assert_frame_equal(prescreen_all(candidates, loader=store.__getitem__, cache=cache),
                       prescreen_all(candidates, loader=store.__getitem__))
    if faces:
        assert prescreen_all(candidates, loader=store.__getitem__, cache=cache)[
            "face_found"].iloc[-1]

    measured: list[object] = []
    real = module.prescreen

    def counted(image: object, thresholds: object = None) -> dict[str, object]:
        measured.append(image)
        return real(image, thresholds)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "prescreen", counted)
    store["1"] = encode(smooth_field(99))  # one image changed since
    again = prescreen_all(candidates, loader=store.__getitem__, cache=cache)
    assert measured == [store["1"]]
    assert_frame_equal(again, prescreen_all(candidates, loader=store.__getitem__))
    # Other thresholds flag the cached measurements anew, without measuring.
    measured.clear()
    strict = prescreen_all(candidates, loader=store.__getitem__, cache=cache,
                           thresholds=PrescreenThresholds(min_sharpness=1e9))
    assert measured == [] and all("blurry" in f.split(";") for f in strict["flags"])
    # A cache that cannot be read is measured again, and says so.
    module._cache_file(cache).write_text("{not json")
    with caplog.at_level("WARNING"):
        rebuilt = prescreen_all(candidates, loader=store.__getitem__, cache=cache)
    assert len(measured) == len(store) and "cannot be read" in caplog.text
    assert_frame_equal(rebuilt, again)
