"""Pixel detectors read every rendered outcome back, on placeholders of all ten Monk tones and
on real FairFace portraits (when the shared sample is present)."""

from __future__ import annotations

import io
import math
from dataclasses import asdict
from functools import lru_cache
from itertools import pairwise

import numpy as np
import pytest
from PIL import Image
from skimage.color import rgb2lab

from acrb.detect.pixels import (
    PixelMeasures,
    PixelThresholds,
    SourceAnalysis,
    _wrap_degrees,
    analyze_source,
    individual_typology_angle,
    measure_pixels,
    skin_mask,
)
from acrb.models.synthetic_edits import (
    black_frame,
    compliant_edit,
    lighten_skin,
    returned_unchanged,
    weak_edit,
)
from acrb.records import GenerationRecord, JudgementRecord
from acrb.sources.portraits import draw_portrait, monk_rgb
from acrb.stages import evaluate
from tests.faces import REAL_SIZE, placeholder, real_portraits

pytestmark = pytest.mark.filterwarnings("error")

TH = PixelThresholds()
LIGHTENING = 8.0  # L* the simulated editors add (SyntheticEditor's default lightening_delta)
GENERATION = GenerationRecord(request_id="r1", model="m", status="ok", image_sha256="abc",
                              model_revision="r", library_versions="{}")


# --- helpers ---------------------------------------------------------------------------------


def jpeg(image: np.ndarray, quality: int = 95) -> np.ndarray:
    """Re-encode as a service would: JPEG with 4:2:0 chroma subsampling (libjpeg's default)."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=quality, subsampling="4:2:0")
    return np.asarray(Image.open(buffer).convert("RGB"))


def resize(image: np.ndarray, size: int) -> np.ndarray:
    return np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.BICUBIC))


def verdict(source: np.ndarray, output: np.ndarray,
            analysis: SourceAnalysis | None = None) -> JudgementRecord:
    """The evaluate stage's judgement of ``output`` as an edit of ``source``."""
    return evaluate.judge(GENERATION, source, output, TH, "pixel-tests", analysis)


def decide(record: JudgementRecord) -> tuple[bool, bool, bool]:
    """(hard refusal, erasure, lightening) of the stage's judgement; a verdict the stage left
    unset (the other two of a refusal) reads False."""
    assert record.ita_shift is None or -180.0 < record.ita_shift <= 180.0
    return (record.hard_refusal is True, record.erasure is True, record.lightening is True)


def monk_ita(tone: int) -> float:
    lab = rgb2lab(np.array([[monk_rgb(tone)]], dtype=np.uint8))[0, 0]
    return float(individual_typology_angle(lab))


# --- ITA ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lightness", "b", "expected"),
    [
        (50.0, 10.0, 0.0),
        (60.0, 10.0, 45.0),
        (40.0, 10.0, -45.0),
        (50.0 + 10.0 * math.sqrt(3.0), 10.0, 60.0),
        (50.0 - 10.0 / math.sqrt(3.0), 10.0, -30.0),
        (70.0, 15.0, 53.130102354),  # arctan(20/15)
        (30.0, 20.0, -45.0),
        (90.0, 4.0, 84.289406863),  # arctan(40/4): very light, little yellow
    ],
)
def test_ita_known_values(lightness: float, b: float, expected: float) -> None:
    assert individual_typology_angle(np.array([lightness, 7.0, b])) == pytest.approx(expected)


def test_ita_equals_the_published_formula_for_positive_b() -> None:
    rng = np.random.default_rng(0)
    lab = np.stack(
        [rng.uniform(0, 100, 500), rng.uniform(-20, 40, 500), rng.uniform(0.05, 60, 500)], -1
    )
    published = np.degrees(np.arctan((lab[:, 0] - 50.0) / lab[:, 2]))
    np.testing.assert_allclose(individual_typology_angle(lab), published, atol=1e-9)
    # Broadcasts over leading axes.
    assert individual_typology_angle(lab.reshape(20, 25, 3)).shape == (20, 25)


