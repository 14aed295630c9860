"""The WinoBias experiment's inputs and design: occupation sentences applied to two portraits.

WinoBias (Zhao et al., 2018) pairs a male-dominated and a female-dominated occupation (by US Bureau
of Labor Statistics figures) in one sentence. ACRB applies such a sentence as one edit to two
portraits at once, a man and a woman, and asks the judges which person took which occupation; the
outcome is how often the stereotype is followed (:mod:`acrb.analysis.experiments.winobias`).

Three inputs:

- a sentence file (:func:`load_sentences`): ``{id, prompt, roles: {male, female}}`` items, as a
  YAML/JSON list or under ``sentences:`` beside ``name``, ``version`` and the ``occupations``
  lists (the embedded ``data/winobias_acrb.yaml``, written by ACRB in the WinoBias form);
- the study's pairs file (:func:`load_study_file`): a JSON list of ``{id, prompt,
  input_image_1, input_image_2}`` as published (``data/prompts/winobias_prompts.json``: 50
  items, ``id`` a JSON integer 1..50, images named ``<Race>_<Gender>_<Age>.jpg``, every pair a
  man and a woman of different races). Ids may be integers or strings and are kept as strings
  (``"1"``); a bool, float or null id is refused. Each image is matched to a source of the run
  by ``source_id``, file name, stem whatever the extension, or race/gender/age cell
  (:class:`SourceMatcher`; the item records which). Keys other than those below are kept as
  the item's ``metadata``. An item's roles come, in this order, from:

  1. ``gender_stereotype``, the study's own coding (its
     ``winobias_prompts_with_stereotype.json``, read by the study's evaluation script): a string
     naming the stereotyped occupation as the prompt writes it (``"janitor"``,
     ``"construction worker"``, ``"CEO"``); it is the occupation the sentence's pronoun refers to,
     named first. Its stereotyped gender is NOT in the value: it is the gender of the item's
     ``input_image_1`` person, as in the study's design (items 1-25: "he", a male-coded
     occupation, a man first; 26-50: "she", a female-coded occupation, a woman first), and as the
     study's evaluation reads it (the stereotype is followed when the first image's person
     holds that occupation). The item's other occupation comes from its ``winobias.study_roles``
     entry, else from the occupation lists. Accepted values: a string that occurs in the prompt
     (whole words, a plural allowed, any case). Refused, naming the item and the field: any
     other value (``"male"``, ``"pro"``, a number, an occupation the prompt does not name).
     The item records ``roles_from: study`` and ``stereotype_role`` (``male``/``female``); where
     the occupation lists (or the mapping) code either occupation the other way, the study's
     coding is used and ``roles_disagree`` is set (the plan logs how many);
  2. the mapping of params ``winobias.study_roles`` (``roles_from: mapping``);
  3. matching the ``occupations`` lists of the sentence file against the prompt: exactly one
     male-coded and one female-coded occupation must occur, else the item is refused and the
     mapping is the fix. Matching is the default for the plain file because the study's
     prompts name their occupations in plain words, and a list lookup is auditable
     (``roles_from: matched``);
- the original WinoBias text files are not read (see the README).

The builder (:func:`balanced_design`) pairs every sentence with ``pairs_per_race`` male-female
pairs of each race (same age where the sources allow), drawn with a seed, the male portrait
first in half of each race's requests (counterbalanced against position effects).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from acrb.demographics import RACES, SOURCE_DIMENSIONS
from acrb.errors import ConfigError, InputDataError
from acrb.records import (
    ImageMatch,
    RequestRecord,
    WinoBiasItemRecord,
    dump_settings,
    request_id_for,
)
from acrb.storage import canonical_json, sha256_file
from acrb.yaml_input import RepeatedKeyError, json_location, read_json, read_yaml

if TYPE_CHECKING:
    from acrb.stages.context import StageContext

#: The prompt category and plan arm of every WinoBias request.
WINOBIAS_CATEGORY = "W"
WINOBIAS_ARM = "none"
#: Where the plan stage writes the WinoBias items and the editors it skipped.
ITEMS_TABLE = Path("data/plan/winobias_items.parquet")
SKIPPED_TABLE = Path("data/plan/winobias_skipped.csv")

log = logging.getLogger("acrb.prompts.winobias")


class Roles(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    male: str = Field(min_length=1, description="the male-coded occupation")
    female: str = Field(min_length=1, description="the female-coded occupation")


class Sentence(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    roles: Roles

    @field_validator("id")
    @classmethod
    def _plain_id(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
            raise ValueError(f"id {value!r} must be letters, digits, '.', '_' or '-'")
        return value


class Occupations(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    male: list[str] = Field(min_length=1)
    female: list[str] = Field(min_length=1)


class SentenceFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    version: int
    occupations: Occupations | None = None
    sentences: list[Sentence] = Field(min_length=1)


@dataclass(frozen=True)
class SentenceSet:
    """A validated sentence file: its items, its label (``name@version`` or the file name),
    its sha256 and its occupation lists (None when it has none)."""

    sentences: tuple[Sentence, ...]
    label: str
    sha256: str
    occupations: Occupations | None


def _read_structured(path: Path, what: str, param: str) -> Any:
    """A YAML or JSON input file, read strictly (:mod:`acrb.yaml_input`: a repeated key, a
    number or a nesting depth Python cannot read, a file over the size limit are refused); a
    key repeated in an entry of a list is named by the entry and its id."""
    fix = f"set {param} to an existing file"
    if not path.is_file():
        raise InputDataError(f"{what} {path} not found", fix)
    if path.suffix.lower() != ".json":
        return read_yaml(path, what=what, missing_fix=fix)
    try:
        return read_json(path, what=what, missing_fix=fix)
    except RepeatedKeyError as exc:
        location, items = exc.location, exc.document
        if isinstance(items, dict) and location[:1] == ("sentences",):
            location, items = location[1:], items["sentences"]
        if not location or not isinstance(location[0], int) or not isinstance(items, list):
            raise
        entry = items[location[0]]
        named = f"entry {location[0]}" + (f" (id {entry['id']})" if isinstance(entry, dict)
                                          and "id" in entry else "")
        inside = f", in {json_location(location[1:])}" if location[1:] else ""
        raise InputDataError(f"{what} {path}, {named}{inside}: {exc.repeats} (JSON would keep "
                             "only the last)", exc.fix) from None


def _first_error(exc: ValidationError, items: Any) -> str:
    first = exc.errors()[0]
    loc = list(first["loc"])
    where = ".".join(str(p) for p in loc)
    # Name the entry by its id where there is one: "sentences.3 (W04).roles.male: ...".
    if len(loc) >= 2 and loc[0] == "sentences" and isinstance(loc[1], int) \
            and isinstance(items, list) and loc[1] < len(items) \
            and isinstance(items[loc[1]], dict) and "id" in items[loc[1]]:
        where = f"sentences.{loc[1]} (id {items[loc[1]]['id']})" + "".join(
            f".{p}" for p in loc[2:])
    return f"{where}: {first['msg']}"


def load_sentences(path: Path | str) -> SentenceSet:
    """Read and validate a sentence file; :class:`InputDataError` naming the file, the entry
    and the fix for a missing key, a duplicate id or an occupation that is both roles."""
    path = Path(path)
    data = _read_structured(path, "WinoBias sentence file", "winobias.sentences")
    if isinstance(data, list):
        data = {"name": path.name, "version": 0, "sentences": data}
    if not isinstance(data, dict):
        raise InputDataError(f"WinoBias sentence file {path} must be a list of sentences or a "
                             "mapping with `sentences`", "see src/acrb/prompts/data/"
                             "winobias_acrb.yaml for the format")
    try:
        parsed = SentenceFile.model_validate(data)
    except ValidationError as exc:
        raise InputDataError(f"WinoBias sentence file {path}: "
                             f"{_first_error(exc, data.get('sentences'))}",
                             "each item needs id, prompt and roles: {male, female} (see "
                             "src/acrb/prompts/data/winobias_acrb.yaml)") from None
    seen: set[str] = set()
    for sentence in parsed.sentences:
        if sentence.id in seen:
            raise InputDataError(f"WinoBias sentence file {path}: duplicate id {sentence.id}",
                                 "give every sentence its own id")
        seen.add(sentence.id)
        if sentence.roles.male.lower() == sentence.roles.female.lower():
            raise InputDataError(f"WinoBias sentence file {path}, id {sentence.id}: the same "
                                 f"occupation {sentence.roles.male!r} is both roles",
                                 "name one male-coded and one female-coded occupation")
    label = path.name if parsed.version == 0 else f"{parsed.name}@{parsed.version}"
    return SentenceSet(tuple(parsed.sentences), label, sha256_file(path), parsed.occupations)


def _occurs(occupation: str, text: str) -> bool:
    # Whole words, case-insensitive, a plural "s" allowed: "nurse" in "the nurses", not in
    # "nursery".
    return re.search(rf"\b{re.escape(occupation)}s?\b", text, flags=re.IGNORECASE) is not None


def match_roles(item_id: str, prompt: str, occupations: Occupations) -> Roles:
    """The roles of ``prompt``: the one male-coded and the one female-coded occupation of
    ``occupations`` that occur in it (whole words, a plural allowed; a longer name wins over
    one it contains, "construction worker" over "worker"). InputDataError otherwise."""
    found: dict[str, list[str]] = {}
    for coding in ("male", "female"):
        names = sorted(getattr(occupations, coding), key=len, reverse=True)
        hits = [name for name in names if _occurs(name, prompt)]
        # Drop a hit contained in a longer hit ("worker" inside "construction worker").
        found[coding] = [h for h in hits
                         if not any(h != o and _occurs(h, o) for o in hits)]
    if len(found["male"]) == 1 and len(found["female"]) == 1:
        return Roles(male=found["male"][0], female=found["female"][0])
    raise InputDataError(
        f"WinoBias item {item_id}: cannot tell its roles from the occupation lists (male-coded "
        f"found: {found['male'] or 'none'}; female-coded found: {found['female'] or 'none'})",
        "list the item with its {male, female} occupations in the file of "
        "winobias.study_roles, or add its occupations to the sentence file's `occupations`")


@dataclass(frozen=True)
class PairedItem:
    """One WinoBias request design: a sentence and its two portraits (source rows), first
    image first."""

    item: WinoBiasItemRecord
    first: Mapping[str, Any]
    second: Mapping[str, Any]


#: The keys every item of the study's pairs file has. :data:`STUDY_CODING_KEY` is read when
#: present; any other key is kept as the item's metadata (published files carry extra keys).
_STUDY_KEYS = ("id", "prompt", "input_image_1", "input_image_2")
STUDY_CODING_KEY = "gender_stereotype"
_STUDY_FIX = ("each item is {id, prompt, input_image_1, input_image_2} and optionally "
              "gender_stereotype: id a whole number or a string, the others non-empty strings")
#: Extensions an image name may carry; a name is also matched by its stem without them.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
#: ACRB's spellings of each source dimension, by their lower case (cell names are matched
#: without regard to case: ``black_male_40s.jpg`` is ``Black_Male_40s.jpg``).
_CELL_LABELS = {dimension: {value.lower(): value for value in values}
                for dimension, values in SOURCE_DIMENSIONS.items()}


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict(orient="records")]


def image_stem(name: str) -> str:
    """``name`` without its folders and without an image extension of
    :data:`IMAGE_EXTENSIONS` (any case); other dots stay (``a.b`` is a stem)."""
    base = PurePosixPath(name.replace("\\", "/")).name
    root, dot, extension = base.rpartition(".")
    return root if dot and root and f".{extension.lower()}" in IMAGE_EXTENSIONS else base


def parse_cell(stem: str) -> tuple[str, str, str] | None:
    """``(race, gender, age)`` in ACRB's spellings of a stem ``<Race>_<Gender>_<Age>`` with
    labels of :mod:`acrb.demographics` (the study's names: ``Black_Male_40s``,
    ``SoutheastAsian_Female_70plus``), None for any other stem."""
    parts = stem.split("_")
    if len(parts) != 3:
        return None
    race, gender, age = (_CELL_LABELS[d].get(p.lower())
                         for d, p in zip(("race", "gender", "age"), parts, strict=True))
    if race is None or gender is None or age is None:
        return None
    return race, gender, age


@dataclass(frozen=True)
class MatchedImage:
    """A study image name's source row and how it was matched (:data:`ImageMatch`)."""

    source: Mapping[str, Any]
    how: ImageMatch


