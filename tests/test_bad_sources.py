"""Bad source inputs through the real CLI: `acrb sources` with ``kind: folder``.

Each case starts from a project whose first `acrb sources` run succeeded, breaks one input,
and runs `acrb sources` again. A refused input must exit 2 with a one-line message naming
the problem (and a fix line), no traceback, and leave every file under ``data/sources``
byte-identical to the good run. An input that is fine (a byte-order mark, a 16-bit PNG, a
CMYK JPEG, ...) must be accepted and converted correctly, leaving no staging folder behind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from acrb import layout
from acrb.cli import app
from tests.image_files import png_bytes, zeros_png

HEADER = "file,race,gender,age"
GOOD_ROWS = ["a.png,Black,Female,20s", "b.jpg,White,Male,70plus", "c.png,Black,Male,20s"]


GRADIENT16 = np.linspace(0, 65535, 64).astype(np.uint16)[None, :].repeat(48, axis=0)


def write_manifest(folder: Path, rows: list[str], header: str = HEADER) -> None:
    (folder / "manifest.csv").write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")


def good_folder(folder: Path) -> None:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(folder / "a.png")
    Image.fromarray(rng.integers(0, 255, (80, 60, 3), dtype=np.uint8)).save(
        folder / "b.jpg", quality=90)
    Image.fromarray(rng.integers(0, 255, (40, 40), dtype=np.uint8)).save(folder / "c.png")
    write_manifest(folder, GOOD_ROWS)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under data/sources with its bytes (None for a folder)."""
    base = root / layout.SOURCES_DIR
    return {str(p.relative_to(base)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(base.rglob("*"))}


def untouched(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under data/sources with its inode and mtime: a file deleted and rewritten
    with the same bytes counts as touched."""
    base = root / layout.SOURCES_DIR
    return {str(p.relative_to(base)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(base.rglob("*")) if p.is_file()}


def run_sources(root: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["sources", "--params", str(root / "params.yaml")])
    return result.exit_code, result.output


@pytest.fixture
def good_project(project: Path) -> Path:
    """The tiny project with ``kind: folder`` on ``faces/`` and one good run done."""
    good_folder(project / "faces")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["sources"].update(kind="folder", folder="faces")
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    code, output = run_sources(project)
    assert code == 0, output
    return project


def set_params(root: Path, **changes: object) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["sources"].update(changes)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def corrupt_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))


def symlink_loop(folder: Path) -> None:
    (folder / "a.png").unlink()
    (folder / "a.png").symlink_to(folder / "loop.png")
    (folder / "loop.png").symlink_to(folder / "a.png")


def dangling_link(folder: Path) -> None:
    (folder / "a.png").unlink()
    (folder / "a.png").symlink_to(folder / "gone.png")


def rows_with(extra: str) -> Callable[[Path], None]:
    return lambda f: write_manifest(f, [*GOOD_ROWS, extra])


def add_image(name: str, make: Callable[[Path], None], row: str) -> Callable[[Path], None]:
    def mutate(folder: Path) -> None:
        make(folder / name)
        write_manifest(folder, [*GOOD_ROWS, row])
    return mutate


@dataclass(frozen=True)
class Refused:
    id: str
    mutate: Callable[[Path], None]
    message: str  # a distinctive part of the one-line problem
    on_root: bool = False  # mutate gets the project root instead of the image folder


REFUSED = [
    Refused("truncated-png", lambda f: truncate(f / "a.png"), "a.png is corrupt or truncated"),
    Refused("truncated-jpeg", lambda f: truncate(f / "b.jpg", 0.3),
            "b.jpg is corrupt or truncated"),
    Refused("corrupt-png-bytes", lambda f: corrupt_middle(f / "a.png"),
            "a.png is corrupt or truncated"),
    Refused("zero-byte-file", lambda f: (f / "c.png").write_bytes(b""),
            "c.png is corrupt or truncated"),
    Refused("text-named-png", lambda f: (f / "c.png").write_text("not an image\n"),
            "c.png is corrupt or truncated"),
    Refused("html-named-jpg", lambda f: (f / "b.jpg").write_text("<html></html>"),
            "b.jpg is corrupt or truncated"),
    Refused("last-row-corrupt", add_image("d.png", lambda p: p.write_bytes(b"\x89PNG\r\n"),
                                          "d.png,White,Female,20s"),
            "d.png is corrupt or truncated"),
    Refused("folder-named-like-image", add_image("d.png", lambda p: p.mkdir(),
                                                 "d.png,White,Female,20s"),
            "d.png is a folder, not an image file"),
    Refused("missing-image", rows_with("nothere.png,White,Female,20s"), "nothere.png not found"),
    Refused("symlink-loop", symlink_loop, "a.png is a symbolic link to nothing (or a loop)"),
    Refused("dangling-symlink", dangling_link, "a.png is a symbolic link to nothing"),
    Refused("empty-folder", lambda f: [p.unlink() for p in f.iterdir()],
            "manifest.csv not found"),
    Refused("folder-missing", lambda r: set_params(r, folder="nowhere"),
            "source folder", on_root=True),
    Refused("folder-is-a-file", lambda r: ((r / "afile").write_text("x"),
                                           set_params(r, folder="afile")),
            "is not a folder", on_root=True),
    Refused("folder-not-set", lambda r: set_params(r, folder=None),
            "sources.folder is not set", on_root=True),
    Refused("manifest-zero-bytes", lambda f: (f / "manifest.csv").write_bytes(b""),
            "manifest.csv is empty"),
    Refused("manifest-header-only", lambda f: write_manifest(f, []),
            "manifest.csv lists no images"),
    Refused("manifest-missing-column", lambda f: write_manifest(
        f, ["a.png,Black,Female"], header="file,race,gender"), "lacks column(s) age"),
    Refused("manifest-no-header", lambda f: (f / "manifest.csv").write_text(
        "\n".join(GOOD_ROWS) + "\n"), "lacks column(s) file, race, gender, age"),
    Refused("manifest-duplicate-column", lambda f: write_manifest(
        f, ["a.png,Black,Female,20s,30s"], header=HEADER + ",age"), "column 'age' appears twice"),
    Refused("duplicate-source-id", rows_with("a.png,White,Female,20s"),
            "line 5: source id 'a' is already used on line 2"),
    Refused("duplicate-id-column", lambda f: write_manifest(
        f, ["a.png,Black,Female,20s,x", "b.jpg,White,Male,70plus,x"], header=HEADER + ",source_id"),
        "source id 'x' is already used"),
    Refused("unknown-race", rows_with("c.png,Caucasian,Female,20s"),
            "line 5: race 'Caucasian' is not one of"),
    Refused("unknown-gender", rows_with("c.png,White,Woman,20s"),
            "line 5: gender 'Woman' is not one of"),
    Refused("unknown-age", rows_with("c.png,White,Female,20-29"),
            "line 5: age '20-29' is not one of"),
    Refused("label-case", rows_with("c.png,white,Female,20s"), "race 'white' is not one of"),
    Refused("too-few-fields", rows_with("c.png,White,Female"),
            "line 5 has 3 field(s), the header has 4"),
    Refused("too-many-fields", rows_with("c.png,White,Female,20s,extra"),
            "line 5 has 5 field(s), the header has 4"),
    Refused("empty-file-cell", rows_with(",White,Female,20s"), "line 5: the file column is empty"),
    Refused("absolute-path", rows_with("/etc/hostname,White,Female,20s"),
            "is outside the folder"),
    Refused("parent-path", rows_with("../params.yaml,White,Female,20s"),
            "is outside the folder"),
    Refused("source-id-with-slash", lambda f: write_manifest(
        f, ["a.png,Black,Female,20s,../../evil"], header=HEADER + ",source_id"),
        "source id '../../evil' cannot be used as a file name"),
    Refused("source-id-hidden", lambda f: write_manifest(
        f, ["a.png,Black,Female,20s,.hidden"], header=HEADER + ",source_id"),
        "source id '.hidden' cannot be used as a file name"),
    Refused("manifest-latin1", lambda f: (f / "manifest.csv").write_bytes(
        (HEADER + ",origin\na.png,Black,Female,20s,Jos\xe9\n").encode("latin-1")),
        "manifest.csv line 2 is not UTF-8 (byte 0xe9"),
    Refused("manifest-utf16", lambda f: (f / "manifest.csv").write_bytes(
        (HEADER + "\n" + GOOD_ROWS[0] + "\n").encode("utf-16")),
        "manifest.csv line 1 is not UTF-8 (byte 0xff"),
    Refused("manifest-binary", lambda f: (f / "manifest.csv").write_bytes(
        (f / "a.png").read_bytes()), "is not UTF-8"),
    Refused("sha256-mismatch", lambda f: write_manifest(
        f, ["a.png,Black,Female,20s," + "0" * 64], header=HEADER + ",sha256_final"),
        "does not match the sha256"),
    Refused("decompression-bomb-20000", add_image(
        "bomb.png", lambda p: p.write_bytes(zeros_png(20000, 20000)), "bomb.png,White,Female,20s"),
        "bomb.png has more than 89,478,485 pixels, the limit"),
    Refused("oversized-10000", add_image(
        "big.png", lambda p: p.write_bytes(zeros_png(10000, 10000)), "big.png,White,Female,20s"),
        "big.png has more than 89,478,485 pixels, the limit"),
    Refused("float-tiff", add_image(
        "f.tif", lambda p: Image.fromarray(np.ones((8, 8), np.float32)).save(p),
        "f.tif,White,Female,20s"), "f.tif has floating-point samples"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_bad_source_is_refused_and_outputs_kept(good_project: Path, case: Refused) -> None:
    before, stats = snapshot(good_project), untouched(good_project)
    assert any(name.startswith("images/") for name in before)
    case.mutate(good_project if case.on_root else good_project / "faces")
    code, output = run_sources(good_project)
    assert code == 2, output
    assert "Traceback" not in output
    # The progress bar may come first; the message is the last two lines: problem, fix.
    lines = output.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    lines = lines[start:]
    assert len(lines) == 2 and lines[1].startswith("  fix: "), output
    assert case.message in lines[0], output
    assert snapshot(good_project) == before
    assert untouched(good_project) == stats


def assert_consistent(root: Path, count: int) -> pd.DataFrame:
    """The table names exactly the images on disk, with their sha256; no staging left."""
    import hashlib

    base = root / layout.SOURCES_DIR
    assert not [p for p in base.iterdir() if p.name.startswith(".tmp-")]
    table = pd.read_parquet(root / layout.SOURCES_TABLE)
    assert len(table) == count
    on_disk = sorted(p.name for p in (root / layout.SOURCE_IMAGES).iterdir())
    assert on_disk == sorted(Path(p).name for p in table["path"])
    for path, digest in zip(table["path"], table["sha256"], strict=True):
        assert hashlib.sha256((root / path).read_bytes()).hexdigest() == digest
    return table


def pixels(root: Path, source_id: str) -> np.ndarray:
    return np.asarray(Image.open(root / layout.SOURCE_IMAGES / f"{source_id}.png"))


def save_cmyk(path: Path) -> None:
    Image.new("CMYK", (40, 40), (0, 255, 255, 0)).save(path, quality=95)  # pure red


def save_palette_transparent(path: Path) -> None:
    image = Image.new("P", (40, 40), 0)
    image.putpalette([0, 0, 0, 200, 30, 30] + [0] * 762)
    image.paste(1, (0, 0, 40, 20))
    image.save(path, transparency=0)


@dataclass(frozen=True)
class Accepted:
    id: str
    mutate: Callable[[Path], None]
    count: int
    check: Callable[[Path], None] = lambda root: None


def close_to(root: Path, source_id: str, rgb: tuple[int, int, int], tol: int = 8) -> None:
    centre = pixels(root, source_id)[20:44, 20:44].reshape(-1, 3).astype(int).mean(axis=0)
    assert np.abs(centre - np.array(rgb)).max() <= tol, centre


def grey_gradient(root: Path, source_id: str) -> None:
    out = pixels(root, source_id)
    assert out.shape == (64, 64, 3)
    row = out[32, :, 0].astype(int)
    # 48x64 centre-cropped to 48x48 (columns 8..55) and resized to 64: a rising ramp from about
    # 8/63 to 55/63 of full scale, nowhere near the all-white image of a clipped 16-bit file.
    assert row[2] < 60 and row[-3] > 200 and np.all(np.diff(row[2:-2]) >= 0), row
    expected = np.interp(np.arange(64), [0, 63], [8 * 255 / 63, 55 * 255 / 63])
    assert np.abs(row[4:-4] - expected[4:-4]).max() <= 6, row


def origin_is(root: Path, origin: str) -> None:
    """A neutralised cell (as ``acrb curate finalize`` writes it) reads back as the value."""
    assert pd.read_parquet(root / layout.SOURCES_TABLE)["origin"].tolist() == [origin]


ACCEPTED = [
    Accepted("manifest-with-bom", lambda f: (f / "manifest.csv").write_bytes(
        b"\xef\xbb\xbf" + ("\n".join([HEADER, *GOOD_ROWS]) + "\n").encode()), 3),
    Accepted("manifest-crlf", lambda f: (f / "manifest.csv").write_bytes(
        ("\r\n".join([HEADER, *GOOD_ROWS]) + "\r\n").encode()), 3),
    Accepted("manifest-bom-crlf-spaces", lambda f: (f / "manifest.csv").write_bytes(
        b"\xef\xbb\xbf" + ("\r\n".join(["file, race, gender, age", *GOOD_ROWS]) + "\r\n")
        .encode()), 3),
    Accepted("blank-lines-and-extra-column", lambda f: write_manifest(
        f, ["a.png,Black,Female,20s,note", "", "b.jpg,White,Male,70plus,", ""],
        header=HEADER + ",comment"), 2),
    Accepted("quoted-cells-space-in-name", add_image(
        "d e.png", lambda p: Image.new("RGB", (9, 9), "blue").save(p),
        '"d e.png",White,Female,"20s"'), 4, lambda r: close_to(r, "d e", (0, 0, 255))),
    Accepted("16-bit-grey-png", add_image(
        "g16.png", lambda p: p.write_bytes(png_bytes(GRADIENT16, 0)), "g16.png,White,Female,20s"),
        4, lambda r: grey_gradient(r, "g16")),
    Accepted("16-bit-rgb-png", add_image(
        "rgb16.png", lambda p: p.write_bytes(png_bytes(np.stack([GRADIENT16] * 3, -1), 2)),
        "rgb16.png,White,Female,20s"), 4, lambda r: grey_gradient(r, "rgb16")),
    Accepted("16-bit-rgba-png", add_image(
        "rgba16.png", lambda p: p.write_bytes(png_bytes(np.stack(
            [GRADIENT16] * 3 + [np.full_like(GRADIENT16, 65535)], -1), 6)),
        "rgba16.png,White,Female,20s"), 4, lambda r: grey_gradient(r, "rgba16")),
    Accepted("16-bit-grey-alpha-png", add_image(
        "la16.png", lambda p: p.write_bytes(png_bytes(np.stack(
            [GRADIENT16, np.full_like(GRADIENT16, 65535)], -1), 4)),
        "la16.png,White,Female,20s"), 4, lambda r: grey_gradient(r, "la16")),
    Accepted("16-bit-tiff", add_image(
        "g16.tif", lambda p: Image.fromarray(GRADIENT16).save(p), "g16.tif,White,Female,20s"),
        4, lambda r: grey_gradient(r, "g16")),
    Accepted("cmyk-jpeg", add_image("cmyk.jpg", save_cmyk, "cmyk.jpg,White,Female,20s"), 4,
             lambda r: close_to(r, "cmyk", (255, 0, 0), tol=12)),
    Accepted("palette-png", add_image(
        "p.png", lambda p: Image.new("RGB", (30, 30), (10, 200, 40)).convert(
            "P", palette=Image.Palette.ADAPTIVE).save(p), "p.png,White,Female,20s"), 4,
        lambda r: close_to(r, "p", (10, 200, 40))),
    Accepted("palette-transparent-on-white", add_image(
        "pt.png", save_palette_transparent, "pt.png,White,Female,20s"), 4,
        lambda r: (np.testing.assert_array_equal(pixels(r, "pt")[60, 32], [255, 255, 255]),
                   np.testing.assert_allclose(pixels(r, "pt")[4, 32], [200, 30, 30], atol=4))),
    Accepted("la-png", add_image(
        "la.png", lambda p: Image.new("LA", (30, 30), (90, 255)).save(p),
        "la.png,White,Female,20s"), 4, lambda r: close_to(r, "la", (90, 90, 90), tol=1)),
    Accepted("transparent-rgba-on-white", add_image(
        "t.png", lambda p: Image.new("RGBA", (30, 30), (0, 0, 0, 0)).save(p),
        "t.png,White,Female,20s"), 4, lambda r: close_to(r, "t", (255, 255, 255), tol=0)),
    Accepted("greyscale-jpeg", add_image(
        "l.jpg", lambda p: Image.new("L", (30, 30), 128).save(p), "l.jpg,White,Female,20s"), 4,
        lambda r: close_to(r, "l", (128, 128, 128), tol=2)),
    Accepted("one-bit-png", add_image(
        "one.png", lambda p: Image.new("1", (30, 30), 1).save(p), "one.png,White,Female,20s"),
        4, lambda r: close_to(r, "one", (255, 255, 255), tol=0)),
    Accepted("image-in-subfolder", add_image(
        "sub/x.png", lambda p: (p.parent.mkdir(), Image.new("RGB", (9, 9), "red").save(p)),
        "sub/x.png,White,Female,20s"), 4, lambda r: close_to(r, "x", (255, 0, 0))),
    Accepted("formula-cell-escaped", lambda f: write_manifest(
        f, ["a.png,Black,Female,20s,'=HYPERLINK(1)"], header=HEADER + ",origin"), 1,
        lambda r: origin_is(r, "=HYPERLINK(1)")),
]


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_fine_source_is_accepted(good_project: Path, case: Accepted) -> None:
    case.mutate(good_project / "faces")
    code, output = run_sources(good_project)
    assert code == 0, output
    assert_consistent(good_project, case.count)
    case.check(good_project)


def test_failed_run_keeps_images_a_later_run_replaces(good_project: Path) -> None:
    """The good run's images survive a failed run, and the next good run replaces them whole
    (an image dropped from the manifest is gone, none is left half-written)."""
    table = assert_consistent(good_project, 3)
    truncate(good_project / "faces" / "a.png")
    assert run_sources(good_project)[0] == 2
    assert assert_consistent(good_project, 3).equals(table)
    write_manifest(good_project / "faces", GOOD_ROWS[1:])
    assert run_sources(good_project)[0] == 0
    assert sorted(assert_consistent(good_project, 2)["source_id"]) == ["b", "c"]


def test_stale_staging_folder_is_removed(good_project: Path) -> None:
    """A staging folder left by a killed run is cleaned up by the next run."""
    stale = good_project / layout.SOURCES_DIR / ".tmp-sources-killed"
    (stale / "images").mkdir(parents=True)
    (stale / "images" / "half.png").write_bytes(b"\x89PNG")
    assert run_sources(good_project)[0] == 0
    assert not stale.exists()
    assert_consistent(good_project, 3)


def test_suite_is_large_enough() -> None:
    assert len(REFUSED) + len(ACCEPTED) >= 30
