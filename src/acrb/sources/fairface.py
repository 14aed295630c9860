"""FairFace as the source of real portraits: load, draw candidates per cell, export them.

FairFace (Kärkkäinen & Joo, "FairFace: Face Attribute Dataset for Balanced Race, Gender, and
Age", WACV 2021; CC BY 4.0) labels every face crop with one of 7 race groups, 2 genders and 9
age bins. ACRB's design (:mod:`acrb.demographics`) is 7 races x 2 genders x 6 adult age bins =
84 cells; the study picks one portrait per cell by hand from ``k`` candidates drawn at random.
This module does the mechanical part of that:

1. :func:`load_fairface` reads FairFace from a local folder (images + a label CSV, as FairFace
   ships it), from local Parquet files (the layout of the Hugging Face hub copy) or from the
   hub itself (pinned to a commit), and maps the labels onto ACRB's spellings. Faces younger
   than 20 are outside the design and are dropped (and counted).
2. :func:`draw_candidates` draws ``k`` rows per cell without replacement, reproducibly from a
   seed, and reports the cells that have fewer than ``k`` rows instead of filling them up from
   other cells.
3. :func:`export_candidates` copies the drawn images byte for byte (no re-encoding) into a
   folder with a table of what they are and where they came from, for the curator.

:func:`load_study_candidates` reads the candidate folders of the original curation study
(``V1`` .. ``V7``, one candidate per cell each) into the same table shape.

Every row keeps an ``image_ref`` string from which :func:`read_image_bytes` gets the original
file's bytes: ``file:<path>``, ``parquet:<path>#<row>`` or ``hub:<id>|<config>|<revision>|
<split>|<row>``.
"""

from __future__ import annotations

import io
import json
import re
import zlib
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, UnidentifiedImageError
from pydantic import Field

from acrb.demographics import AGES, GENDERS, RACES
from acrb.errors import ConfigError, InputDataError
from acrb.records import Record, read_table, write_table
from acrb.storage import (
    atomic_write_bytes,
    sha256_bytes,
    sha256_file,
    write_csv,
)

#: FairFace's race labels -> ACRB's spelling.
RACE_LABELS: dict[str, str] = {
    "Black": "Black",
    "East Asian": "EastAsian",
    "Indian": "Indian",
    "Latino_Hispanic": "Latino",
    "Middle Eastern": "MiddleEastern",
    "Southeast Asian": "SoutheastAsian",
    "White": "White",
}
GENDER_LABELS: dict[str, str] = {"Female": "Female", "Male": "Male"}
#: FairFace's age bins -> ACRB's; ``None`` marks bins outside the design (under 20). The hub
#: copy spells the oldest bin ``more than 70``; some re-distributions use ``70+``.
AGE_LABELS: dict[str, str | None] = {
    "0-2": None,
    "3-9": None,
    "10-19": None,
    "20-29": "20s",
    "30-39": "30s",
    "40-49": "40s",
    "50-59": "50s",
    "60-69": "60s",
    "more than 70": "70plus",
    "70+": "70plus",
}
LABELS: dict[str, dict[str, Any]] = {"race": RACE_LABELS, "gender": GENDER_LABELS,
                                     "age": AGE_LABELS}

#: Label files tried, in order, in a local FairFace folder: ACRB's own name, then the names
#: of FairFace's release (``fairface_label_val.csv``, ``fairface_label_train.csv``).
LABEL_FILES: dict[str, tuple[str, ...]] = {
    "validation": ("labels.csv", "fairface_label_val.csv"),
    "val": ("labels.csv", "fairface_label_val.csv"),
    "train": ("labels.csv", "fairface_label_train.csv"),
}
#: Config of the hub copy ``HuggingFaceM4/FairFace``: ``0.25`` is the crop with 25% margin
#: around the face that the FairFace paper uses; ``1.25`` is the wider crop.
DEFAULT_HUB_CONFIG = "0.25"
DATASET_NAME = "FairFace (Kärkkäinen & Joo, WACV 2021; CC BY 4.0)"

