"""API keys never leave the process: one mask for everything the project writes or prints.

Keys live only in the environment variables that params name in ``api_key_env`` (a model's
config, a VLM judge's or the feature describer's backend, a synthesis backend). Every key the
program reads is registered here, and :func:`redact` replaces it with ``[redacted:NAME]``
(``NAME`` is the variable, never the value). Every piece of a key at least
:data:`PIECE_CHARS` long is masked too, wherever it stands in the key (an endpoint that echoes
part of the key, a key cut by a length limit), and a long key's first and last 8 characters:
providers echo a wrong key as ``sk-abcd...wxyz``.

How pieces are found: any run of :data:`PIECE_CHARS` characters of a key holds one of the key's
blocks of half that length that start at a multiple of the block length, so one search for the
blocks (an alternation of a few dozen strings, rather than one for every piece: about ten
times faster) finds every place a piece may stand, and each find is grown, character by
character in step with the key, to the longest run of the key there. Runs shorter than
:data:`PIECE_CHARS` are left alone, so a block that happens to stand in ordinary text is not
masked.

Where it applies: a reply is redacted where it enters the program (the chat clients, the image
API adapters), before any text is cut to length; then again, as defence in depth, where things
leave it: :func:`acrb.records.write_table`, every text file written through
:func:`acrb.storage.atomic_path`, log records (a log record factory), the CLI's error lines and
uncaught tracebacks, and MLflow params, tags, metric names and artifacts
(:mod:`acrb.tracking`). Until a key is registered, every function here is a no-op.

Values shorter than :data:`MIN_SECRET_CHARS` are not treated as keys: local servers take
placeholders such as ``EMPTY`` or ``none``, and masking those everywhere would rewrite ordinary
words in prompts and answers. A key shorter than :data:`PIECE_CHARS` is masked only whole.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

#: Shortest value treated as a key (shorter ones are placeholders, see the module docstring).
MIN_SECRET_CHARS = 8
#: Every piece of a key at least this long is masked, wherever it stands in the key.
PIECE_CHARS = 12
#: Keys at least this long also have their first and last :data:`FRAGMENT_CHARS` masked.
FRAGMENT_FROM_CHARS = 24
FRAGMENT_CHARS = 8
#: Files :func:`redact_file` rewrites; others (Parquet, images) are binary and are redacted
#: before they are encoded.
TEXT_SUFFIXES = frozenset({".json", ".jsonl", ".md", ".html", ".htm", ".csv", ".tsv", ".txt",
                           ".yaml", ".yml", ".log", ".tex", ".xml", ".svg"})

#: A key's aligned blocks are this long: any :data:`PIECE_CHARS` run of the key holds one whole.
_BLOCK_CHARS = PIECE_CHARS // 2


@dataclass(frozen=True)
class _Index:
    """What the masks are looked up in; replaced whole when a key is registered, so a thread
    that is redacting keeps a consistent one."""

    keys: dict[str, str]  # a registered key -> its variable's name
    whole: dict[str, str]  # masked only whole (a short key, a long key's ends) -> name
    blocks: dict[str, tuple[tuple[str, int], ...]]  # aligned block -> ((key, offset), ...)
    pattern: re.Pattern[str]  # any block or whole text: where a mask may start
    whole_lengths: frozenset[int]


_lock = threading.Lock()
_index: _Index | None = None  # None until a key is registered: every function is a no-op
_installed = False


def mask(name: str) -> str:
    """What stands in place of the key held in the environment variable ``name``."""
    return f"[redacted:{name}]"


def register_secret(name: str, value: str | None) -> bool:
    """Mask ``value`` (the key in environment variable ``name``) from now on; False when it is
    empty or too short to be a key (:data:`MIN_SECRET_CHARS`)."""
    global _index
    value = (value or "").strip()
    if len(value) < MIN_SECRET_CHARS:
        return False
    with _lock:
        keys = dict(_index.keys) if _index else {}
        if value in keys:
            return True
        keys[value] = name
        whole: dict[str, str] = {}
        blocks: dict[str, list[tuple[str, int]]] = {}
        for key, key_name in keys.items():
            if len(key) < PIECE_CHARS:
                whole.setdefault(key, key_name)
            else:
                for offset in range(0, len(key) - _BLOCK_CHARS + 1, _BLOCK_CHARS):
                    blocks.setdefault(key[offset:offset + _BLOCK_CHARS], []).append(
                        (key, offset))
            if len(key) >= FRAGMENT_FROM_CHARS:
                for fragment in (key[:FRAGMENT_CHARS], key[-FRAGMENT_CHARS:]):
                    whole.setdefault(fragment, key_name)
        _index = _Index(
            keys=keys, whole=whole, blocks={b: tuple(at) for b, at in blocks.items()},
            pattern=re.compile("|".join(re.escape(s) for s in sorted({*blocks, *whole}))),
            whole_lengths=frozenset(len(s) for s in whole))
    _install_hooks()
    return True


def _spans(text: str) -> list[tuple[int, int, str]]:
    """Where ``text`` holds a registered key, a piece of one (:data:`PIECE_CHARS` or longer) or
    a long key's end: ``(start, end, name)``, sorted, overlapping ones merged."""
    index = _index
    if index is None or not text:
        return []
    found: list[tuple[int, int, str]] = []
    grown: dict[tuple[str, int], int] = {}  # (key, text index of its first char) -> end grown to
    position = 0
    while (hit := index.pattern.search(text, position)) is not None:
        at = hit.start()
        position = at + 1
        for length in index.whole_lengths:
            # (Near the end a longer window is cut short: it may read as a shorter whole.)
            if (at + length <= len(text)
                    and (name := index.whole.get(text[at:at + length])) is not None):
                found.append((at, at + length, name))
        for key, offset in index.blocks.get(text[at:at + _BLOCK_CHARS], ()):
            if grown.get((key, at - offset), -1) >= at + _BLOCK_CHARS:
                continue  # inside a run of this key already grown from an earlier block
            start, end = _grow(text, at, key, offset)
            grown[(key, at - offset)] = end
            if end - start >= PIECE_CHARS:
                found.append((start, end, index.keys[key]))
    merged: list[tuple[int, int, str]] = []
    for start, end, name in sorted(found, key=lambda span: (span[0], -span[1])):
        if merged and start < merged[-1][1]:
            last = merged[-1]
            merged[-1] = (last[0], max(last[1], end), last[2])
        else:
            merged.append((start, end, name))
    return merged