class SourceMatcher:
    """The run's sources, found by the name a study file gives an image, in this order: its
    ``source_id``; a source's file name; its stem (:func:`image_stem`: the name whatever its
    extension, ``.jpg``, ``.jpeg``, ``.png`` or none) as a ``source_id`` or a source's file stem;
    its ``<Race>_<Gender>_<Age>`` cell (:func:`parse_cell`) in the sources' ``race``,
    ``gender`` and ``age`` labels. The cell is what lets a stand-in run (placeholder portraits
    named ``syn-Black-Male-40s-0``) take the study's ``Black_Male_40s.jpg``: the study's design
    has one portrait per cell. A cell with several sources gives the first by ``source_id``
    (deterministic); a file name or stem shared by two sources is left out, so it cannot pick
    the wrong one."""

    def __init__(self, sources: pd.DataFrame) -> None:
        rows = sorted(_records(sources), key=lambda r: str(r["source_id"]))
        self._by_id = {str(row["source_id"]): row for row in rows}
        self._by_name = self._unique(rows, lambda row: PurePosixPath(str(row["path"])).name)
        self._by_stem = self._unique(rows, lambda row: image_stem(str(row["path"])))
        self._by_cell: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        for row in rows:
            cell = (str(row["race"]), str(row["gender"]), str(row["age"]))
            self._by_cell.setdefault(cell, row)

    @staticmethod
    def _unique(rows: Sequence[Mapping[str, Any]], name: Any) -> dict[str, Mapping[str, Any]]:
        found: dict[str, list[Mapping[str, Any]]] = {}
        for row in rows:
            found.setdefault(name(row), []).append(row)
        return {key: hits[0] for key, hits in found.items() if len(hits) == 1}

    def match(self, name: str) -> MatchedImage | None:
        """The source ``name`` names and how, None when it names none."""
        if name in self._by_id:
            return MatchedImage(self._by_id[name], "source_id")
        base = PurePosixPath(name.replace("\\", "/")).name
        if base in self._by_name:
            return MatchedImage(self._by_name[base], "file_name")
        stem = image_stem(name)
        if stem in self._by_id:
            return MatchedImage(self._by_id[stem], "stem")
        if stem in self._by_stem:
            return MatchedImage(self._by_stem[stem], "stem")
        cell = parse_cell(stem)
        if cell is not None and cell in self._by_cell:
            return MatchedImage(self._by_cell[cell], "cell")
        return None


