"""The FairFace sampler on small datasets shaped like FairFace, built in the test: label mapping,
per-cell draws with shortfalls, determinism, errors, and byte-exact export. Offline."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

# Set before `datasets` is imported anywhere: these tests only ever read local files.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from acrb.errors import ConfigError, InputDataError
from acrb.sources.fairface import (
    CANDIDATE_COLUMNS,
    draw_candidates,
    export_candidates,
    load_fairface,
    load_study_candidates,
    read_candidates,
    read_image_bytes,
)
from acrb.storage import sha256_bytes, sha256_file

# The hub copy's ClassLabel names (HuggingFaceM4/FairFace), in its order.
HF_AGE = ["0-2", "3-9", "10-19", "20-29", "30-39", "40-49", "50-59", "60-69", "more than 70"]
HF_GENDER = ["Male", "Female"]
HF_RACE = ["East Asian", "Indian", "Black", "White", "Middle Eastern", "Latino_Hispanic",
           "Southeast Asian"]

#: (FairFace race, gender, age bin, how many rows). Black_Female_20s has more than k; the
#: East Asian cell has fewer; the Latino cell uses the `70+` spelling; the last two are
#: children, outside the design.
CELLS = [
    ("Black", "Female", "20-29", 9),
    ("East Asian", "Male", "more than 70", 3),
    ("Latino_Hispanic", "Female", "70+", 8),
    ("White", "Male", "10-19", 2),
    ("Indian", "Female", "3-9", 1),
]
RACES = ("Black", "EastAsian", "Latino")
GENDERS = ("Female", "Male")
AGES = ("20s", "70plus")
K = 7


def image_bytes(seed: int, fmt: str = "JPEG") -> bytes:
    """A small, unique noise image."""
    pixels = np.random.default_rng(seed).integers(0, 256, (24, 20, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def label_rows() -> list[dict[str, str]]:
    rows = []
    for race, gender, age, count in CELLS:
        for _ in range(count):
            index = len(rows) + 1
            rows.append({"file": f"val/{index}.jpg", "age": age, "gender": gender, "race": race,
                         "service_test": "True"})
    return rows


def write_folder(root: Path, rows: list[dict[str, str]], label_file: str = "labels.csv") -> Path:
    """A FairFace-release-shaped folder: val/<n>.jpg plus a label CSV."""
    for index, row in enumerate(rows):
        path = root / row["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image_bytes(index))
    pd.DataFrame(rows).to_csv(root / label_file, index=False)
    return root


def write_parquet(path: Path, rows: list[dict[str, str]]) -> Path:
    """The hub layout: an HF Image column, race and age as ClassLabel ints, gender as text."""
    import datasets

    ages = [{"70+": "more than 70"}.get(r["age"], r["age"]) for r in rows]
    features = datasets.Features({
        "image": datasets.Image(),
        "race": datasets.ClassLabel(names=HF_RACE),
        "gender": datasets.Value("string"),
        "age": datasets.ClassLabel(names=HF_AGE),
    })
    data = {
        "image": [{"bytes": image_bytes(i, "PNG"), "path": None} for i in range(len(rows))],
        "race": [HF_RACE.index(r["race"]) for r in rows],
        "gender": [r["gender"] for r in rows],
        "age": [HF_AGE.index(a) for a in ages],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(data, features=features).to_parquet(str(path))
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_folder(tmp_path / "fairface", label_rows())


@pytest.fixture
def parquet(tmp_path: Path) -> Path:
    return write_parquet(tmp_path / "hub" / "0.25" / "validation-00000-of-00001.parquet",
                         label_rows())


def draw(frame: pd.DataFrame, seed: int = 1) -> tuple[pd.DataFrame, dict[str, int]]:
    return draw_candidates(frame, K, seed, RACES, GENDERS, AGES)


# ------------------------------------------------------------------------------- loading


def test_folder_labels_are_mapped_and_children_dropped(folder: Path) -> None:
    frame = load_fairface(folder, revision=None)
    assert len(frame) == 9 + 3 + 8
    assert frame.attrs["dropped_under_20"] == 3
    assert set(frame["race"]) == {"Black", "EastAsian", "Latino"}
    assert set(frame["age"]) == {"20s", "70plus"}
    latino = frame[frame["race"] == "Latino"]
    assert set(latino["fairface_age"]) == {"70+"} and set(latino["age"]) == {"70plus"}
    assert frame["origin"].is_unique and frame["origin"].iloc[0] == "val/1.jpg"
    assert read_image_bytes(frame["image_ref"].iloc[0]) == (folder / "val/1.jpg").read_bytes()


def test_fairface_release_label_file_name_is_accepted(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "release", label_rows(), "fairface_label_val.csv")
    assert len(load_fairface(root, revision=None, split="validation")) == 20


def test_parquet_with_class_label_ints_and_hf_images(parquet: Path, folder: Path) -> None:
    by_file = load_fairface(parquet, revision=None)
    by_folder = load_fairface(parquet.parent.parent, revision=None, split="validation")
    from_csv = load_fairface(folder, revision=None)
    assert by_file[["race", "gender", "age"]].equals(by_folder[["race", "gender", "age"]])
    # Same rows in the same order as the CSV form, so the ClassLabel ints were read by name.
    assert by_file[["race", "gender", "age"]].equals(from_csv[["race", "gender", "age"]])
    assert set(by_file["fairface_age"]) == {"20-29", "more than 70"}
    assert by_file.attrs["dropped_under_20"] == 3
    first = read_image_bytes(by_file["image_ref"].iloc[0])
    assert first == image_bytes(0, "PNG")


@pytest.mark.parametrize(("column", "value"), [("race", "Martian"), ("age", "15-19"),
                                               ("gender", "female")])
def test_unknown_label_names_value_and_column(tmp_path: Path, column: str, value: str) -> None:
    rows = label_rows()
    rows[4][column] = value
    root = write_folder(tmp_path / "bad", rows)
    with pytest.raises(InputDataError) as caught:
        load_fairface(root, revision=None)
    assert repr(value) in caught.value.problem and column in caught.value.problem


def test_acrb_spellings_are_not_fairface_labels(tmp_path: Path) -> None:
    rows = label_rows()
    rows[0]["race"] = "EastAsian"
    with pytest.raises(InputDataError, match="EastAsian"):
        load_fairface(write_folder(tmp_path / "acrb", rows), revision=None)


def test_missing_image_file_is_reported(folder: Path) -> None:
    (folder / "val" / "5.jpg").unlink()
    with pytest.raises(InputDataError, match=r"val/5\.jpg"):
        load_fairface(folder, revision=None)


def test_hub_id_needs_a_pinned_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no local folder of that name
    with pytest.raises(ConfigError, match="no revision"):
        load_fairface("HuggingFaceM4/FairFace", revision=None)
    with pytest.raises(ConfigError, match="not a commit hash"):
        load_fairface("HuggingFaceM4/FairFace", revision="main")


def test_hub_source_with_a_pinned_revision(parquet: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub path end to end, with `datasets.load_dataset` answered from a local file."""
    import datasets

    from acrb.sources import fairface

    revision = "0123456789abcdef0123456789abcdef01234567"
    calls = []

    def load_dataset(path: str, name: str | None = None, **kwargs: str) -> datasets.Dataset:
        calls.append((path, name, kwargs))
        return datasets.Dataset.from_parquet(str(parquet), cache_dir=str(tmp_path / "cache"))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.chdir(tmp_path)
    fairface._hub_dataset.cache_clear()
    try:
        frame = load_fairface("HuggingFaceM4/FairFace", revision=revision)
        assert calls == [("HuggingFaceM4/FairFace", "0.25",
                          {"revision": revision, "split": "validation"})]
        assert frame["origin"].iloc[0] == "validation/0"
        assert set(frame["fairface_race"]) == {"Black", "East Asian", "Latino_Hispanic"}
        assert frame.attrs["dropped_under_20"] == 3
        assert read_image_bytes(frame["image_ref"].iloc[1]) == image_bytes(1, "PNG")
    finally:
        fairface._hub_dataset.cache_clear()


