"""Import a published feature mapping: a JSON object from source id to feature prompt.

The study publishes its feature prompts as ``{"White_Male_20s": "<p_feat>", ...}``, keyed by
the curated FairFace cells (``sources.kind: fairface`` gives the sources those ids). The file
is read from the user's copy (keep it under ``inputs/study/``) and named in every row as
``<file name>@<sha256>``.

Refused, with the file and the fix named: a file that is not JSON, not an object, repeats an
id, maps an id to something other than a string or to empty text, or lacks a source of this
run. Ids the run has no source for are ignored and counted. A prompt that names a race,
ethnicity or nationality (:mod:`acrb.features.labels`) is *not* refused: the published mapping
is what the study ran, and reproducing it means using it as published. Each such prompt is
listed as a warning in the stage's summary.json instead, so a reader sees that the feature
arm's prompt carried a label for that source.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acrb.errors import InputDataError
from acrb.features.labels import demographic_labels
from acrb.records import FeaturePromptRecord
from acrb.storage import sha256_file


@dataclass(frozen=True)
class MappingImport:
    """The rows for this run's sources, and what the import noticed."""

    records: list[FeaturePromptRecord]
    describer: str
    labelled: dict[str, list[str]]  # source id -> the group labels its prompt names
    extra_ids: int  # ids in the file this run has no source for


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` hook: an object, refusing a key that appears twice (plain ``json`` keeps
    the last silently)."""
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise _Duplicate(repeated)
    return dict(pairs)


class _Duplicate(ValueError):
    def __init__(self, keys: list[str]) -> None:
        super().__init__(", ".join(keys))
        self.keys = keys


def read_mapping(path: Path, source_ids: Sequence[str]) -> MappingImport:
    """The feature prompts of ``source_ids`` from the mapping file ``path``."""
    fix = "the mapping must be one JSON object {\"<source_id>\": \"<feature prompt>\", ...}"
    if not path.is_file():
        raise InputDataError(f"feature mapping {path} does not exist",
                             "set features.mapping to your copy of the study's mapping JSON "
                             "(e.g. under inputs/study/)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as exc:
        raise InputDataError(f"feature mapping {path} is not UTF-8 text: {exc}", fix) from None
    except _Duplicate as exc:
        raise InputDataError(f"feature mapping {path} repeats source id(s) {exc.keys}",
                             "keep one feature prompt per source id") from None
    except json.JSONDecodeError as exc:
        raise InputDataError(f"feature mapping {path} is not valid JSON (line {exc.lineno}, "
                             f"column {exc.colno}: {exc.msg})", fix) from None
    if not isinstance(data, dict):
        raise InputDataError(f"feature mapping {path} holds a JSON {type(data).__name__}, not "
                             "an object", fix)
    for source_id, text in data.items():
        if not isinstance(text, str):
            raise InputDataError(f"feature mapping {path}: the value of {source_id!r} is of type "
                                 f"{type(text).__name__}, not a string", fix)
        if not text.strip():
            raise InputDataError(f"feature mapping {path}: the feature prompt of {source_id!r} "
                                 "is empty", "give every source id a feature prompt")
    missing = [s for s in source_ids if s not in data]
    if missing:
        shown = ", ".join(missing[:12]) + (f" (and {len(missing) - 12} more)"
                                            if len(missing) > 12 else "")
        raise InputDataError(
            f"feature mapping {path} has no feature prompt for {len(missing)} of this run's "
            f"{len(source_ids)} sources: {shown}",
            "add them to the mapping, or describe the portraits instead "
            "(features.describer: vlm); the study's mapping is keyed by the curated FairFace "
            "cells (sources.kind: fairface)")
    describer = f"{path.name}@{sha256_file(path)}"
    records, labelled = [], {}
    for source_id in source_ids:
        text = " ".join(data[source_id].split())
        labels = demographic_labels(text)
        if labels:
            labelled[source_id] = labels
        records.append(FeaturePromptRecord(
            source_id=source_id, source_sha256="", text=text, dimensions="{}",
            origin="mapping", describer=describer, attempts=0, rejected=""))
    wanted = set(source_ids)
    return MappingImport(records=records, describer=describer, labelled=labelled,
                         extra_ids=sum(1 for key in data if key not in wanted))
