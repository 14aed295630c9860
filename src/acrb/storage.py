"""Atomic, content-addressed file writes, and the one way images are read back.

Every file a stage produces is written to a temporary name in the same folder and renamed into
place (``os.replace`` is atomic on POSIX), so a crash or ``kill -9`` never leaves a half-written
file under its final name. Temporary names start with ``.tmp-`` and are never read as outputs.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pandas as pd
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
    except OSError as exc:
        # A write that fails without naming its file (a full disk) is reported naming ours.
        if exc.filename is None:
            exc.filename = str(path)
        raise
    finally:
        if tmp.exists():
            tmp.unlink()


@contextmanager
def atomic_paths(paths: Sequence[Path]) -> Iterator[list[Path]]:
    """Yield a temporary path beside each of ``paths`` (in order); when the block succeeds,
    each is renamed onto its path, all after every one was written.

    For outputs that belong together (a table and the table it refers to): a failure while
    any of them is written (a value the file format refuses, a full disk, ``kill -9``) leaves
    every previous file as it was, never a new one beside an old one. The renames themselves
    are one after another, each atomic; a rename fails only where the folder vanished.
    """
    temporaries: list[Path] = []
    try:
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=path.suffix,
                                            dir=path.parent)
            os.close(fd)
            temporaries.append(Path(tmp_name))
        yield list(temporaries)
        for tmp in temporaries:
            redact_file(tmp)  # as atomic_path: no API key in a text output
            os.chmod(tmp, 0o666 & ~_UMASK)
        for tmp, path in zip(temporaries, paths, strict=True):
            try:
                os.replace(tmp, path)
            except OSError as exc:
                if exc.filename is None:
                    exc.filename = str(path)
                raise
    finally:
        for tmp in temporaries:
            tmp.unlink(missing_ok=True)


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


#: The most pixels an image may have before it is refused unread: Pillow's own decompression
#: bomb limit (about 89.5 megapixels, e.g. 9459 x 9459). A larger image would take gigabytes to
#: decode, and no portrait or model output needs that many.
MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485

# Greyscale modes whose samples are 16 bits: Pillow's convert("RGB") clips them at 255 (an
# almost white image) instead of scaling, so they are scaled here.
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


def load_rgb(path: Path) -> np.ndarray:
    """Decode an image fully (so truncation is caught here) as an RGB uint8 array.

    Every mode Pillow reads is converted: greyscale, palette, CMYK and 16-bit images (scaled
    by 255/65535, not clipped); an alpha channel is composited onto white, so transparent
    pixels do not show whatever colour the file stored under them. An image of more than
    :data:`MAX_IMAGE_PIXELS` pixels is refused before it is decoded.
    """
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
                if width * height > MAX_IMAGE_PIXELS:
                    raise _too_large(path, width, height)
                image.load()
                return _to_rgb(image, path)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # Pillow refuses these in Image.open, before this function sees the size.
        raise InputDataError(
            f"image {path} has more than {MAX_IMAGE_PIXELS:,} pixels, the limit (a guard "
            "against decompression bombs)",
            "downscale it (a source portrait needs no more than a few megapixels)",
        ) from None
    except FileNotFoundError as exc:
        raise InputDataError(f"image {path} not found",
                             "restore the file, or re-run the stage that writes it") from exc
    except IsADirectoryError:
        raise InputDataError(f"image {path} is a folder, not an image file",
                             "point the entry at an image file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputDataError(f"image {path} is a symbolic link that loops",
                                 "replace the link with the image file") from None
        raise _corrupt(path, exc) from exc
    except (UnidentifiedImageError, SyntaxError, ValueError) as exc:
        raise _corrupt(path, exc) from exc


def _corrupt(path: Path, exc: BaseException) -> InputDataError:
    return InputDataError(
        f"image {path} is corrupt or truncated ({exc})",
        "replace the file with a complete copy, or remove it from the manifest",
    )


def _too_large(path: Path, width: int, height: int) -> InputDataError:
    return InputDataError(
        f"image {path} is {width} x {height} = {width * height:,} pixels, more than the limit "
        f"of {MAX_IMAGE_PIXELS:,}",
        "downscale it (a source portrait needs no more than a few megapixels)",
    )


def _to_rgb(image: Image.Image, path: Path) -> np.ndarray:
    if image.mode in _SIXTEEN_BIT_MODES or image.mode == "I":
        samples = np.asarray(image).astype(np.int64)
        if image.mode == "I" and (samples.min() < 0 or samples.max() > 65535):
            raise InputDataError(
                f"image {path} has 32-bit integer samples (mode I), outside the 16-bit range",
                "save it with 8 or 16 bits per sample")
        grey = ((samples * 255 + 32767) // 65535).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=2)
    if image.mode == "F":
        raise InputDataError(f"image {path} has floating-point samples (mode F)",
                             "save it with 8 or 16 bits per sample")
    has_alpha = image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        image.mode == "P" and "transparency" in image.info)
    if has_alpha:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return np.asarray(Image.alpha_composite(white, rgba).convert("RGB"))
    return np.asarray(image.convert("RGB"))


def remove_stale_temporaries(folder: Path, *, recursive: bool = True) -> int:
    """Delete temporary files left by a killed writer in ``folder`` (and, with ``recursive``,
    its subfolders); returns how many were removed."""
    if not folder.exists():
        return 0
    removed = 0
    for stale in (folder.rglob if recursive else folder.glob)(f"{TMP_PREFIX}*"):
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
    from pydantic import ValidationError

    from acrb.errors import ConfigError
    from acrb.yaml_input import read_yaml

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{what} {path} does not exist",
                          f"set {param} to a file such as {example}")
    data = read_yaml(path, what=what, missing_fix=f"set {param} to a file such as {example}")
    if extra:
        data = {**(data if isinstance(data, dict) else {}), **extra}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "file"
        raise InputDataError(f"{what} {path}: {where}: {first['msg']}",
                             f"see {example} for the format") from None


# --- CSV files people open in spreadsheets -------------------------------------------------
#: A cell starting with one of these is read as a formula by Excel, LibreOffice and Google
#: Sheets (OWASP, "CSV Injection"): ``=HYPERLINK(...)`` in a curator's rationale would run
#: when a colleague opens decisions.csv.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def safe_csv_cell(value: Any) -> Any:
    """``value`` with a single quote put before it if it is text a spreadsheet would run as a
    formula (it starts with one of :data:`FORMULA_PREFIXES`), else unchanged.

    Numbers stay numbers: only ``str`` cells are touched, and text that is a plain decimal
    number (``-0.12``, ``+3e-4``) is left as it is, since a spreadsheet reads it as that
    number and nothing else. Reference: OWASP, "CSV Injection"
    (https://owasp.org/www-community/attacks/CSV_Injection).
    """
    if (isinstance(value, str) and value.startswith(FORMULA_PREFIXES)
            and not _PLAIN_NUMBER.fullmatch(value)):
        return "'" + value
    return value


def unescape_csv_cell(value: Any) -> Any:
    """The inverse of :func:`safe_csv_cell`, for reading a CSV this project wrote."""
    if isinstance(value, str) and value.startswith("'") and value[1:].startswith(
            FORMULA_PREFIXES) and not _PLAIN_NUMBER.fullmatch(value[1:]):
        return value[1:]
    return value


def csv_safe_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` with every text cell (and column name) passed through
    :func:`safe_csv_cell`; numeric, boolean and missing cells are unchanged."""
    safe = frame.copy()
    for column in safe.columns:
        if not (pd.api.types.is_numeric_dtype(safe[column])
                or pd.api.types.is_bool_dtype(safe[column])):
            safe[column] = safe[column].map(safe_csv_cell)
    safe.columns = [safe_csv_cell(str(name)) for name in safe.columns]
    return safe


def csv_text(frame: pd.DataFrame, **to_csv: Any) -> str:
    """``frame`` as CSV text (no index unless ``index=True``), text cells neutralised."""
    to_csv.setdefault("index", False)
    return str(csv_safe_frame(frame).to_csv(**to_csv))


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` to ``path`` as Parquet, atomically (no index)."""
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


def write_csv(frame: pd.DataFrame, path: Path, **to_csv: Any) -> None:
    """Write ``frame`` as CSV to ``path`` atomically, text cells neutralised. The one way this
    project writes a CSV file (``tests/test_csv_cells.py`` checks no writer bypasses it)."""
    atomic_write_text(path, csv_text(frame, **to_csv))


def read_csv(path: Path, **read: Any) -> pd.DataFrame:
    """Read a CSV this project wrote with :func:`write_csv`, undoing the neutralisation of its
    text cells (``'=x`` reads back as ``=x``)."""
    frame = pd.read_csv(path, **read)
    for column in frame.columns:
        if not (pd.api.types.is_numeric_dtype(frame[column])
                or pd.api.types.is_bool_dtype(frame[column])):
            frame[column] = frame[column].map(unescape_csv_cell)
    frame.columns = [unescape_csv_cell(name) for name in frame.columns]
    return frame
