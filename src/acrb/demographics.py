"""The demographic vocabulary of source images: the FairFace factorial design.

Values are the canonical ACRB spellings (safe in file names and MLflow metric keys). FairFace's
own labels (``Latino_Hispanic``, ``Middle Eastern``, ``20-29``, ``70+`` ...) are mapped onto
these by the dataset loaders.
"""

from __future__ import annotations

RACES: tuple[str, ...] = (
    "Black",
    "EastAsian",
    "Indian",
    "Latino",
    "MiddleEastern",
    "SoutheastAsian",
    "White",
)
#: The race the study compares with all other races pooled ("White vs non-White").
REFERENCE_RACE = "White"
GENDERS: tuple[str, ...] = ("Female", "Male")
AGES: tuple[str, ...] = ("20s", "30s", "40s", "50s", "60s", "70plus")

#: The source-image dimensions an audit breaks rates down by, with their values in order.
SOURCE_DIMENSIONS: dict[str, tuple[str, ...]] = {
    "race": RACES,
    "gender": GENDERS,
    "age": AGES,
}


def other_groups(selectors: list[str]) -> list[str]:
    """Every group of the selectors' dimensions that no selector names, in the design's order:
    ``["gender:Male", "race:White"]`` -> ``["gender:Female", "race:Black", ...]`` (all races
    but White). The groups a stereotype link leaves on the other side of each dimension it
    names; the catalogs write them out as ``incongruent_with``."""
    named: dict[str, set[str]] = {}
    for selector in selectors:
        dimension, _, group = selector.partition(":")
        named.setdefault(dimension, set()).add(group)
    return [f"{dimension}:{group}" for dimension, groups in named.items()
            for group in SOURCE_DIMENSIONS.get(dimension, ()) if group not in groups]
