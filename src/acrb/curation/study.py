"""Import the curation record of the original FairFace study as decisions in a curation.

The study kept ``candidates/selection_logs.json`` (every select and deselect, in order, with
its criteria checklist and a timestamp), ``candidates/selections.json`` (the final choice per
cell) and ``curated/metadata.json`` (what its finalized folder was built from). Importing
replays the log (or, where only ``selections.json`` exists, takes its choices as selections
with no checklist) through :meth:`CurationStore.decide`, so every study action becomes an entry of
the hash-chained audit log (with the study's own timestamp kept as ``recorded_at``), then
checks the result against the other two files and reports every disagreement rather than
papering over it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from acrb.curation.store import CRITERIA, MAX_RATIONALE, CurationStore
from acrb.errors import InputDataError

SOURCE = "import:"


@dataclass
class StudyImport:
    entries: int
    selects: int
    deselects: int
    selected_cells: int
    #: cells where the replayed log and selections.json disagree: cell -> (log, file)
    disagree_with_selections: dict[str, tuple[str | None, str | None]] = field(
        default_factory=dict)
    #: cells the study's finalized folder was built from but that the log later deselected
    curated_then_deselected: list[str] = field(default_factory=list)
    #: selected cells whose image is absent from the study's finalized folder
    curated_file_missing: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"replayed {self.entries} study log entries ({self.selects} select, "
               f"{self.deselects} deselect): {self.selected_cells} cells selected"]
        if self.disagree_with_selections:
            out.append("selections.json disagrees with the log for: " + ", ".join(
                f"{c} (log {a}, file {b})" for c, (a, b) in self.disagree_with_selections.items()))
        else:
            out.append("selections.json agrees with the replayed log")
        if self.curated_then_deselected:
            out.append("in the study's curated folder but deselected afterwards: "
                       + ", ".join(self.curated_then_deselected))
        if self.curated_file_missing:
            out.append("selected, but the image is absent from the study's curated folder: "
                       + ", ".join(self.curated_file_missing))
        return out


def _study_files(folder: Path) -> tuple[Path, Path | None]:
    """(candidates folder holding the logs, curated folder or None)."""
    folder = Path(folder)
    for candidates in (folder, folder / "candidates"):
        if (candidates / "selection_logs.json").is_file() \
                or (candidates / "selections.json").is_file():
            curated = candidates.parent / "curated"
            return candidates, curated if (curated / "metadata.json").is_file() else None
    raise InputDataError(f"no selection_logs.json or selections.json in {folder} or "
                         f"{folder / 'candidates'}",
                         "point at the study's folder (holding candidates/ and curated/)")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputDataError(f"{path} is not readable JSON ({exc})",
                             "restore the study's file") from exc


def import_study(store: CurationStore, folder: Path, curator: str = "study") -> StudyImport:
    """Replay the study's selection log into ``store`` and compare it with its other records.

    The store must hold the study's candidates (ids ``<cell>_V<n>``, as ``acrb sources`` writes
    them when ``sources.fairface.dataset`` is the study's candidates folder).
    """
    candidates, curated = _study_files(folder)
    if (candidates / "selection_logs.json").is_file():
        source = f"{SOURCE}selection_logs.json"
        log = _read_json(candidates / "selection_logs.json")
    else:  # only the final choices survive: import them as selections without a checklist
        source = f"{SOURCE}selections.json"
        log = [{"demo_id": cell, "version": v.get("version"), "action": "select",
                "criteria": {}, "notes": "imported from selections.json (no log kept)"}
               for cell, v in _read_json(candidates / "selections.json").items()]
    if not isinstance(log, list):
        raise InputDataError(f"{candidates / 'selection_logs.json'} is not a list of entries",
                             "restore the study's file")
    if any(d["source"].startswith(SOURCE) for d in store.decisions()):
        raise InputDataError(f"{store.workdir} already holds an import of the study's log",
                             "import into a fresh curation folder (--workdir)")
    missing = sorted({f"{e['demo_id']}_{e['version']}" for e in log
                      if e.get("action") == "select"
                      and store.candidate(f"{e['demo_id']}_{e['version']}") is None})
    if missing:
        raise InputDataError(
            f"{len(missing)} candidates named by the study's log are not in this curation "
            f"(e.g. {', '.join(missing[:3])})",
            "load the study's candidates: set sources.fairface.dataset to its candidates "
            "folder, run `acrb sources`, then import again")
    state: dict[str, str] = {}
    selects = deselects = 0
    for number, entry in enumerate(tqdm(log, desc="import", unit="entry"), start=1):
        cell, action = entry.get("demo_id"), entry.get("action")
        extra = {"recorded_at": entry.get("timestamp", ""), "study_entry": number}
        if action == "select":
            notes = str(entry.get("notes") or "")
            if len(notes) > MAX_RATIONALE:
                raise InputDataError(f"study log entry {number}: notes longer than "
                                     f"{MAX_RATIONALE} characters", "shorten them")
            criteria = {k: bool(v) for k, v in (entry.get("criteria") or {}).items()
                        if k in CRITERIA}
            store.decide(curator, cell, "select", candidate_id=f"{cell}_{entry['version']}",
                         criteria=criteria, rationale=notes, source=source, extra=extra)
            state[cell] = entry["version"]
            selects += 1
        elif action == "deselect":
            store.decide(curator, cell, "deselect", source=source, extra=extra)
            state.pop(cell, None)
            deselects += 1
        else:
            raise InputDataError(f"study log entry {number}: action {action!r} is neither "
                                 "select nor deselect", "fix or remove the entry")
    result = StudyImport(entries=len(log), selects=selects, deselects=deselects,
                         selected_cells=len(state))
    selections_file = candidates / "selections.json"
    if selections_file.is_file():
        final = {cell: v.get("version") for cell, v in _read_json(selections_file).items()}
        for cell in sorted(set(final) | set(state)):
            if final.get(cell) != state.get(cell):
                result.disagree_with_selections[cell] = (state.get(cell), final.get(cell))
    if curated is not None:
        metadata = _read_json(curated / "metadata.json")
        built_from = metadata.get("source_versions", {})
        result.curated_then_deselected = sorted(c for c in built_from if c not in state)
        result.curated_file_missing = sorted(
            cell for cell in state
            if not (curated / cell.split("_")[0] / f"{cell}.jpg").is_file())
    store.note({"action": "import_study", "curator": curator, "folder": str(folder),
                "entries": result.entries, "selected_cells": result.selected_cells,
                "disagree_with_selections": sorted(result.disagree_with_selections),
                "curated_then_deselected": result.curated_then_deselected,
                "curated_file_missing": result.curated_file_missing})
    return result