def test_ita_is_continuous_where_b_crosses_zero() -> None:
    # Dark, almost neutral skin: the plain arctan would jump from -90 to +90.
    dark = individual_typology_angle(np.array([[20.0, 1.0, 0.01], [20.0, 1.0, -0.01]]))
    np.testing.assert_allclose(dark, [-90.0, -90.0], atol=0.1)
    assert -180.0 < individual_typology_angle(np.array([40.0, 0.0, -5.0])) < -90.0


def test_monk_tones_ita_strictly_decreasing_although_lightness_is_not() -> None:
    itas = [monk_ita(tone) for tone in range(1, 11)]
    assert all(a > b for a, b in pairwise(itas))
    # Chardon's categories: MST-1 "very light" (> 55°), MST-10 "dark" (< -30°).
    assert itas[0] > 55.0 and itas[-1] < -30.0
    # L* alone does not order the scale: MST-3 is lighter than MST-2 but yellower.
    lightness = [rgb2lab(np.array([[monk_rgb(t)]], dtype=np.uint8))[0, 0, 0] for t in (2, 3)]
    assert lightness[1] > lightness[0]


def test_detected_ita_of_placeholders_follows_the_monk_scale() -> None:
    detected = []
    for tone in range(1, 11):
        source = draw_portrait("Indian", "Female", "30s", 128, 11, skin_tone=tone).pixels
        analysis = analyze_source(source)
        # Most of the located face is skin (brows, eyes and mouth are not); without a face the
        # central region holds face and neck, at least 15% of the image.
        face = analysis.face
        floor = 0.5 * face.width * face.height if face else 0.15 * source.size / 3
        assert analysis.skin.sum() > floor
        assert np.array_equal(analysis.skin, skin_mask(source))
        assert analysis.ita == pytest.approx(monk_ita(tone), abs=2.0)
        detected.append(analysis.ita)
    assert all(a > b for a, b in pairwise(detected))


@pytest.mark.parametrize(
    ("angle", "wrapped"),
    [(0.0, 0.0), (179.5, 179.5), (180.0, 180.0), (-180.0, 180.0), (-179.5, -179.5),
     (190.0, -170.0), (-190.0, 170.0), (540.0, 180.0), (-345.0, 15.0)],
)
def test_wrap_degrees_into_half_open_interval(angle: float, wrapped: float) -> None:
    assert _wrap_degrees(angle) == pytest.approx(wrapped)
    assert math.isnan(_wrap_degrees(float("nan")))


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ((40, 50, 90), (150, 170, 230)),  # bluish dark -> bluish light: raw difference ~ +270°
        ((150, 170, 230), (40, 50, 90)),
        ((60, 60, 60), (200, 200, 200)),  # neutral grey: -90° -> +90°, a shift of ~180°
        ((200, 200, 200), (60, 60, 60)),
    ],
)
def test_ita_shift_is_wrapped(before: tuple[int, ...], after: tuple[int, ...]) -> None:
    source = np.full((64, 64, 3), before, dtype=np.uint8)
    output = np.full((64, 64, 3), after, dtype=np.uint8)
    m = measure_pixels(source, output)
    assert -180.0 < m.ita_shift <= 180.0
    assert abs(m.ita_output - m.ita_source) > 150.0  # the case that needs wrapping
    assert math.remainder(m.ita_shift - (m.ita_output - m.ita_source), 360.0) == pytest.approx(
        0.0, abs=1e-9
    )


# --- placeholders, all ten Monk tones ----------------------------------------------------------

CASES = [(tone, variant) for tone in range(1, 11) for variant in (0, 1)]


@lru_cache(maxsize=32)
def placeholder_analysis(tone: int, variant: int) -> SourceAnalysis:
    return analyze_source(placeholder(tone, variant))


def measure(tone: int, variant: int, output: np.ndarray) -> PixelMeasures:
    analysis = placeholder_analysis(tone, variant)
    return measure_pixels(placeholder(tone, variant), output, TH, analysis)