#: Columns of the table that :func:`export_candidates` and :func:`load_study_candidates` give.
CANDIDATE_COLUMNS: tuple[str, ...] = (
    "candidate_id", "cell", "rank", "race", "gender", "age", "origin", "file", "sha256",
    "width", "height", "dataset",
)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_FORMAT_SUFFIX = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp", "GIF": "gif",
                  "TIFF": "tif"}
_EXPORT_SUFFIXES = {f".{suffix}" for suffix in _FORMAT_SUFFIX.values()} | {".jpeg", ".bin"}

ImageLoader = Callable[[str], bytes]


class CandidateRecord(Record):
    """One candidate portrait for a design cell, as exported for the curator."""

    table: ClassVar[str] = "fairface_candidate"
    key: ClassVar[str] = "candidate_id"

    candidate_id: str = Field(description="`<Race>_<Gender>_<Age>_c<rank>` (drawn) or "
                              "`..._V<n>` (study)")
    cell: str = Field(description="`<Race>_<Gender>_<Age>` in ACRB spellings")
    rank: int = Field(description="1-based position in the cell's draw (or the study version)")
    race: str
    gender: str
    age: str
    origin: str = Field(description="the dataset row: FairFace file name, `<parquet>/<row>` or "
                        "`<split>/<row>`")
    file: str = Field(description="image path relative to the folder holding this table")
    sha256: str = Field(description="sha256 of the image file, which is FairFace's own bytes")
    width: int
    height: int
    dataset: str


def cell_name(race: str, gender: str, age: str) -> str:
    return f"{race}_{gender}_{age}"


# --------------------------------------------------------------------------------- loading


def load_fairface(source: str | Path, *, revision: str | None, split: str = "validation",
                  config: str | None = DEFAULT_HUB_CONFIG) -> pd.DataFrame:
    """Read FairFace's labels (not its pixels) as a table in ACRB spellings.

    ``source`` is one of

    - a local folder of images with a label CSV (``labels.csv``, or FairFace's own
      ``fairface_label_val.csv`` / ``fairface_label_train.csv`` for ``split``), or the CSV
      itself; columns ``file, race, gender, age`` in FairFace's label strings, ``file``
      relative to the CSV's folder (FairFace's CSVs also have ``service_test``, ignored);
    - a local Parquet file, or a folder of them (files whose name starts with ``split`` are
      taken if there are any), with an ``image`` column as the Hugging Face ``Image`` feature
      writes it (``{bytes, path}``) and ``race, gender, age`` as strings or as ``ClassLabel``
      integers whose names are in the file's ``huggingface`` metadata;
    - a Hugging Face hub dataset id (e.g. ``HuggingFaceM4/FairFace``), loaded with
      ``datasets.load_dataset(source, config, revision=revision, split=split)``. ``revision``
      must be a commit hash so that the audit can be repeated on the same rows.

    Returns columns ``origin`` (a stable row id), ``race``, ``gender``, ``age`` (ACRB
    values), ``fairface_race``, ``fairface_gender``, ``fairface_age`` (the labels as found),
    ``image_ref`` (see :func:`read_image_bytes`) and ``dataset``. Rows under 20 are dropped;
    their count is in ``frame.attrs["dropped_under_20"]``. A label outside FairFace's scheme
    raises :class:`InputDataError` naming the value and column.
    """
    path = Path(source)
    if path.exists():
        if path.is_file() and path.suffix.lower() == ".csv":
            raw, where = _read_label_csv(path), str(path)
        elif path.is_file() and path.suffix.lower() == ".parquet":
            raw, where = _read_parquet_files([path], root=path.parent), str(path)
        elif path.is_dir():
            raw, where = _read_local_folder(path, split)
        else:
            raise InputDataError(
                f"FairFace source {path} is neither a folder, a .csv nor a .parquet file",
                "give a folder with images and labels.csv, a Parquet file or folder, or a hub "
                "dataset id",
            )
    elif _HUB_ID.match(str(source)) and path.suffix.lower() not in {".csv", ".parquet"}:
        raw, where = _read_hub(str(source), config, revision, split)
    else:
        raise InputDataError(
            f"FairFace source {source} does not exist",
            "give an existing folder or Parquet file, or a hub dataset id such as "
            "HuggingFaceM4/FairFace",
        )
    return _to_acrb(raw, where)


