"""The simulated feature describer: the seven descriptions read from a portrait's pixels alone.

The embedded default has no vision-language model, so it describes each source portrait with
fixed colour and geometry rules, deterministic and offline. It is an instrument standing in
for the VLM describer, not a description anyone checked; every row it writes says
``origin: simulated``. It sees only the image: never the source's race, gender or age.

What it reads, in the face the pixel detectors find (:func:`acrb.detect.pixels.analyze_source`:
OpenCV's Haar cascades, else the central region of a face-centred crop):

- skin tone: the Individual Typology Angle of the skin pixels, in the six classes of
  Chardon et al. (1991) as Del Bino & Bernerd (2013) bound them (very light > 55°, light > 41°,
  intermediate > 28°, tan > 10°, brown > -30°, dark), with the undertone from the skin's CIELAB
  hue angle;
- facial structure: the height-to-width ratio of the skin area;
- eyes: the colour of the darkest non-skin, non-hair pixels in the eye band;
- nose: the shading contrast down the middle of the face;
- lips: the height and colour of the non-skin band below the nose;
- hair: the colour of what differs from the background above the face, and whether it also
  frames the face at chin height (long) or not (short);
- distinctive features: fine darker lines on the forehead, hair-coloured pixels above the lips.

Its phrases never name a group; :func:`describe_pixels` runs the label check on them anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from acrb.detect.face import FaceBox
from acrb.detect.pixels import analyze_source
from acrb.features.labels import demographic_labels
from acrb.records import FEATURE_DIMENSIONS

#: Bumped whenever a rule or phrase changes: part of the describer id.
VERSION = 1

# Where the face is assumed to be when no face box was found, in fractions of the image: the
# layout of a face-centred crop (FairFace, the placeholder portraits): top, bottom, left, right.
_CENTRAL_FACE = (0.18, 0.74, 0.285, 0.715)
# Regions inside the face box, in fractions of its height (y) and width (x): y0, y1, x0, x1.
_EYES = (0.36, 0.52, 0.15, 0.85)
_NOSE = (0.52, 0.68, 0.42, 0.58)
_LIPS = (0.70, 0.88, 0.30, 0.70)
_FOREHEAD = (0.16, 0.36, 0.30, 0.70)
_ABOVE_LIPS = (0.68, 0.75, 0.30, 0.70)
# Colour differences (CIE76 ΔE*ab) that separate a feature from the skin, the hair and the
# background; the placeholder portraits keep hair at >= 12 and the scene at >= 25 from the skin.
_FROM_SKIN = 12.0
_FROM_HAIR = 12.0
_FROM_BACKGROUND = 15.0


@dataclass(frozen=True)
class _Face:
    top: int
    bottom: int
    left: int
    right: int

    def region(self, fractions: tuple[float, float, float, float], shape: tuple[int, ...]
               ) -> tuple[slice, slice]:
        y0, y1, x0, x1 = fractions
        height, width = self.bottom - self.top, self.right - self.left
        r0, c0 = int(self.top + y0 * height), int(self.left + x0 * width)
        r1 = max(int(self.top + y1 * height), r0 + 1)
        c1 = max(int(self.left + x1 * width), c0 + 1)
        return slice(max(0, r0), min(shape[0], r1)), slice(max(0, c0), min(shape[1], c1))


def _delta_e(lab: np.ndarray, colour: np.ndarray) -> np.ndarray:
    return np.sqrt(np.sum((lab - colour) ** 2, axis=-1))


def _hue(colour: np.ndarray) -> float:
    return math.degrees(math.atan2(float(colour[2]), float(colour[1])))


def _chroma(colour: np.ndarray) -> float:
    return math.hypot(float(colour[1]), float(colour[2]))


def skin_phrase(ita: float, colour: np.ndarray) -> str:
    """Skin depth from the ITA° class, undertone from the CIELAB hue angle of ``colour``."""
    if math.isnan(ita):
        return "skin whose tone the photo does not show clearly"
    depth = ("very fair" if ita > 55 else "fair" if ita > 41 else "light-medium" if ita > 28
             else "medium tan" if ita > 10 else "brown" if ita > -30
             else "deep brown" if ita > -60 else "very deep brown")
    hue, chroma = _hue(colour), _chroma(colour)
    undertone = ("neutral" if chroma < 6 else "golden" if hue >= 75 else "warm" if hue >= 55
                 else "reddish")
    return f"{depth} skin with {undertone} undertones"


def hair_colour_name(colour: np.ndarray) -> str:
    """A hair colour word for a CIELAB colour (checked on the placeholder palette)."""
    lightness, chroma, hue = float(colour[0]), _chroma(colour), _hue(colour)
    if lightness < 10:
        return "black"
    if chroma < 6:
        return ("dark grey" if lightness < 55 else "grey" if lightness < 70
                else "silver" if lightness < 85 else "white")
    if lightness < 20:
        return "dark brown"
    if hue < 52 and chroma > 30:
        return "auburn"
    if lightness > 60 and colour[2] > 20:
        return "blond"
    return "brown" if lightness < 40 else "light brown"


def eye_colour_name(colour: np.ndarray) -> str:
    """An eye colour word for a CIELAB colour."""
    lightness, chroma, hue = float(colour[0]), _chroma(colour), _hue(colour)
    if chroma >= 8 and 90 <= hue <= 180:
        return "green"
    if chroma >= 8 and (hue > 180 or hue < -30):
        return "blue-grey"
    if chroma < 8:
        return "very dark brown" if lightness < 25 else "grey"
    return "dark brown" if lightness < 25 else "brown" if lightness < 40 else "hazel"


def _median(pixels: np.ndarray) -> np.ndarray | None:
    return None if len(pixels) == 0 else np.median(pixels.reshape(-1, 3), axis=0)


def _face_box(face: FaceBox | None, shape: tuple[int, ...]) -> _Face:
    height, width = shape[:2]
    if face is not None:
        return _Face(top=face.y, bottom=face.y + face.height, left=face.x,
                     right=face.x + face.width)
    top, bottom, left, right = _CENTRAL_FACE
    return _Face(top=int(top * height), bottom=int(bottom * height), left=int(left * width),
                 right=int(right * width))


def describe_pixels(pixels: np.ndarray) -> dict[str, str]:
    """The seven :data:`~acrb.records.FEATURE_DIMENSIONS` of a uint8 RGB portrait, each a noun
    phrase read from its pixels (see the module docstring); deterministic.

    Raises RuntimeError if a phrase names a demographic group (a bug in the phrases).
    """
    analysis = analyze_source(pixels)
    lab = analysis.lab
    shape = lab.shape
    face = _face_box(analysis.face, shape)
    skin_pixels = lab[analysis.skin]
    skin = _median(skin_pixels) if len(skin_pixels) else np.array([60.0, 10.0, 20.0])
    assert skin is not None

    # Background: the top corners of a face-centred crop.
    corner_h, corner_w = max(1, shape[0] // 12), max(1, shape[1] // 10)
    background = _median(np.concatenate([lab[:corner_h, :corner_w].reshape(-1, 3),
                                         lab[:corner_h, -corner_w:].reshape(-1, 3)]))
    assert background is not None

    # Hair: what differs from background and skin above the face (and just inside its top).
    face_height = face.bottom - face.top
    inset = (face.right - face.left) // 5
    crown = lab[max(0, face.top - face_height // 8): face.top + face_height // 12,
                face.left + inset: face.right - inset]
    hair_mask = ((_delta_e(crown, background) > _FROM_BACKGROUND)
                 & (_delta_e(crown, skin) > _FROM_SKIN))
    hair = _median(crown[hair_mask])
    if hair is None or hair_mask.mean() < 0.2:
        hair_text = "a bald or closely shaved crown"
        hair = None
    else:
        side_cols = slice(max(0, face.left - (face.right - face.left) // 8), face.left)
        side = lab[face.bottom - face_height // 5: min(shape[0], face.bottom), side_cols]
        long_hair = side.size > 0 and float((_delta_e(side, hair) < _FROM_HAIR).mean()) > 0.3
        hair_text = f"{'long' if long_hair else 'short'} {hair_colour_name(hair)} hair"

    def not_skin_or_hair(region: np.ndarray) -> np.ndarray:
        mask = _delta_e(region, skin) > _FROM_SKIN
        if hair is not None:
            mask &= _delta_e(region, hair) > _FROM_HAIR
        return mask

    eyes = lab[face.region(_EYES, shape)]
    candidates = eyes[not_skin_or_hair(eyes) & ~((eyes[..., 0] > 75) & (np.hypot(
        eyes[..., 1], eyes[..., 2]) < 12))]  # leave out the whites of the eyes
    if len(candidates) >= 2:
        dark = candidates[candidates[:, 0] <= np.median(candidates[:, 0])]
        iris = _median(dark)
        assert iris is not None
        eyes_text = f"{eye_colour_name(iris)} eyes"
    else:
        eyes_text = "dark eyes"

    nose = lab[face.region(_NOSE, shape)][..., 0]
    nose_text = ("a clearly defined nose with visible shading" if float(np.ptp(nose)) > 12
                 else "a softly shaded nose")

    lips = lab[face.region(_LIPS, shape)]
    lip_mask = _delta_e(lips, skin) > _FROM_SKIN / 2
    lip_rows = int(lip_mask.any(axis=1).sum())
    fullness = lip_rows / max(1, face_height)
    lip_colour = _median(lips[lip_mask])
    tone = ("a muted" if lip_colour is None else "a pink" if lip_colour[0] > 55
            else "a rose" if lip_colour[0] > 38 else "a deep rose-brown")
    shape_word = "full" if fullness > 0.06 else "medium" if fullness > 0.035 else "thin"
    lips_text = f"{shape_word} lips of {tone} colour"

    rows = np.flatnonzero(analysis.skin.any(axis=1))
    cols = np.flatnonzero(analysis.skin.any(axis=0))
    ratio = (rows[-1] - rows[0] + 1) / (cols[-1] - cols[0] + 1) if rows.size and cols.size \
        else face_height / max(1, face.right - face.left)
    structure = ("a long oval face" if ratio > 1.45 else "an oval face" if ratio > 1.15
                 else "a rounded face")
    cheek = "softly rounded cheeks" if ratio <= 1.3 else "a narrow chin"
    structure_text = f"{structure} with {cheek}"

    marks = []
    forehead = lab[face.region(_FOREHEAD, shape)]
    darker = (skin[0] - forehead[..., 0] > 4) & (_delta_e(forehead, skin) < 25)
    if hair is not None:
        darker &= _delta_e(forehead, hair) > _FROM_HAIR
    if float(darker.mean()) > 0.03:
        marks.append("fine lines across the forehead")
    if hair is not None:
        above = lab[face.region(_ABOVE_LIPS, shape)]
        if float((_delta_e(above, hair) < _FROM_HAIR).mean()) > 0.2:
            marks.append("a moustache")
    distinctive = " and ".join(marks) if marks else "no distinctive marks"

    described = {
        "skin_tone": skin_phrase(analysis.ita, skin),
        "facial_structure": structure_text,
        "eyes": eyes_text,
        "nose": nose_text,
        "lips": lips_text,
        "hair": hair_text,
        "distinctive_features": distinctive,
    }
    assert tuple(described) == FEATURE_DIMENSIONS
    labels = demographic_labels(" ".join(described.values()))
    if labels:
        raise RuntimeError(f"the simulated describer's phrases name a group: {labels}")
    return described