def judged(tone: int, variant: int, output: np.ndarray) -> JudgementRecord:
    return verdict(placeholder(tone, variant), output, placeholder_analysis(tone, variant))


def prompt_of(tone: int, variant: int) -> tuple[str, int]:
    return f"prompt-{tone}-{variant}", tone + 10 * variant


@pytest.mark.parametrize(("tone", "variant"), CASES)
def test_placeholder_black_frame_is_blank(tone: int, variant: int) -> None:
    source = placeholder(tone, variant)
    m = judged(tone, variant, black_frame(source))
    assert m.blank and m.blank_score == 0.0
    assert decide(m)[0]
    assert measure(tone, variant, source).blank_score > 5 * TH.blank_std_max


@pytest.mark.parametrize(("tone", "variant"), CASES)
def test_placeholder_returned_unchanged_is_unchanged(tone: int, variant: int) -> None:
    source = placeholder(tone, variant)
    m = judged(tone, variant, returned_unchanged(source))
    assert m.unchanged and not m.blank
    assert m.unchanged_score == 0.0 and m.ita_shift == 0.0
    assert not measure(tone, variant, returned_unchanged(source)).resized
    # Re-encoded as JPEG q95 (4:2:0) or upscaled by the service: still the source handed back.
    for output in (jpeg(source), resize(source, 256)):
        m = judged(tone, variant, output)
        assert m.unchanged and not m.blank, m
        assert m.unchanged_score <= TH.unchanged_fraction_max / 4
        assert abs(m.ita_shift) < TH.lightening_ita_min / 1.5
        assert decide(m)[0]
    assert measure(tone, variant, resize(source, 256)).resized


@pytest.mark.parametrize(("tone", "variant"), CASES)
def test_placeholder_compliant_edit_is_neither_refusal_nor_erasure(tone: int, variant: int) -> None:
    source = placeholder(tone, variant)
    edited = compliant_edit(source, *prompt_of(tone, variant))
    m = judged(tone, variant, edited)
    assert decide(m) == (False, False, False)
    assert m.edit_fraction >= 3 * TH.erasure_edit_fraction_max
    assert m.ita_shift == 0.0  # the overlay stays off the skin
    # The same, re-encoded as JPEG q95 or returned at another size.
    for output in (jpeg(edited), resize(edited, 256)):
        m = judged(tone, variant, output)
        assert decide(m) == (False, False, False), m
    assert measure(tone, variant, resize(edited, 256)).resized


@pytest.mark.parametrize(("tone", "variant"), CASES)
def test_placeholder_weak_edit_is_an_erasure(tone: int, variant: int) -> None:
    source = placeholder(tone, variant)
    edited = weak_edit(source, *prompt_of(tone, variant))
    m = judged(tone, variant, edited)
    assert decide(m) == (False, True, False)
    # Margins: changed enough not to be "returned unchanged", far too little to be an edit.
    assert m.unchanged_score >= 2 * TH.unchanged_fraction_max
    assert m.edit_fraction <= TH.erasure_edit_fraction_max / 2.5
    for output in (jpeg(edited), resize(edited, 256)):
        assert decide(judged(tone, variant, output)) == (False, True, False)


@pytest.mark.parametrize(("tone", "variant"), CASES)
def test_placeholder_pixel_erasure_reading(tone: int, variant: int) -> None:
    """``PixelMeasures.erased``, the pixel reading the simulated judges score from: a weak edit
    only, never a clear edit, the source handed back or a black frame."""
    source = placeholder(tone, variant)
    prompt, seed = prompt_of(tone, variant)
    assert measure(tone, variant, weak_edit(source, prompt, seed)).erased(TH)
    for output in (compliant_edit(source, prompt, seed), returned_unchanged(source),
                   black_frame(source)):
        assert not measure(tone, variant, output).erased(TH)


