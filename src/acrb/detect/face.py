"""Locate the face in a portrait with OpenCV's Haar cascades (weights ship in the wheel).

Detection uses Viola-Jones Haar cascades (Viola & Jones, CVPR 2001; Lienhart & Maydt, ICIP
2002), whose weights ship inside the ``opencv-python(-headless)`` 4.x wheels (the 5.x wheels no
longer do), so nothing is downloaded. The frontal cascade ``haarcascade_frontalface_default.xml``
runs first, then ``..._alt2.xml``; FairFace is in-the-wild photography with many three-quarter
views and tilted heads, so if both miss, the profile cascade (on the image and its mirror, as it
only knows left-facing profiles) and the frontal cascades on the image rotated by ±15° are tried
before giving up (see :func:`detect_faces`). The subject's face is the largest one over the
image centre (FairFace crops are centred on the face), else the largest (:func:`main_face`).

Faces are searched on a grey copy resized to :data:`WORK_SIZE` px on its longest side, so the
cascade settings mean the same at FairFace's 224 px hub copy, its 448 px release and 1024 px
upscales. Used by the candidate pre-screen (:mod:`acrb.sources.prescreen`) and by the skin-tone
detector (:mod:`acrb.detect.pixels`).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from acrb.errors import ConfigError, InputDataError

cv2: Any
try:
    import cv2
except ImportError:  # reported by require_opencv when a face is searched for
    cv2 = None

#: Longest side, in pixels, of the grey copy that faces are detected on.
WORK_SIZE = 256

Box = tuple[int, int, int, int]

# Cascade settings, chosen on the 588 study candidates (FairFace, 448 px, detected at 256 px).
# OpenCV's usual scale step 1.1 with 5 neighbours finds 75% of their faces with the two
# frontal cascades; a finer step (1.05) and 2 neighbours, with the fallbacks, find 97% (94%
# over the image centre). Boxes under 20% of the short side are not searched for: FairFace's
# faces are 1/3 to 1/2 of the width, and what the cascades found below 1/5 on these photos was
# hands, cloth and background faces. Finer steps and fewer neighbours cost time and false
# positives; a false positive is marked by `off_centre` or `small_face`, not hidden.
_SCALE_FACTOR = 1.05
_MIN_NEIGHBORS = 2
_MIN_FACE = 0.2
_ROTATIONS = (15.0, -15.0)
_FRONTAL = "haarcascade_frontalface_default.xml"
_FRONTAL_ALT2 = "haarcascade_frontalface_alt2.xml"
_FRONTAL_ALT = "haarcascade_frontalface_alt.xml"
_PROFILE = "haarcascade_profileface.xml"
# The second round of detectors (see _detector_stages) keeps a box only if it can be the
# subject of a face-centred crop: centre within this distance (fraction of the side) of the
# image centre, side within these fractions of the image's short side. The first round's boxes
# on the 588 candidates lie within 0.2 of the centre and at 0.25-0.75 of the side (the
# prescreen's own small_face and off_centre limits are 0.25 and 0.2).
_SUBJECT_OFFSET_MAX = 0.2
_SUBJECT_SIZE = (0.25, 0.8)
_CLAHE_CLIP = 2.0
_CLAHE_TILES = (8, 8)


@dataclass(frozen=True)
class FaceBox:
    """The subject's face in an image: ``x, y`` (top left), ``width, height`` in the image's
    own pixels, and the cascade (and rotation) that found it."""

    x: int
    y: int
    width: int
    height: int
    detector: str

    def covers(self, y: float, x: float) -> bool:
        """Whether the point (``y``, ``x``), in pixels, lies inside the box."""
        return self.x <= x <= self.x + self.width and self.y <= y <= self.y + self.height


def require_opencv() -> None:
    """Raise :class:`ConfigError` with the fix when OpenCV is not importable."""
    if cv2 is None:
        raise ConfigError("face detection needs OpenCV, which is not installed",
                          "pip install 'opencv-python-headless>=4.8,<5' (a dependency of acrb)")


#: Faces located recently, by the digest of the image's pixels: a portrait is searched once
#: however many requests edit or measure it (a search that finds nothing tries every cascade
#: and both rotations, up to a second on two cores).
_LOCATED: OrderedDict[tuple[tuple[int, ...], bytes], FaceBox | None] = OrderedDict()
_LOCATED_KEPT = 4096
_LOCATED_LOCK = threading.Lock()


def _pixels_key(rgb: np.ndarray) -> tuple[tuple[int, ...], bytes]:
    return rgb.shape, hashlib.blake2b(rgb.data, digest_size=16).digest()


#: Bump when the search's settings or steps change: a faces file of another version is not used.
FACE_SEARCH_VERSION = 1


def faces_entry(image: np.ndarray) -> tuple[str, dict[str, Any] | None]:
    """One entry of a faces file (:func:`write_faces`) for ``image``: the key of its pixels and
    its located face (None when none was found)."""
    rgb = np.ascontiguousarray(image)
    face = locate_face(rgb)
    shape, digest = _pixels_key(rgb)
    key = "x".join(str(n) for n in shape) + ":" + digest.hex()
    return key, None if face is None else {
        "x": face.x, "y": face.y, "width": face.width, "height": face.height,
        "detector": face.detector}


def faces_document(entries: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """The faces file's content for ``entries`` (:func:`faces_entry`), stamped with the search
    version and OpenCV's, so that a file made by another search is ignored."""
    require_opencv()
    return {"search_version": FACE_SEARCH_VERSION, "opencv": str(cv2.__version__),
            "faces": dict(sorted(entries.items()))}


