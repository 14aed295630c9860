"""The simulated editors convert each source portrait to CIELAB once, not once per edit, and
their edits stay the bytes that converting the portrait anew for every edit made.

:func:`reference_visible_colours` is :func:`acrb.models.synthetic_edits._visible_colours` as
it was before the per-source cache, kept here verbatim as the known answer.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from skimage.color import deltaE_cie76, rgb2lab

from acrb.models import synthetic_edits as se
from acrb.sources.portraits import draw_portrait

# Cells of the embedded default at its resolution (128 px), plus an odd size, so that rows and
# the pixel count are not multiples of any SIMD width.
PORTRAITS = [("Black", "Female", "20s", 128), ("White", "Male", "70plus", 128),
             ("EastAsian", "Female", "40s", 128), ("Indian", "Male", "30s", 128),
             ("Latino", "Female", "60s", 97), ("MiddleEastern", "Male", "50s", 64)]
PROMPTS = [f"{letter}{n:02d}" for letter in "ABCDE" for n in range(1, 9)]
SEEDS = (0, 7)


def portraits() -> Iterator[np.ndarray]:
    for index, (race, gender, age, size) in enumerate(PORTRAITS):
        yield draw_portrait(race, gender, age, size, 11 + index).pixels


def reference_visible_colours(
    source: np.ndarray, region: np.ndarray, start: int, rng: np.random.Generator
) -> tuple[se.RGB, se.RGB]:
    """``_visible_colours`` before the cache: the source converted to CIELAB for each edit."""
    palette = se._OVERLAY_PALETTE
    order = [(start + k) % len(palette) for k in range(len(palette))]
    jitter = rng.integers(-12, 13, size=(len(order), 3))
    candidates = np.clip(np.array([palette[i] for i in order]) + jitter, 0, 255)
    candidate_lab = se._lab_of(candidates)
    covered_lab = se._lab_of(source[region])
    face_lab = se._face_lab(rgb2lab(source))
    close = deltaE_cie76(candidate_lab[:, None, :], covered_lab[None, :, :]) \
        < se._OVERLAY_MIN_DELTA_E
    close_fraction = close.mean(axis=1)
    far_from_face = deltaE_cie76(candidate_lab, face_lab) >= se._OVERLAY_MIN_DELTA_E
    badness = close_fraction + np.where(far_from_face, 0.0, 1.0)

    def pick(extra_badness: np.ndarray) -> int:
        total = badness + extra_badness
        good = np.flatnonzero(total <= se._COVERED_CLOSE_MAX)
        return int(good[0]) if good.size else int(np.argmin(total))

    main = pick(np.zeros(len(order)))
    accent_close = deltaE_cie76(candidate_lab, candidate_lab[main]) < se._OVERLAY_MIN_DELTA_E
    accent = pick(np.where(accent_close, 1.0, 0.0))
    as_rgb = [tuple(int(c) for c in candidates[i]) for i in (main, accent)]
    return as_rgb[0], as_rgb[1]  # type: ignore[return-value]


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    se._SOURCE_LABS.clear()
    yield
    se._SOURCE_LABS.clear()


def all_edits() -> list[bytes]:
    return [edit(source, prompt, seed).tobytes() for source in portraits()
            for prompt in PROMPTS for seed in SEEDS for edit in (se.compliant_edit, se.weak_edit)]


def test_edits_are_the_bytes_of_converting_the_source_for_every_edit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cached = all_edits()
    monkeypatch.setattr(se, "_visible_colours", reference_visible_colours)
    assert all_edits() == cached


def test_the_cached_pixels_are_those_converted_alone_or_in_any_region() -> None:
    rng = np.random.default_rng(5)
    for source in portraits():
        height, width = source.shape[:2]
        known = se._source_lab(source)
        assert np.array_equal(known.face, se._face_lab(rgb2lab(source)))
        lab = known.pixels.reshape(height, width, 3)
        # Single pixels, short runs (SIMD tails) and the overlays' own regions.
        for y, x in rng.integers(0, min(height, width), size=(20, 2)):
            assert np.array_equal(lab[y, x], se._lab_of(source[y:y + 1, x])[0])
        for length in range(1, 40):
            start = int(rng.integers(0, height * width - length))
            flat = source.reshape(-1, 3)[start:start + length]
            assert np.array_equal(known.pixels[start:start + length], se._lab_of(flat))
        for kind in se.OVERLAY_KINDS:
            region = se._overlay_mask(kind, height, width, np.random.default_rng(3))
            assert np.array_equal(lab[region], se._lab_of(source[region]))


def test_a_portrait_is_converted_once_however_often_it_is_edited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = next(portraits())
    converted: list[int] = []
    real = se.rgb2lab

    def counted(rgb: np.ndarray) -> np.ndarray:
        if np.asarray(rgb).size >= source.size:  # the whole portrait, not the few candidates
            converted.append(np.asarray(rgb).size)
        return real(rgb)

    monkeypatch.setattr(se, "rgb2lab", counted)
    for prompt in PROMPTS[:20]:
        se.compliant_edit(source, prompt, 0)
        se.weak_edit(source, prompt, 1)
    # Once as a column of pixels (the covered pixels), once whole (the face colour).
    assert len(converted) == 2


def test_the_cache_is_bounded_and_keyed_by_the_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    sources = list(portraits())[:4]
    monkeypatch.setattr(se, "_SOURCE_LABS_KEPT", 2)
    for source in sources:
        se.compliant_edit(source, "A01", 0)
    assert len(se._SOURCE_LABS) == 2
    assert next(reversed(se._SOURCE_LABS.values())) is se._source_lab(sources[-1])
    # Less room than one portrait takes: the newest is still kept, alone.
    monkeypatch.setattr(se, "_SOURCE_LABS_BYTES", 1)
    se.compliant_edit(sources[0], "A01", 0)
    assert len(se._SOURCE_LABS) == 1
    # Pixels changed in place are another portrait, not the one cached under the array.
    source = sources[0].copy()
    before = se.compliant_edit(source, "B02", 3)
    source[40:90, 40:90] = (250, 250, 250)
    after = se.compliant_edit(source, "B02", 3)
    monkeypatch.setattr(se, "_visible_colours", reference_visible_colours)
    assert after.tobytes() == se.compliant_edit(source, "B02", 3).tobytes()
    assert before.tobytes() != after.tobytes()
