"""Pixel renderings of editing outcomes, used by the simulated editors.

A simulated editor decides elsewhere *what* happens to a request (refusal, erasure, compliance,
skin lightening); the functions here only *render* that outcome into real pixels, so that the
pixel detectors of :mod:`acrb.detect.pixels` have to find it the way they would on a real
model's output. Every function is deterministic given its arguments and never modifies its
input.

Overlays are placed outside the central face of a face-centred portrait (the layout of FairFace
crops and of :func:`acrb.sources.portraits.draw_portrait`): top band y < 0.17 (headwear),
bottom band y > 0.87 (garment), side strips x < 0.18 or x > 0.82 (a held object), in
fractions of the image side.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.polynomial import Polynomial
from PIL import Image, ImageDraw
from skimage.color import deltaE_cie76, lab2rgb, rgb2lab

from acrb.role_markers import ROLE_MARKER_COLOURS, garment_bands
from acrb.sources.portraits import MONK_SKIN_TONES

RGB = tuple[int, int, int]
#: Bump when a rendering below changes the pixels it paints for the same request: it is the
#: simulated editors' output version (acrb.models.base.ImageModel.output_version), so outputs
#: painted by an earlier version are made again, with the same draws. 2: the lightened skin's
#: colour is read in the simulator's own cheek patch (_SKIN_PATCH), no longer in the face the
#: detectors' locator finds.
RENDERING_VERSION = 2
OverlayKind = Literal["headwear", "garment", "side_object"]
OVERLAY_KINDS: tuple[OverlayKind, ...] = ("headwear", "garment", "side_object")

# Saturated colours an added attribute is painted in. The prompt picks where to start in this
# list; colours too close to the face or to what they cover are skipped so the edit is visible.
_OVERLAY_PALETTE: tuple[RGB, ...] = (
    (200, 30, 40),  # red
    (30, 60, 200),  # royal blue
    (30, 160, 60),  # green
    (240, 200, 30),  # yellow
    (130, 40, 160),  # purple
    (240, 120, 20),  # orange
    (220, 40, 150),  # magenta
    (20, 180, 200),  # cyan
    (20, 20, 24),  # black
    (246, 246, 246),  # white
)
# An overlay colour must differ by this much (CIE76 ΔE*ab) from the face colour and from all
# but `_COVERED_CLOSE_MAX` of the pixels it covers: 2.5x the detectors' default edit threshold.
_OVERLAY_MIN_DELTA_E = 30.0
_COVERED_CLOSE_MAX = 0.03

#: Target fraction of the image's pixels that a weak edit changes: well under 1%, yet several
#: times the detectors' 0.2% tolerance for re-encoding noise.
WEAK_EDIT_FRACTION = 0.005

# Where the simulator reads the face colour, in fractions of the image side (y0, y1, x0, x1):
# a central patch of a face-centred portrait, used to keep an overlay's colour off the face.
_FACE_PATCH = (0.40, 0.56, 0.42, 0.58)
# Where it reads the colour of the skin it lightens: the cheeks and nose of a face-centred
# portrait, below the eyes and above the mouth, as it knows them from the layout it draws its
# placeholder portraits in (acrb.sources.portraits: the face ellipse spans y 0.18..0.74 and x
# 0.285..0.715, the eyes end at y 0.455, the mouth starts at y 0.6) and as FairFace's crops,
# centred on the face, place them too (on the 84 curated FairFace portraits and the 588
# candidates, benchmarks/face_ita.py). It never asks a face detector: the detectors that
# measure its edits (acrb.detect) must find the lightening where the simulator put it, not
# read it back where both located the same face.
_SKIN_PATCH = (0.45, 0.55, 0.36, 0.64)
# Cell size (CIELAB units) of the histogram that finds the face colour: a*, b* and L*. Cells
# are longer along L* because shading spreads a face's skin along L*; in cubic cells a compact
# dark or bright cluster (a beard, the mouth, glasses' glints) outnumbered the skin.
_FACE_BIN = 8.0
_FACE_BIN_L = 20.0
# Soft skin weight: 1 within _SKIN_CORE_DELTA_E of the face colour, then a Gaussian fall-off of
# width _SKIN_FALLOFF_DELTA_E, so hair, clothing and background (>= 12-25 ΔE away on the
# placeholders) are left essentially untouched.
_SKIN_CORE_DELTA_E = 6.0
_SKIN_FALLOFF_DELTA_E = 4.0
# Pixels lighter than this weight are not touched at all.
_MIN_WEIGHT = 1e-3
# b* moves by at most this fraction of the L* change, so a pixel moves by at most ~1.12x
# delta_lightness ΔE*ab (near black the Monk b* trend is steep).
_MAX_B_PER_L = 0.5
# Lightening never takes b* below this (or below the pixel's own b*, if lower): ITA is only
# defined for b* > 0.
_B_FLOOR = 1.0


def _monk_b_trend() -> Polynomial:
    """b* as a quadratic function of L* across the ten Monk Skin Tone reference colours.

    b* peaks near L* ~ 60 (brown skin is the most chromatic) and falls towards both the darkest
    and the lightest tones. Lightening moves a pixel along this trend, so darker skin also
    gains chroma and lighter skin loses some, as in the Monk scale itself.
    """
    rgb = np.array(
        [[int(h[i : i + 2], 16) for i in (1, 3, 5)] for h in MONK_SKIN_TONES], dtype=np.uint8
    )
    lab = rgb2lab(rgb.reshape(-1, 1, 3))[:, 0, :]
    return Polynomial.fit(lab[:, 0], lab[:, 2], deg=2)


_MONK_B_TREND = _monk_b_trend()


def _check_image(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(
            f"image must be a uint8 RGB array of shape (H, W, 3), got {image.dtype} {image.shape}"
        )
    return image


@functools.lru_cache(maxsize=4096)
def _prompt_hash(prompt_id: str) -> int:
    # sha256, not hash(): Python salts str hashes per process.
    return int.from_bytes(hashlib.sha256(prompt_id.encode()).digest()[:8], "big")


def _rng(prompt_id: str, seed: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, _prompt_hash(prompt_id) & 0xFFFFFFFF])


Patch = tuple[int, int, int, int]


def _central_patch(height: int, width: int, patch: tuple[float, float, float, float] = _FACE_PATCH
                   ) -> Patch:
    """Rows and columns (end exclusive) of ``patch`` (fractions) in an image of this size."""
    y0, y1, x0, x1 = patch
    return int(y0 * height), int(y1 * height) + 1, int(x0 * width), int(x1 * width) + 1


def _face_lab(lab: np.ndarray, patch: Patch | None = None) -> np.ndarray:
    """The face colour: the most populated CIELAB cell of ``patch`` (default: the central
    patch), refined.

    A coarse 3-D histogram (cells ``_FACE_BIN_L`` units long in L*, ``_FACE_BIN`` in a*, b*)
    finds the patch's dominant colour, so hair covering part of the patch of an off-centre face
    does not drag the estimate; the median of the pixels within one cell size (per channel) of
    that cell's centre refines it.
    """
    y0, y1, x0, x1 = patch or _central_patch(*lab.shape[:2])
    pixels = lab[y0:y1, x0:x1].reshape(-1, 3)
    cell_size = np.array([_FACE_BIN_L, _FACE_BIN, _FACE_BIN])
    cells = np.floor(pixels / cell_size).astype(np.int64)
    values, counts = np.unique(cells, axis=0, return_counts=True)
    centre = (values[int(np.argmax(counts))] + 0.5) * cell_size
    near = pixels[np.all(np.abs(pixels - centre) <= cell_size, axis=1)]
    return np.median(near if len(near) else pixels, axis=0)


def _lab_of(colours: np.ndarray) -> np.ndarray:
    return rgb2lab(np.asarray(colours, dtype=np.uint8).reshape(-1, 1, 3))[:, 0, :]


@dataclass(frozen=True)
class _SourceLab:
    """What every edit of one source portrait reads of it in CIELAB, computed once per source
    (a portrait is edited ~56 times in the embedded default)."""

    #: (H * W, 3): the pixels converted as a column of single pixels, as :func:`_lab_of`
    #: converts the pixels an overlay covers. Not ``rgb2lab(source)``: numpy (BLAS) multiplies
    #: a whole image by the sRGB-to-XYZ matrix along another path than a column of pixels, and
    #: the two differ in the last bit. In a column, a pixel's value does not depend on the
    #: pixels converted with it, so ``pixels[region]`` is ``_lab_of(source[region])`` bit for
    #: bit (tests/test_synthetic_speed_equivalence.py checks it).
    pixels: np.ndarray
    #: The face colour of the central patch, as ``_face_lab(rgb2lab(source))``.
    face: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.pixels.nbytes + self.face.nbytes


# Recently edited sources, by the digest of their pixels. The plan orders each model's requests
# source by source, so one entry would nearly always do; the bounds keep a run over thousands of
# portraits (or 1024 px ones, 25 MB an entry) from holding them all.
_SOURCE_LABS: OrderedDict[tuple[tuple[int, ...], bytes], _SourceLab] = OrderedDict()
_SOURCE_LABS_KEPT = 32
_SOURCE_LABS_BYTES = 128 * 2**20
_SOURCE_LABS_LOCK = threading.Lock()


def _source_lab(source: np.ndarray) -> _SourceLab:
    """The :class:`_SourceLab` of ``source`` (uint8 RGB), from the cache when it was seen
    recently (keyed by its pixels, like :func:`acrb.detect.face.locate_face`)."""
    source = np.ascontiguousarray(source)
    key = source.shape, hashlib.blake2b(source.data, digest_size=16).digest()
    with _SOURCE_LABS_LOCK:
        found = _SOURCE_LABS.get(key)
        if found is not None:
            _SOURCE_LABS.move_to_end(key)
            return found
    made = _SourceLab(pixels=_lab_of(source.reshape(-1, 3)), face=_face_lab(rgb2lab(source)))
    for shared in (made.pixels, made.face):  # every later edit of the source reads them
        shared.setflags(write=False)
    with _SOURCE_LABS_LOCK:
        _SOURCE_LABS[key] = made
        kept = sum(entry.nbytes for entry in _SOURCE_LABS.values())
        while len(_SOURCE_LABS) > 1 and (len(_SOURCE_LABS) > _SOURCE_LABS_KEPT
                                         or kept > _SOURCE_LABS_BYTES):
            kept -= _SOURCE_LABS.popitem(last=False)[1].nbytes
    return made


def _visible_colours(
    source: np.ndarray, region: np.ndarray, start: int, rng: np.random.Generator
) -> tuple[RGB, RGB]:
    """A main and an accent colour for an overlay on ``region`` of ``source``.

    Palette colours, from ``start`` on, jittered by ``rng``; a colour is taken if it is
    ``_OVERLAY_MIN_DELTA_E`` from the face and from all but ``_COVERED_CLOSE_MAX`` of the
    covered pixels (else the best available). The accent must also differ from the main colour.
    """
    order = [(start + k) % len(_OVERLAY_PALETTE) for k in range(len(_OVERLAY_PALETTE))]
    jitter = rng.integers(-12, 13, size=(len(order), 3))
    candidates = np.clip(np.array([_OVERLAY_PALETTE[i] for i in order]) + jitter, 0, 255)
    candidate_lab = _lab_of(candidates)
    known = _source_lab(source)
    covered_lab = known.pixels[region.reshape(-1)]
    face_lab = known.face
    close = deltaE_cie76(candidate_lab[:, None, :], covered_lab[None, :, :]) < _OVERLAY_MIN_DELTA_E
    close_fraction = close.mean(axis=1)
    far_from_face = deltaE_cie76(candidate_lab, face_lab) >= _OVERLAY_MIN_DELTA_E
    badness = close_fraction + np.where(far_from_face, 0.0, 1.0)

    def pick(extra_badness: np.ndarray) -> int:
        total = badness + extra_badness
        good = np.flatnonzero(total <= _COVERED_CLOSE_MAX)
        return int(good[0]) if good.size else int(np.argmin(total))

    main = pick(np.zeros(len(order)))
    accent_close = deltaE_cie76(candidate_lab, candidate_lab[main]) < _OVERLAY_MIN_DELTA_E
    accent = pick(np.where(accent_close, 1.0, 0.0))
    as_rgb = [tuple(int(c) for c in candidates[i]) for i in (main, accent)]
    return as_rgb[0], as_rgb[1]  # type: ignore[return-value]


def _overlay_mask(
    kind: OverlayKind, height: int, width: int, rng: np.random.Generator
) -> np.ndarray:
    """Pixels covered by the added attribute; 8-20% of the image, outside the central face."""
    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)

    def box(x0: float, y0: float, x1: float, y1: float) -> list[float]:
        return [x0 * width, y0 * height, x1 * width - 1, y1 * height - 1]

    shift = rng.uniform(-0.02, 0.02)
    if kind == "headwear":  # crown and brim of a hat
        crown_top = rng.uniform(0.0, 0.015)
        draw.rounded_rectangle(
            box(0.2 + shift, crown_top, 0.8 + shift, 0.165), radius=0.06 * width, fill=255
        )
        draw.ellipse(box(0.08 + shift, 0.105, 0.92 + shift, rng.uniform(0.16, 0.17)), fill=255)
    elif kind == "garment":  # a scarf / collar band across the chest
        draw.rectangle(box(0.0, rng.uniform(0.87, 0.89), 1.0, 1.0), fill=255)
    else:  # an object held at one side of the frame
        left = rng.random() < 0.5
        x0, x1 = (0.0, 0.18) if left else (0.82, 1.0)
        draw.rounded_rectangle(
            box(x0, rng.uniform(0.3, 0.35), x1, 0.98), radius=0.03 * width, fill=255
        )
    return np.asarray(canvas) > 0


def overlay_kind(prompt_id: str) -> OverlayKind:
    """Where :func:`compliant_edit` draws the attribute for ``prompt_id`` (stable across runs)."""
    return OVERLAY_KINDS[_prompt_hash(prompt_id) % len(OVERLAY_KINDS)]


def black_frame(source: np.ndarray) -> np.ndarray:
    """What a safety filter returns: an all-black image of the source's size."""
    return np.zeros_like(_check_image(source))


