"""A tiny review set for the review app's tests: small PNGs written with PIL and a set table.

Item ids, source ids and image paths carry the group labels and the model on purpose (as a
real set's may: a curated source is named after its cell), so a test can check that the
rating page never shows them.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from acrb.records import REVIEW_AXES, ReviewItemRecord, write_table
from acrb.review.store import ReviewStore

MODEL = "secret-model-x"
GROUPS = (("Black", "Female", "20s"), ("White", "Male", "70plus"),
          ("East Asian", "Female", "40s"), ("Indian", "Male", "30s"))


def make_review_set(root: Path, items: int = 6, *, paired_every: int = 2,
                    distinct_images: int | None = None) -> Path:
    """Write ``root/data/review/set/items.parquet`` and its images under ``root/data/images``;
    every ``paired_every``-th item (0, 2, ...) is a pair. ``distinct_images`` caps how many
    image files are drawn (large sets reuse them). Returns the table's path."""
    images = root / "data" / "images"
    images.mkdir(parents=True, exist_ok=True)
    drawn = distinct_images or items
    rows = []
    for index in range(items):
        race, gender, age = GROUPS[index % len(GROUPS)]
        cell = f"{race.replace(' ', '')}_{gender}_{age}"
        file = index % drawn
        paths = {}
        for role, shade in (("source", 60), ("edited", 140), ("feature", 220)):
            name = f"data/images/{cell}_{MODEL}_{role}_{file}.png"
            if not (root / name).exists():
                colour = ((shade + 37 * file) % 256, (shade * 3 + file) % 256, shade)
                Image.new("RGB", (24, 24), colour).save(root / name)
            paths[role] = name
        paired = paired_every > 0 and index % paired_every == 0
        rows.append(ReviewItemRecord(
            item_id=f"{MODEL}:{cell}:{index:04d}", request_id=f"req-{index}",
            paired_request_id=f"req-{index}-feature" if paired else None, model=MODEL,
            prompt_id=f"A{index % 3}", instruction=f"Put a hat on the person ({index})",
            source_id=cell, source_path=paths["source"], output_path=paths["edited"],
            paired_output_path=paths["feature"] if paired else None, race=race,
            gender=gender, age=age, random_sample=index % 5 != 4,
            needs_review=index % 5 == 4))
    table = root / "data" / "review" / "set" / "items.parquet"
    write_table(table, rows, ReviewItemRecord)
    return table


def make_review_store(root: Path, raters: tuple[str, ...] = ("r01",), *, items: int = 6,
                      k: int = 3, repeat_fraction: float = 0.0, paired_every: int = 2,
                      distinct_images: int | None = None, age_question: str | None = None
                      ) -> tuple[ReviewStore, dict[str, str]]:
    """A review folder under ``root`` with a set loaded and raters added; returns the store
    and each rater's token."""
    table = make_review_set(root, items, paired_every=paired_every,
                            distinct_images=distinct_images)
    store = ReviewStore(root / "review-work", create=True, raters_per_item=k,
                        repeat_fraction=repeat_fraction, age_question=age_question)
    store.load_set(table, root)
    return store, {name: store.add_rater(name) for name in raters}


def answers_for(order: tuple[str, ...], value: int | None = 3,
                axes: tuple[str, ...] = REVIEW_AXES) -> dict[str, dict[str, int | None]]:
    """Every axis of ``axes`` (default: the age change question's) of every output shown
    answered with ``value``."""
    return {output: dict.fromkeys(axes, value) for output in order}