def remember_faces(document: dict[str, Any]) -> int:
    """Keep the faces of a faces file (written by the ``sources`` stage beside the portraits)
    as if :func:`locate_face` had found them in this process, so that each stage does not
    search every portrait again; returns how many were kept. A file of another search version
    or OpenCV version is ignored (0): the faces are then searched as usual."""
    require_opencv()
    if (document.get("search_version") != FACE_SEARCH_VERSION
            or document.get("opencv") != str(cv2.__version__)):
        return 0
    kept = 0
    with _LOCATED_LOCK:
        for key, box in document.get("faces", {}).items():
            dims, _, digest = key.partition(":")
            shape = tuple(int(n) for n in dims.split("x"))
            _LOCATED[(shape, bytes.fromhex(digest))] = None if box is None else FaceBox(**box)
            kept += 1
        while len(_LOCATED) > _LOCATED_KEPT:
            _LOCATED.popitem(last=False)
    return kept


def remember_faces_file(path: Path) -> int:
    """:func:`remember_faces` of the faces file at ``path``; 0 when there is none."""
    import json

    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return 0
    except ValueError as exc:
        raise InputDataError(
            f"{path} is not JSON: {exc}",
            "re-run the sources stage (`dvc repro sources`) to rewrite it") from exc
    return remember_faces(document) if isinstance(document, dict) else 0


def locate_face(image: np.ndarray) -> FaceBox | None:
    """The subject's face in a uint8 RGB portrait (H, W, 3), or None when no cascade finds one.

    Grey levels are ITU-R BT.601 luma (as PIL's ``L`` mode); the face is searched on a copy
    :data:`WORK_SIZE` px on its longest side and its box scaled back to ``image``'s pixels.
    The answer depends on the pixels alone, so the last :data:`_LOCATED_KEPT` answers are kept
    by the pixels' digest and an image seen again is not searched again.
    """
    require_opencv()
    rgb = np.ascontiguousarray(image)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"image must be a uint8 RGB array of shape (H, W, 3), got {rgb.dtype} "
                         f"{rgb.shape}")
    key = _pixels_key(rgb)
    with _LOCATED_LOCK:
        if key in _LOCATED:
            _LOCATED.move_to_end(key)
            return _LOCATED[key]
    face = _search_face(rgb)
    with _LOCATED_LOCK:
        _LOCATED[key] = face
        while len(_LOCATED) > _LOCATED_KEPT:
            _LOCATED.popitem(last=False)
    return face


