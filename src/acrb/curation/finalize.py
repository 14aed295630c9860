"""Turn a curation into the source set: one 1024² image per cell, a manifest and the audit trail.

The finalized folder is an input of the pipeline (``sources.fairface.curated``), tracked with
``dvc add`` so that every audit names the exact bytes it started from. It holds:

- ``images/<Race>/<cell>.png``: the chosen candidate, centre-cropped to a square if it is not
  one (FairFace crops are square) and resized to ``size`` x ``size`` with Pillow's Lanczos
  filter (a windowed sinc, a = 3). FairFace crops are 448 px, so this is a 2.29x upscale: it adds
  no detail, and Lanczos is used because it keeps edges sharper than bicubic at the cost of
  faint ringing at hard edges. PNG, so the resize is the only change to the pixels.
- ``manifest.csv``: one row per image, the columns the ``sources`` stage reads (``file, race,
  gender, age, source_id, dataset, origin``) plus where it came from and why it was chosen:
  ``candidate_id``, ``sha256_original`` (the candidate file as the dataset ships it),
  ``sha256_final``, ``curator``, ``decided_at`` (for imported decisions, the original time),
  ``logged_at`` (when the audit log recorded it), one column per criterion, ``criteria_met``,
  ``rationale``, ``prescreen_flags``, ``audit_seq``.
- ``manifest.json``: the same rows, the cells left ``missing``, the resize filter, and the
  audit log's entry count and head hash at finalization.
- ``audit.jsonl`` (the whole hash-chained log, ending with the ``finalize`` entry) and
  ``decisions.csv`` (every decision, in order), so the trail travels with the images.

The folder is written beside the target and renamed into place, so a crash leaves the old set.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image, ImageOps
from tqdm import tqdm

from acrb.curation.store import AUDIT_LOG, CRITERIA, CurationStore
from acrb.errors import InputDataError
from acrb.storage import atomic_write_text, sha256_file, write_csv, write_png
from acrb.web.audit import verify

DEFAULT_SIZE = 1024
RESIZE_FILTER = "PIL.Image.Resampling.LANCZOS (Lanczos windowed sinc, a=3)"
MANIFEST_COLUMNS = (
    "source_id", "file", "race", "gender", "age", "dataset", "origin", "candidate_id",
    "sha256_original", "sha256_final", "width", "height", "curator", "decided_at", "logged_at",
    *CRITERIA, "criteria_met", "rationale", "prescreen_flags", "audit_seq",
)


@dataclass(frozen=True)
class FinalizeResult:
    folder: Path
    manifest: Path
    images: int
    missing: list[str]
    audit_head: str


def missing_cells(store: CurationStore) -> list[str]:
    chosen = store.selections()
    return [cell for cell, *_ in store.cells() if cell not in chosen]


def finalize(store: CurationStore, out_dir: Path, *, size: int = DEFAULT_SIZE,
             allow_incomplete: bool = False, curator: str = "") -> FinalizeResult:
    """Write the finalized source set to ``out_dir`` (replacing an earlier one)."""
    check = store.verify()
    if not check.ok:
        raise InputDataError(f"the audit log does not verify: {check.message()}",
                             check.fix or ("restore audit.jsonl from a backup; a set cannot "
                                           "be finalized from a trail that was altered"))
    missing = missing_cells(store)
    if missing and not allow_incomplete:
        raise InputDataError(
            f"{len(missing)} of {len(store.cells())} cells have no selected portrait: "
            + ", ".join(missing),
            "select one in `acrb curate serve`, or pass --allow-incomplete to finalize "
            "without them (the manifest then lists them as missing)")
    root = store.candidates_dir()
    if root is None:
        raise InputDataError(f"{store.workdir} has no candidates",
                             "load them with `acrb curate serve --candidates FOLDER`")
    chosen = store.selections()
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        picked = [chosen[cell] for cell, *_ in store.cells() if cell in chosen]
        rows = [_write_image(store, root, staging, decision, size)
                for decision in tqdm(picked, desc="finalize", unit="img")]
        entry = store.note({"action": "finalize", "curator": curator, "folder": str(out_dir),
                            "images": len(rows), "missing": missing, "size": size})
        shutil.copyfile(store.log, staging / AUDIT_LOG)
        exported = verify(staging / AUDIT_LOG, expected_head=entry["hash"])
        if not exported.ok:
            raise InputDataError(f"the exported audit log does not verify: "
                                 f"{exported.message()}", "finalize again")
        frame = pd.DataFrame(rows, columns=list(MANIFEST_COLUMNS))
        write_csv(frame, staging / "manifest.csv")
        history = pd.DataFrame(store.decisions())
        if len(history):
            history["criteria"] = [json.dumps(c, sort_keys=True) for c in history["criteria"]]
        write_csv(history, staging / "decisions.csv")
        manifest = {
            "created_at": entry["at"], "size": size, "resize_filter": RESIZE_FILTER,
            "cells_expected": len(store.cells()), "cells_selected": len(rows),
            "missing": missing, "candidates": str(root),
            "audit": {"file": AUDIT_LOG, "entries": entry["seq"], "head": entry["hash"]},
            "criteria": CRITERIA, "images": rows,
        }
        atomic_write_text(staging / "manifest.json",
                          json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out_dir.rename(old)
            staging.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return FinalizeResult(out_dir, out_dir / "manifest.csv", len(rows), missing, entry["hash"])


def _write_image(store: CurationStore, root: Path, staging: Path, decision: dict[str, Any],
                 size: int) -> dict[str, Any]:
    candidate = store.candidate(decision["candidate_id"])
    if candidate is None:
        raise InputDataError(f"selected candidate {decision['candidate_id']} is not in the "
                             "curation database", "select another candidate for the cell")
    source = root / candidate["file"]
    if not source.is_file():
        raise InputDataError(f"{source} not found (candidate {candidate['candidate_id']})",
                             "re-draw the candidates with `acrb sources` (the draw is seeded)")
    original = sha256_file(source)
    if original != candidate["sha256"]:
        raise InputDataError(
            f"{source} changed since it was curated (sha256 {original[:12]}, curated "
            f"{candidate['sha256'][:12]})",
            "restore the candidate file; the decision was made on the recorded bytes")
    with Image.open(source) as image:
        rgb = image.convert("RGB")
    side = min(rgb.size)
    if rgb.size[0] != rgb.size[1]:
        rgb = ImageOps.fit(rgb, (side, side), method=Image.Resampling.LANCZOS)
    final = rgb.resize((size, size), Image.Resampling.LANCZOS) if side != size else rgb
    relative = Path("images") / candidate["race"] / f"{candidate['cell']}.png"
    final_sha256 = write_png(staging / relative, np.asarray(final))
    criteria = decision["criteria"]
    return {
        "source_id": candidate["cell"], "file": relative.as_posix(), "race": candidate["race"],
        "gender": candidate["gender"], "age": candidate["age"], "dataset": candidate["dataset"],
        "origin": candidate["origin"], "candidate_id": candidate["candidate_id"],
        "sha256_original": original, "sha256_final": final_sha256,
        "width": size, "height": size, "curator": decision["curator"],
        "decided_at": decision["recorded_at"], "logged_at": decision["at"],
        **{name: bool(criteria.get(name)) for name in CRITERIA},
        "criteria_met": sum(bool(criteria.get(name)) for name in CRITERIA),
        "rationale": decision["rationale"],
        "prescreen_flags": candidate["prescreen"].get("flags", ""),
        "audit_seq": decision["seq"],
    }


def read_manifest(folder: Path) -> dict[str, Any]:
    """The ``manifest.json`` of a finalized set."""
    path = Path(folder) / "manifest.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputDataError(f"{path} not found",
                             "finalize a curation into this folder with `acrb curate finalize`"
                             ) from exc
    except ValueError as exc:
        raise InputDataError(f"{path} is not valid JSON ({exc})",
                             "finalize again, or restore it with `dvc checkout`") from exc
