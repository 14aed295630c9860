"""The manifest of a folder of source images: ``<folder>/manifest.csv``, read and checked whole.

Columns ``file, race, gender, age`` are required; ``source_id``, ``dataset``, ``origin`` and
``sha256_final`` (written by ``acrb curate finalize``) are used when present, and any other
column is carried along unread. The file is UTF-8, with or without a byte-order mark (Excel
writes one). Every row is checked before any image is decoded, so a bad manifest fails in
a moment and names its line: labels outside the design's vocabulary, a file that is missing
or outside the folder, a source id used twice or unusable as a file name.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from acrb.demographics import SOURCE_DIMENSIONS
from acrb.errors import InputDataError
from acrb.storage import unescape_csv_cell

MANIFEST_NAME = "manifest.csv"
REQUIRED_COLUMNS = ("file", "race", "gender", "age")
HEADER_FIX = "the first line must be the header 'file,race,gender,age' (then one row per image)"

# A source id becomes a file name under data/sources/images: no separators, no leading dot
# (hidden files, "..") and nothing a shell or a spreadsheet treats specially.
_SOURCE_ID = re.compile(r"\w[\w.+ -]*")


@dataclass(frozen=True)
class ManifestRow:
    """One image of the manifest, checked. ``line`` is the line of ``manifest.csv`` it is on."""

    line: int
    file: str
    path: Path
    source_id: str
    race: str
    gender: str
    age: str
    dataset: str
    origin: str
    sha256_final: str


def read_manifest(folder: Path) -> list[ManifestRow]:
    """Parse and check ``folder/manifest.csv``; raises :class:`InputDataError` naming the file,
    the line and the fix on the first problem found."""
    if not folder.is_dir():
        raise InputDataError(
            f"source folder {folder} does not exist" if not folder.exists()
            else f"source folder {folder} is not a folder",
            "set sources.folder to a folder holding manifest.csv and the images")
    manifest = folder / MANIFEST_NAME
    if not manifest.is_file():
        raise InputDataError(f"{manifest} not found",
                             "write a manifest.csv with columns file, race, gender, age")
    text = _decode(manifest)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        while header is not None and not any(cell.strip() for cell in header):
            header = next(reader, None)
        if header is None:
            raise InputDataError(f"{manifest} is empty", HEADER_FIX)
        columns = [name.strip() for name in header]
        seen: set[str] = set()
        for name in columns:
            if name and name in seen:
                raise InputDataError(f"{manifest} line {reader.line_num}: column {name!r} "
                                     "appears twice in the header", "keep one of them")
            seen.add(name)
        missing = [name for name in REQUIRED_COLUMNS if name not in seen]
        if missing:
            raise InputDataError(
                f"{manifest} lacks column(s) {', '.join(missing)} (its header is "
                f"{','.join(columns)!r})", HEADER_FIX)
        rows: list[ManifestRow] = []
        ids: dict[str, int] = {}
        for cells in reader:
            if not any(cell.strip() for cell in cells):
                continue  # blank line
            line = reader.line_num
            if len(cells) != len(columns):
                raise InputDataError(
                    f"{manifest} line {line} has {len(cells)} field(s), the header has "
                    f"{len(columns)}", "give every row one value per column (quote values "
                    "holding commas)")
            row = {name: str(unescape_csv_cell(cell)).strip()
                   for name, cell in zip(columns, cells, strict=True)}
            checked = _check_row(folder, manifest, line, row)
            if checked.source_id in ids:
                raise InputDataError(
                    f"{manifest} line {line}: source id {checked.source_id!r} is already "
                    f"used on line {ids[checked.source_id]}",
                    "give every image its own source_id (or its own file name)")
            ids[checked.source_id] = line
            rows.append(checked)
    except csv.Error as exc:
        raise InputDataError(f"{manifest} line {reader.line_num} is not valid CSV ({exc})",
                             "save the manifest as plain CSV") from None
    if not rows:
        raise InputDataError(f"{manifest} lists no images",
                             "add one row per image under the header")
    return rows


def _decode(manifest: Path) -> str:
    data = manifest.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputDataError(
            f"{manifest} line {line} is not UTF-8 (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start})", "save the manifest as UTF-8 text") from None


def _check_row(folder: Path, manifest: Path, line: int, row: dict[str, str]) -> ManifestRow:
    where = f"{manifest} line {line}"
    for dimension in ("race", "gender", "age"):
        valid = SOURCE_DIMENSIONS[dimension]
        if row[dimension] not in valid:
            raise InputDataError(
                f"{where}: {dimension} {row[dimension]!r} is not one of " + ", ".join(valid),
                "use the canonical spelling")
    name = row["file"]
    if not name:
        raise InputDataError(f"{where}: the file column is empty",
                             "name the image file, relative to the manifest's folder")
    relative = PurePosixPath(name.replace("\\", "/"))
    if relative.is_absolute() or ".." in relative.parts or re.match(r"[A-Za-z]:", name):
        raise InputDataError(
            f"{where}: file {name!r} is outside the folder {folder}",
            "copy the image into the folder and name it relative to manifest.csv "
            "(the folder is what DVC tracks)")
    path = folder.joinpath(*relative.parts)
    if path.is_dir():
        raise InputDataError(f"{where}: {path} is a folder, not an image file",
                             "name an image file")
    if not path.exists():
        # A dangling or looping symbolic link is not "missing": say what it is.
        problem = (f"{path} is a symbolic link to nothing (or a loop)" if path.is_symlink()
                   else f"{path} not found")
        raise InputDataError(f"{where}: {problem}",
                             "add the image to the folder, or remove its row")
    source_id = row.get("source_id") or relative.stem
    if not _SOURCE_ID.fullmatch(source_id):
        raise InputDataError(
            f"{where}: source id {source_id!r} cannot be used as a file name",
            "use letters, digits, spaces, '_', '-', '.' and '+' only (set a source_id column, or "
            "rename the file)")
    return ManifestRow(
        line=line, file=name, path=path, source_id=source_id, race=row["race"],
        gender=row["gender"], age=row["age"], dataset=row.get("dataset") or folder.name,
        origin=row.get("origin") or name, sha256_final=row.get("sha256_final") or "")
