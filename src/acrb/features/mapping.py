"""Import a published feature mapping: a JSON object from source id or design cell to feature
prompt.

The study publishes its feature prompts as ``data/identity_prompts/identity_prompt_mapping.json``,
one JSON object with 84 keys named by design cell, ``<Race>_<Gender>_<Age>`` in ACRB's spellings
(:mod:`acrb.demographics`: ``White_Male_20s`` ... ``Black_Female_70plus``), each value one
sentence ("Maintain the person's ..."). The file is read from the user's copy (keep it under
``inputs/study/``) and named in every row as ``<file name>@<sha256>``.

A source gets the prompt keyed by its ``source_id`` if there is one (the curated FairFace sources
of ``sources.kind: fairface`` are named by cell), else the prompt of its cell, built from its own
``race``, ``gender`` and ``age`` labels (the placeholder portraits, ``syn-White-Male-20s-0``, and
any other source of a design cell). Each row says which (``matched_by``: ``source_id`` or
``cell``) and under which key (``mapping_key``). Matching by cell reads the labels only to pick
the study's sentence for that portrait, which is what the study itself did: it wrote one sentence
per cell and gave it to that cell's portrait. The feature prompt remains an instruction to the
audited editor, and ACRB never puts the labels into it: the editor gets the published sentence,
nothing more.

Refused, with the file and the fix named: a file that is not JSON (or holds what JSON cannot
read as published: :mod:`acrb.yaml_input`), not an object, repeats a key, maps a key to
something other than a string or to empty text, or lacks a source of this run (by id and by
cell; the error names the cell key it looked for). Keys the run has no source
for, cells or not, are allowed (the mapping may cover more than the run) and counted. A prompt
that names a race, ethnicity or nationality (:mod:`acrb.features.labels`; 15 of the study's 84
sentences name a group such as "East Asian" or "ethnic") is *not* refused: the published mapping
is what the study ran, and reproducing it means using it as published. Each such prompt is
listed as a warning in the stage's summary.json instead, so a reader sees that the feature
arm's prompt carried a label for that source.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from acrb.errors import InputDataError
from acrb.features.labels import demographic_labels
from acrb.records import FeaturePromptRecord
from acrb.storage import sha256_file
from acrb.yaml_input import RepeatedKeyError, read_json


class LabelledSource(Protocol):
    """What the importer needs of a source (a :class:`~acrb.records.SourceRecord` has it)."""

    @property
    def source_id(self) -> str: ...
    @property
    def race(self) -> str: ...
    @property
    def gender(self) -> str: ...
    @property
    def age(self) -> str: ...


def cell_key(source: LabelledSource) -> str:
    """The design cell a source belongs to, as the study's mapping names it: ``White_Male_20s``."""
    return f"{source.race}_{source.gender}_{source.age}"


@dataclass(frozen=True)
class MappingImport:
    """The rows for this run's sources, and what the import noticed."""

    records: list[FeaturePromptRecord]
    describer: str
    labelled: dict[str, list[str]]  # source id -> the group labels its prompt names
    extra_ids: int  # keys in the file that no source of this run used
    matched: dict[str, int] = field(default_factory=dict)  # source_id / cell -> sources


def read_mapping(path: Path, sources: Sequence[LabelledSource]) -> MappingImport:
    """The feature prompts of ``sources`` from the mapping file ``path``: by source id, else by
    the source's design cell (see the module docstring)."""
    fix = ("the mapping must be one JSON object {\"<source_id or Race_Gender_Age cell>\": "
           "\"<feature prompt>\", ...}")
    if not path.is_file():
        raise InputDataError(f"feature mapping {path} does not exist",
                             "set features.mapping to your copy of the study's mapping JSON "
                             "(e.g. under inputs/study/)")
    try:
        data = read_json(path, what="feature mapping", missing_fix=fix)
    except RepeatedKeyError as exc:
        if exc.location:
            raise
        raise InputDataError(f"feature mapping {path} repeats source id(s) or cell(s) "
                             f"{exc.keys}",
                             "keep one feature prompt per source id or cell") from None
    if not isinstance(data, dict):
        raise InputDataError(f"feature mapping {path} holds a JSON {type(data).__name__}, not "
                             "an object", fix)
    for key, text in data.items():
        if not isinstance(text, str):
            raise InputDataError(f"feature mapping {path}: the value of {key!r} is of type "
                                 f"{type(text).__name__}, not a string", fix)
        if not text.strip():
            raise InputDataError(f"feature mapping {path}: the feature prompt of {key!r} "
                                 "is empty", "give every source id or cell a feature prompt")
    found: list[tuple[LabelledSource, str, Literal["source_id", "cell"]]] = []
    missing: list[str] = []
    for source in sources:
        if source.source_id in data:
            found.append((source, source.source_id, "source_id"))
        elif cell_key(source) in data:
            found.append((source, cell_key(source), "cell"))
        else:
            missing.append(f"{source.source_id} (cell {cell_key(source)})"
                           if cell_key(source) != source.source_id else source.source_id)
    if missing:
        shown = ", ".join(missing[:12]) + (f" (and {len(missing) - 12} more)"
                                            if len(missing) > 12 else "")
        raise InputDataError(
            f"feature mapping {path} has no feature prompt for {len(missing)} of this run's "
            f"{len(sources)} sources, by source id or by cell key: {shown}",
            "add those keys to the mapping, or describe the portraits instead "
            "(features.describer: vlm); the study's mapping is keyed by the design cells "
            "<Race>_<Gender>_<Age> (White_Male_20s), which a source matches by its race, "
            "gender and age labels")
    describer = f"{path.name}@{sha256_file(path)}"
    records, labelled = [], {}
    for source, key, matched_by in found:
        text = " ".join(data[key].split())
        labels = demographic_labels(text)
        if labels:
            labelled[source.source_id] = labels
        records.append(FeaturePromptRecord(
            source_id=source.source_id, source_sha256="", text=text, dimensions="{}",
            origin="mapping", describer=describer, attempts=0, rejected="",
            matched_by=matched_by, mapping_key=key))
    used = {key for _, key, _ in found}
    return MappingImport(records=records, describer=describer, labelled=labelled,
                         extra_ids=sum(1 for key in data if key not in used),
                         matched=dict(Counter(matched_by for _, _, matched_by in found)))