def _grow(text: str, at: int, key: str, offset: int) -> tuple[int, int]:
    """The longest run of ``text`` around ``text[at:at + block]``, the block of ``key`` at
    ``offset``, that is the matching run of ``key``: ``(start, end)`` in ``text``."""
    start, key_start = at, offset
    while start > 0 and key_start > 0 and text[start - 1] == key[key_start - 1]:
        start, key_start = start - 1, key_start - 1
    end, key_end = at + _BLOCK_CHARS, offset + _BLOCK_CHARS
    while end < len(text) and key_end < len(key) and text[end] == key[key_end]:
        end, key_end = end + 1, key_end + 1
    return start, end


def register_params_secrets(raw: Any) -> list[str]:
    """Register the keys of every ``api_key_env`` found anywhere in ``raw`` (the params as
    read from YAML) that is set in the environment; returns the variables registered."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                if key == "api_key_env" and isinstance(item, str) and item:
                    found.append(item)
                else:
                    walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(raw)
    return [name for name in dict.fromkeys(found)
            if register_secret(name, os.environ.get(name))]


def registered_names() -> list[str]:
    """The environment variables whose keys are registered (never the keys): what a process
    started from this one, with the same environment, registers to mask the same keys."""
    index = _index
    return sorted(set(index.keys.values())) if index else []


def active() -> bool:
    """Whether any key is registered (else every redaction is a no-op)."""
    return _index is not None


def redact(text: str) -> str:
    """``text`` with every registered key, every piece of one at least :data:`PIECE_CHARS`
    long, and long keys' ends replaced by the key's mask (one mask per run)."""
    spans = _spans(text)
    if not spans:
        return text
    parts: list[str] = []
    done = 0
    for start, end, name in spans:
        parts += [text[done:start], mask(name)]
        done = end
    parts.append(text[done:])
    return "".join(parts)


def redact_value(value: Any) -> Any:
    """``value`` with :func:`redact` applied to every string in it (dicts, lists, tuples)."""
    if _index is None:
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {redact_value(k): redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_value(v) for v in value)
    return value


def contains_secret(data: bytes | str) -> bool:
    """Whether ``data`` holds what :func:`redact` masks (a key, a piece of one, a key's end)."""
    if _index is None:
        return False
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    return bool(_spans(data))


def redact_file(path: Path) -> bool:
    """Rewrite the text file ``path`` in place with its keys masked (files whose suffix is not
    in :data:`TEXT_SUFFIXES`, or that are not UTF-8, are left alone); True if it changed."""
    if _index is None or path.suffix.lower() not in TEXT_SUFFIXES:
        return False
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    clean = redact(text)
    if clean == text:
        return False
    path.write_text(clean, encoding="utf-8")
    return True


class _RedactingRecordFactory:
    """Log records whose message is redacted when made, whichever logger or handler shows them."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record: logging.LogRecord = self.inner(*args, **kwargs)
        if _index is None:
            return record
        try:
            message = record.getMessage()
        except Exception:  # a malformed call; the handler reports it as it would have
            return record
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return record


def _redacting_excepthook(inner: Any) -> Any:
    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if _index is None:
            inner(kind, error, tb)
            return
        sys.stderr.write(redact("".join(traceback.format_exception(kind, error, tb))))

    return hook


def _install_hooks() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    logging.setLogRecordFactory(_RedactingRecordFactory(logging.getLogRecordFactory()))
    sys.excepthook = _redacting_excepthook(sys.excepthook)


def forget_all() -> None:
    """Unregister every key (tests; a process that reloads its params). Hooks stay installed
    and become no-ops."""
    global _index
    with _lock:
        _index = None