def _search_face(rgb: np.ndarray) -> FaceBox | None:
    height, width = rgb.shape[:2]
    work = resize_longest(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY), WORK_SIZE)
    faces, detector = detect_faces(work)
    if not faces:
        return None
    scale_x, scale_y = work.shape[1] / width, work.shape[0] / height
    x, y, w, h = main_face(faces, work.shape[1], work.shape[0])
    left, top = round(x / scale_x), round(y / scale_y)
    return FaceBox(x=left, y=top, width=min(round(w / scale_x), width - left),
                   height=min(round(h / scale_y), height - top), detector=detector)


def detect_faces(gray: np.ndarray) -> tuple[list[Box], str]:
    """Faces in a grey uint8 image, as ``(x, y, w, h)`` boxes in its pixels, and the name of
    the detector that found them (empty if none did).

    Detectors are tried in turn (see the module docstring). The first whose faces include one
    over the image centre wins: a face-centred crop's subject is there, and the cascades'
    false positives (on hands, patterned cloth, faces at the edge) mostly are not. If none
    finds a face over the centre, the first that found anything wins.
    """
    height, width = gray.shape
    first: tuple[list[Box], str] | None = None
    for faces, detector in _detector_stages(gray):
        if faces and first is None:
            first = (faces, detector)
        if any(_covers_centre(box, width, height) for box in faces):
            return faces, detector
    return first or ([], "")


def main_face(faces: list[Box], width: int, height: int) -> Box:
    """The portrait's subject: the largest face over the image centre, else the largest."""
    central = [box for box in faces if _covers_centre(box, width, height)]
    return max(central or faces, key=lambda box: box[2] * box[3])


def _covers_centre(box: Box, width: int, height: int) -> bool:
    x, y, w, h = box
    return x <= width / 2 <= x + w and y <= height / 2 <= y + h


def _detector_stages(gray: np.ndarray) -> Iterator[tuple[list[Box], str]]:
    """``(faces, detector name)`` of each detector in turn; later ones run only if asked.

    The first round (frontal cascades, profile and its mirror, small rotations, all on the
    equalised image) keeps every box it finds. The second round only runs on the few faces
    the first misses and keeps only boxes of a face-centred crop's subject
    (:func:`_plausible_subject`), because its detectors are the looser ones.
    """
    equalised = cv2.equalizeHist(gray)
    side = int(_MIN_FACE * min(gray.shape))
    height, width = gray.shape

    def run(cascade: str, image: np.ndarray, neighbors: int = _MIN_NEIGHBORS) -> list[Box]:
        found = _cascade(cascade).detectMultiScale(
            image, scaleFactor=_SCALE_FACTOR, minNeighbors=neighbors, minSize=(side, side))
        return [tuple(int(v) for v in box) for box in found]  # type: ignore[misc]

    def run_mirrored(cascade: str, image: np.ndarray, neighbors: int = _MIN_NEIGHBORS
                     ) -> list[Box]:
        found = run(cascade, cv2.flip(image, 1), neighbors)
        return [(width - x - w, y, w, h) for x, y, w, h in found]

    yield run(_FRONTAL, equalised), _short(_FRONTAL)
    yield run(_FRONTAL_ALT2, equalised), _short(_FRONTAL_ALT2)
    yield run(_PROFILE, equalised), _short(_PROFILE)
    yield run_mirrored(_PROFILE, equalised), f"{_short(_PROFILE)}:mirror"
    for angle in _ROTATIONS:
        matrix = cv2.getRotationMatrix2D((width / 2, height / 2), angle, 1.0)
        rotated = cv2.warpAffine(equalised, matrix, (width, height),
                                 borderMode=cv2.BORDER_REPLICATE)
        back = cv2.invertAffineTransform(matrix)
        for name in (_FRONTAL, _FRONTAL_ALT2):
            faces = [_unrotate(box, back, width, height) for box in run(name, rotated)]
            yield faces, f"{_short(name)}:rot{angle:+.0f}"

    def plausible(faces: list[Box]) -> list[Box]:
        return [box for box in faces if _plausible_subject(box, width, height)]

    # Second round. Haar cascades are not mirror-symmetric, so a mirrored image is a new try;
    # CLAHE (local equalisation) recovers a face in shade beside a bright background, where
    # global equalisation spends the grey levels on the background; the plain grey image
    # keeps the contrast of faces that equalisation flattens.
    variants = (
        ("", equalised),
        (":clahe", _clahe().apply(gray)),
        (":grey", gray),
    )
    for suffix, image in variants:
        for name in (_FRONTAL, _FRONTAL_ALT2, _FRONTAL_ALT, _PROFILE):
            if suffix:
                yield plausible(run(name, image)), f"{_short(name)}{suffix}"
            if name != _PROFILE or suffix:  # the equalised profile mirror ran above
                yield (plausible(run_mirrored(name, image)),
                       f"{_short(name)}{suffix}:mirror")
    # Last resort: a single detection window suffices, on the subject's box alone.
    for suffix, image in variants[:2]:
        for name in (_FRONTAL, _FRONTAL_ALT2, _FRONTAL_ALT):
            yield plausible(run(name, image, 1)), f"{_short(name)}{suffix}:n1"
            yield plausible(run_mirrored(name, image, 1)), f"{_short(name)}{suffix}:n1:mirror"


