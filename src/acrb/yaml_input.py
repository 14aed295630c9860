"""Reading a YAML file a user edits (params, catalogs, attributes, rubrics, profiles): strictly.

PyYAML accepts a mapping that repeats a key and keeps the last value, so a second `generate:`
section in params.yaml silently replaces the first. Every user YAML is read here instead: bytes
that are not UTF-8, a repeated key at any level and a syntax error are each refused with one
line naming the file and the line (1-based, as editors count).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode

from acrb.errors import AcrbError, InputDataError

_MERGE_TAG = "tag:yaml.org,2002:merge"
_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DuplicateKeyError(yaml.YAMLError):
    """A mapping repeats a key; ``first_line`` and ``line`` are 1-based."""

    def __init__(self, key: Any, first_line: int, line: int) -> None:
        self.key, self.first_line, self.line = key, first_line, line
        super().__init__(f"key {key!r} appears twice, on lines {first_line} and {line}")


class StrictSafeLoader(_BaseLoader):  # type: ignore[valid-type, misc]
    """``yaml.SafeLoader`` that refuses a mapping with a repeated key (merge keys ``<<``
    may still override, as YAML defines)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise DuplicateKeyError(key, first, line)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def decode_utf8(data: bytes, path: Path | str, *, what: str,
                error: type[AcrbError] = InputDataError) -> str:
    """``data`` as text (a leading byte-order mark dropped), or ``error`` naming the line and
    column of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(f"{what} {path} line {line}, column {column}: byte "
                    f"0x{data[exc.start]:02x} is not UTF-8 text",
                    "save the file as UTF-8 (or retype the character there)") from None


def parse_yaml(data: bytes, path: Path | str, *, what: str,
               error: type[AcrbError] = InputDataError) -> Any:
    """The document in ``data`` (the bytes of ``path``), or ``error`` naming ``what`` ``path``
    and the line of the first bad byte, repeated key or syntax error.

    A UTF-8 byte-order mark is accepted (editors on Windows write one).
    """
    text = decode_utf8(data, path, what=what, error=error)
    try:
        return yaml.load(text, Loader=StrictSafeLoader)  # a SafeLoader: no arbitrary objects
    except DuplicateKeyError as exc:
        raise error(f"{what} {path}: key {exc.key!r} appears twice, on lines {exc.first_line} "
                    f"and {exc.line} (YAML would keep only the last)",
                    "merge the two into one entry, or delete the one you do not mean") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise error(f"{what} {path} is not valid YAML{where}: {problem}",
                    "fix the YAML syntax there (indentation, a missing ':' or quote)") from None
    except yaml.YAMLError as exc:
        one_line = " ".join(str(exc).split())
        raise error(f"{what} {path} is not valid YAML: {one_line}", "fix the YAML syntax") from None


def read_yaml(path: Path | str, *, what: str, error: type[AcrbError] = InputDataError,
              missing_fix: str = "check the path") -> Any:
    """``parse_yaml`` of the file at ``path``; a missing file or a folder is ``error`` too."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} {path} not found", missing_fix) from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a folder, not a file", missing_fix) from None
    except PermissionError:
        raise error(f"{what} {path} cannot be read (permission denied)",
                    f"make it readable: chmod u+r {path}") from None
    return parse_yaml(data, path, what=what, error=error)
