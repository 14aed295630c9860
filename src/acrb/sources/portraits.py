"""Procedural placeholder portraits: cartoon faces that stand in for real source photos.

The default, model-free pipeline needs source images for every race x gender x age cell
without downloading a dataset. :func:`draw_portrait` draws a face-centred, head-and-shoulders
cartoon laid out like a FairFace crop (Kärkkäinen & Joo, WACV 2021): the face is an ellipse
in the middle ~43% of the width, with hair, ears, neck, clothing and a muted background around
it. The skin is one of the ten Monk Skin Tone reference colours, so the pixel detectors of
:mod:`acrb.detect.pixels` can be checked across the full range of skin tones.

These images are test fixtures for a simulation. They are not, and must not be read as,
depictions of what people of any group look like.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw
from skimage.color import deltaE_cie76, rgb2lab

from acrb.demographics import AGES, GENDERS, RACES

RGB = tuple[int, int, int]

#: The Monk Skin Tone (MST) scale: ten reference skin colours, MST-1 (lightest) to MST-10
#: (darkest), as sRGB hex strings. Monk, E. (2019), "Monk Skin Tone Scale"; colour values as
#: published by Google at https://skintone.google (CC BY 4.0). Index ``i`` holds MST-(i+1).
MONK_SKIN_TONES: tuple[str, ...] = (
    "#f6ede4",  # MST-1
    "#f3e7db",  # MST-2
    "#f7ead0",  # MST-3
    "#eadaba",  # MST-4
    "#d7bd96",  # MST-5
    "#a07e56",  # MST-6
    "#825c43",  # MST-7
    "#604134",  # MST-8
    "#3a312a",  # MST-9
    "#292420",  # MST-10
)

#: For each race, the inclusive range of Monk tone indices (1..10) that placeholder faces of
#: that group are drawn from, uniformly by seed.
#:
#: ILLUSTRATIVE PLACEHOLDERS FOR A SIMULATION, NOT A CLAIM ABOUT REAL PEOPLE. Skin tone varies
#: enormously within every group and no race has a "range" of tones. The ranges only make the
#: synthetic audit exercise every tone (all ten occur across the seven groups) with some
#: variety inside each group, so that tone-dependent detector failures show up in tests.
RACE_TONE_RANGE: dict[str, tuple[int, int]] = {
    "Black": (7, 10),
    "EastAsian": (2, 5),
    "Indian": (5, 9),
    "Latino": (3, 7),
    "MiddleEastern": (3, 6),
    "SoutheastAsian": (4, 7),
    "White": (1, 4),
}

# Muted backgrounds, clothing and hair colours. A colour is used only if it is far enough from
# the skin in CIELAB (ΔE*ab 1976) for the face to be separable by colour, as it is in most real
# portraits; otherwise the next candidate in the seeded order is tried.
_BACKGROUNDS: tuple[RGB, ...] = (
    (110, 125, 150),  # slate blue
    (128, 148, 124),  # sage
    (150, 140, 168),  # lavender
    (98, 132, 134),  # teal grey
    (182, 194, 206),  # pale blue grey
    (60, 66, 78),  # charcoal
    (168, 132, 140),  # dusty rose
    (122, 124, 100),  # olive grey
)
_CLOTHING: tuple[RGB, ...] = (
    (32, 42, 92),  # navy
    (122, 26, 42),  # maroon
    (30, 92, 52),  # forest green
    (200, 160, 40),  # mustard
    (22, 120, 130),  # teal
    (92, 52, 122),  # purple
    (182, 32, 44),  # red
    (70, 100, 150),  # denim
    (236, 236, 238),  # white shirt
    (26, 26, 32),  # black
)
# Young hair colours with seeded weights (black and dark brown most common).
_HAIR_YOUNG: tuple[RGB, ...] = (
    (10, 9, 11),  # jet black
    (45, 30, 22),  # dark brown
    (96, 62, 40),  # brown
    (126, 56, 30),  # auburn
    (205, 175, 115),  # blond
)
_HAIR_YOUNG_WEIGHTS = np.array([0.45, 0.30, 0.12, 0.05, 0.08])
_HAIR_GREY: tuple[RGB, ...] = (
    (150, 150, 152),  # grey
    (120, 118, 116),  # dark grey
    (188, 188, 194),  # silver
)
_HAIR_WHITE: tuple[RGB, ...] = (
    (228, 228, 232),  # white
    (190, 190, 196),  # silver
    (160, 160, 164),  # light grey
)
_EYE_WHITE: RGB = (238, 236, 230)
_IRIS: tuple[RGB, ...] = ((58, 38, 26), (30, 22, 18), (70, 90, 110), (80, 100, 60))
_LIP_TINT: RGB = (160, 60, 72)

# Minimum CIELAB distance from the skin colour: background/clothing must be clearly different;
# hair may be closer (black hair next to MST-10 skin is at most ~13 ΔE, as in real photos).
_MIN_DELTA_E_SCENE = 25.0
_MIN_DELTA_E_HAIR = 12.0

# Forehead wrinkle lines per age bin (0 for the young).
_WRINKLE_LINES: dict[str, int] = {"20s": 0, "30s": 0, "40s": 1, "50s": 2, "60s": 3, "70plus": 4}


@dataclass(frozen=True, eq=False)
class Portrait:
    """A drawn placeholder portrait.

    Attributes:
        pixels: the image, uint8 array of shape (resolution, resolution, 3), sRGB.
        skin_tone: the Monk Skin Tone index (1..10) the face was drawn in.
        skin_rgb: the base sRGB colour of the face skin (the Monk reference colour; the
            drawn skin varies around it by a few levels of shading and noise).
    """

    pixels: np.ndarray
    skin_tone: int
    skin_rgb: tuple[int, int, int]


def monk_rgb(tone: int) -> RGB:
    """The sRGB colour (0..255 per channel) of Monk Skin Tone ``tone`` (1..10)."""
    if not 1 <= tone <= len(MONK_SKIN_TONES):
        raise ValueError(f"Monk skin tone must be in 1..{len(MONK_SKIN_TONES)}, got {tone}")
    hex_code = MONK_SKIN_TONES[tone - 1].lstrip("#")
    return (int(hex_code[0:2], 16), int(hex_code[2:4], 16), int(hex_code[4:6], 16))


def _check_choice(kind: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {kind} {value!r}; valid values are {', '.join(valid)}")


def _lab(colours: np.ndarray) -> np.ndarray:
    return rgb2lab(np.asarray(colours, dtype=np.uint8).reshape(-1, 1, 3))[:, 0, :]


def _first_distinct(
    candidates: list[RGB], avoid: list[RGB], min_delta_e: float
) -> RGB:
    """The first candidate at least ``min_delta_e`` (CIE76) from every colour in ``avoid``.

    Falls back to the candidate farthest from its nearest avoided colour.
    """
    cand_lab = _lab(np.array(candidates))
    avoid_lab = _lab(np.array(avoid))
    nearest = deltaE_cie76(cand_lab[:, None, :], avoid_lab[None, :, :]).min(axis=1)
    ok = np.flatnonzero(nearest >= min_delta_e)
    return candidates[int(ok[0]) if ok.size else int(np.argmax(nearest))]


def _scale(colour: RGB, factor: float) -> RGB:
    return tuple(int(np.clip(round(c * factor), 0, 255)) for c in colour)  # type: ignore[return-value]


def _mix(a: RGB, b: RGB, weight_b: float) -> RGB:
    return tuple(  # type: ignore[return-value]
        round((1 - weight_b) * ca + weight_b * cb) for ca, cb in zip(a, b, strict=True)
    )


def _jitter(colour: RGB, rng: np.random.Generator, amount: int) -> RGB:
    shift = rng.integers(-amount, amount + 1, size=3)
    return tuple(int(np.clip(c + s, 0, 255)) for c, s in zip(colour, shift, strict=True))  # type: ignore[return-value]


def _hair_colour(age: str, skin: RGB, rng: np.random.Generator) -> RGB:
    young = [_HAIR_YOUNG[i] for i in rng.choice(len(_HAIR_YOUNG), 5, False, _HAIR_YOUNG_WEIGHTS)]
    if age in ("60s", "70plus"):
        palette = list(_HAIR_GREY if age == "60s" else _HAIR_WHITE)
        candidates = [palette[i] for i in rng.permutation(len(palette))]
    elif age == "50s":
        # Some grey: the natural colour blended a third of the way to grey.
        candidates = [_mix(c, (160, 160, 162), 0.35) for c in young]
    else:
        candidates = young
    return _first_distinct(candidates, [skin], _MIN_DELTA_E_HAIR)


def draw_portrait(
    race: str,
    gender: str,
    age: str,
    resolution: int,
    seed: int,
    *,
    skin_tone: int | None = None,
) -> Portrait:
    """Draw a deterministic cartoon head-and-shoulders portrait, face-centred like a FairFace crop.

    Args:
        race, gender, age: a cell of the design, spelled as in :mod:`acrb.demographics`.
        resolution: side of the square image in pixels (>= 32; 64..1024 is the intended range).
        seed: varies tone (within the race's illustrative range), hair, colours and features.
        skin_tone: draw this Monk tone (1..10) instead of one from ``RACE_TONE_RANGE`` (for
            sweeps over all tones).

    Returns:
        The portrait, identical for identical arguments. The layout is fixed in fractions of the
        image side: face ellipse centred at (0.50, 0.46) spanning x 0.285..0.715 and
        y 0.18..0.74, neck down to the clothing at y ~0.82, nothing but background, hair and
        clothing outside x 0.24..0.76 above y 0.8.

    Raises:
        ValueError: on an unknown race, gender or age (naming the valid values), an invalid
            ``skin_tone`` or a resolution below 32.
    """
    _check_choice("race", race, RACES)
    _check_choice("gender", gender, GENDERS)
    _check_choice("age", age, AGES)
    if resolution < 32:
        raise ValueError(f"resolution must be at least 32 pixels, got {resolution}")
    # A stable per-cell stream: Python's hash() is salted per process, crc32 is not.
    cell_key = zlib.crc32(f"{race}|{gender}|{age}".encode())
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, cell_key])

    low, high = RACE_TONE_RANGE[race]
    drawn_tone = int(rng.integers(low, high + 1))
    tone = drawn_tone if skin_tone is None else skin_tone
    skin = monk_rgb(tone)

    background = _first_distinct(
        [_jitter(_BACKGROUNDS[i], rng, 8) for i in rng.permutation(len(_BACKGROUNDS))],
        [skin],
        _MIN_DELTA_E_SCENE,
    )
    clothing = _first_distinct(
        [_CLOTHING[i] for i in rng.permutation(len(_CLOTHING))],
        [skin, background],
        _MIN_DELTA_E_SCENE,
    )
    hair = _hair_colour(age, skin, rng)
    male = gender == "Male"
    long_hair = rng.random() < (0.15 if male else 0.75)
    fringe = rng.random() < 0.4
    balding = male and age in ("60s", "70plus") and rng.random() < 0.5
    moustache = male and age != "20s" and rng.random() < 0.3
    iris = _IRIS[int(rng.integers(len(_IRIS)))]
    face_width = 0.43 + 0.02 * rng.random()  # fraction of the image width
    light_from_left = rng.random() < 0.5

    size = resolution
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)

    def box(x0: float, y0: float, x1: float, y1: float) -> list[float]:
        # Inclusive corners; at small sizes a thin feature (an eye is 3% of the side) would
        # otherwise end before it starts, which PIL rejects.
        left, top = x0 * size, y0 * size
        return [left, top, max(left, x1 * size - 1), max(top, y1 * size - 1)]

    line = max(1, round(size / 128))
    cx, cy, rx, ry = 0.5, 0.46, face_width / 2, 0.28
    shadow = _scale(skin, 0.9)  # neck and ears sit slightly in shadow

    # Back layer: long or bob hair falls behind the head and onto the shoulders.
    if long_hair:
        bottom = 0.86 if not male else 0.7
        draw.rounded_rectangle(box(cx - rx - 0.06, 0.14, cx + rx + 0.06, bottom), 0.08 * size, hair)
    elif not male:
        draw.rounded_rectangle(box(cx - rx - 0.04, 0.14, cx + rx + 0.04, 0.6), 0.06 * size, hair)
    draw.rectangle(box(0.41, 0.62, 0.59, 0.88), shadow)  # neck
    draw.ellipse(box(-0.06, 0.8, 1.06, 1.5), clothing)  # shoulders and torso
    draw.polygon(  # neckline
        [(0.42 * size, 0.8 * size), (0.58 * size, 0.8 * size), (0.5 * size, 0.88 * size)], shadow
    )
    for side in (-1, 1):  # ears
        ex = cx + side * rx
        draw.ellipse(box(ex - 0.03, 0.41, ex + 0.03, 0.53), shadow)
    draw.ellipse(box(cx - rx, cy - ry, cx + rx, cy + ry), skin)  # face

    # Top hair: a cap over the crown; balding heads keep only the sides.
    if balding:
        for side in (-1, 1):
            ex = cx + side * (rx - 0.01)
            draw.ellipse(box(ex - 0.04, 0.24, ex + 0.04, 0.42), hair)
    else:
        hairline = 0.27 if fringe else 0.23
        draw.chord(box(cx - rx - 0.02, 0.12, cx + rx + 0.02, 2 * hairline - 0.12), 180, 360, hair)
        if fringe:
            draw.rectangle(box(cx - rx + 0.03, 0.2, cx + rx - 0.03, hairline), hair)

    # Features. Brows take the hair colour; grey/white brows on dark hair would vanish.
    brow = hair if age not in ("60s", "70plus") else _scale(hair, 0.75)
    for side in (-1, 1):
        ex = cx + side * 0.09
        draw.ellipse(box(ex - 0.045, 0.425, ex + 0.045, 0.455), _EYE_WHITE)
        draw.ellipse(box(ex - 0.016, 0.424, ex + 0.016, 0.456), iris)
        draw.arc(box(ex - 0.05, 0.385, ex + 0.05, 0.43), 200, 340, brow, width=2 * line)
    nose = _scale(skin, 0.86)
    draw.line([(0.5 * size, 0.47 * size), (0.515 * size, 0.545 * size)], nose, width=line)
    draw.arc(box(0.475, 0.53, 0.525, 0.56), 20, 160, nose, width=line)
    lips = _mix(_scale(skin, 0.85), _LIP_TINT, 0.45)
    draw.ellipse(box(0.445, 0.6, 0.555, 0.632), lips)
    if moustache:
        draw.chord(box(0.44, 0.57, 0.56, 0.62), 180, 360, hair)

    # Wrinkles: forehead lines, then crow's feet and nasolabial folds with age.
    crease = _scale(skin, 0.84)
    n_lines = _WRINKLE_LINES[age]
    for k in range(n_lines):
        y = 0.30 + 0.022 * k + (0.03 if fringe else 0.0)
        draw.arc(box(0.4, y, 0.6, y + 0.03), 200, 340, crease, width=line)
    if n_lines >= 2:  # nasolabial folds, nose wing to mouth corner
        for side in (-1, 1):
            draw.line(
                [
                    ((cx + side * 0.04) * size, 0.545 * size),
                    ((cx + side * 0.07) * size, 0.61 * size),
                ],
                crease,
                width=line,
            )
    if n_lines >= 3:
        for side in (-1, 1):
            x = cx + side * 0.155
            for dy in (-0.012, 0.0, 0.012):
                draw.line([(x * size, (0.44 + dy) * size), ((x + side * 0.025) * size,
                          (0.44 + 2 * dy) * size)], crease, width=1)

    # Soft directional light and sensor-like noise so nothing is perfectly flat.
    shaded = np.asarray(image, dtype=np.float32)
    ramp = np.linspace(1.03, 0.97, size, dtype=np.float32)
    shaded *= (ramp if light_from_left else ramp[::-1])[None, :, None]
    shaded += rng.integers(-2, 3, size=(size, size, 1), dtype=np.int8)
    shaded += 0.5  # round half up on the cast below
    np.clip(shaded, 0, 255, out=shaded)
    return Portrait(pixels=shaded.astype(np.uint8), skin_tone=tone, skin_rgb=skin)