def _plausible_subject(box: Box, width: int, height: int) -> bool:
    """Whether ``box`` can be a face-centred portrait's subject: it covers the image centre,
    its centre lies within :data:`_SUBJECT_OFFSET_MAX` of the image centre and its side is
    :data:`_SUBJECT_SIZE` of the image's short side."""
    x, y, w, h = box
    offset = np.hypot((x + w / 2) / width - 0.5, (y + h / 2) / height - 0.5)
    low, high = _SUBJECT_SIZE
    return (_covers_centre(box, width, height) and offset <= _SUBJECT_OFFSET_MAX
            and low <= w / min(width, height) <= high)


def _unrotate(box: Box, back: np.ndarray, width: int, height: int) -> Box:
    """A box found on the rotated image, moved back (by its centre) onto the original."""
    x, y, w, h = box
    cx, cy = back @ np.array([x + w / 2, y + h / 2, 1.0])
    left = int(np.clip(round(cx - w / 2), 0, width - 1))
    top = int(np.clip(round(cy - h / 2), 0, height - 1))
    return left, top, w, h


def _clahe() -> Any:
    return cv2.createCLAHE(clipLimit=_CLAHE_CLIP, tileGridSize=_CLAHE_TILES)


def _short(cascade: str) -> str:
    return cascade.removeprefix("haarcascade_").removesuffix(".xml")


_THREAD = threading.local()


def _cascade(name: str) -> cv2.CascadeClassifier:
    """The named cascade, loaded once per thread: a ``CascadeClassifier`` keeps scratch state
    while it detects, and one shared across threads returns wrong boxes."""
    loaded: dict[str, cv2.CascadeClassifier] = _THREAD.__dict__.setdefault("cascades", {})
    if name not in loaded:
        path = Path(cv2.data.haarcascades) / name
        classifier = cv2.CascadeClassifier(str(path))
        if classifier.empty():
            raise ConfigError(
                f"OpenCV's Haar cascade {path} is missing or unreadable",
                "install opencv-python-headless 4.x (a dependency of acrb: reinstall it); the "
                "5.x wheels no longer ship the cascade files",
            )
        loaded[name] = classifier
    return loaded[name]


def resize_longest(gray: np.ndarray, size: int) -> np.ndarray:
    """``gray`` resized so that its longest side is ``size`` pixels."""
    height, width = gray.shape
    scale = size / max(height, width)
    if scale == 1:
        return gray
    shape = (max(1, round(width * scale)), max(1, round(height * scale)))
    # Area averaging for shrinking (no aliasing); cubic for the rare small source.
    interpolation = cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC
    return cv2.resize(gray, shape, interpolation=interpolation)
