"""Reading a file a user edits or imports (params, catalogs, rubrics; the study's JSON files):
strictly.

PyYAML accepts a mapping that repeats a key and keeps the last value, so a second `generate:`
section in params.yaml silently replaces the first. Every user YAML is read here instead: bytes
that are not UTF-8, a repeated key at any level and a syntax error are each refused with one
line naming the file and the line (1-based, as editors count).

Imported JSON (the study's prompt file, a survey export, the feature mapping, the WinoBias
study file) is read here too (:func:`read_json`, :func:`parse_json`), with the same refusals and
the ones Python's ``json`` would otherwise raise as a traceback: a number of more digits than
Python converts (``sys.get_int_max_str_digits``, 4,300 by default: a ``ValueError``) and arrays
or objects nested more than :data:`MAX_JSON_DEPTH` deep (a ``RecursionError``, or a crash where
the recursion limit was raised). Both are found before ``json.loads`` runs
(:func:`json_text_problem`, which the per-request records of :mod:`acrb.journal` use as well).
No file larger than :data:`MAX_INPUT_BYTES` is read (:func:`read_input_bytes`).
"""

from __future__ import annotations

import json
import re
import sys
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
    """``parse_yaml`` of the file at ``path``; a missing file, a folder or a file over
    :data:`MAX_INPUT_BYTES` is ``error`` too."""
    path = Path(path)
    data = read_input_bytes(path, what=what, error=error, missing_fix=missing_fix)
    return parse_yaml(data, path, what=what, error=error)


# --- files read whole ------------------------------------------------------------------------
#: The largest file read as an input (200 MiB). The largest input ACRB knows of, a survey export
#: of tens of thousands of ratings, is a few MB; a file a hundred times that is the wrong file,
#: and reading it whole (then parsing it) would take gigabytes of memory.
MAX_INPUT_BYTES = 200 * 1024 * 1024


