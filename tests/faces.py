"""Portraits the detector and verdict tests read: real FairFace faces from the shared sample
beside the clone (when present), and placeholder portraits of all ten Monk tones (always)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from acrb.demographics import AGES, GENDERS, RACES
from acrb.sources.portraits import RACE_TONE_RANGE, draw_portrait
from tests.conftest import FAIRFACE_SAMPLE

#: Side the real portraits are resized to (the FairFace candidates are 448 px).
REAL_SIZE = 256
#: Side of the placeholder portraits.
PLACEHOLDER_SIZE = 128


def real_sample_paths() -> list[Path]:
    """21 candidate photos, 3 per race, spread over versions, genders and ages (fixed choice).

    Layout (see the sample's README.md): candidates/V{1..7}/{Race}/{Race}_{Gender}_{Age}.jpg.
    """
    paths = []
    for i, race in enumerate(RACES):
        for k in range(3):
            version = (i + 3 * k) % 7 + 1
            gender, age = GENDERS[(i + k) % 2], AGES[(2 * i + k) % 6]
            paths.append(
                FAIRFACE_SAMPLE / "candidates" / f"V{version}" / race / f"{race}_{gender}_{age}.jpg"
            )
    return paths


def has_real_faces() -> bool:
    return FAIRFACE_SAMPLE.is_dir()


@lru_cache(maxsize=1)
def _load_real() -> tuple[tuple[str, np.ndarray], ...]:
    portraits = []
    for path in real_sample_paths():
        assert path.is_file(), f"missing from the FairFace sample: {path}"
        image = Image.open(path).convert("RGB")
        if image.size != (REAL_SIZE, REAL_SIZE):
            image = image.resize((REAL_SIZE, REAL_SIZE), Image.Resampling.LANCZOS)
        pixels = np.asarray(image)
        pixels.flags.writeable = False
        portraits.append((str(path.relative_to(FAIRFACE_SAMPLE)), pixels))
    return tuple(portraits)


def real_portraits() -> tuple[tuple[str, np.ndarray], ...]:
    """The 21 real portraits of :func:`real_sample_paths` as (name, uint8 RGB), for tests
    marked ``real_faces`` (which skip, or fail under ACRB_REQUIRE_FAIRFACE=1, without them)."""
    assert has_real_faces(), "mark the test real_faces"
    return _load_real()


@lru_cache(maxsize=32)
def placeholder(tone: int, variant: int) -> np.ndarray:
    """A 128 px portrait in Monk tone ``tone``, of a race whose illustrative range holds it."""
    races = [race for race in RACES if RACE_TONE_RANGE[race][0] <= tone <= RACE_TONE_RANGE[race][1]]
    race = races[0] if variant == 0 else races[-1]
    gender, age = GENDERS[(tone + variant) % 2], AGES[(tone + 3 * variant) % 6]
    pixels = draw_portrait(race, gender, age, PLACEHOLDER_SIZE, 100 * tone + variant,
                           skin_tone=tone).pixels
    pixels.flags.writeable = False
    return pixels


def placeholder_portraits() -> tuple[tuple[str, np.ndarray], ...]:
    """Two placeholders per Monk tone (20), named ``monk-<tone>-<variant>``."""
    return tuple((f"monk-{tone}-{variant}", placeholder(tone, variant))
                 for tone in range(1, 11) for variant in (0, 1))


def portraits() -> tuple[tuple[str, np.ndarray], ...]:
    """Real faces when the sample is present, else the placeholders: a check that matters on
    photographs runs on them where they are, and still runs (on drawings) where they are not,
    except where ACRB_REQUIRE_FAIRFACE=1 (CI) says the photographs must be there."""
    if has_real_faces():
        return _load_real()
    if os.environ.get("ACRB_REQUIRE_FAIRFACE") == "1":
        pytest.fail(f"the FairFace sample is not at {FAIRFACE_SAMPLE}, and "
                    "ACRB_REQUIRE_FAIRFACE=1 says it must be", pytrace=False)
    return placeholder_portraits()