def test_missing_local_path_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match="does not exist"):
        load_fairface(tmp_path / "nowhere" / "labels.csv", revision=None)


# ------------------------------------------------------------------------------- drawing


def test_k_per_cell_and_shortfalls_are_reported_not_filled(folder: Path) -> None:
    frame = load_fairface(folder, revision=None)
    candidates, shortfalls = draw(frame)
    sizes = candidates.groupby("cell").size().to_dict()
    assert sizes == {"Black_Female_20s": 7, "EastAsian_Male_70plus": 3,
                     "Latino_Female_70plus": 7}
    # Every cell of the design with fewer than k rows is listed with what it has; full cells
    # are not.
    design = {f"{r}_{g}_{a}" for r in RACES for g in GENDERS for a in AGES}
    expected = {cell: 0 for cell in design - {"Black_Female_20s", "Latino_Female_70plus"}}
    expected["EastAsian_Male_70plus"] = 3
    assert shortfalls == expected
    # No row in a cell it does not belong to, no row twice.
    cells = candidates["race"] + "_" + candidates["gender"] + "_" + candidates["age"]
    assert (cells == candidates["cell"]).all()
    assert candidates["origin"].is_unique
    short = candidates[candidates["cell"] == "EastAsian_Male_70plus"]
    assert set(short["origin"]) == set(frame[frame["race"] == "EastAsian"]["origin"])
    assert list(short["candidate_id"]) == [f"EastAsian_Male_70plus_c{i}" for i in (1, 2, 3)]
    assert list(candidates.columns[:3]) == ["candidate_id", "cell", "rank"]


def test_draw_is_deterministic_and_independent_of_file_order(folder: Path) -> None:
    frame = load_fairface(folder, revision=None)
    first, short_first = draw(frame, seed=7)
    again, short_again = draw(frame, seed=7)
    shuffled = frame.sample(frac=1.0, random_state=3).reset_index(drop=True)
    reordered, _ = draw(shuffled, seed=7)
    other, _ = draw(frame, seed=8)
    pd.testing.assert_frame_equal(first, again)
    assert short_first == short_again
    pd.testing.assert_frame_equal(first, reordered)
    assert list(first["origin"]) != list(other["origin"])


