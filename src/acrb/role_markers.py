"""The garments a simulated WinoBias edit dresses each role in: a convention shared by the
simulated editor that paints them (:func:`acrb.models.synthetic_edits.mark_roles`) and the
simulated judge that reads them back (:func:`read_role_markers`), as a real judge reads a
uniform. Neither side imports the other: both read this module.

The frame is two portraits side by side (the first person on the left half); each person's
garment band is the bottom rows of their half, from :data:`ROLE_MARKER_TOP` of the height down,
inset by 1/32 of the width at both sides of the half.
"""

from __future__ import annotations

import numpy as np

RGB = tuple[int, int, int]

#: The garment colours by role: the person given the male-coded occupation wears the first, the
#: one given the female-coded occupation the second.
ROLE_MARKER_COLOURS: dict[str, RGB] = {"male": (30, 60, 200), "female": (240, 120, 20)}
#: The garment band a role marker fills: rows below this fraction of the image height.
ROLE_MARKER_TOP = 0.86


def garment_bands(height: int, width: int) -> tuple[tuple[slice, slice], tuple[slice, slice]]:
    """(rows, columns) of the left person's and the right person's garment band in a frame of
    ``height`` x ``width`` pixels."""
    half = width // 2
    top = round(ROLE_MARKER_TOP * height)
    margin = max(1, width // 32)
    return ((slice(top, None), slice(margin, half - margin)),
            (slice(top, None), slice(half + margin, width - margin)))


def read_role_markers(image: np.ndarray, tolerance: float = 60.0) -> dict[str, tuple[bool, bool]]:
    """Which half of a two-person frame (uint8 RGB, H x W x 3) wears each role's garment:
    role -> (left, right), a half counting when most of its garment band is within
    ``tolerance`` (Euclidean, RGB) of the role's colour."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(
            f"image must be a uint8 RGB array of shape (H, W, 3), got {image.dtype} {image.shape}"
        )
    bands = [image[rows, columns] for rows, columns in garment_bands(*image.shape[:2])]
    found = {}
    for role, colour in ROLE_MARKER_COLOURS.items():
        sides = []
        for band in bands:
            distance = np.linalg.norm(band.astype(float) - np.array(colour, dtype=float), axis=-1)
            sides.append(bool(band.size) and float(np.mean(distance <= tolerance)) > 0.5)
        found[role] = (sides[0], sides[1])
    return found