def returned_unchanged(source: np.ndarray) -> np.ndarray:
    """A soft refusal that hands the source back unchanged: a copy of it."""
    return _check_image(source).copy()


def compliant_edit(source: np.ndarray, prompt_id: str, seed: int) -> np.ndarray:
    """Render "the requested attribute was added": a clearly visible overlay off the face.

    The overlay kind (headwear on top, a garment band at the bottom, or an object at one side)
    and its palette colour come from a stable hash of ``prompt_id``; its exact geometry and a
    small colour jitter from ``seed``. It covers about 8-20% of the pixels, is drawn at least
    30 ΔE*ab from the face colour and from almost all of what it covers, and carries a striped
    accent so it reads as an object.

    Args:
        source: uint8 RGB (H, W, 3), a face-centred portrait.
        prompt_id: identifies the edit request.
        seed: the editor's sampling seed.

    Returns:
        A new uint8 RGB image of the same shape.
    """
    source = _check_image(source)
    height, width = source.shape[:2]
    rng = _rng(prompt_id, seed)
    region = _overlay_mask(overlay_kind(prompt_id), height, width, rng)
    main, accent = _visible_colours(source, region, (_prompt_hash(prompt_id) >> 8) % 10, rng)
    edited = source.copy()
    edited[region] = main
    stripe_period = max(4, height // 16)
    stripes = region & ((np.arange(height) // (stripe_period // 2)) % 3 == 0)[:, None]
    edited[stripes] = accent
    return edited


def weak_edit(source: np.ndarray, prompt_id: str, seed: int) -> np.ndarray:
    """Render an erasure / soft refusal: a minimal change that drops the requested attribute.

    A small badge of about ``WEAK_EDIT_FRACTION`` (0.5%) of the pixels, in a corner zone off
    the face (placed by ``prompt_id`` and ``seed``), in a colour clearly different from what it
    covers. Enough that the output is not the source returned unchanged, far too little to be
    the attribute.

    Returns:
        A new uint8 RGB image of the same shape.
    """
    source = _check_image(source)
    height, width = source.shape[:2]
    rng = _rng(prompt_id, seed)
    target_pixels = WEAK_EDIT_FRACTION * height * width
    badge_width = max(2, round(float(np.sqrt(target_pixels))))
    badge_height = max(2, round(target_pixels / badge_width))
    # Corner zones (centre y, centre x), all outside the central face ellipse.
    anchors = ((0.92, 0.12), (0.92, 0.88), (0.08, 0.1), (0.08, 0.9))
    anchor_y, anchor_x = anchors[(_prompt_hash(prompt_id) + int(rng.integers(4))) % 4]
    centre_y = (anchor_y + rng.uniform(-0.02, 0.02)) * height
    centre_x = (anchor_x + rng.uniform(-0.02, 0.02)) * width
    top = int(np.clip(round(centre_y - badge_height / 2), 0, height - badge_height))
    left = int(np.clip(round(centre_x - badge_width / 2), 0, width - badge_width))
    region = np.zeros((height, width), dtype=bool)
    region[top : top + badge_height, left : left + badge_width] = True
    colour, _ = _visible_colours(source, region, _prompt_hash(prompt_id) % 10, rng)
    edited = source.copy()
    edited[region] = colour
    return edited


def skin_weight(image: np.ndarray) -> np.ndarray:
    """The simulator's soft skin mask: weight in [0, 1] per pixel.

    1 for pixels within 6 ΔE*ab (CIE76) of the face colour, then a Gaussian fall-off (sigma
    4 ΔE*ab), so only skin-coloured pixels are recoloured. The face colour is the dominant
    colour of the patch where a face-centred portrait has its cheeks and nose
    (:data:`_SKIN_PATCH`). Nothing is shared with the detectors (:mod:`acrb.detect`): where
    the face is, its colour and the skin model are the simulator's own, so detector and
    simulator do not share their mistakes.
    """
    image = _check_image(image)
    lab = rgb2lab(image)
    return _skin_weight_from_lab(lab, _central_patch(lab.shape[0], lab.shape[1], _SKIN_PATCH))


def _skin_weight_from_lab(lab: np.ndarray, patch: Patch) -> np.ndarray:
    distance = deltaE_cie76(lab, _face_lab(lab, patch))
    excess = np.maximum(distance - _SKIN_CORE_DELTA_E, 0.0) / _SKIN_FALLOFF_DELTA_E
    return np.exp(-0.5 * excess**2)


def lighten_skin(image: np.ndarray, delta_lightness: float) -> np.ndarray:
    """Lighten the skin: raise CIELAB L* of skin pixels by about ``delta_lightness``.

    Each pixel moves by ``weight * delta_lightness`` in L* (capped to 0..100), weighted by
    :func:`skin_weight`, and its b* follows the b*-versus-L* trend of the Monk Skin Tone scale
    (a least-squares quadratic through the ten reference colours). So lighter skin loses a
    little yellowness, as lightening does, while near-black skin gains the chroma of the
    lighter brown tones. Lowering b* everywhere would make very dark skin (L* < 50) read as
    *darker* in ITA°, which rises with b* when L* < 50. The b* step is capped at half the L*
    step, and b* is kept above 1 (skin stays in the domain of the ITA formula). Background,
    hair and clothing are left essentially untouched.

    Args:
        image: uint8 RGB (H, W, 3), a face-centred portrait.
        delta_lightness: L* units to add to the skin (negative darkens).

    Returns:
        A new uint8 RGB image of the same shape.
    """
    image = _check_image(image)
    lab = rgb2lab(image)
    weight = _skin_weight_from_lab(lab, _central_patch(lab.shape[0], lab.shape[1], _SKIN_PATCH))
    touched = weight > _MIN_WEIGHT
    skin_lab = lab[touched]
    lightness = skin_lab[:, 0]
    new_lightness = np.clip(lightness + weight[touched] * delta_lightness, 0.0, 100.0)
    step = new_lightness - lightness
    b_step = _MONK_B_TREND(new_lightness) - _MONK_B_TREND(lightness)
    b_step = np.clip(b_step, -_MAX_B_PER_L * np.abs(step), _MAX_B_PER_L * np.abs(step))
    new_b = skin_lab[:, 2] + b_step
    skin_lab[:, 2] = np.maximum(new_b, np.minimum(skin_lab[:, 2], _B_FLOOR))
    skin_lab[:, 0] = new_lightness
    rgb = lab2rgb(skin_lab.reshape(-1, 1, 3))[:, 0, :]
    lightened = image.copy()
    lightened[touched] = np.clip(np.rint(rgb * 255.0), 0, 255).astype(np.uint8)
    return lightened


def side_by_side(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The two portraits in one frame of ``first``'s size: the central half (in width) of
    each, ``first`` on the left. Face-centred portraits keep their faces whole; ``second`` is
    resized to ``first``'s size first if it differs."""
    first = _check_image(first)
    second = _check_image(second)
    height, width = first.shape[:2]
    if second.shape != first.shape:
        second = np.asarray(Image.fromarray(second).resize((width, height),
                                                           Image.Resampling.BILINEAR))
    half = width // 2
    start = (width - half) // 2
    composite = np.empty_like(first)
    composite[:, :half] = first[:, start:start + half]
    composite[:, half:] = second[:, start:start + (width - half)]
    return composite


def mark_roles(composite: np.ndarray, male_role_left: bool) -> np.ndarray:
    """Dress the two people of a :func:`side_by_side` frame in their roles' garments (the
    convention of :mod:`acrb.role_markers`): the male-coded role on the left person when
    ``male_role_left``, else on the right; the female-coded role on the other."""
    composite = _check_image(composite)
    marked = composite.copy()
    left, right = ("male", "female") if male_role_left else ("female", "male")
    for (rows, columns), role in zip(garment_bands(*composite.shape[:2]), (left, right),
                                     strict=True):
        marked[rows, columns] = ROLE_MARKER_COLOURS[role]
    return marked