def load_roles_mapping(path: Path | str) -> dict[str, Roles]:
    """A study roles mapping: ``{item id: {male, female}}`` (YAML or JSON)."""
    path = Path(path)
    data = _read_structured(path, "WinoBias roles mapping", "winobias.study_roles")
    if not isinstance(data, dict):
        raise InputDataError(f"WinoBias roles mapping {path} must map item ids to "
                             "{male, female}", "fix the file")
    roles = {}
    for item_id, value in data.items():
        try:
            roles[str(item_id)] = Roles.model_validate(value)
        except ValidationError as exc:
            raise InputDataError(f"WinoBias roles mapping {path}, item {item_id}: "
                                 f"{exc.errors()[0]['msg']}",
                                 "give each item {male: <occupation>, female: <occupation>}"
                                 ) from None
    return roles


def _study_id(entry: Mapping[str, Any], where: str) -> str:
    """An item's id as a string: the study's files use JSON integers (its code filters
    ``start_id <= id <= end_id``), other copies strings; a bool, float or null is refused."""
    if "id" not in entry:
        raise InputDataError(f"{where}: field id is missing", _STUDY_FIX)
    value = entry["id"]
    if isinstance(value, bool) or not isinstance(value, int | str) \
            or (isinstance(value, str) and not value.strip()):
        kind = "null" if value is None else type(value).__name__
        raise InputDataError(f"{where}: field id is {json.dumps(value)} ({kind}), not a whole "
                             "number or a non-empty string", _STUDY_FIX)
    return str(value).strip()