def _read_local_folder(folder: Path, split: str) -> tuple[pd.DataFrame, str]:
    for name in LABEL_FILES.get(split, ("labels.csv",)):
        if (folder / name).is_file():
            return _read_label_csv(folder / name), str(folder / name)
    parquet = sorted(folder.rglob("*.parquet"))
    if parquet:
        # The hub layout keeps all splits side by side (``0.25/train-*.parquet``,
        # ``0.25/validation-*.parquet``): take the requested split's files if it is named.
        named = [p for p in parquet
                 if p.name.startswith(f"{split}-") or p.stem == split or p.parent.name == split]
        return _read_parquet_files(named or parquet, root=folder), str(folder)
    raise InputDataError(
        f"{folder} has no label file ({', '.join(LABEL_FILES.get(split, ('labels.csv',)))}) "
        "and no .parquet files",
        "add labels.csv with columns file,race,gender,age (FairFace's label strings)",
    )


def _read_label_csv(path: Path) -> pd.DataFrame:
    try:
        labels = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputDataError(f"{path} is not a readable CSV file ({exc})",
                             "check the file; it needs columns file,race,gender,age") from exc
    _require_columns(labels, ("file", "race", "gender", "age"), str(path))
    folder = path.parent.resolve()
    files = [folder / name for name in labels["file"]]
    missing = [str(name) for name, full in zip(labels["file"], files, strict=True)
               if not full.is_file()]
    if missing:
        raise InputDataError(
            f"{path}: {len(missing)} image file(s) listed but not found, e.g. {missing[:3]}",
            f"put the images under {folder} at the listed paths, or remove their rows",
        )
    return pd.DataFrame({
        "origin": labels["file"],
        "race": labels["race"], "gender": labels["gender"], "age": labels["age"],
        "image_ref": [f"file:{full}" for full in files],
        "dataset": f"{DATASET_NAME}: {path.name}",
    })


def _read_parquet_files(files: Sequence[Path], root: Path) -> pd.DataFrame:
    parts = []
    for path in files:
        try:
            schema = pq.read_schema(path)
            table = pq.read_table(path, columns=[c for c in ("race", "gender", "age")
                                                 if c in schema.names])
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputDataError(f"{path} is not a readable Parquet file ({exc})",
                                 "re-download or re-write the file") from exc
        if "image" not in schema.names:
            raise InputDataError(f"{path} has no 'image' column",
                                 "write the images as a Hugging Face Image feature "
                                 "({bytes, path}) in a column named 'image'")
        frame = table.to_pandas()
        _require_columns(frame, ("race", "gender", "age"), str(path))
        names = _class_label_names(schema)
        for column in ("race", "gender", "age"):
            frame[column] = _as_label_strings(frame[column], names.get(column), column,
                                              str(path))
        resolved = path.resolve()
        relative = path.relative_to(root) if path.is_relative_to(root) else Path(path.name)
        rows = range(len(frame))
        frame.insert(0, "origin", [f"{relative.as_posix()}/{row}" for row in rows])
        frame["image_ref"] = [f"parquet:{resolved}#{row}" for row in rows]
        frame["dataset"] = f"{DATASET_NAME}: {relative.as_posix()}"
        parts.append(frame)
    return pd.concat(parts, ignore_index=True)


