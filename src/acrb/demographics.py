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
GENDERS: tuple[str, ...] = ("Female", "Male")
AGES: tuple[str, ...] = ("20s", "30s", "40s", "50s", "60s", "70plus")

#: The source-image dimensions an audit breaks rates down by, with their values in order.
SOURCE_DIMENSIONS: dict[str, tuple[str, ...]] = {
    "race": RACES,
    "gender": GENDERS,
    "age": AGES,
}