def _study_text(entry: Mapping[str, Any], key: str, where: str) -> str:
    if key not in entry:
        raise InputDataError(f"{where}: field {key} is missing", _STUDY_FIX)
    value = entry[key]
    if not isinstance(value, str) or not value.strip():
        raise InputDataError(f"{where}: field {key} is {json.dumps(value)}, not a non-empty "
                             "string", _STUDY_FIX)
    return value


RoleCoding = Literal["male", "female"]


def _listed_coding(occupation: str, occupations: Occupations | None) -> RoleCoding | None:
    """How the occupation lists code ``occupation`` (None: not listed, or no lists)."""
    if occupations is None:
        return None
    if occupation.lower() in {o.lower() for o in occupations.male}:
        return "male"
    if occupation.lower() in {o.lower() for o in occupations.female}:
        return "female"
    return None


def study_coding_roles(where: str, item_id: str, prompt: str, stereotyped: str,
                       coding: RoleCoding, occupations: Occupations | None,
                       mapped: Roles | None = None) -> tuple[Roles, bool]:
    """The roles of a study item that carries its own coding, and whether ACRB's other coding
    of it disagrees.

    ``stereotyped`` is the item's ``gender_stereotype``: the occupation the study codes as
    stereotyped, as the prompt writes it; ``coding`` its stereotyped gender (the gender of the
    item's first image, the study's design). The study's coding is kept: ``stereotyped`` is the
    ``coding`` role. The other role is the item's other occupation: that of its
    ``winobias.study_roles`` entry (``mapped``) when it has one, else the other occupation the
    occupation lists find in the prompt. The second value is True when that other coding
    (the mapping, else the lists) puts either occupation in the other role.
    InputDataError naming the item and field: ``stereotyped`` not in the prompt, not an
    occupation of the mapping entry, or no other occupation to be found."""
    other: RoleCoding = "female" if coding == "male" else "male"
    field = f"{where}: field {STUDY_CODING_KEY} {stereotyped!r}"
    if not _occurs(stereotyped, prompt):
        raise InputDataError(f"{field} does not occur in the prompt",
                             f"{STUDY_CODING_KEY} names the stereotyped occupation as the "
                             "prompt writes it (e.g. \"janitor\")")
    if mapped is not None:
        pair = {mapped.male.lower(): "male", mapped.female.lower(): "female"}
        if stereotyped.lower() not in pair:
            raise InputDataError(f"{field} is neither occupation of its winobias.study_roles "
                                 f"entry ({mapped.male}, {mapped.female})",
                                 "make the mapping entry name the same two occupations")
        rest = mapped.female if pair[stereotyped.lower()] == "male" else mapped.male
        roles = Roles.model_validate({coding: stereotyped, other: rest})
        return roles, pair[stereotyped.lower()] != coding
    candidates: list[str] = []
    if occupations is not None:
        try:
            matched = match_roles(item_id, prompt, occupations)
        except InputDataError:
            matched = None
        if matched is not None:
            # Both roles found: the other occupation is the one that is not the study's.
            candidates = [o for o in (getattr(matched, other), getattr(matched, coding))
                          if o.lower() != stereotyped.lower()][:1]
        else:
            names = sorted({*occupations.male, *occupations.female}, key=len, reverse=True)
            hits = [n for n in names if _occurs(n, prompt) and n.lower() != stereotyped.lower()
                    and not _occurs(n, stereotyped) and not _occurs(stereotyped, n)]
            candidates = [h for h in hits if not any(h != o and _occurs(h, o) for o in hits)]
    if len(candidates) != 1:
        raise InputDataError(
            f"{field}: cannot tell the item's other occupation (occupations found besides it: "
            f"{candidates or 'none'}{'' if occupations else '; no occupation lists'})",
            "list the item with its {male, female} occupations in the file of "
            "winobias.study_roles, or add its occupations to the sentence file's `occupations`")
    rest = candidates[0]
    roles = Roles.model_validate({coding: stereotyped, other: rest})
    disagree = _listed_coding(stereotyped, occupations) == other \
        or _listed_coding(rest, occupations) == coding
    return roles, disagree


