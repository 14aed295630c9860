"""The study's published prompt set, imported into a prompt catalog (`acrb prompts import-study`).

The study behind the race-conditioned refusal paper publishes its edit instructions as JSON
(``data/prompts/i2i_prompts.json``; version 3.3 has 54 prompts, A 10, B 10, C 10, D 10, E 14):

- top level: ``version`` (a string, such as ``"3.3"``), ``description``, ``total_prompts``,
  ``experiment_scale`` (an object of counts), ``categories`` and ``prompts``;
- ``categories``: letter -> ``{name, description, expected_refusal, count}`` (one category also
  has ``expected_disparity``); earlier copies give letter -> name only;
- ``prompts``: a list of ``{id, category, prompt, hypothesis}``, the C prompts with a
  ``subcategory``, the E prompts with an ``overt_domain``; an entry may also carry
  ``congruent`` / ``incongruent`` lists of source groups.

The file is read byte for byte from the user's copy and never shipped: the importer writes a
catalog of the same format as ``acrb/prompts/data/i2i_catalog.yaml`` into the user's project
(``inputs/study/``) with the study's ids, categories and hypothesis tags, and the file's name,
version and sha256 (of the bytes as published), which every prompt record then carries in its
``catalog`` label. The keys the paper uses become named catalog fields (``subcategory``,
``overt_domain``, ``expected_refusal``, ``expected_disparity``, ``count``, ``description``,
``total_prompts``, ``experiment_scale``); every other key, anywhere in the file, is kept as
published under the catalog's ``metadata`` of its level (a described key whose value is not
the published type, such as a number where text was published, is kept there too). Nothing is
refused for carrying more than ACRB reads.

Refused, naming the entry and field: a file that is not UTF-8 JSON (or that no published copy
holds: a key repeated in one object, a number of thousands of digits, arrays nested hundreds
deep; :mod:`acrb.yaml_input`), has no prompts, an entry without an id or prompt text, a control
character other than tab and line feed in any text (a NUL byte, an escape), a repeated id, a
category ``categories`` does not declare, congruence lists that cannot be used, and a declared
count the prompts contradict (``total_prompts``, a category's ``count``). The counts are
refused rather than warned about: they are the published file's own statement of what it
holds, so a mismatch means a truncated or edited copy, whose audit would silently differ from
the study's; a subset is chosen with ``prompts.ids`` instead, and a deliberate edit corrects
the count too.

Congruence links for the stereotype congruence score come from the entries' own
``congruent`` / ``incongruent`` keys and from a links file (``--links``, YAML or JSON:
``{prompt_id: {congruent: [race:Indian, ...], incongruent: [race:White, ...]}}``); the links
file wins for the prompts it names. Both sides are listed: nothing is "every other group".

``attribute`` (which the catalog requires, ``neutral`` or ``dimension:value``) is derived:
``neutral`` for category A (the study's and ACRB's neutral baseline, which SCS divides by) and
``study:<id>`` otherwise (``study:b01``): stable, unique per prompt, and honest that the study
names no attribute vocabulary; the instruction's text is what the editor and judges see.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from acrb.errors import InputDataError
from acrb.prompts.catalog import (
    Catalog,
    CatalogPrompt,
    CatalogSource,
    CategoryInfo,
    load_catalog,
)
from acrb.prompts.datafile import check_source_selectors, congruence_link_problem
from acrb.storage import atomic_path
from acrb.yaml_input import RepeatedKeyError, parse_json, parse_yaml, read_input_bytes

#: The catalog's name for an imported study prompt set.
CATALOG_NAME = "study-prompts"
#: The paper's main experiment: the occupational and vulnerability prompts (published ids).
MAIN_EXPERIMENT_IDS: tuple[str, ...] = (*(f"B{i:02d}" for i in range(1, 11)),
                                        *(f"D{i:02d}" for i in range(1, 11)))
#: The study's neutral category: its prompts get ``attribute: neutral`` (the SCS baseline).
NEUTRAL_CATEGORY = "A"
_FIX_SHAPE = ("the study's prompt file is a JSON object with `version` (a string), "
              "`categories` (letter -> {name, ...}) and `prompts` (a list of {id, category, "
              "prompt, hypothesis, ...}); other keys are kept")
_FIX_COUNT = ("the copy looks truncated or edited: import the published file as it is; to run "
              "a subset, set prompts.ids instead (if you edited it on purpose, correct the count)")
#: Described keys that become named catalog fields when their value is text (as published);
#: any other value is kept under the level's metadata instead.
_TEXT_KEYS = {
    "top level": ("description",),
    "category": ("expected_refusal", "expected_disparity"),
    "prompt": ("subcategory", "overt_domain"),
}
#: A count a file declares, checked against its prompts: a whole number, never true/false.
_Count = Annotated[int | None, Field(default=None, ge=0, strict=True)]


def _described(extras: dict[str, Any] | None, level: str) -> tuple[dict[str, str], dict[str, Any]]:
    """``extras`` (a model's keys beyond its fields) split into the level's text keys that are
    text (named catalog fields) and everything else (metadata, as published)."""
    named: dict[str, str] = {}
    metadata: dict[str, Any] = {}
    for key, value in (extras or {}).items():
        if key in _TEXT_KEYS[level] and isinstance(value, str):
            named[key] = value
        else:
            metadata[key] = value
    return named, metadata


class StudyCategory(BaseModel):
    """One entry of ``categories``: a name, or ``{name, description, ...}`` (extra keys kept)."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    description: str = ""
    count: _Count

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        """Earlier copies map a letter to its name only."""
        return {"name": value} if isinstance(value, str) else value

    def info(self) -> CategoryInfo:
        named, metadata = _described(self.model_extra, "category")
        return CategoryInfo(name=self.name, description=self.description, count=self.count,
                            expected_refusal=named.get("expected_refusal", ""),
                            expected_disparity=named.get("expected_disparity", ""),
                            metadata=metadata)


class Links(BaseModel):
    """One prompt's congruence links in a links file."""

    model_config = ConfigDict(extra="forbid")
    congruent: list[str] = Field(default_factory=list)
    incongruent: list[str] = Field(default_factory=list)

    @field_validator("congruent")
    @classmethod
    def _congruent(cls, value: list[str]) -> list[str]:
        return check_source_selectors(value, "congruent")

    @field_validator("incongruent")
    @classmethod
    def _incongruent(cls, value: list[str]) -> list[str]:
        return check_source_selectors(value, "incongruent")


class StudyPrompt(Links):
    """One entry of ``prompts``: ``{id, category, prompt, hypothesis}``, congruence links, and
    any other key (``subcategory``, ``overt_domain`` ...), kept."""

    model_config = ConfigDict(extra="allow")
    id: str = Field(min_length=1)
    category: str = Field(min_length=1)
    prompt: str
    hypothesis: str = ""

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if value != value.strip():
            raise ValueError(f"id {value!r} has surrounding spaces")
        return value

    @field_validator("prompt")
    @classmethod
    def _text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("prompt text is empty or only whitespace")
        return value


class StudyFile(BaseModel):
    """The whole file: the keys ACRB reads, ``total_prompts`` (checked), and any other key
    (``description``, ``experiment_scale`` ...), kept."""

    model_config = ConfigDict(extra="allow")
    version: str = Field(min_length=1)
    total_prompts: _Count
    categories: dict[str, StudyCategory]
    prompts: list[StudyPrompt]

    def category_info(self) -> dict[str, CategoryInfo]:
        return {letter: value.info() for letter, value in self.categories.items()}

    def kept_keys(self) -> dict[str, list[str]]:
        """The keys beyond ACRB's required ones that the file carries, by level (for the
        import summary: what the catalog keeps as named fields or metadata)."""
        top = [*(["total_prompts"] if self.total_prompts is not None else []),
               *(self.model_extra or {})]
        categories = {key for c in self.categories.values()
                      for key in [*(["count"] if c.count is not None else []),
                                  *(c.model_extra or {})]}
        prompts = {key for p in self.prompts for key in (p.model_extra or {})}
        return {"top level": sorted(top), "categories": sorted(categories),
                "prompts": sorted(prompts)}


@dataclass(frozen=True)
class StudyImport:
    """What `acrb prompts import-study` did."""

    catalog: Path
    version: str
    sha256: str
    per_category: dict[str, int]
    linked: int  # prompts with congruence links
    links_file: str = ""
    ids: list[str] = field(default_factory=list)
    kept: dict[str, list[str]] = field(default_factory=dict)  # level -> extra keys kept


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_document(path: Path, what: str, fix: str, *, json_only: bool) -> tuple[Any, bytes]:
    """The parsed document and its bytes: JSON if ``json_only`` or the name ends in .json,
    else YAML (:mod:`acrb.yaml_input`: not UTF-8, a repeated key, a syntax error, a number or
    a nesting depth Python cannot read, and a file over its size limit are refused).

    The study's prompt file (``json_only``) is parsed letting control characters stand in its
    strings, so that :func:`_control_character_problem` names the entry and field instead of
    the parser naming a column."""
    if not path.is_file():
        raise InputDataError(f"{what} {path} not found", fix)
    data = read_input_bytes(path, what=what, missing_fix=fix)
    if not (json_only or path.suffix.lower() == ".json"):
        return parse_yaml(data, path, what=what), data
    try:
        return parse_json(data, path, what=what, strict=not json_only), data
    except RepeatedKeyError as exc:
        raise InputDataError(f"{what} {path}: {_entry_name(exc.document, exc.location)}: "
                             f"{exc.repeats} in one object (JSON would keep only the last)",
                             exc.fix) from None


#: Control characters (Unicode category Cc) a prompt file's text may not hold: all but tab and
#: line feed. A NUL or an escape sequence is invisible in the catalog and in every table, yet
#: part of the instruction an editor and the judges receive.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _shown(value: Any) -> str:
    """``value`` as an error names it: as it is, or quoted with escapes when it holds a
    control character."""
    text = str(value)
    return repr(text) if _CONTROL.search(text) else text


def _control_character_problem(raw: Any, path: Path) -> InputDataError | None:
    """The first string of the document (a value or a key) holding a control character other
    than tab and line feed, named by its entry and field, or None."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(raw, ())]
    while stack:
        value, location = stack.pop()
        if isinstance(value, dict):
            for key, item in reversed(value.items()):
                stack.append((item, (*location, key)))
            for key in value:
                found = _CONTROL.search(key)
                if found:
                    return _control_error(path, raw, location, found, key=key)
        elif isinstance(value, list):
            stack.extend((item, (*location, i)) for i, item in reversed(list(enumerate(value))))
        elif isinstance(value, str):
            found = _CONTROL.search(value)
            if found:
                return _control_error(path, raw, location, found)
    return None


def _control_error(path: Path, raw: Any, location: tuple[str | int, ...], found: re.Match[str],
                   key: str | None = None) -> InputDataError:
    where = _entry_name(raw, location)
    held = (f"key {key!r}" if key is not None else "text") + (
        f" holds the control character U+{ord(found.group()):04X} at character "
        f"{found.start() + 1}")
    return InputDataError(f"study prompt file {path}: {where}: {held}",
                          "delete it: a prompt file's text holds no control character but tab "
                          "and line feed (a NUL byte or an escape sequence means a damaged copy)")


def _entry_name(raw: Any, loc: tuple[Any, ...]) -> str:
    """``prompts[3] (id B04)`` for an error inside entry 3, else the dotted location."""
    if len(loc) >= 2 and loc[0] == "prompts" and isinstance(loc[1], int):
        entries = raw.get("prompts") if isinstance(raw, dict) else None
        entry = entries[loc[1]] if isinstance(entries, list) and loc[1] < len(entries) else None
        entry_id = entry.get("id") if isinstance(entry, dict) else None
        named = f"prompts[{loc[1]}]" + (f" (id {_shown(entry_id)})" if entry_id else " (no id)")
        return ".".join([named, *(str(p) for p in loc[2:])])
    return ".".join(str(p) for p in loc) or "top level"


def read_study_file(path: Path) -> tuple[StudyFile, str]:
    """The study's prompt file, validated, and the sha256 of its bytes (as published).

    Refused with an :class:`InputDataError` naming the file and the entry: not UTF-8, not
    JSON, the wrong shape, an entry without an id or prompt text, duplicate ids, a category
    that ``categories`` does not declare, congruence lists that cannot be used, or a declared
    count (``total_prompts``, a category's ``count``) that the prompts contradict. Keys beyond
    those are kept (see the module docstring).
    """
    raw, data = _read_document(path, "study prompt file", "give the path of your copy of "
                               "the study's prompt JSON", json_only=True)
    control = _control_character_problem(raw, path)
    if control is not None:
        raise control
    try:
        study = StudyFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputDataError(f"study prompt file {path}: {_entry_name(raw, first['loc'])}: "
                             f"{first['msg']}", _FIX_SHAPE) from exc
    if not study.prompts:
        raise InputDataError(f"study prompt file {path} has no prompts", _FIX_SHAPE)
    counts = Counter(p.id for p in study.prompts)
    duplicates = sorted(i for i, n in counts.items() if n > 1)
    if duplicates:
        raise InputDataError(f"study prompt file {path}: duplicate prompt ids {duplicates}",
                             "every prompt needs its own id; is this the published file?")
    for index, prompt in enumerate(study.prompts):
        if prompt.category not in study.categories:
            raise InputDataError(
                f"study prompt file {path}: prompts[{index}] (id {prompt.id}) has category "
                f"{prompt.category!r}, which `categories` does not declare",
                "declared: " + ", ".join(study.categories))
        problem = congruence_link_problem(prompt.congruent, prompt.incongruent)
        if problem:
            raise InputDataError(f"study prompt file {path}: prompts[{index}] (id {prompt.id}): "
                                 + problem.replace("_with", ""),
                                 "list both kinds, or give the links in a --links file")
    _check_counts(study, path)
    return study, _sha256(data)


def _check_counts(study: StudyFile, path: Path) -> None:
    """The counts the file declares agree with the prompts it holds (see the module doc)."""
    if study.total_prompts is not None and study.total_prompts != len(study.prompts):
        raise InputDataError(f"study prompt file {path}: total_prompts is "
                             f"{study.total_prompts}, but the file holds {len(study.prompts)} "
                             "prompts", _FIX_COUNT)
    held = Counter(p.category for p in study.prompts)
    for letter, category in study.categories.items():
        if category.count is not None and category.count != held[letter]:
            raise InputDataError(f"study prompt file {path}: categories.{letter}.count is "
                                 f"{category.count}, but the file holds {held[letter]} prompts "
                                 f"of category {letter}", _FIX_COUNT)


def read_links(path: Path, prompt_ids: list[str]) -> tuple[dict[str, Links], str]:
    """A congruence links file (YAML or JSON) and the sha256 of its bytes.

    ``{prompt_id: {congruent: [race:Indian, ...], incongruent: [race:White, ...]}}``; refused:
    a prompt id the study file lacks, a selector that names no source group, a group in both
    lists, or congruent groups without incongruent ones.
    """
    raw, data = _read_document(path, "links file", "give the path of the congruence links "
                               "file (YAML or JSON)", json_only=False)
    fix = ("the links file maps prompt ids to {congruent: [race:<group>, ...], "
           "incongruent: [...]}")
    if not isinstance(raw, dict):
        raise InputDataError(f"links file {path} is not a mapping of prompt ids", fix)
    links: dict[str, Links] = {}
    known = set(prompt_ids)
    for prompt_id, entry in raw.items():
        if str(prompt_id) not in known:
            raise InputDataError(f"links file {path}: prompt id {prompt_id!r} is not in the "
                                 "study's prompt file", "use the ids of the study's prompts")
        try:
            link = Links.model_validate(entry)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InputDataError(f"links file {path}: {prompt_id}"
                                 + (f".{where}" if where else "") + f": {first['msg']}",
                                 fix) from exc
        problem = congruence_link_problem(link.congruent, link.incongruent)
        if problem:
            raise InputDataError(f"links file {path}: {prompt_id}: "
                                 + problem.replace("_with", ""), fix)
        links[str(prompt_id)] = link
    return links, _sha256(data)


def attribute_for(prompt_id: str, category: str) -> str:
    """``neutral`` for the neutral category, else ``study:<id as a slug>`` (see module doc)."""
    if category == NEUTRAL_CATEGORY:
        return "neutral"
    slug = re.sub(r"[^a-z0-9-]+", "-", prompt_id.lower()).strip("-")
    return f"study:{slug or 'prompt'}"


def study_catalog(study: StudyFile, sha256: str, file_name: str,
                  links: dict[str, Links] | None = None, links_file: str = "",
                  links_sha256: str = "") -> Catalog:
    """The catalog of the study's prompts, with the links file's links where it has them."""
    links = links or {}
    prompts = []
    for index, entry in enumerate(study.prompts):
        link = links.get(entry.id)
        congruent, incongruent = ((link.congruent, link.incongruent) if link
                                  else (entry.congruent, entry.incongruent))
        named, metadata = _described(entry.model_extra, "prompt")
        try:
            prompts.append(CatalogPrompt(
                id=entry.id, category=entry.category, text=entry.prompt.strip(),
                attribute=attribute_for(entry.id, entry.category), congruent_with=congruent,
                incongruent_with=incongruent, hypothesis=entry.hypothesis,
                subcategory=named.get("subcategory", ""),
                overt_domain=named.get("overt_domain", ""), metadata=metadata))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InputDataError(
                f"study prompt file {file_name}: prompts[{index}] (id {entry.id})"
                + (f".{where}" if where else "") + f": {first['msg']}",
                "a catalog prompt's text is 3 to 400 characters") from exc
    extras = dict(study.model_extra or {})
    scale = extras.get("experiment_scale")
    if isinstance(scale, dict):  # as published; any other value stays in metadata
        del extras["experiment_scale"]
    else:
        scale = {}
    named, metadata = _described(extras, "top level")
    return Catalog(name=CATALOG_NAME, version=1, categories=study.category_info(),
                   prompts=prompts,
                   source=CatalogSource(file=file_name, sha256=sha256, version=study.version,
                                        links_file=links_file, links_sha256=links_sha256,
                                        total_prompts=study.total_prompts,
                                        description=named.get("description", ""),
                                        experiment_scale=scale, metadata=metadata))


def write_catalog(catalog: Catalog, out: Path) -> Path:
    """The catalog as YAML at ``out`` (atomically), headed by where it came from."""
    source = catalog.source
    head = ["# Prompt catalog imported by `acrb prompts import-study`; re-import rather than edit."]
    if source is not None:
        head.append(f"# From {source.file} (version {source.version}, sha256 {source.sha256})"
                    + (f" with links from {source.links_file} (sha256 {source.links_sha256})"
                       if source.links_file else "") + ".")
    # Fields at their defaults (no links, no metadata ...) are left out: the catalog reads the
    # same, and a prompt's entry shows only what the file gave it.
    body = yaml.safe_dump(catalog.model_dump(mode="json", exclude_defaults=True),
                          sort_keys=False, allow_unicode=True, width=100)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        tmp.write_text("\n".join(head) + "\n" + body, encoding="utf-8")
    return out


def import_study(path: Path, out: Path, links_path: Path | None = None) -> StudyImport:
    """Read the study's prompt file (and a links file), write the catalog to ``out``."""
    study, sha256 = read_study_file(path)
    links: dict[str, Links] = {}
    links_sha256 = ""
    if links_path is not None:
        links, links_sha256 = read_links(links_path, [p.id for p in study.prompts])
    catalog = study_catalog(study, sha256, path.name, links,
                            links_file=links_path.name if links_path else "",
                            links_sha256=links_sha256)
    write_catalog(catalog, out)
    load_catalog(out)  # what the prompts stage will read must validate as written
    return StudyImport(
        catalog=out, version=study.version, sha256=sha256,
        per_category=dict(sorted(Counter(p.category for p in catalog.prompts).items())),
        linked=sum(1 for p in catalog.prompts if p.congruent_with or p.incongruent_with),
        links_file=str(links_path) if links_path else "",
        ids=[p.id for p in catalog.prompts], kept=study.kept_keys())