def _class_label_names(schema: pa.Schema) -> dict[str, list[str]]:
    """``ClassLabel`` names per column from the ``huggingface`` metadata ``datasets`` writes."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        features = json.loads(raw)["info"]["features"]
    except (KeyError, TypeError, ValueError):
        return {}
    return {name: list(spec["names"]) for name, spec in features.items()
            if isinstance(spec, dict) and spec.get("_type") == "ClassLabel" and "names" in spec}


def _as_label_strings(values: pd.Series, names: list[str] | None, column: str,
                      where: str) -> pd.Series:
    if pd.api.types.is_integer_dtype(values):
        if names is None:
            raise InputDataError(
                f"{where}: column '{column}' holds integers but the file has no ClassLabel "
                "names for it",
                "write the labels as FairFace's strings, or keep the Hugging Face features "
                "metadata (Dataset.to_parquet keeps it)",
            )
        bad = sorted({int(v) for v in values if not 0 <= int(v) < len(names)})
        if bad:
            raise InputDataError(f"{where}: {column} class index {bad[0]} is out of range "
                                 f"(0..{len(names) - 1})", "check the file's labels")
        return values.map(lambda v: names[int(v)])
    return values.astype(str)


def _read_hub(dataset_id: str, config: str | None, revision: str | None,
              split: str) -> tuple[pd.DataFrame, str]:
    if not revision:
        raise ConfigError(
            f"FairFace source {dataset_id!r} is a hub dataset id but no revision is given "
            "(if it was meant as a local folder: that folder does not exist)",
            "pin the dataset: pass the commit hash of the revision to use (see the dataset's "
            "'Files and versions' history on the hub)",
        )
    if not _COMMIT.match(revision):
        raise ConfigError(
            f"revision {revision!r} of {dataset_id} is not a commit hash; branch and tag names "
            "can move, so the rows could change between runs",
            "pass the 40-hex-digit commit hash of the revision to use",
        )
    dataset = _hub_dataset(dataset_id, config, revision, split)
    frame = pd.DataFrame({"origin": [f"{split}/{row}" for row in range(len(dataset))]})
    for column in ("race", "gender", "age"):
        if column not in dataset.features:
            raise InputDataError(f"{dataset_id} ({config}, {split}) has no '{column}' column",
                                 "check the dataset id and config")
        feature = dataset.features[column]
        values = list(dataset[column])
        if hasattr(feature, "int2str"):
            values = feature.int2str(values)
        frame[column] = [str(v) for v in values]
    frame["image_ref"] = [f"hub:{dataset_id}|{config or ''}|{revision}|{split}|{row}"
                          for row in range(len(dataset))]
    frame["dataset"] = f"{DATASET_NAME}: {dataset_id}@{revision} {config or ''} {split}"
    return frame, f"{dataset_id}@{revision} ({config}, {split})"


@lru_cache(maxsize=2)
def _hub_dataset(dataset_id: str, config: str | None, revision: str, split: str) -> Any:
    """The hub dataset with images left undecoded (so the original file bytes come back)."""
    import datasets  # the optional `fairface` extra; only needed for hub sources

    try:
        loaded = datasets.load_dataset(dataset_id, config, revision=revision, split=split)
    except Exception as exc:  # network, auth, unknown id/config/split: all need the user
        raise InputDataError(
            f"could not load {dataset_id} (config {config}, revision {revision}, split "
            f"{split}): {exc}",
            "check the id, config, revision and split, and that the hub (or its cache, when "
            "HF_DATASETS_OFFLINE=1) is reachable",
        ) from exc
    return loaded.cast_column("image", datasets.Image(decode=False))


def _require_columns(frame: pd.DataFrame, columns: Iterable[str], where: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputDataError(f"{where} lacks column(s) {missing}",
                             "FairFace tables need file (or image), race, gender and age")


def _to_acrb(raw: pd.DataFrame, where: str) -> pd.DataFrame:
    """Map FairFace labels to ACRB spellings; drop (and count) faces under 20."""
    frame = raw.rename(columns={c: f"fairface_{c}" for c in ("race", "gender", "age")})
    for column, mapping in LABELS.items():
        found = frame[f"fairface_{column}"]
        unknown = sorted(set(found) - set(mapping))
        if unknown:
            example = frame.loc[found == unknown[0], "origin"].iloc[0]
            raise InputDataError(
                f"{where}: {column} label {unknown[0]!r} (row {example}) is not one of "
                f"FairFace's {column} labels ({', '.join(repr(k) for k in mapping)})",
                "use FairFace's own label strings; ACRB maps them to its spellings",
            )
        frame[column] = found.map(mapping)
    adult = frame["age"].notna()
    frame = frame.loc[adult, ["origin", "race", "gender", "age", "fairface_race",
                              "fairface_gender", "fairface_age", "image_ref", "dataset"]]
    frame = frame.reset_index(drop=True)
    frame.attrs["dropped_under_20"] = int((~adult).sum())
    return frame


# --------------------------------------------------------------------------- image bytes


def read_image_bytes(image_ref: str) -> bytes:
    """The original bytes of one image, from an ``image_ref`` of :func:`load_fairface`."""
    kind, _, rest = image_ref.partition(":")
    if kind == "file":
        try:
            return Path(rest).read_bytes()
        except OSError as exc:
            raise InputDataError(f"image {rest} cannot be read ({exc})",
                                 "restore the file, or reload the dataset") from exc
    if kind == "parquet":
        path, _, row = rest.rpartition("#")
        cell = _parquet_images(path)[int(row)].as_py()
        return _image_feature_bytes(cell, Path(path).parent, image_ref)
    if kind == "hub":
        dataset_id, config, revision, split, row = rest.split("|")
        dataset = _hub_dataset(dataset_id, config or None, revision, split)
        return _image_feature_bytes(dataset[int(row)]["image"], None, image_ref)
    raise InputDataError(f"unknown image reference {image_ref!r}",
                         "image_ref values come from load_fairface or load_study_candidates")


def open_image(image_ref: str) -> Image.Image:
    """The image of one ``image_ref``, decoded by PIL."""
    return Image.open(io.BytesIO(read_image_bytes(image_ref)))


@lru_cache(maxsize=4)
def _parquet_images(path: str) -> pa.ChunkedArray:
    return pq.read_table(path, columns=["image"]).column("image")


def _image_feature_bytes(cell: Any, folder: Path | None, image_ref: str) -> bytes:
    """Bytes of a Hugging Face ``Image`` feature value (``{bytes, path}``)."""
    if isinstance(cell, dict):
        if cell.get("bytes"):
            return bytes(cell["bytes"])
        if cell.get("path"):
            path = Path(cell["path"])
            path = path if path.is_absolute() or folder is None else folder / path
            if path.is_file():
                return path.read_bytes()
    raise InputDataError(f"{image_ref}: the image has neither bytes nor a readable path",
                         "re-write the dataset with the image bytes embedded")


# ------------------------------------------------------------------------------- drawing


def draw_candidates(frame: pd.DataFrame, k: int, seed: int,
                    races: Sequence[str] = RACES, genders: Sequence[str] = GENDERS,
                    ages: Sequence[str] = AGES) -> tuple[pd.DataFrame, dict[str, int]]:
    """Draw ``k`` candidate rows per race x gender x age cell, without replacement.

    Each cell's rows are sorted by ``origin`` and permuted by a generator seeded with
    ``(seed, crc32(cell))``: the draw depends only on the seed, the cell and that cell's rows,
    not on file order nor on which other cells are drawn. The first ``k`` of the permutation
    become ``<cell>_c1`` .. ``<cell>_c<k>``. A cell with fewer than ``k`` rows keeps all of
    them and is listed in the returned shortfalls (cell -> rows found); it is never topped up
    from another cell, since that would put a person in the wrong cell.

    Returns the candidates (columns ``candidate_id, cell, rank``, then ``frame``'s columns)
    in design order, and the shortfalls.
    """
    if k < 1:
        raise ConfigError(f"k = {k}: need at least one candidate per cell", "set k >= 1")
    for dimension, wanted, valid in (("race", races, RACES), ("gender", genders, GENDERS),
                                     ("age", ages, AGES)):
        bad = [v for v in wanted if v not in valid]
        if bad:
            raise ConfigError(f"{dimension} value(s) {bad} are not ACRB spellings",
                              f"use values from {', '.join(valid)}")
    _require_columns(frame, ("origin", "race", "gender", "age"), "the FairFace table")
    groups = {key: rows for key, rows in frame.groupby(["race", "gender", "age"], sort=False)}
    drawn: list[pd.DataFrame] = []
    shortfalls: dict[str, int] = {}
    for race in races:
        for gender in genders:
            for age in ages:
                cell = cell_name(race, gender, age)
                rows = groups.get((race, gender, age), frame.iloc[0:0])
                rows = rows.sort_values("origin", kind="stable").reset_index(drop=True)
                rng = np.random.default_rng([seed, zlib.crc32(cell.encode())])
                order = rng.permutation(len(rows))[:k]
                if len(rows) < k:
                    shortfalls[cell] = len(rows)
                picked = rows.iloc[order].reset_index(drop=True)
                ranks = range(1, len(picked) + 1)
                picked.insert(0, "rank", list(ranks))
                picked.insert(0, "cell", cell)
                picked.insert(0, "candidate_id", [f"{cell}_c{r}" for r in ranks])
                if len(picked):  # empty frames would turn the text columns into `object`
                    drawn.append(picked)
    if not drawn:
        return pd.DataFrame(columns=["candidate_id", "cell", "rank", *frame.columns]), shortfalls
    return pd.concat(drawn, ignore_index=True), shortfalls


# ------------------------------------------------------------------------------ exporting


def export_candidates(candidates: pd.DataFrame, loader: ImageLoader | None,
                      out_dir: Path) -> Path:
    """Copy each candidate's original image into ``out_dir`` and write the candidate table.

    Images go to ``out_dir/images/<candidate_id>.<ext>`` exactly as the dataset stores them
    (no decode/re-encode, so the sha256 is the dataset's own); ``ext`` follows the format
    PIL reads from the bytes. ``loader`` maps a row's ``image_ref`` to bytes (default
    :func:`read_image_bytes`). Image files in ``out_dir/images`` that belong to no candidate
    (left from an earlier export) are removed, so the folder always matches the table.
    Writes ``candidates.parquet`` (schema :class:`CandidateRecord`) and ``candidates.csv``
    (the same rows, for people); returns the Parquet path. All writes are atomic.
    """
    _require_columns(candidates, ("candidate_id", "cell", "rank", "race", "gender", "age",
                                  "origin", "image_ref"), "the candidate table")
    load = loader or read_image_bytes
    images = out_dir / "images"
    records: list[CandidateRecord] = []
    rows: list[dict[str, Any]] = candidates.to_dict(orient="records")  # type: ignore[assignment]
    for row in rows:
        data = load(row["image_ref"])
        image_format, width, height = _probe(data, f"{row['candidate_id']} ({row['origin']})")
        relative = Path("images") / f"{row['candidate_id']}.{image_format}"
        atomic_write_bytes(out_dir / relative, data)
        records.append(CandidateRecord(
            candidate_id=row["candidate_id"], cell=row["cell"], rank=int(row["rank"]),
            race=row["race"], gender=row["gender"], age=row["age"], origin=str(row["origin"]),
            file=relative.as_posix(), sha256=sha256_bytes(data), width=width, height=height,
            dataset=str(row.get("dataset", DATASET_NAME)),
        ))
    keep = {Path(r.file).name for r in records}
    for stale in images.iterdir() if images.exists() else ():
        if stale.is_file() and stale.suffix.lower() in _EXPORT_SUFFIXES and stale.name not in keep:
            stale.unlink()
    table = out_dir / "candidates.parquet"
    write_table(table, [r.model_dump() for r in records], CandidateRecord)
    frame = pd.DataFrame([r.model_dump() for r in records], columns=list(CANDIDATE_COLUMNS))
    write_csv(frame, out_dir / "candidates.csv")
    return table


def read_candidates(path: Path) -> pd.DataFrame:
    """Read ``candidates.parquet`` back, with ``image_ref`` pointing at the exported files."""
    frame = read_table(path, CandidateRecord)
    frame["image_ref"] = [f"file:{(path.parent / f).resolve()}" for f in frame["file"]]
    return frame


def _probe(data: bytes, what: str) -> tuple[str, int, int]:
    """File extension, width and height of encoded image bytes; decodes fully to catch
    truncated files before a curator or a model sees them."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            image_format = image.format or ""
            width, height = image.size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InputDataError(f"image of {what} is corrupt or not an image ({exc})",
                             "replace the file in the dataset, or drop the row") from exc
    return _FORMAT_SUFFIX.get(image_format, image_format.lower() or "bin"), width, height


# ------------------------------------------------------------------------- study layout


def load_study_candidates(folder: Path) -> pd.DataFrame:
    """Read the candidate folders of the FairFace curation study as a candidate table.

    Layout: ``<folder>/V<n>/<Race>/<Race>_<Gender>_<Age>.jpg`` (``folder`` may also be its
    parent, holding ``candidates/``), with ``V<n>/metadata.json`` listing every file with
    FairFace's race and age labels. Gives :data:`CANDIDATE_COLUMNS` plus ``image_ref``, one
    row per listed file: ``candidate_id`` ``<Race>_<Gender>_<Age>_V<n>``, ``rank`` ``n``,
    ``origin`` and ``file`` ``V<n>/<Race>/<file>`` (relative to ``folder``). Labels are
    checked against the file names, so a misfiled image is an error, not a wrong cell.
    """
    folder = Path(folder)
    if (folder / "candidates").is_dir() and not list(folder.glob("V*/metadata.json")):
        folder = folder / "candidates"
    versions = sorted(folder.glob("V*/metadata.json"),
                      key=lambda p: int(p.parent.name[1:]) if p.parent.name[1:].isdigit() else 0)
    if not versions:
        raise InputDataError(f"{folder} has no V<n>/metadata.json",
                             "point at the study's candidates folder (holding V1 .. V7)")
    rows = []
    for metadata in versions:
        version = metadata.parent.name
        if not version[1:].isdigit():
            continue
        try:
            listing = json.loads(metadata.read_text())["images"]
        except (OSError, ValueError, KeyError) as exc:
            raise InputDataError(f"{metadata} is not a readable study metadata file ({exc})",
                                 "restore it from the study's data") from exc
        for entry in listing:
            rows.append(_study_row(folder, version, entry, metadata))
    frame = pd.DataFrame(rows)
    frame["dataset"] = f"{DATASET_NAME}: curation-study candidates"
    design = {cell_name(r, g, a): i for i, (r, g, a) in enumerate(
        (r, g, a) for r in RACES for g in GENDERS for a in AGES)}
    frame["_order"] = frame["cell"].map(design)
    frame = frame.sort_values(["_order", "rank"], kind="stable").drop(columns="_order")
    return frame[[*CANDIDATE_COLUMNS, "image_ref"]].reset_index(drop=True)


def _study_row(folder: Path, version: str, entry: dict[str, Any],
               metadata: Path) -> dict[str, Any]:
    where = f"{metadata}: {entry.get('filename')!r}"
    try:
        race = RACE_LABELS[entry["race"]]
        age = AGE_LABELS[entry["age"]]
        gender = GENDER_LABELS[entry["gender"]]
    except KeyError as exc:
        raise InputDataError(f"{where}: label {exc.args[0]!r} is not a FairFace label",
                             "fix the metadata entry") from exc
    if age is None:
        raise InputDataError(f"{where}: age {entry['age']!r} is outside the design (20+)",
                             "remove the entry")
    cell = cell_name(race, gender, age)
    if Path(entry["filename"]).stem != cell:
        raise InputDataError(f"{where}: the labels say cell {cell}",
                             "rename the file or fix its labels so they agree")
    relative = Path(version) / race / entry["filename"]
    path = folder / relative
    if not path.is_file():
        raise InputDataError(f"{where}: {path} not found", "restore the file")
    with Image.open(path) as image:
        width, height = image.size
    return {
        "candidate_id": f"{cell}_{version}", "cell": cell, "rank": int(version[1:]),
        "race": race, "gender": gender, "age": age, "origin": relative.as_posix(),
        "file": relative.as_posix(), "sha256": sha256_file(path), "width": width,
        "height": height, "image_ref": f"file:{path.resolve()}",
    }