def load_study_file(path: Path | str, sources: pd.DataFrame,
                    occupations: Occupations | None,
                    roles: Mapping[str, Roles] | None = None) -> list[PairedItem]:
    """The study's WinoBias pairs, mapped onto the run's sources.

    ``path`` is a JSON list of ``{id, prompt, input_image_1, input_image_2}`` items, as the
    study publishes it (``id`` a JSON integer; a string is read too, and kept as a string), and
    optionally ``gender_stereotype`` (the study's own coding, see the module docstring); any
    other key is kept in the item's ``metadata``. Each image is matched to a source of
    ``sources`` (the run's sources table) by :class:`SourceMatcher`: source id, file name,
    stem whatever the extension, or race/gender/age cell; the item records how, and both
    images' source, race, gender and age. Pairs may cross races (the study's do). Refused with
    an InputDataError naming the item and the field: a missing key, a key an item repeats, an
    id that is a bool, float or null, a value that is not a non-empty string, a duplicate id, an
    image matching no source, two images of the same gender, a ``gender_stereotype`` that is
    not an occupation of the prompt, roles that cannot be told; naming the file, what JSON
    cannot read (:mod:`acrb.yaml_input`). The file's name and sha256 are kept on each item.
    """
    path = Path(path)
    data = _read_structured(path, "WinoBias study file", "winobias.study_file")
    if not isinstance(data, list) or not data:
        raise InputDataError(f"WinoBias study file {path} must be a non-empty JSON list",
                             _STUDY_FIX)
    matcher = SourceMatcher(sources)
    sha = sha256_file(path)
    roles = dict(roles or {})
    seen: set[str] = set()
    paired = []
    for position, entry in enumerate(data):
        where = f"WinoBias study file {path}, entry {position}"
        if not isinstance(entry, dict):
            raise InputDataError(f"{where} is not an object", _STUDY_FIX)
        raw_id = entry.get("id")
        if raw_id is not None and not isinstance(raw_id, bool | dict | list):
            where += f" (id {raw_id})"
        item_id = _study_id(entry, where)
        where = f"WinoBias study file {path}, item {item_id}"
        if item_id in seen:
            raise InputDataError(f"WinoBias study file {path}: duplicate id {item_id}",
                                 "give every item its own id")
        seen.add(item_id)
        prompt = _study_text(entry, "prompt", where)
        names = [_study_text(entry, key, where) for key in ("input_image_1", "input_image_2")]
        stereotyped = _study_text(entry, STUDY_CODING_KEY, where) \
            if STUDY_CODING_KEY in entry else None
        images = []
        for key, name in zip(("input_image_1", "input_image_2"), names, strict=True):
            matched = matcher.match(name)
            if matched is None:
                raise InputDataError(
                    f"{where}: field {key} {name!r} is not among the run's sources (by "
                    "source_id, file name, stem or <Race>_<Gender>_<Age> cell)",
                    "curate that portrait into the source set, or fix the name in the file")
            images.append(matched)
        first, second = images[0].source, images[1].source
        if first["gender"] == second["gender"]:
            raise InputDataError(
                f"{where}: both images are {first['gender']} ({first['source_id']}, "
                f"{second['source_id']})", "a WinoBias item pairs one male and one female "
                "portrait")
        if not {str(first["gender"]), str(second["gender"])} <= {"Male", "Female"}:
            raise InputDataError(f"{where}: images of genders other than Male and Female",
                                 "fix the pair")
        roles_from: Literal["mapping", "matched", "study"]
        stereotype_role: Literal["male", "female", ""] = ""
        disagree = False
        if stereotyped is not None:
            # The study's design: the first image shows the person of the stereotyped gender
            # (its evaluation counts "the first image's person took it" as followed).
            stereotype_role = "male" if first["gender"] == "Male" else "female"
            item_roles, disagree = study_coding_roles(
                where, item_id, prompt, stereotyped, stereotype_role, occupations,
                roles.get(item_id))
            roles_from = "study"
        elif item_id in roles:
            item_roles, roles_from = roles[item_id], "mapping"
        elif occupations is not None:
            item_roles, roles_from = match_roles(item_id, prompt, occupations), "matched"
        else:
            raise InputDataError(f"{where}: no {STUDY_CODING_KEY}, no roles mapping entry and "
                                 "no occupation lists to match",
                                 "set winobias.study_roles, or a sentence file with "
                                 "`occupations`")
        extra = {k: v for k, v in entry.items() if k not in (*_STUDY_KEYS, STUDY_CODING_KEY)}
        item = WinoBiasItemRecord(
            prompt_id=item_id, text=prompt, male_role=item_roles.male,
            female_role=item_roles.female, roles_from=roles_from, origin="study",
            file=path.name, file_sha256=sha, stereotype_role=stereotype_role,
            roles_disagree=disagree, metadata=canonical_json(extra) if extra else "",
            **_image_fields("first", names[0], images[0]),
            **_image_fields("second", names[1], images[1]))
        paired.append(PairedItem(item, first, second))
    return paired


