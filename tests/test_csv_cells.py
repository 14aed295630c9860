"""CSV formula injection (OWASP "CSV Injection"): every CSV the project writes neutralises text
cells a spreadsheet would run as a formula, keeps numbers numbers, and goes through one writer.
"""

from __future__ import annotations

import ast
import csv
import io
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from acrb.curation.finalize import finalize
from acrb.curation.store import CRITERIA, CurationStore
from acrb.storage import csv_text, read_csv, safe_csv_cell, unescape_csv_cell, write_csv
from tests.curation_fixtures import make_candidates

REPO = Path(__file__).resolve().parents[1]
PAYLOAD = '=HYPERLINK("http://x","y")'


@pytest.mark.parametrize(("value", "written"), [
    (PAYLOAD, "'" + PAYLOAD),
    ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
    ("-2+3+cmd|' /C calc'!A0", "'-2+3+cmd|' /C calc'!A0"),
    ("@SUM(1+1)*cmd|' /C calc'!A0", "'@SUM(1+1)*cmd|' /C calc'!A0"),
    ("\t=1+1", "'\t=1+1"),
    ("\r=1+1", "'\r=1+1"),
    ("-", "'-"),
    ("=", "'="),
    ("plain text", "plain text"),
    ("a=b", "a=b"),
    ("", ""),
    ("'already quoted", "'already quoted"),
    # Plain decimal numbers written as text are read by a spreadsheet as numbers, nothing else.
    ("-0.12", "-0.12"),
    ("+3e-4", "+3e-4"),
    ("-.5", "-.5"),
    ("-0.12 [-0.2, 0.1]", "'-0.12 [-0.2, 0.1]"),
    (-0.12, -0.12),
    (3, 3),
    (None, None),
])
def test_safe_csv_cell(value: object, written: object) -> None:
    assert safe_csv_cell(value) == written
    assert unescape_csv_cell(safe_csv_cell(value)) == value
    assert safe_csv_cell(safe_csv_cell(value)) == written  # neutralising twice changes nothing


def test_csv_keeps_numbers_numbers(tmp_path: Path) -> None:
    frame = pd.DataFrame({
        "model": ["=evil()", "ok", "@x"],
        "delta": [-0.12, 0.5, float("nan")],
        "n": [-3, 4, 5],
        "flag": [True, False, True],
        "note": ["-0.25", "+x", None],
    })
    path = tmp_path / "out.csv"
    write_csv(frame, path, float_format="%.6g")
    rows = list(csv.reader(io.StringIO(path.read_text())))
    assert rows[0] == ["model", "delta", "n", "flag", "note"]
    assert rows[1] == ["'=evil()", "-0.12", "-3", "True", "-0.25"]
    assert rows[2] == ["ok", "0.5", "4", "False", "'+x"]
    assert rows[3] == ["'@x", "", "5", "True", ""]
    back = pd.read_csv(path)
    assert back["delta"].dtype == np.float64 and back["delta"][0] == -0.12
    assert math.isnan(back["delta"][2])
    assert back["n"].tolist() == [-3, 4, 5]
    # The project's own reader gives the original text back.
    assert read_csv(path)["model"].tolist() == ["=evil()", "ok", "@x"]


def test_column_names_are_neutralised() -> None:
    text = csv_text(pd.DataFrame({"=1+1": [1]}))
    assert text.splitlines()[0] == "'=1+1"


def test_curator_rationale_is_neutralised_in_decisions_and_manifest(tmp_path: Path) -> None:
    """A curator's rationale `=HYPERLINK(...)`, entered through the curation store (what the
    web tool calls), reaches decisions.csv and manifest.csv as text, not as a formula."""
    cells = ["Black_Female_20s", "White_Male_70plus"]
    folder = make_candidates(tmp_path / "candidates", k=1, size=48, cells=cells)
    store = CurationStore(tmp_path / "curation", create=True)
    store.load_candidates(shutil.copytree(folder, tmp_path / "loaded"))
    store.add_curator("alice")
    for cell in cells:
        store.decide("alice", cell, "select", candidate_id=f"{cell}_c1",
                     criteria=dict.fromkeys(CRITERIA, True), rationale=PAYLOAD)
    result = finalize(store, tmp_path / "set", size=32, allow_incomplete=True)
    for name in ("decisions.csv", "manifest.csv"):
        text = (result.folder / name).read_text()
        cells_written = [cell for row in csv.reader(io.StringIO(text)) for cell in row]
        assert "'" + PAYLOAD in cells_written, name
        assert not [c for c in cells_written if c.startswith(("=", "+", "@", "\t", "\r"))
                    or (c.startswith("-") and c != safe_csv_cell(c))], name
    manifest = read_csv(result.folder / "manifest.csv", keep_default_na=False)
    assert manifest["rationale"].tolist() == [PAYLOAD, PAYLOAD]


def _csv_writes(path: Path) -> list[str]:
    """Calls in ``path`` that write CSV without :func:`acrb.storage.write_csv`: ``.to_csv(``,
    ``csv.writer(`` and ``csv.DictWriter(``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            owner = node.func.value
            if name == "to_csv" or (name in ("writer", "DictWriter")
                                    and isinstance(owner, ast.Name) and owner.id == "csv"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}(")
        elif isinstance(node, ast.ImportFrom) and node.module == "csv":
            names = {alias.name for alias in node.names}
            if names & {"writer", "DictWriter"}:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: from csv import writer")
    return found


def test_no_csv_writer_bypasses_the_helper() -> None:
    """Every CSV the package writes goes through acrb.storage.write_csv / csv_text, the only
    place that calls ``to_csv``."""
    storage = REPO / "src" / "acrb" / "storage.py"
    files = sorted((REPO / "src" / "acrb").rglob("*.py"))
    assert len(files) > 50
    bypass = [hit for path in files if path != storage for hit in _csv_writes(path)]
    assert not bypass, "CSV written without acrb.storage.write_csv:\n" + "\n".join(bypass)
    assert _csv_writes(storage), "the helper itself must be found by the scan"
