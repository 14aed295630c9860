"""A small candidate folder, made the way `acrb sources` makes the real one, for curation tests.

Every design cell (84) gets ``k`` synthetic placeholder portraits, exported with
:func:`export_candidates` (PNG bytes, sha256) and pre-screened with :func:`prescreen_all`, so
the curation tool sees exactly the files and tables it sees in a real audit.

The pre-screen's measurements (about 0.1 s per portrait) are kept in :data:`PRESCREEN_CACHE`,
one folder per test session that tests/conftest.py sets, so the folders of several test files
(the same portraits) are measured once; measuring itself is tested in tests/test_prescreen.py.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
from PIL import Image

from acrb.curation.store import CurationStore, design_cells
from acrb.sources.fairface import export_candidates, read_candidates
from acrb.sources.portraits import draw_portrait
from acrb.sources.prescreen import prescreen_all, write_prescreen

#: The pre-screen cache of this test session (None: every portrait measured).
PRESCREEN_CACHE: Path | None = None


def make_candidates(folder: Path, k: int = 2, size: int = 96,
                    cells: list[str] | None = None) -> Path:
    """Write ``folder/{candidates.parquet, candidates.csv, images/, prescreen.parquet}``."""
    images: dict[str, bytes] = {}
    rows = []
    for index, (cell, race, gender, age) in enumerate(design_cells()):
        if cells is not None and cell not in cells:
            continue
        for rank in range(1, k + 1):
            # Seeded by cell and rank alone: a folder of k candidates holds the portraits of a
            # smaller k's folder, whose measurements the pre-screen cache then has.
            portrait = draw_portrait(race, gender, age, size, seed=rank * 1000 + index)
            buffer = io.BytesIO()
            Image.fromarray(portrait.pixels).save(buffer, format="PNG")
            ref = f"mem:{cell}_c{rank}"
            images[ref] = buffer.getvalue()
            rows.append({"candidate_id": f"{cell}_c{rank}", "cell": cell, "rank": rank,
                         "race": race, "gender": gender, "age": age,
                         "origin": f"test/{cell}_{rank}.png", "image_ref": ref,
                         "dataset": "test placeholder portraits (no real person)"})
    table = export_candidates(pd.DataFrame(rows), images.__getitem__, folder)
    screened = prescreen_all(read_candidates(table), workers=2, cache=PRESCREEN_CACHE)
    write_prescreen(folder / "prescreen.parquet", screened)
    return folder


def make_store(root: Path, curators: tuple[str, ...] = ("alice",), k: int = 2,
               cells: list[str] | None = None) -> tuple[CurationStore, dict[str, str]]:
    """A curation folder under ``root`` with candidates loaded and curators added;
    returns the store and each curator's token."""
    candidates = make_candidates(root / "candidates", k=k, cells=cells)
    store = CurationStore(root / "curation", create=True)
    store.load_candidates(candidates)
    tokens = {name: store.add_curator(name) for name in curators}
    return store, tokens
