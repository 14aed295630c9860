"""Atomic, content-addressed file writes, and the one way images are read back.

Every file a stage produces is written to a temporary name in the same folder and renamed into
place (``os.replace`` is atomic on POSIX), so a crash or ``kill -9`` never leaves a half-written
file under its final name. Temporary names start with ``.tmp-`` and are never read as outputs.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from PIL import Image, UnidentifiedImageError

from acrb.errors import InputDataError
from acrb.redaction import redact_file

if TYPE_CHECKING:
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")

TMP_PREFIX = ".tmp-"
_UMASK = os.umask(0)
os.umask(_UMASK)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the form that content hashes are taken of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def plain_value(value: Any) -> Any:
    """A table cell as a plain Python value for JSON: NumPy scalars unwrapped, NaN as None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and np.isnan(value):
        return None
    return value


def content_hash(value: Any, length: int = 20) -> str:
    """Hex sha256 of ``canonical_json(value)``, truncated to ``length`` characters."""
    return sha256_bytes(canonical_json(value).encode("utf-8"))[:length]


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed onto ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # Defence in depth: a text output never carries an API key (acrb.redaction).
        redact_file(tmp)
        # mkstemp creates files readable by the owner only; outputs are shared like any file.
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def encode_png(pixels: np.ndarray, compress_level: int = 1) -> bytes:
    """PNG bytes of an RGB uint8 array. Level 1 trades a slightly larger file for speed."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()


def write_png(path: Path, pixels: np.ndarray) -> str:
    """Write ``pixels`` as PNG atomically and return the file's sha256."""
    data = encode_png(pixels)
    atomic_write_bytes(path, data)
    return sha256_bytes(data)


def load_rgb(path: Path) -> np.ndarray:
    """Decode an image fully (so truncation is caught here) as an RGB uint8 array."""
    try:
        with Image.open(path) as image:
            image.load()
            return np.asarray(image.convert("RGB"))
    except FileNotFoundError as exc:
        raise InputDataError(f"image {path} not found",
                             "restore the file, or re-run the stage that writes it") from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InputDataError(
            f"image {path} is corrupt or truncated ({exc})",
            "replace the file with a complete copy, or remove it from the manifest",
        ) from exc


def remove_stale_temporaries(folder: Path) -> int:
    """Delete temporary files left by a killed writer; returns how many were removed."""
    if not folder.exists():
        return 0
    removed = 0
    for stale in folder.rglob(f"{TMP_PREFIX}*"):
        stale.unlink(missing_ok=True)
        removed += 1
    return removed


def load_yaml_model(path: Path | str, model: type[M], *, what: str, param: str, example: str,
                    extra: dict[str, Any] | None = None) -> M:
    """Read a YAML data file (a rubric, a question file, instructions) into ``model``.

    A missing file is a :class:`~acrb.errors.ConfigError` naming ``param`` (the setting that
    points at it) and an ``example`` file; invalid YAML or a value ``model`` refuses is an
    :class:`~acrb.errors.InputDataError` naming the file and the first bad entry. ``extra``
    fields are added to the file's mapping before validation (e.g. its sha256).
    """
    import yaml
    from pydantic import ValidationError

    from acrb.errors import ConfigError

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist",
                          f"set {param} to a file such as {example}") from None
    except yaml.YAMLError as exc:
        raise InputDataError(f"{what} {path} is not valid YAML: {exc}",
                             "fix the file's syntax") from None
    if extra:
        data = {**(data if isinstance(data, dict) else {}), **extra}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "file"
        raise InputDataError(f"{what} {path}: {where}: {first['msg']}",
                             f"see {example} for the format") from None