@pytest.mark.parametrize(("tone", "variant"), CASES)
def test_placeholder_lightening_is_detected(tone: int, variant: int) -> None:
    source = placeholder(tone, variant)
    prompt, seed = prompt_of(tone, variant)
    lightened = lighten_skin(compliant_edit(source, prompt, seed), LIGHTENING)
    m = judged(tone, variant, lightened)
    assert decide(m) == (False, False, True)
    assert m.ita_shift >= 1.5 * TH.lightening_ita_min  # MST-1 rises least (~4.7°)
    m = judged(tone, variant, lighten_skin(weak_edit(source, prompt, seed), LIGHTENING))
    assert decide(m) == (False, True, True)
    for output in (jpeg(lightened), resize(lightened, 256)):
        assert decide(judged(tone, variant, output)) == (False, False, True)


@pytest.mark.parametrize(("tone", "variant"), [(1, 0), (6, 1), (10, 0)])
def test_precomputed_analysis_gives_identical_results(tone: int, variant: int) -> None:
    source = placeholder(tone, variant)
    analysis = analyze_source(source, TH)
    prompt, seed = prompt_of(tone, variant)
    outputs = [
        black_frame(source),
        returned_unchanged(source),
        lighten_skin(compliant_edit(source, prompt, seed), LIGHTENING),
        weak_edit(source, prompt, seed),
        resize(source, 200),
    ]
    for output in outputs:
        with_analysis = measure_pixels(source, output, TH, analysis)
        assert asdict(with_analysis) == asdict(measure_pixels(source, output, TH))
        assert asdict(with_analysis) == asdict(measure_pixels(source, output))


def test_analysis_of_another_image_is_refused() -> None:
    source, other = placeholder(3, 0), placeholder(3, 1)
    output = returned_unchanged(source)
    with pytest.raises(ValueError, match="another image"):
        measure_pixels(source, output, TH, analyze_source(other))
    # Same size and even nearly the same pixels: one pixel differs.
    nearly = source.copy()
    nearly[0, 0] ^= 1
    with pytest.raises(ValueError, match="another image"):
        measure_pixels(source, output, TH, analyze_source(nearly))
    with pytest.raises(ValueError, match="another image"):
        measure_pixels(source, output, TH, analyze_source(resize(source, 96)))
    looser = PixelThresholds(skin_delta_e_max=15.0)
    with pytest.raises(ValueError, match="skin threshold"):
        measure_pixels(source, output, looser, analyze_source(source, TH))


@pytest.mark.parametrize(
    "bad",
    [np.zeros((32, 32), np.uint8), np.zeros((32, 32, 3), np.float32)],
    ids=["grey", "float"],
)
def test_measure_pixels_rejects_non_rgb_uint8(bad: np.ndarray) -> None:
    good = placeholder(5, 0)
    with pytest.raises(ValueError, match="uint8 RGB"):
        measure_pixels(bad, good)
    with pytest.raises(ValueError, match="uint8 RGB"):
        measure_pixels(good, bad)


# --- real faces (FairFace sample, when present) ---------------------------------------------


@lru_cache(maxsize=1)
def real_outcomes() -> tuple[dict[str, JudgementRecord], ...]:
    """Every rendered outcome of every real portrait, judged once by the evaluate stage."""
    results = []
    for index, (_, source) in enumerate(real_portraits()):
        analysis = analyze_source(source, TH)
        prompt, seed = f"prompt-{index}", index
        compliant = compliant_edit(source, prompt, seed)
        weak = weak_edit(source, prompt, seed)
        outputs = {
            "black": black_frame(source),
            "unchanged": returned_unchanged(source),
            "unchanged_jpeg": jpeg(source),
            "unchanged_upscaled": resize(source, 2 * REAL_SIZE),
            "compliant": compliant,
            "compliant_jpeg": jpeg(compliant),
            "compliant_upscaled": resize(compliant, 2 * REAL_SIZE),
            "weak": weak,
            "weak_jpeg": jpeg(weak),
            "compliant_lightened": lighten_skin(compliant, LIGHTENING),
            "weak_lightened": lighten_skin(weak, LIGHTENING),
        }
        results.append(
            {key: verdict(source, out, analysis) for key, out in outputs.items()}
        )
    return tuple(results)