def _image_fields(which: str, name: str, matched: MatchedImage) -> dict[str, Any]:
    source = matched.source
    return {f"{which}_image": name, f"{which}_match": matched.how,
            f"{which}_source_id": str(source["source_id"]), f"{which}_race": str(source["race"]),
            f"{which}_gender": str(source["gender"]), f"{which}_age": str(source["age"])}


def balanced_design(sentences: SentenceSet, sources: pd.DataFrame, pairs_per_race: int,
                    seed: int) -> list[PairedItem]:
    """Every sentence with ``pairs_per_race`` male-female pairs of each race in ``sources``.

    A pair is a male and a female source of the same race, drawn without replacement per
    sentence and race: pairs of the same age first, pairs of different ages only when the
    same-age pairs run out (a ConfigError when the race has fewer distinct pairs than asked).
    In each race, the male portrait is the first image in half of the
    requests (one more or less for an odd count), at random positions: which image comes first
    cannot then explain a preference for either gender. Deterministic given ``seed``.
    """
    rng = np.random.default_rng(seed)
    rows = sorted(_records(sources), key=lambda r: str(r["source_id"]))
    items = [WinoBiasItemRecord(
        prompt_id=s.id, text=s.prompt, male_role=s.roles.male, female_role=s.roles.female,
        roles_from="file", origin="sentences", file=sentences.label,
        file_sha256=sentences.sha256) for s in sentences.sentences]
    races = [r for r in RACES if any(row["race"] == r for row in rows)] + sorted(
        {str(row["race"]) for row in rows} - set(RACES))
    design = []
    for race in races:
        men = [r for r in rows if r["race"] == race and r["gender"] == "Male"]
        women = [r for r in rows if r["race"] == race and r["gender"] == "Female"]
        if not men or not women:
            continue  # a race without both genders has no pairs
        same_age = [(m, w) for m in men for w in women if m["age"] == w["age"]]
        other_age = [(m, w) for m in men for w in women if m["age"] != w["age"]]
        if pairs_per_race > len(same_age) + len(other_age):
            raise ConfigError(
                f"winobias.pairs_per_race is {pairs_per_race}, but race {race} has only "
                f"{len(same_age) + len(other_age)} distinct male-female pairs of sources",
                "lower winobias.pairs_per_race, or add sources of that race")
        slots = len(items) * pairs_per_race
        male_first = np.array([True] * ((slots + 1) // 2) + [False] * (slots // 2))
        rng.shuffle(male_first)
        slot = 0
        for item in items:
            # Same-age pairs first; pairs of different ages only when those run out.
            order = [same_age[int(k)] for k in rng.permutation(len(same_age))] + \
                [other_age[int(k)] for k in rng.permutation(len(other_age))]
            for man, woman in order[:pairs_per_race]:
                first, second = (man, woman) if male_first[slot] else (woman, man)
                design.append(PairedItem(item, first, second))
                slot += 1
    return design


@dataclass(frozen=True)
class WinoBiasPlan:
    """The WinoBias part of a plan: its items, its requests, the editors it skipped
    (model -> reason) and how many study items' own coding disagrees with ACRB's
    (``roles_disagree``; the study's coding is used)."""

    items: list[WinoBiasItemRecord]
    requests: list[RequestRecord]
    skipped: dict[str, str]
    role_disagreements: int = 0


def paired_items(sources: pd.DataFrame, ctx: StageContext) -> list[PairedItem]:
    """The design of params ``winobias``: the study file's pairs when ``study_file`` is set,
    else the builder's (:func:`balanced_design`) over the sentence file."""
    cfg = ctx.params.winobias
    assert cfg is not None
    sentences = load_sentences(ctx.path(cfg.sentences))
    if cfg.study_file:
        roles = load_roles_mapping(ctx.path(cfg.study_roles)) if cfg.study_roles else None
        return load_study_file(ctx.path(cfg.study_file), sources, sentences.occupations, roles)
    return balanced_design(sentences, sources, cfg.pairs_per_race, cfg.seed)


def plan_winobias(sources: pd.DataFrame, ctx: StageContext) -> WinoBiasPlan:
    """The WinoBias requests of params ``winobias`` for every editor that takes two images,
    one per design pair and seed of ``plan.seeds``, in the plain arm; editors that take one
    image are skipped and named with the reason (generators are not editors: left out
    silently). Empty without ``winobias``."""
    if ctx.params.winobias is None:
        return WinoBiasPlan([], [], {})
    design = paired_items(sources, ctx)
    if not design:
        raise ConfigError("the WinoBias design has no pairs: no race has both a male and a "
                          "female source", "add portraits of both genders to the sources")
    items = list({p.item.prompt_id: p.item for p in design}.values())
    disagreements = [i.prompt_id for i in items if i.roles_disagree]
    if disagreements:
        log.warning("WinoBias: %d study item(s) code their roles otherwise than the occupation "
                    "lists or the roles mapping; the study's gender_stereotype is used (items "
                    "%s)", len(disagreements), ", ".join(disagreements[:10]))
    requests: list[RequestRecord] = []
    skipped: dict[str, str] = {}
    for name, entry in ctx.params.models.items():
        model_class = entry.model_class()
        config = entry.typed_config()
        if model_class.task != "i2i":
            continue  # a generator edits nothing: not an editor left out
        limit = model_class.source_image_limit(config)
        if limit < 2:
            skipped[name] = f"takes {limit} source image per request; WinoBias edits two"
            continue
        revision = entry.resolved_revision()
        output_config = model_class.id_config(config, WINOBIAS_ARM, "winobias")
        for pair, seed in ((p, s) for p in design for s in ctx.params.plan.seeds):
            requests.append(_request(name, entry.key, revision, entry.settings, output_config,
                                     pair, seed))
    return WinoBiasPlan(items, requests, skipped, len(disagreements))


def _request(name: str, key: str, revision: str, settings: dict[str, Any],
             output_config: dict[str, Any], pair: PairedItem, seed: int) -> RequestRecord:
    first, second, item = pair.first, pair.second, pair.item
    request_id = request_id_for(
        model_key=key, model_revision=revision, settings=settings,
        source_sha256=str(first["sha256"]), prompt_text=item.text, seed=seed, arm=WINOBIAS_ARM,
        extra_source_sha256s=[str(second["sha256"])], output_config=output_config)
    return RequestRecord(
        request_id=request_id, model=name, model_key=key, model_revision=revision,
        settings=dump_settings(settings), source_id=str(first["source_id"]),
        source_path=str(first["path"]), source_sha256=str(first["sha256"]),
        prompt_id=item.prompt_id, prompt_text=item.text, category=WINOBIAS_CATEGORY,
        attribute=f"occupation:{item.male_role}", congruence="neutral", seed=seed,
        arm=WINOBIAS_ARM, race=str(first["race"]), gender=str(first["gender"]),
        age=str(first["age"]), mode="i2i", base_id=item.prompt_id,
        extra_sources=canonical_json([{"source_id": second["source_id"],
                                       "path": second["path"], "sha256": second["sha256"]}]),
        experiment="winobias")


def male_position(gender_of_first: str) -> Literal["first", "second"]:
    """Which input image shows the man, given the first image's gender."""
    return "first" if gender_of_first == "Male" else "second"


def write_skipped(path: Path, skipped: Mapping[str, str]) -> None:
    """The editors left out of the WinoBias experiment, as CSV ``model, reason``."""
    from acrb.storage import write_csv

    frame = pd.DataFrame(sorted(skipped.items()), columns=["model", "reason"])
    write_csv(frame, path)


def read_items(path: Path) -> dict[str, WinoBiasItemRecord]:
    """The WinoBias items the plan wrote, by prompt id (empty when there are none)."""
    from acrb.records import read_table

    if not path.exists():
        return {}
    frame = read_table(path, WinoBiasItemRecord)
    return {str(r["prompt_id"]): WinoBiasItemRecord.model_validate(r)
            for r in frame.to_dict(orient="records")}


def role_counts(design: Sequence[PairedItem]) -> pd.DataFrame:
    """Requests per race and which gender comes first (a check of the balance)."""
    return pd.DataFrame([{"race": p.first["race"], "male_first": p.first["gender"] == "Male"}
                         for p in design]).value_counts().rename("n").reset_index()
