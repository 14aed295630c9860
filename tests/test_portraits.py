"""Placeholder portraits: deterministic, every design cell drawable, all ten Monk tones used."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from itertools import product

import numpy as np
import pytest

from acrb.demographics import AGES, GENDERS, RACES
from acrb.sources.portraits import MONK_SKIN_TONES, RACE_TONE_RANGE, draw_portrait, monk_rgb

pytestmark = pytest.mark.filterwarnings("error")

ALL_TONES = set(range(1, len(MONK_SKIN_TONES) + 1))


def digest(pixels: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(pixels).tobytes()).hexdigest()


def cheek(pixels: np.ndarray) -> np.ndarray:
    """Pixels of the left cheek: plain skin in the fixed layout (no eyes, nose or wrinkles)."""
    size = pixels.shape[0]
    return pixels[int(0.47 * size) : int(0.52 * size), int(0.33 * size) : int(0.40 * size)]


def test_monk_scale_has_ten_hex_colours() -> None:
    assert len(MONK_SKIN_TONES) == 10
    assert all(len(code) == 7 and code.startswith("#") for code in MONK_SKIN_TONES)
    assert monk_rgb(1) == (0xF6, 0xED, 0xE4)
    assert monk_rgb(6) == (0xA0, 0x7E, 0x56)
    assert monk_rgb(10) == (0x29, 0x24, 0x20)


@pytest.mark.parametrize("tone", [0, 11, -1])
def test_monk_rgb_rejects_tones_outside_the_scale(tone: int) -> None:
    with pytest.raises(ValueError, match=str(tone)):
        monk_rgb(tone)


def test_tone_ranges_cover_every_race_and_all_ten_tones() -> None:
    assert set(RACE_TONE_RANGE) == set(RACES)
    reachable: set[int] = set()
    for low, high in RACE_TONE_RANGE.values():
        assert 1 <= low <= high <= 10
        reachable |= set(range(low, high + 1))
    assert reachable == ALL_TONES


@pytest.mark.parametrize("race", RACES)
def test_seeds_reach_every_tone_of_the_race_range(race: str) -> None:
    low, high = RACE_TONE_RANGE[race]
    drawn = {draw_portrait(race, "Female", "30s", 32, seed).skin_tone for seed in range(40)}
    assert drawn == set(range(low, high + 1))


def test_all_ten_tones_are_drawn_across_races() -> None:
    drawn = {
        draw_portrait(race, "Male", "50s", 32, seed).skin_tone
        for race in RACES
        for seed in range(40)
    }
    assert drawn == ALL_TONES


@pytest.mark.parametrize("race", RACES)
def test_every_cell_of_the_design_draws(race: str) -> None:
    low, high = RACE_TONE_RANGE[race]
    for gender, age in product(GENDERS, AGES):
        portrait = draw_portrait(race, gender, age, 64, seed=7)
        assert portrait.pixels.shape == (64, 64, 3)
        assert portrait.pixels.dtype == np.uint8
        assert low <= portrait.skin_tone <= high
        assert portrait.skin_rgb == monk_rgb(portrait.skin_tone)
        # The face really is drawn in that tone: shading and noise move it by a few levels.
        face = np.median(cheek(portrait.pixels).reshape(-1, 3), axis=0)
        assert np.abs(face - np.array(portrait.skin_rgb)).max() <= 8


@pytest.mark.parametrize(
    ("race", "gender", "age", "resolution", "seed"),
    [
        ("Black", "Female", "20s", 128, 0),
        ("EastAsian", "Male", "70plus", 64, 12345),
        ("White", "Male", "60s", 256, 2**40 + 3),
        ("SoutheastAsian", "Female", "40s", 33, 1),
    ],
)
def test_identical_arguments_give_byte_identical_portraits(
    race: str, gender: str, age: str, resolution: int, seed: int
) -> None:
    first = draw_portrait(race, gender, age, resolution, seed)
    second = draw_portrait(race, gender, age, resolution, seed)
    assert first.pixels.shape == (resolution, resolution, 3)
    assert first.pixels.tobytes() == second.pixels.tobytes()
    assert (first.skin_tone, first.skin_rgb) == (second.skin_tone, second.skin_rgb)


def test_portraits_do_not_depend_on_the_process_hash_seed() -> None:
    """Python salts str hashes per process; a portrait must not change between runs."""
    code = (
        "import hashlib; from acrb.sources.portraits import draw_portrait; "
        "print(hashlib.sha256(draw_portrait('Latino', 'Female', '30s', 64, 99).pixels"
        ".tobytes()).hexdigest())"
    )
    here = digest(draw_portrait("Latino", "Female", "30s", 64, 99).pixels)
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        result = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert result.stdout.strip() == here


def test_seed_and_cell_change_the_portrait() -> None:
    base = digest(draw_portrait("Indian", "Male", "40s", 64, 1).pixels)
    assert digest(draw_portrait("Indian", "Male", "40s", 64, 2).pixels) != base
    assert digest(draw_portrait("Indian", "Female", "40s", 64, 1).pixels) != base
    assert digest(draw_portrait("Indian", "Male", "50s", 64, 1).pixels) != base
    assert digest(draw_portrait("Latino", "Male", "40s", 64, 1).pixels) != base


@pytest.mark.parametrize("tone", sorted(ALL_TONES))
def test_skin_tone_override_draws_that_tone(tone: int) -> None:
    # White's range is 1..4: the override must win over the race's range.
    portrait = draw_portrait("White", "Female", "20s", 96, 5, skin_tone=tone)
    assert portrait.skin_tone == tone
    assert portrait.skin_rgb == monk_rgb(tone)
    face = np.median(cheek(portrait.pixels).reshape(-1, 3), axis=0)
    assert np.abs(face - np.array(monk_rgb(tone))).max() <= 8


def test_background_clothing_and_hair_differ_from_the_skin() -> None:
    """Corners (background) and the bottom centre (clothing) are never skin-coloured."""
    for tone in sorted(ALL_TONES):
        pixels = draw_portrait("Black", "Male", "30s", 64, tone, skin_tone=tone).pixels
        skin = np.array(monk_rgb(tone), dtype=float)
        for y, x in ((2, 2), (2, 61), (61, 32)):
            assert np.abs(pixels[y, x] - skin).max() > 10


@pytest.mark.parametrize(
    ("race", "gender", "age", "bad"),
    [
        ("Martian", "Female", "20s", "Martian"),
        ("black", "Female", "20s", "black"),
        ("Black", "Nonbinary", "20s", "Nonbinary"),
        ("Black", "Female", "teen", "teen"),
    ],
)
def test_unknown_values_raise_naming_the_value(race: str, gender: str, age: str, bad: str) -> None:
    with pytest.raises(ValueError, match=f"'{bad}'"):
        draw_portrait(race, gender, age, 64, 0)


def test_invalid_resolution_and_tone_raise() -> None:
    with pytest.raises(ValueError, match="31"):
        draw_portrait("White", "Male", "20s", 31, 0)
    with pytest.raises(ValueError, match="11"):
        draw_portrait("White", "Male", "20s", 64, 0, skin_tone=11)