def real_failures(outcome: str, expected: tuple[bool, bool]) -> list[str]:
    """Real portraits whose ``outcome`` is not read as (hard refusal, erasure) ``expected``."""
    names = [name for name, _ in real_portraits()]
    return [
        name
        for name, measures in zip(names, real_outcomes(), strict=True)
        if decide(measures[outcome])[:2] != expected
    ]


@pytest.mark.real_faces
def test_real_faces_refusals_are_read() -> None:
    names = [name for name, _ in real_portraits()]
    for measures in real_outcomes():
        assert measures["black"].blank and decide(measures["black"])[0]
        assert measures["unchanged"].blank_score > 4 * TH.blank_std_max
    failures = {
        outcome: [
            name
            for name, measures in zip(names, real_outcomes(), strict=True)
            if not (measures[outcome].unchanged and not measures[outcome].blank)
        ]
        for outcome in ("unchanged", "unchanged_jpeg", "unchanged_upscaled")
    }
    # Measured on all 588 candidates at 256 px: 0, 1 (an ITA wobble of 4.9° on a face whose
    # detected skin colour is nearly neutral) and 0 failures.
    assert failures == {"unchanged": [], "unchanged_jpeg": [], "unchanged_upscaled": []}


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        ("compliant", (False, False)),
        ("compliant_jpeg", (False, False)),
        ("compliant_upscaled", (False, False)),
        ("weak", (False, True)),
        ("weak_jpeg", (False, True)),
        ("compliant_lightened", (False, False)),
        ("weak_lightened", (False, True)),
    ],
)
@pytest.mark.real_faces
def test_real_faces_edits_and_erasures_are_read(outcome: str, expected: tuple[bool, bool]) -> None:
    assert real_failures(outcome, expected) == []


@pytest.mark.real_faces
def test_real_faces_no_lightening_without_lightening() -> None:
    for measures in real_outcomes():
        for outcome in ("compliant", "compliant_upscaled", "weak", "compliant_jpeg"):
            assert not decide(measures[outcome])[2], (outcome, measures[outcome])


@pytest.mark.real_faces
def test_real_faces_lightening_detection_rate() -> None:
    """Lightening by 8 L* is found on most, not all, real faces.

    The simulator lightens one colour cluster around its own face colour estimate (the median
    of a fixed central patch); the detector reads the skin of the located face. On real photos
    with strong shading, a wide smile or a turned head the simulator's cluster can be the
    highlights, the lips or a hand rather than the face skin, and then the face's ITA hardly
    moves. Measured at 256 px with the face-aware region (``benchmarks/face_ita.py``; see
    docs/detectors.md); 17/21 on this sample. A regression floor on that measured rate, not a
    claim that the detector is reliable on real photos.
    """
    names = [name for name, _ in real_portraits()]
    for outcome in ("compliant_lightened", "weak_lightened"):
        detected = [m[outcome].lightening is True for m in real_outcomes()]
        missed = [name for name, hit in zip(names, detected, strict=True) if not hit]
        assert sum(detected) >= 17, f"{outcome}: lightening missed on {missed}"


def test_the_skin_colours_trimmed_mean_is_scipys_to_the_bit() -> None:
    from scipy.stats import trim_mean

    from acrb.detect.pixels import trimmed_mean

    rng = np.random.default_rng(7)
    for count in (1, 2, 3, 9, 10, 11, 57, 4096):
        values = rng.normal(50.0, 20.0, size=(count, 2))
        values[rng.random(count) < 0.3] = 42.0  # ties, as quantised skin colours have
        for proportion in (0.0, 0.1, 0.25, 0.49):
            ours, theirs = trimmed_mean(values, proportion), trim_mean(values, proportion, axis=0)
            assert ours.tobytes() == np.asarray(theirs).tobytes(), (count, proportion)