def test_a_cells_draw_does_not_depend_on_other_cells(folder: Path) -> None:
    frame = load_fairface(folder, revision=None)
    full, _ = draw(frame)
    alone, _ = draw_candidates(frame, K, 1, ["Black"], ["Female"], ["20s"])
    black = full[full["cell"] == "Black_Female_20s"].reset_index(drop=True)
    pd.testing.assert_frame_equal(black, alone)


def test_design_values_must_be_acrb_spellings(folder: Path) -> None:
    frame = load_fairface(folder, revision=None)
    with pytest.raises(ConfigError, match="East Asian"):
        draw_candidates(frame, K, 1, ["East Asian"], GENDERS, AGES)
    with pytest.raises(ConfigError):
        draw_candidates(frame, 0, 1, RACES, GENDERS, AGES)


# ----------------------------------------------------------------------------- exporting


@pytest.mark.parametrize("form", ["folder", "parquet"])
def test_export_writes_the_original_bytes(form: str, folder: Path, parquet: Path,
                                          tmp_path: Path) -> None:
    frame = load_fairface(folder if form == "folder" else parquet, revision=None)
    candidates, _ = draw(frame)
    out = tmp_path / "export"
    table_path = export_candidates(candidates, None, out)
    table = read_candidates(table_path)
    assert list(table.columns[:len(CANDIDATE_COLUMNS)]) == list(CANDIDATE_COLUMNS)
    assert len(table) == len(candidates) == 17
    suffix = "jpg" if form == "folder" else "png"
    for row, original in zip(table.itertuples(), candidates["image_ref"], strict=True):
        exported = out / row.file
        assert exported.name == f"{row.candidate_id}.{suffix}"
        assert exported.read_bytes() == read_image_bytes(original)
        assert sha256_file(exported) == row.sha256 == sha256_bytes(read_image_bytes(original))
        assert (row.width, row.height) == (20, 24)
    csv = pd.read_csv(out / "candidates.csv")
    assert list(csv["candidate_id"]) == list(table["candidate_id"])
    assert not list(out.rglob(".tmp-*"))


def test_re_export_removes_images_of_dropped_candidates(folder: Path, tmp_path: Path) -> None:
    candidates, _ = draw(load_fairface(folder, revision=None))
    out = tmp_path / "export"
    export_candidates(candidates, None, out)
    export_candidates(candidates[candidates["cell"] == "EastAsian_Male_70plus"], None, out)
    assert sorted(p.name for p in (out / "images").iterdir()) == [
        f"EastAsian_Male_70plus_c{i}.jpg" for i in (1, 2, 3)]


def test_export_uses_the_given_loader_and_rejects_broken_images(folder: Path,
                                                                tmp_path: Path) -> None:
    candidates, _ = draw(load_fairface(folder, revision=None))
    calls: list[str] = []

    def loader(ref: str) -> bytes:
        calls.append(ref)
        return read_image_bytes(ref)

    export_candidates(candidates.head(2), loader, tmp_path / "a")
    assert calls == list(candidates["image_ref"].head(2))
    with pytest.raises(InputDataError, match="corrupt"):
        export_candidates(candidates.head(1), lambda ref: b"not an image", tmp_path / "b")


# -------------------------------------------------------------------------- study layout


def test_study_layout_is_read_into_the_candidate_table(tmp_path: Path) -> None:
    root = tmp_path / "candidates"
    for version in (1, 2):
        images = []
        for race, code, gender, age, code_age in (("Black", "Black", "Male", "20-29", "20s"),
                                                  ("East Asian", "EastAsian", "Female",
                                                   "more than 70", "70plus")):
            name = f"{code}_{gender}_{code_age}.jpg"
            path = root / f"V{version}" / code / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(image_bytes(version * 10 + len(images)))
            images.append({"filename": name, "race": race, "race_code": code, "gender": gender,
                           "age": age, "age_code": code_age})
        (root / f"V{version}" / "metadata.json").write_text(json.dumps({"images": images}))
    frame = load_study_candidates(tmp_path)  # the parent of candidates/ works too
    assert list(frame["candidate_id"]) == ["Black_Male_20s_V1", "Black_Male_20s_V2",
                                           "EastAsian_Female_70plus_V1",
                                           "EastAsian_Female_70plus_V2"]
    assert frame["origin"].iloc[2] == "V1/EastAsian/EastAsian_Female_70plus.jpg"
    assert list(frame["rank"]) == [1, 2, 1, 2]
    first = root / frame["file"].iloc[0]
    assert frame["sha256"].iloc[0] == sha256_file(first)
    # Labels that disagree with the file name are an error, not a silent re-filing.
    meta = json.loads((root / "V1" / "metadata.json").read_text())
    meta["images"][0]["gender"] = "Female"
    (root / "V1" / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(InputDataError, match="cell Black_Female_20s"):
        load_study_candidates(root)
