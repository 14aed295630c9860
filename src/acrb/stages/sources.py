"""Stage `sources`: the source portraits every edit starts from.

``kind: synthetic`` draws placeholder portraits procedurally over the race x gender x age design
(clearly labelled synthetic; no real person). ``kind: folder`` takes your own images listed in
``<folder>/manifest.csv`` (columns ``file, race, gender, age``), checks that each decodes fully,
centre-crops to a square and resizes to ``resolution``. Writes ``data/sources/images/*.png`` and
``data/sources/sources.parquet``.
"""

from __future__ import annotations

import csv
import shutil
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError
from tqdm import tqdm

from acrb import layout
from acrb.config import SourcesParams
from acrb.demographics import SOURCE_DIMENSIONS
from acrb.errors import InputDataError
from acrb.records import SourceRecord, write_table
from acrb.sources.portraits import draw_portrait
from acrb.stages.context import StageContext
from acrb.storage import content_hash, write_png
from acrb.tracking import stage_run

SYNTHETIC_DATASET = "acrb-synthetic-portraits (SIMULATION: placeholder faces, no real person)"


@dataclass(frozen=True)
class SourcesSummary:
    count: int
    table: Path


def run(ctx: StageContext) -> SourcesSummary:
    cfg = ctx.params.sources
    images_dir = ctx.path(layout.SOURCE_IMAGES)
    if images_dir.exists():
        shutil.rmtree(images_dir)  # this stage's own output: rebuilt whole each run
    images_dir.mkdir(parents=True)
    with stage_run("sources", profile=ctx.profile, params_hash=ctx.params_hash,
                   simulated=cfg.kind == "synthetic") as tracker:
        if cfg.kind == "synthetic":
            records = _synthetic_sources(cfg, ctx)
        else:
            records = _folder_sources(cfg, ctx)
        table = ctx.path(layout.SOURCES_TABLE)
        write_table(table, records, SourceRecord)
        tracker.log_params({"sources.kind": cfg.kind, "sources.resolution": cfg.resolution,
                            "sources.count": len(records)})
        tracker.log_metrics({"sources.count": len(records)})
    return SourcesSummary(count=len(records), table=table)


def _synthetic_sources(cfg: SourcesParams, ctx: StageContext) -> list[SourceRecord]:
    cells = list(product(cfg.races, cfg.genders, cfg.ages, range(cfg.per_cell)))
    records = []
    for race, gender, age, index in tqdm(cells, desc="sources", unit="img"):
        seed = int(content_hash([cfg.seed, race, gender, age, index], 15), 16)
        portrait = draw_portrait(race, gender, age, cfg.resolution, seed)
        source_id = f"syn-{race}-{gender}-{age}-{index}"
        relative = layout.SOURCE_IMAGES / f"{source_id}.png"
        digest = write_png(ctx.path(relative), portrait.pixels)
        records.append(SourceRecord(
            source_id=source_id, path=str(relative), sha256=digest, race=race, gender=gender,
            age=age, dataset=SYNTHETIC_DATASET,
            origin=f"acrb.sources.portraits.draw_portrait(seed={seed})",
            width=cfg.resolution, height=cfg.resolution, skin_tone=portrait.skin_tone,
        ))
    return records


def load_rgb(path: Path) -> np.ndarray:
    """Decode an image fully (so truncation is caught here) as an RGB uint8 array."""
    try:
        with Image.open(path) as image:
            image.load()
            return np.asarray(image.convert("RGB"))
    except FileNotFoundError as exc:
        raise InputDataError(f"image {path} not found",
                             "restore the file, or re-run the stage that writes it") from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InputDataError(
            f"image {path} is corrupt or truncated ({exc})",
            "replace the file with a complete copy, or remove it from the manifest",
        ) from exc


def square_resize(pixels: np.ndarray, resolution: int) -> np.ndarray:
    """Centre-crop to a square, then resize with a Lanczos filter (sharp, little aliasing)."""
    image = Image.fromarray(pixels)
    side = min(image.size)
    image = ImageOps.fit(image, (side, side), method=Image.Resampling.LANCZOS)
    if side != resolution:
        image = image.resize((resolution, resolution), Image.Resampling.LANCZOS)
    return np.asarray(image)


def _folder_sources(cfg: SourcesParams, ctx: StageContext) -> list[SourceRecord]:
    if cfg.folder is None:
        raise InputDataError("sources.kind is 'folder' but sources.folder is not set",
                             "set sources.folder to a folder holding manifest.csv and images")
    folder = Path(cfg.folder)
    folder = folder if folder.is_absolute() else ctx.root / folder
    manifest = folder / "manifest.csv"
    if not manifest.exists():
        raise InputDataError(f"{manifest} not found",
                             "write a manifest.csv with columns file, race, gender, age")
    with open(manifest, newline="") as handle:
        rows = list(csv.DictReader(handle))
    required = {"file", "race", "gender", "age"}
    if not rows or not required <= set(rows[0]):
        raise InputDataError(f"{manifest} is empty or lacks columns {sorted(required)}",
                             "add a header row 'file,race,gender,age' and one row per image")
    records = []
    for line, row in enumerate(tqdm(rows, desc="sources", unit="img"), start=2):
        for dimension in ("race", "gender", "age"):
            valid = SOURCE_DIMENSIONS[dimension]
            if row[dimension] not in valid:
                raise InputDataError(
                    f"{manifest} line {line}: {dimension} {row[dimension]!r} is not one of "
                    + ", ".join(valid),
                    "use the canonical spelling",
                )
        original = folder / row["file"]
        pixels = square_resize(load_rgb(original), cfg.resolution)
        source_id = row.get("source_id") or Path(row["file"]).stem
        relative = layout.SOURCE_IMAGES / f"{source_id}.png"
        digest = write_png(ctx.path(relative), pixels)
        records.append(SourceRecord(
            source_id=source_id, path=str(relative), sha256=digest, race=row["race"],
            gender=row["gender"], age=row["age"], dataset=row.get("dataset") or folder.name,
            origin=row.get("origin") or row["file"], width=cfg.resolution,
            height=cfg.resolution,
        ))
    return records
