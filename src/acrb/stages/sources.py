"""Stage `sources`: the source portraits every edit starts from.

``kind: synthetic`` draws placeholder portraits procedurally over the race x gender x age design
(clearly labelled synthetic; no real person). ``kind: folder`` takes your own images listed in
``<folder>/manifest.csv`` (columns ``file, race, gender, age``), checks that each decodes fully,
centre-crops to a square and resizes to ``resolution``. Writes ``data/sources/images/*.png`` and
``data/sources/sources.parquet``, built in a staging folder and swapped in only when every input
was read: a failed run leaves the previous outputs exactly as they were.

``kind: fairface`` first draws ``k`` FairFace candidates per cell and pre-screens them into
``data/sources/candidates/`` (the input of ``acrb curate serve``); then, once a person has
curated them and ``acrb curate finalize`` has written the curated set to
``sources.fairface.curated``, it takes that set like a folder (checking every image's sha256
against the manifest). Until the set exists the stage stops after writing the candidates and
says what to do next.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps
from tqdm import tqdm

from acrb import layout
from acrb.config import SourcesParams
from acrb.detect.face import faces_document, faces_entry
from acrb.errors import AcrbError, InputDataError
from acrb.records import SourceRecord, write_table
from acrb.sources.manifest import MANIFEST_NAME, read_manifest
from acrb.sources.portraits import draw_portrait
from acrb.stages.context import StageContext, stage_workers
from acrb.storage import (
    TMP_PREFIX,
    atomic_write_json,
    atomic_write_text,
    content_hash,
    load_rgb,
    sha256_file,
    write_png,
)
from acrb.tracking import RunLog, stage_run

SYNTHETIC_DATASET = "acrb-synthetic-portraits (SIMULATION: placeholder faces, no real person)"


@dataclass(frozen=True)
class SourcesSummary:
    count: int
    table: Path


def run(ctx: StageContext, workers: int | None = None) -> SourcesSummary:
    """Build the sources into a staging folder, then swap them in (see :func:`_staged`).

    ``workers``: processes that search the portraits' faces (:func:`_write_faces`); by default
    ``ACRB_SOURCES_WORKERS`` if set, else the CPUs this process may use."""
    if workers is None:
        workers = stage_workers("ACRB_SOURCES_WORKERS")
    cfg = ctx.params.sources
    table = ctx.path(layout.SOURCES_TABLE)
    with stage_run("sources", profile=ctx.profile, params_hash=ctx.params_hash, params=ctx.params,
                   simulated=cfg.kind == "synthetic") as tracker:
        with _staged(ctx) as staging:
            images = staging / layout.SOURCE_IMAGES.name
            if cfg.kind == "synthetic":
                records = _synthetic_sources(cfg, images)
            elif cfg.kind == "fairface":
                records = _fairface_sources(cfg, ctx, tracker, images)
            else:
                if cfg.folder is None:
                    raise InputDataError(
                        "sources.kind is 'folder' but sources.folder is not set",
                        "set sources.folder to a folder holding manifest.csv and images")
                records = _manifest_sources(_resolve(ctx, cfg.folder), cfg.resolution, images)
            write_table(staging / layout.SOURCES_TABLE.name, records, SourceRecord)
            _write_faces(staging, records, workers)
        tracker.log_params({"sources.kind": cfg.kind, "sources.resolution": cfg.resolution,
                            "sources.count": len(records)})
        tracker.log_metrics({"sources.count": len(records)})
        tracker.log_dataset(table, "sources")
    return SourcesSummary(count=len(records), table=table)


@contextmanager
def _staged(ctx: StageContext) -> Iterator[Path]:
    """A staging folder beside the outputs (``data/sources/.tmp-sources-*``, holding
    ``images/`` to fill and a place for ``sources.parquet``); when the block succeeds, the
    outputs are swapped in, and the staging folder (with the previous images) is removed
    either way.

    So a run that fails (a corrupt image, a bad manifest, a missing curated set) leaves
    ``data/sources`` byte-identical to what it was. The swap is two renames and a replace, the
    table last: the previous images are moved aside, the new ones moved in, then
    ``sources.parquet`` is replaced; only a kill in the microseconds between them can leave the
    table naming images that were replaced, and the next run rebuilds both. Staging folders
    left by a killed run are removed when the stage next starts.
    """
    out = ctx.path(layout.SOURCES_DIR)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(f"{TMP_PREFIX}sources-*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}sources-", dir=out))
    try:
        (staging / layout.SOURCE_IMAGES.name).mkdir()
        yield staging
        images, table = ctx.path(layout.SOURCE_IMAGES), ctx.path(layout.SOURCES_TABLE)
        if images.exists() or images.is_symlink():
            images.rename(staging / "previous-images")
        (staging / layout.SOURCE_IMAGES.name).rename(images)
        if (staging / layout.SOURCE_FACES.name).exists():
            os.replace(staging / layout.SOURCE_FACES.name, ctx.path(layout.SOURCE_FACES))
        os.replace(staging / layout.SOURCES_TABLE.name, table)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


#: Portraits below which their faces are searched in this process. Two worker processes start
#: in about 0.7 s (their imports); a search takes 0.35 s a portrait on one core, 0.23 s where
#: OpenCV spreads it over two threads as it does here, so on two cores the pool wins about
#: 0.05 s a portrait and pays for itself from some 15 portraits on (more cores win more).
PARALLEL_MIN = 32
#: Portraits waiting for a worker, per worker: enough to keep each busy, few enough that a
#: set of thousands of 1024 px portraits is never all in memory at once.
PARALLEL_QUEUED = 4


def _write_faces(staging: Path, records: list[SourceRecord], workers: int = 1) -> None:
    """``faces.json``: the face located in each portrait as written (decoded from its file, the
    pixels every later stage reads), keyed by those pixels (:mod:`acrb.detect.face`); searched
    in ``workers`` processes from :data:`PARALLEL_MIN` portraits on. The file does not depend
    on where the faces were searched."""
    paths = [staging / layout.SOURCE_IMAGES.name / Path(r.path).name for r in records]
    entries = dict(tqdm(_faces_entries(paths, workers), total=len(paths),
                        desc="sources: faces", unit="img", file=sys.stderr))
    atomic_write_json(staging / layout.SOURCE_FACES.name, faces_document(entries))


def _faces_entries(paths: Sequence[Path], workers: int
                   ) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """:func:`acrb.detect.face.faces_entry` of each portrait of ``paths``, in order: here, or
    in ``workers`` processes (started fresh, not forked) for :data:`PARALLEL_MIN` portraits or
    more. An error a worker raises arrives here whole (an :class:`~acrb.errors.AcrbError` with
    its fix)."""
    if workers <= 1 or len(paths) < PARALLEL_MIN:
        for path in paths:
            yield faces_entry(load_rgb(path))
        return
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    workers = min(workers, len(paths))
    # Only the portrait's pixels travel: a worker imports the face locator alone, not this
    # stage, so it starts in under a second.
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    queued: deque[Future[tuple[str, dict[str, Any] | None]]] = deque()
    try:
        for path in paths:
            queued.append(pool.submit(faces_entry, load_rgb(path)))
            if len(queued) >= PARALLEL_QUEUED * workers:
                yield queued.popleft().result()
        while queued:
            yield queued.popleft().result()
    except BrokenProcessPool as exc:
        raise AcrbError(
            f"a process searching the portraits' faces stopped abruptly ({exc}): killed, or "
            "out of memory",
            "run the stage again in one process (ACRB_SOURCES_WORKERS=1), or with more memory"
        ) from None
    finally:
        # On an error, the searches not started are dropped rather than waited for.
        pool.shutdown(wait=True, cancel_futures=True)


def _synthetic_sources(cfg: SourcesParams, images: Path) -> list[SourceRecord]:
    cells = list(product(cfg.races, cfg.genders, cfg.ages, range(cfg.per_cell)))
    records = []
    for race, gender, age, index in tqdm(cells, desc="sources", unit="img"):
        seed = int(content_hash([cfg.seed, race, gender, age, index], 15), 16)
        portrait = draw_portrait(race, gender, age, cfg.resolution, seed)
        source_id = f"syn-{race}-{gender}-{age}-{index}"
        relative = layout.SOURCE_IMAGES / f"{source_id}.png"
        digest = write_png(images / relative.name, portrait.pixels)
        records.append(SourceRecord(
            source_id=source_id, path=str(relative), sha256=digest, race=race, gender=gender,
            age=age, dataset=SYNTHETIC_DATASET,
            origin=f"acrb.sources.portraits.draw_portrait(seed={seed})",
            width=cfg.resolution, height=cfg.resolution, skin_tone=portrait.skin_tone,
        ))
    return records


def square_resize(pixels: np.ndarray, resolution: int) -> np.ndarray:
    """Centre-crop to a square, then resize with a Lanczos filter (sharp, little aliasing)."""
    image = Image.fromarray(pixels)
    side = min(image.size)
    image = ImageOps.fit(image, (side, side), method=Image.Resampling.LANCZOS)
    if side != resolution:
        image = image.resize((resolution, resolution), Image.Resampling.LANCZOS)
    return np.asarray(image)


def _resolve(ctx: StageContext, path: str) -> Path:
    found = Path(path)
    return found if found.is_absolute() else ctx.root / found


def _manifest_sources(folder: Path, resolution: int, images: Path) -> list[SourceRecord]:
    """Every image of ``folder/manifest.csv``, checked (the whole manifest before any image),
    decoded fully, squared and resized, written to ``images``."""
    manifest = folder / MANIFEST_NAME
    rows = read_manifest(folder)
    records = []
    for row in tqdm(rows, desc="sources", unit="img"):
        if row.sha256_final and sha256_file(row.path) != row.sha256_final:
            raise InputDataError(
                f"{row.path} does not match the sha256 in {manifest} line {row.line}: the "
                "curated image changed after it was finalized",
                "restore it (`dvc checkout`), or finalize the curation again")
        pixels = square_resize(load_rgb(row.path), resolution)
        relative = layout.SOURCE_IMAGES / f"{row.source_id}.png"
        digest = write_png(images / relative.name, pixels)
        records.append(SourceRecord(
            source_id=row.source_id, path=str(relative), sha256=digest, race=row.race,
            gender=row.gender, age=row.age, dataset=row.dataset, origin=row.origin,
            width=resolution, height=resolution,
        ))
    return records


def _fairface_sources(cfg: SourcesParams, ctx: StageContext, tracker: RunLog,
                      images: Path) -> list[SourceRecord]:
    """Draw and pre-screen the candidates; then take the curated set if it is finalized."""
    from acrb.sources import fairface
    from acrb.sources.prescreen import prescreen_all, write_prescreen

    ff = cfg.fairface
    assert ff is not None  # checked by SourcesParams
    local = _resolve(ctx, ff.dataset)
    out = ctx.path(layout.SOURCE_CANDIDATES)
    if local.is_dir() and (list(local.glob("V*/metadata.json"))
                           or list(local.glob("candidates/V*/metadata.json"))):
        frame = fairface.load_study_candidates(local)
        frame = frame[frame["race"].isin(cfg.races) & frame["gender"].isin(cfg.genders)
                      & frame["age"].isin(cfg.ages)].reset_index(drop=True)
        counts = frame.groupby("cell").size()
        shortfalls = {c: int(counts.get(c, 0)) for c in _cells(cfg) if counts.get(c, 0) < ff.k}
        dropped = 0
    else:
        rows = fairface.load_fairface(str(local) if local.exists() else ff.dataset,
                                      revision=ff.revision, split=ff.split, config=ff.config)
        dropped = int(rows.attrs.get("dropped_under_20", 0))
        frame, shortfalls = fairface.draw_candidates(rows, ff.k, ff.seed, cfg.races,
                                                     cfg.genders, cfg.ages)
    table = fairface.export_candidates(frame, None, out)
    screened = prescreen_all(fairface.read_candidates(table), thresholds=ff.prescreen,
                             workers=ff.workers, progress=True,
                             cache=ctx.path(layout.PRESCREEN_CACHE))
    write_prescreen(out / "prescreen.parquet", screened, ff.prescreen)
    flags = [f for value in screened["flags"] for f in value.split(";") if f]
    summary: dict[str, Any] = {
        "dataset": ff.dataset, "revision": ff.revision, "config": ff.config, "split": ff.split,
        "k": ff.k, "seed": ff.seed, "candidates": len(screened),
        "cells": len(_cells(cfg)), "shortfalls": shortfalls, "dropped_under_20": dropped,
        "faces_found": int(screened["face_found"].sum()),
        "unflagged": int((screened["flags"] == "").sum()),
        "flags": {name: flags.count(name) for name in sorted(set(flags))},
    }
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    tracker.log_params({"sources.fairface.dataset": ff.dataset,
                        "sources.fairface.revision": ff.revision or "",
                        "sources.fairface.k": ff.k, "sources.fairface.seed": ff.seed})
    tracker.log_metrics({"candidates.count": len(screened),
                         "candidates.faces_found": summary["faces_found"],
                         "candidates.unflagged": summary["unflagged"],
                         "candidates.short_cells": len(shortfalls)})
    print(f"sources: {len(screened)} FairFace candidates in {len(_cells(cfg))} cells, faces "
          f"found on {summary['faces_found']}, {summary['unflagged']} without a flag -> {out}")
    if shortfalls:
        print("sources: cells with fewer than k candidates (not filled from other cells): "
              + ", ".join(f"{c} ({n})" for c, n in shortfalls.items()))
    curated = _resolve(ctx, ff.curated)
    if not (curated / "manifest.csv").is_file():
        raise InputDataError(
            f"the candidates are in {out}, but there is no curated set at {curated} yet",
            "curate them: `acrb curate add-curator NAME`, `acrb curate serve`, then "
            f"`acrb curate finalize --out {ff.curated}` and `dvc add {ff.curated}`; "
            "then run this stage again (docs/sources.md: Building the FairFace source set)")
    manifest = curated / "manifest.json"
    missing = json.loads(manifest.read_text())["missing"] if manifest.is_file() else []
    if missing:
        print(f"sources: the curated set was finalized without {len(missing)} cell(s): "
              + ", ".join(missing))
    tracker.log_metrics({"sources.missing_cells": len(missing)})
    return _manifest_sources(curated, cfg.resolution, images)


def _cells(cfg: SourcesParams) -> list[str]:
    from acrb.sources.fairface import cell_name

    return [cell_name(r, g, a) for r, g, a in product(cfg.races, cfg.genders, cfg.ages)]
