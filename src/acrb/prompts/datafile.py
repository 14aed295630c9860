"""Reading the versioned YAML data files of the prompt set (catalog, base prompts, attributes)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from acrb.demographics import SOURCE_DIMENSIONS, other_groups
from acrb.errors import InputDataError
from acrb.yaml_input import read_yaml

M = TypeVar("M", bound=BaseModel)


class VersionedDataFile(BaseModel):
    """The head every data file shares: a name and a version, cited as ``name@version``."""

    model_config = ConfigDict(extra="forbid")
    name: str
    version: int

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"


def check_not_blank(value: str | None) -> str | None:
    """A prompt text must say something: empty or whitespace-only text is refused (a model
    given it would edit with no instruction, and its outcome would be counted)."""
    if value is not None and not value.strip():
        raise ValueError("is blank (empty or only whitespace): write the text, or delete the "
                         "entry")
    return value


def check_source_selectors(value: list[str], field: str = "congruent_with") -> list[str]:
    """``congruent_with`` / ``incongruent_with`` entries must name a source group, as
    ``race:Black``."""
    for selector in value:
        dimension, _, group = selector.partition(":")
        if group not in SOURCE_DIMENSIONS.get(dimension, ()):
            raise ValueError(
                f"{field} selector {selector!r} must be one of "
                + ", ".join(f"{d}:<{'|'.join(v)}>" for d, v in SOURCE_DIMENSIONS.items())
            )
    return value


def congruence_link_problem(congruent: list[str], incongruent: list[str]) -> str | None:
    """Why a pair of congruence lists cannot be used for SCS, or None if they can.

    Both sides are data: a group in both lists is contradictory, and congruent groups without
    incongruent ones leave SCS without its incongruent side (ACRB no longer reads "every other
    group" into an empty list)."""
    both = sorted(set(congruent) & set(incongruent))
    if both:
        return f"groups {both} are in both congruent_with and incongruent_with"
    if congruent and not incongruent:
        return ("congruent_with is set but incongruent_with is empty: list the incongruent "
                "groups too (for every other group of the same dimensions: "
                + ", ".join(other_groups(congruent)) + ")")
    return None


def load_data_file(path: Path, model: type[M], what: str, param: str) -> M:
    """Read and validate one YAML data file; errors name the file, the entry and the fix."""
    if not path.exists():
        raise InputDataError(f"{what} {path} not found",
                             f"set {param} in params.yaml to an existing YAML file")
    data = read_yaml(path, what=what, missing_fix=f"set {param} in params.yaml to an existing "
                     "YAML file")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        entry_id = entry_id_at(data, first["loc"])
        entry = "" if entry_id is None else f" entry {entry_id}"
        raise InputDataError(f"{what} {path}{entry}: {where}: {first['msg']}",
                             "fix that entry (the file's header describes the format)") from exc


def entry_id_at(data: Any, loc: tuple[Any, ...]) -> Any:
    """The id of the innermost list entry on the path ``loc`` into ``data``, or None: a
    validation error then names the entry as a user knows it (``entry A04``)."""
    entry_id = None
    node = data
    for part in loc:
        if isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node):
            node = node[part]
            if isinstance(node, dict) and node.get("id") is not None:
                entry_id = node["id"]
        else:
            node = node.get(part) if isinstance(node, dict) else None
    return entry_id


def check_entries(what: str, path: Path, ids: Iterable[str], groups: Iterable[str],
                  declared: Iterable[str], *, entry_word: str, group_word: str, fix: str) -> None:
    """Entries exist, their ids are unique and every group they use is declared."""
    ids = list(ids)
    if not ids:
        raise InputDataError(f"{what} {path} has no {entry_word}", fix)
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise InputDataError(f"{what} {path}: duplicate ids {duplicates}",
                             "give every entry a unique id")
    unknown = sorted(set(groups) - set(declared))
    if unknown:
        raise InputDataError(f"{what} {path}: entries use undeclared {group_word} {unknown}",
                             f"declare them under '{group_word}:'")
