"""API keys never leave the process: one mask for everything the project writes or prints.

Keys live only in the environment variables that params name in ``api_key_env`` (a model's
config, a VLM judge's or the feature describer's backend, a synthesis backend). Every key the
program reads is registered here, and :func:`redact` replaces it with ``[redacted:NAME]``
(``NAME`` is the variable, never the value). A long key's first and last 8 characters are
masked too: providers echo a wrong key as ``sk-abcd...wxyz``, and a key cut in half by a
length limit would otherwise leave its start behind.

Where it applies: a reply is redacted where it enters the program (the chat clients, the image
API adapters), before any text is cut to length; then again, as defence in depth, where things
leave it: :func:`acrb.records.write_table`, every text file written through
:func:`acrb.storage.atomic_path`, log records (a log record factory), the CLI's error lines and
uncaught tracebacks, and MLflow params, tags, metric names and artifacts
(:mod:`acrb.tracking`). Until a key is registered, every function here is a no-op.

Values shorter than :data:`MIN_SECRET_CHARS` are not treated as keys: local servers take
placeholders such as ``EMPTY`` or ``none``, and masking those everywhere would rewrite ordinary
words in prompts and answers.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

#: Shortest value treated as a key (shorter ones are placeholders, see the module docstring).
MIN_SECRET_CHARS = 8
#: Keys at least this long also have their first and last :data:`FRAGMENT_CHARS` masked.
FRAGMENT_FROM_CHARS = 24
FRAGMENT_CHARS = 8
#: Files :func:`redact_file` rewrites; others (Parquet, images) are binary and are redacted
#: before they are encoded.
TEXT_SUFFIXES = frozenset({".json", ".jsonl", ".md", ".html", ".htm", ".csv", ".tsv", ".txt",
                           ".yaml", ".yml", ".log", ".tex", ".xml", ".svg"})

_lock = threading.Lock()
_names: dict[str, str] = {}  # secret text (a key or a fragment of one) -> its variable's name
_pattern: re.Pattern[str] | None = None
_installed = False


def mask(name: str) -> str:
    """What stands in place of the key held in the environment variable ``name``."""
    return f"[redacted:{name}]"


def register_secret(name: str, value: str | None) -> bool:
    """Mask ``value`` (the key in environment variable ``name``) from now on; False when it is
    empty or too short to be a key (:data:`MIN_SECRET_CHARS`)."""
    global _pattern
    value = (value or "").strip()
    if len(value) < MIN_SECRET_CHARS:
        return False
    with _lock:
        if value in _names:
            return True
        _names[value] = name
        if len(value) >= FRAGMENT_FROM_CHARS:
            for fragment in (value[:FRAGMENT_CHARS], value[-FRAGMENT_CHARS:]):
                _names.setdefault(fragment, name)
        # Longest first, so a whole key is masked as one, not as its fragments.
        ordered = sorted(_names, key=len, reverse=True)
        _pattern = re.compile("|".join(re.escape(s) for s in ordered))
    _install_hooks()
    return True


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


def active() -> bool:
    """Whether any key is registered (else every redaction is a no-op)."""
    return _pattern is not None


def redact(text: str) -> str:
    """``text`` with every registered key (and long keys' ends) replaced by its mask."""
    pattern = _pattern
    if pattern is None or not text:
        return text
    return pattern.sub(lambda m: mask(_names[m.group(0)]), text)


def redact_value(value: Any) -> Any:
    """``value`` with :func:`redact` applied to every string in it (dicts, lists, tuples)."""
    if _pattern is None:
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {redact_value(k): redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_value(v) for v in value)
    return value


def contains_secret(data: bytes | str) -> bool:
    """Whether ``data`` holds a registered key or fragment."""
    pattern = _pattern
    if pattern is None:
        return False
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    return pattern.search(data) is not None


def redact_file(path: Path) -> bool:
    """Rewrite the text file ``path`` in place with its keys masked (files whose suffix is not
    in :data:`TEXT_SUFFIXES`, or that are not UTF-8, are left alone); True if it changed."""
    if _pattern is None or path.suffix.lower() not in TEXT_SUFFIXES:
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
        if _pattern is None:
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
        if _pattern is None:
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
    global _pattern
    with _lock:
        _names.clear()
        _pattern = None