def read_input_bytes(path: Path | str, *, what: str, error: type[AcrbError] = InputDataError,
                     missing_fix: str = "check the path") -> bytes:
    """The bytes of the input file ``path``, or ``error`` naming ``what`` ``path`` when it is
    missing, a folder, unreadable or larger than :data:`MAX_INPUT_BYTES`."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_INPUT_BYTES and path.is_file():
            raise error(f"{what} {path} is {size / 2**20:,.1f} MiB, more than the "
                        f"{MAX_INPUT_BYTES / 2**20:,.0f} MiB an input file may have",
                        "check that it is the file you mean (an input of this kind is a few "
                        "MB at most); if it is, split it")
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} {path} not found", missing_fix) from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a folder, not a file", missing_fix) from None
    except PermissionError:
        raise error(f"{what} {path} cannot be read (permission denied)",
                    f"make it readable: chmod u+r {path}") from None


# --- JSON --------------------------------------------------------------------------------------
#: The deepest nesting of arrays and objects an imported JSON document (or a stored record) may
#: have. The deepest ACRB reads is about 5 (a survey record's metadata); Python's ``json``
#: recurses once per level, and so does the code that walks the document afterwards.
MAX_JSON_DEPTH = 100

# A JSON string, escapes included.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


def _max_int_digits() -> int:
    """How many digits ``int()`` converts from text (0: no limit)."""
    return sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0


def _emptied(string: re.Match[str]) -> str:
    """A JSON string emptied, its line breaks kept (so that lines are still counted right)."""
    return '""' + "\n" * string.group().count("\n")


def json_text_problem(text: str | bytes) -> str | None:
    """What in the JSON ``text`` Python's ``json`` cannot read without raising a traceback (or
    crashing), found without parsing it, or None: a number with more digits than Python
    converts, or arrays and objects nested more than :data:`MAX_JSON_DEPTH` deep (with the line,
    where ``text`` has several). Strings are skipped, so text that merely holds brackets or
    digits is fine. Cheap for ordinary records: only a text with that many brackets, or that
    many digits in a row, is looked at closely."""
    digits = _max_int_digits()
    if isinstance(text, bytes):
        long_number = bool(digits) and re.search(b"[0-9]{%d}" % (digits + 1), text) is not None
        brackets = text.count(b"[") + text.count(b"{")
    else:
        long_number = bool(digits) and re.search(f"[0-9]{{{digits + 1}}}", text) is not None
        brackets = text.count("[") + text.count("{")
    if not long_number and brackets <= MAX_JSON_DEPTH:
        return None
    source = text if isinstance(text, str) else text.decode("utf-8", "replace")
    deep = brackets > MAX_JSON_DEPTH
    if _number_or_depth(_JSON_STRING.sub('""', source).encode("utf-8", "replace"),
                        long_number, deep, digits) is None:
        return None
    # Found: again with the strings' line breaks kept, to name the line (slower).
    numbered = _JSON_STRING.sub(_emptied, source).encode("utf-8", "replace")
    found = _number_or_depth(numbered, long_number, deep, digits)
    assert found is not None
    index, problem = found
    line = numbered.count(b"\n", 0, index) + 1
    return problem.format(at=f" at line {line:,}" if b"\n" in numbered else "")


def _number_or_depth(plain: bytes, long_number: bool, deep: bool, digits: int
                     ) -> tuple[int, str] | None:
    """Where in ``plain`` (JSON with its strings emptied) the first number of more than
    ``digits`` digits stands (if ``long_number``), else where the nesting first passes
    :data:`MAX_JSON_DEPTH` (if ``deep``), with the problem (``{at}`` left for the line)."""
    if long_number:
        found = re.search(b"[0-9]{%d,}" % (digits + 1), plain)
        if found:
            return found.start(), (f"a number of {len(found.group()):,} digits{{at}}, more "
                                   f"than the {digits:,} Python reads")
    if deep:
        deepest, index = _nesting_depth(plain)
        if deepest > MAX_JSON_DEPTH:
            return index, (f"arrays and objects nested too deeply{{at}} ({deepest:,} levels, "
                           f"more than the {MAX_JSON_DEPTH} ACRB reads)")
    return None


def _nesting_depth(plain: bytes) -> tuple[int, int]:
    """The deepest level the brackets of ``plain`` (JSON with its strings emptied) reach, and
    the index where they first pass :data:`MAX_JSON_DEPTH`. A running count, so an unclosed
    bracket counts too; in chunks, so that memory stays small."""
    import numpy as np

    codes = np.frombuffer(plain, dtype=np.uint8)
    deepest = level = 0
    first = -1
    chunk = 1 << 22
    for start in range(0, len(codes), chunk):
        part = codes[start:start + chunk]
        steps = ((part == ord("[")) | (part == ord("{"))).astype(np.int64) \
            - ((part == ord("]")) | (part == ord("}")))
        levels = level + np.cumsum(steps)
        if first < 0 and levels.size and levels.max() > MAX_JSON_DEPTH:
            first = start + int(np.argmax(levels > MAX_JSON_DEPTH))
        deepest = max(deepest, int(levels.max(initial=0)))
        level = int(levels[-1]) if levels.size else level
    return deepest, first


class RepeatedKeyError(InputDataError):
    """A JSON object repeats a key (``json`` would keep the last silently, as YAML does).

    ``keys``: the keys repeated in that object; ``location``: where the object is (keys and
    list indices from the top, ``()`` for the top level); ``document``: the whole document as
    parsed (each object with the last of its repeated values), for naming the entry.
    """

    def __init__(self, problem: str, fix: str, *, keys: list[str],
                 location: tuple[str | int, ...], document: Any) -> None:
        super().__init__(problem, fix)
        self.keys, self.location, self.document = keys, location, document

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:
        return InputDataError, (self.problem, self.fix)

    @property
    def repeats(self) -> str:
        """``key 'x' appears twice`` (or ``keys 'x', 'y' each appear twice``)."""
        return _repeats(self.keys)


def _repeats(keys: list[str]) -> str:
    if len(keys) == 1:
        return f"key {keys[0]!r} appears twice"
    return f"keys {', '.join(repr(k) for k in keys)} each appear twice"


#: The fix for a repeated key.
REPEATED_KEY_FIX = "merge the two into one, or delete the one you do not mean"


def json_location(location: tuple[str | int, ...]) -> str:
    """``prompts[3].metadata`` for ``("prompts", 3, "metadata")``; ``top level`` for ``()``."""
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location)
    return text.lstrip(".") or "top level"


def _find(document: Any, target: int) -> tuple[str | int, ...]:
    """Where in ``document`` the object whose ``id()`` is ``target`` stands (depth-first,
    without recursion)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(document, ())]
    while stack:
        value, location = stack.pop()
        if id(value) == target:
            return location
        if isinstance(value, dict):
            stack.extend((v, (*location, k)) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((v, (*location, i)) for i, v in reversed(list(enumerate(value))))
    return ()


def parse_json(data: bytes | str, path: Path | str, *, what: str, strict: bool = True) -> Any:
    """The JSON document in ``data`` (the bytes of ``path``), or an :class:`InputDataError`
    naming ``what`` ``path`` for bytes that are not UTF-8, a syntax error (line and column), a
    number or a nesting depth Python cannot read (:func:`json_text_problem`), or a repeated key
    (:class:`RepeatedKeyError`, naming where).

    A UTF-8 byte-order mark is accepted. ``strict=False`` lets control characters stand inside
    strings (for a caller that refuses them by field itself, naming the entry).
    """
    text = decode_utf8(data, path, what=what) if isinstance(data, bytes) else data
    problem = json_text_problem(text)
    if problem is not None:
        raise InputDataError(f"{what} {path} cannot be read: it holds {problem}",
                             "check that it is the file you mean: a copy as published or "
                             "exported holds no such value")
    repeated: list[tuple[dict[str, Any], list[str]]] = []

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        value = dict(pairs)
        if len(value) != len(pairs) and not repeated:
            seen: set[str] = set()
            keys: list[str] = []
            for key, _ in pairs:
                if key in seen and key not in keys:
                    keys.append(key)
                seen.add(key)
            repeated.append((value, keys))
        return value

    try:
        document = json.loads(text, object_pairs_hook=unique_keys, strict=strict)
    except json.JSONDecodeError as exc:
        raise InputDataError(f"{what} {path} is not valid JSON: {exc.msg} at line "
                             f"{exc.lineno}, column {exc.colno}",
                             "fix the JSON syntax there") from None
    except (ValueError, RecursionError) as exc:  # what json_text_problem did not foresee
        raise InputDataError(f"{what} {path} is not valid JSON: {' '.join(str(exc).split())}",
                             "fix the JSON there") from None
    if repeated:
        obj, keys = repeated[0]
        location = _find(document, id(obj))
        raise RepeatedKeyError(f"{what} {path}: {_repeats(keys)} in one object, at "
                               f"{json_location(location)} (JSON would keep only the last)",
                               REPEATED_KEY_FIX, keys=keys, location=location,
                               document=document)
    return document


def read_json(path: Path | str, *, what: str, missing_fix: str = "check the path",
              strict: bool = True) -> Any:
    """:func:`parse_json` of the file at ``path`` (read by :func:`read_input_bytes`)."""
    path = Path(path)
    data = read_input_bytes(path, what=what, missing_fix=missing_fix)
    return parse_json(data, path, what=what, strict=strict)
