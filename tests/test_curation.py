"""Curation without the browser: the audit chain and `acrb curate verify`, the store's safety
checks, finalize (manifest, 1024² Lanczos, refusals), the `sources` stage with kind fairface on
a FairFace-shaped folder, and the study's own record on the 588 real candidates when present."""

from __future__ import annotations

import json
import os
import shutil
from itertools import pairwise
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from typer.testing import CliRunner

from acrb.cli import app
from acrb.curation.finalize import finalize, missing_cells
from acrb.curation.store import CRITERIA, CurationStore
from acrb.curation.study import import_study
from acrb.errors import InputDataError
from acrb.records import read_table, write_table
from acrb.sources.fairface import CandidateRecord
from acrb.sources.portraits import draw_portrait
from acrb.sources.prescreen import PrescreenRecord
from acrb.stages import sources as sources_stage
from acrb.stages.context import StageContext
from acrb.storage import sha256_file
from acrb.web.audit import canonical, entry_hash, verify
from tests.conftest import FAIRFACE_SAMPLE, write_params
from tests.curation_fixtures import make_candidates
from tests.test_prescreen import check_real_prescreen

ALL = dict.fromkeys(CRITERIA, True)


@pytest.fixture(scope="module")
def candidates_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_candidates(tmp_path_factory.mktemp("candidates") / "candidates", k=2)


@pytest.fixture
def store(tmp_path: Path, candidates_folder: Path) -> CurationStore:
    folder = shutil.copytree(candidates_folder, tmp_path / "candidates")
    store = CurationStore(tmp_path / "curation", create=True)
    store.load_candidates(folder)
    store.add_curator("alice")
    return store


def select_all(store: CurationStore, skip: tuple[str, ...] = ()) -> None:
    for cell, *_ in store.cells():
        if cell not in skip:
            store.decide("alice", cell, "select", candidate_id=f"{cell}_c1", criteria=ALL,
                         rationale="clear, frontal, neutral")


# ----------------------------------------------------------------------------- audit log


def test_every_change_is_chained_and_an_edited_line_is_named(store: CurationStore) -> None:
    store.decide("alice", "Black_Female_20s", "reject", candidate_id="Black_Female_20s_c2",
                 criteria={"frontal_face": False}, rationale="looks away")
    store.decide("alice", "Black_Female_20s", "select", candidate_id="Black_Female_20s_c1",
                 criteria=ALL, rationale="ok")
    assert store.verify().ok
    lines = store.log.read_text().splitlines()
    # load_candidates, add_curator, reject, select
    assert [json.loads(x)["action"] for x in lines] == ["load_candidates", "add_curator",
                                                        "reject", "select"]
    assert all(json.loads(b)["prev"] == json.loads(a)["hash"] for a, b in pairwise(lines))

    edited = json.loads(lines[2])
    edited["rationale"] = "fine"
    lines[2] = canonical(edited)
    store.log.write_text("\n".join(lines) + "\n")
    check = store.verify()
    assert not check.ok and check.line == 3 and "edited" in check.problem

    result = CliRunner().invoke(app, ["curate", "verify", str(store.workdir)])
    assert result.exit_code == 1
    assert "audit.jsonl line 3" in result.output


def test_a_rewritten_chain_is_caught_by_the_database_copy(store: CurationStore) -> None:
    select_all(store)
    lines = store.log.read_text().splitlines()
    entries = [json.loads(x) for x in lines]
    entries[10]["rationale"] = "rewritten"
    prev = entries[9]["hash"]
    for entry in entries[10:]:  # recompute every later hash so the file alone looks intact
        entry["prev"] = prev
        entry["hash"] = entry_hash(entry)
        prev = entry["hash"]
    store.log.write_text("".join(canonical(e) + "\n" for e in entries))
    assert verify(store.log, expected_head=prev).ok  # the file's own chain is consistent...
    check = store.verify()  # ...but not with what the database recorded
    assert not check.ok and check.line == 11


def test_removing_the_last_lines_is_caught(store: CurationStore) -> None:
    select_all(store)
    lines = store.log.read_text().splitlines(keepends=True)
    store.log.write_text("".join(lines[:-2]))
    check = store.verify()
    assert not check.ok and check.line == len(lines) - 1 and "removed" in check.problem


def test_a_line_left_by_an_uncommitted_write_is_set_aside_and_reported(
        store: CurationStore) -> None:
    store.decide("alice", "Black_Female_20s", "select", candidate_id="Black_Female_20s_c1",
                 criteria=ALL)
    with open(store.log, "a") as handle:  # as if the process died before COMMIT
        handle.write('{"seq": 99}\n')
    reopened = CurationStore(store.workdir)
    aside = list(store.workdir.glob("audit.jsonl.past-head-*"))
    assert len(aside) == 1 and aside[0].read_text() == '{"seq": 99}\n'
    check = reopened.verify()  # set aside, never silently accepted
    assert not check.ok and aside[0].name in check.problem and "--resolve" in check.fix
    # The tool stays usable: the next decision chains onto the recorded head.
    reopened.decide("alice", "Black_Female_20s", "deselect")
    assert not reopened.verify().ok
    [entry] = reopened.resolve_set_aside("alice")
    assert entry["file"] == aside[0].name and entry["lines"] == 1 and entry["file_intact"]
    assert reopened.verify().ok and aside[0].exists()


# ------------------------------------------------------------------------------ the store


def test_decisions_are_validated(store: CurationStore) -> None:
    with pytest.raises(InputDataError, match="not a candidate of cell"):
        store.decide("alice", "Black_Female_20s", "select", candidate_id="White_Male_20s_c1")
    with pytest.raises(InputDataError, match="not in the design"):
        store.decide("alice", "Nobody_Female_20s", "select", candidate_id="x")
    with pytest.raises(InputDataError, match="at most"):
        store.decide("alice", "Black_Female_20s", "reject", candidate_id="Black_Female_20s_c1",
                      rationale="x" * 2001)
    with pytest.raises(InputDataError, match="no curator"):
        store.decide("mallory", "Black_Female_20s", "deselect")
    assert [json.loads(x)["action"] for x in store.log.read_text().splitlines()] == [
        "load_candidates", "add_curator"]


def test_select_reject_deselect_state(store: CurationStore) -> None:
    cell = "White_Male_70plus"
    store.decide("alice", cell, "select", candidate_id=f"{cell}_c1", criteria=ALL)
    store.decide("alice", cell, "select", candidate_id=f"{cell}_c2", criteria=ALL)
    assert store.selections()[cell]["candidate_id"] == f"{cell}_c2"
    store.decide("alice", cell, "reject", candidate_id=f"{cell}_c2", rationale="blurred")
    assert cell not in store.selections() and f"{cell}_c2" in store.rejections()
    store.decide("alice", cell, "select", candidate_id=f"{cell}_c1", criteria=ALL)
    store.decide("alice", cell, "deselect")
    assert cell not in store.selections()
    assert [d["action"] for d in store.decisions(cell)] == [
        "select", "select", "reject", "select", "deselect"]


def test_changed_candidates_are_refused(store: CurationStore, tmp_path: Path) -> None:
    folder = tmp_path / "candidates"
    table = read_table(folder / "candidates.parquet", CandidateRecord)
    table.loc[0, "sha256"] = "0" * 64
    write_table(folder / "candidates.parquet", table.to_dict(orient="records"), CandidateRecord)
    with pytest.raises(InputDataError, match="differ from the ones being curated"):
        store.load_candidates(folder)


def test_tokens_are_stored_as_hashes_only(store: CurationStore) -> None:
    token = store.add_curator("bob")
    assert store.curator_for_token(token) == "bob"
    assert token.encode() not in store.database.read_bytes()
    assert token not in store.log.read_text()
    assert store.curator_for_token(token + "x") is None


# ------------------------------------------------------------------------------- finalize


def test_finalize_refuses_an_incomplete_grid_and_names_the_missing_cells(
        store: CurationStore, tmp_path: Path) -> None:
    select_all(store, skip=("Indian_Male_30s", "White_Female_60s"))
    with pytest.raises(InputDataError, match="Indian_Male_30s, White_Female_60s"):
        finalize(store, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    result = finalize(store, tmp_path / "out", size=128, allow_incomplete=True)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert result.missing == manifest["missing"] == ["Indian_Male_30s", "White_Female_60s"]
    assert manifest["cells_selected"] == 82 and len(pd.read_csv(result.manifest)) == 82


def test_finalize_writes_images_manifest_and_trail(store: CurationStore,
                                                   tmp_path: Path) -> None:
    select_all(store)
    store.decide("alice", "Black_Male_40s", "select", candidate_id="Black_Male_40s_c2",
                 criteria={**ALL, "neutral_expression": False}, rationale="smiling a little")
    out = tmp_path / "inputs" / "fairface-curated"
    result = finalize(store, out, size=256, curator="alice")
    assert result.images == 84 and result.missing == []
    manifest = pd.read_csv(out / "manifest.csv", keep_default_na=False)
    row = manifest.set_index("source_id").loc["Black_Male_40s"]
    assert row["candidate_id"] == "Black_Male_40s_c2" and row["curator"] == "alice"
    assert row["rationale"] == "smiling a little" and row["criteria_met"] == 5
    assert not row["neutral_expression"]
    original = tmp_path / "candidates" / "images" / "Black_Male_40s_c2.png"
    assert row["sha256_original"] == sha256_file(original)
    final = out / row["file"]
    assert row["sha256_final"] == sha256_file(final)
    with Image.open(final) as image, Image.open(original) as source:
        assert image.size == (256, 256)
        expected = source.convert("RGB").resize((256, 256), Image.Resampling.LANCZOS)
        assert np.array_equal(np.asarray(image), np.asarray(expected))
    meta = json.loads((out / "manifest.json").read_text())
    assert "LANCZOS" in meta["resize_filter"] and meta["size"] == 256
    assert verify(out / "audit.jsonl", expected_head=meta["audit"]["head"]).ok
    assert json.loads((out / "audit.jsonl").read_text().splitlines()[-1])["action"] == "finalize"
    assert len(pd.read_csv(out / "decisions.csv")) == len(store.decisions()) == 85
    ok = CliRunner().invoke(app, ["curate", "verify", str(out)])
    assert ok.exit_code == 0, ok.output

    lines = (out / "audit.jsonl").read_text().splitlines()
    lines[5] = lines[5].replace('"alice"', '"mallory"')
    (out / "audit.jsonl").write_text("\n".join(lines) + "\n")
    bad = CliRunner().invoke(app, ["curate", "verify", str(out)])
    assert bad.exit_code == 1 and "line 6" in bad.output


def test_finalize_defaults_to_1024_pixels(store: CurationStore, tmp_path: Path) -> None:
    store.decide("alice", "Indian_Female_20s", "select", candidate_id="Indian_Female_20s_c1",
                 criteria=ALL)
    result = finalize(store, tmp_path / "out", allow_incomplete=True)
    assert result.images == 1 and len(result.missing) == 83
    with Image.open(tmp_path / "out" / "images" / "Indian" / "Indian_Female_20s.png") as image:
        assert image.size == (1024, 1024)


def test_finalize_refuses_a_candidate_changed_since_curation(store: CurationStore,
                                                            tmp_path: Path) -> None:
    select_all(store)
    target = tmp_path / "candidates" / "images" / "Latino_Female_50s_c1.png"
    Image.new("RGB", (96, 96)).save(target)
    with pytest.raises(InputDataError, match="changed since it was curated"):
        finalize(store, tmp_path / "out", size=64)


def test_finalize_refuses_a_broken_audit_log(store: CurationStore, tmp_path: Path) -> None:
    select_all(store)
    lines = store.log.read_text().splitlines()
    store.log.write_text("\n".join(lines[:3] + lines[4:]) + "\n")
    with pytest.raises(InputDataError, match="does not verify"):
        finalize(store, tmp_path / "out")


# --------------------------------------------------------- the sources stage, kind fairface


def fairface_folder(root: Path) -> Path:
    """A FairFace-release-shaped folder (val/<n>.jpg + fairface_label_val.csv) covering the
    tiny design: 9 faces per cell, except Black Male 70+ with 2 (a shortfall)."""
    rows = []
    for race in ("Black", "White"):
        for gender in ("Female", "Male"):
            for age in ("20-29", "more than 70"):
                count = 2 if (race, gender, age) == ("Black", "Male", "more than 70") else 9
                for _ in range(count):
                    rows.append({"file": f"val/{len(rows) + 1}.jpg", "age": age,
                                 "gender": gender, "race": race, "service_test": "True"})
    ages = {"20-29": "20s", "more than 70": "70plus"}
    for index, row in enumerate(rows):
        path = root / row["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        portrait = draw_portrait(row["race"], row["gender"], ages[row["age"]], 64, seed=index)
        Image.fromarray(portrait.pixels).save(path, quality=90)
    pd.DataFrame(rows).to_csv(root / "fairface_label_val.csv", index=False)
    return root


def test_sources_stage_draws_curates_and_builds_from_the_curated_set(project: Path) -> None:
    fairface_folder(project / "fairface")
    write_params(project, {"sources": {"kind": "fairface", "resolution": 64,
                                       "fairface": {"dataset": "fairface", "k": 7}}})
    with pytest.raises(InputDataError, match="no curated set"):
        sources_stage.run(StageContext.load(Path("params.yaml")))
    candidates = project / "data" / "sources" / "candidates"
    summary = json.loads((candidates / "summary.json").read_text())
    assert summary["candidates"] == 7 * 7 + 2 and summary["shortfalls"] == {"Black_Male_70plus": 2}
    screened = read_table(candidates / "prescreen.parquet", PrescreenRecord)
    assert len(screened) == 51 and set(screened["candidate_id"]) == set(
        pd.read_parquet(candidates / "candidates.parquet")["candidate_id"])

    store = CurationStore(project / "curation", create=True)
    store.load_candidates(candidates)
    assert len(store.cells()) == 8
    store.add_curator("alice")
    for cell, *_ in store.cells():
        store.decide("alice", cell, "select", candidate_id=f"{cell}_c2", criteria=ALL)
    finalize(store, project / "inputs" / "fairface-curated", size=96)

    summary = sources_stage.run(StageContext.load(Path("params.yaml")))
    assert summary.count == 8
    table = pd.read_parquet(summary.table)
    assert set(table["source_id"]) == {c for c, *_ in store.cells()}
    assert (table["width"] == 64).all()

    image = next((project / "inputs" / "fairface-curated" / "images" / "White").glob("*.png"))
    Image.new("RGB", (96, 96)).save(image)
    with pytest.raises(InputDataError, match="changed after it was finalized"):
        sources_stage.run(StageContext.load(Path("params.yaml")))


def test_fairface_kind_needs_its_section(project: Path) -> None:
    from acrb.errors import ConfigError

    write_params(project, {"sources": {"kind": "fairface"}})
    with pytest.raises(ConfigError, match="fairface"):
        StageContext.load(Path("params.yaml"))


# ------------------------------------------------------- the study's record, on real faces


@pytest.mark.real_faces
def test_study_candidates_prescreen_import_and_finalize(project: Path) -> None:
    write_params(project, {"sources": {
        "kind": "fairface", "resolution": 1024,
        "races": ["Black", "EastAsian", "Indian", "Latino", "MiddleEastern", "SoutheastAsian",
                  "White"],
        "ages": ["20s", "30s", "40s", "50s", "60s", "70plus"],
        "fairface": {"dataset": str(FAIRFACE_SAMPLE / "candidates"), "k": 7}}})
    with pytest.raises(InputDataError, match="no curated set"):
        sources_stage.run(StageContext.load(Path("params.yaml")))
    candidates = project / "data" / "sources" / "candidates"
    screened = read_table(candidates / "prescreen.parquet", PrescreenRecord)
    assert len(screened) == 588
    assert screened["face_found"].mean() >= 0.95
    assert screened["sharpness"].notna().all()
    check_real_prescreen(screened)  # the pre-screen's own checks, on the stage's table

    store = CurationStore(project / "curation", create=True)
    store.load_candidates(candidates)
    report = import_study(store, FAIRFACE_SAMPLE)
    assert (report.entries, report.selects, report.deselects) == (103, 97, 6)
    assert report.selected_cells == 83 and report.disagree_with_selections == {}
    # The study's own records disagree in two places, and the import says so:
    assert report.curated_then_deselected == ["Black_Female_40s"]
    assert report.curated_file_missing == ["EastAsian_Male_70plus"]
    assert missing_cells(store) == ["Black_Female_40s"]
    assert store.verify().ok

    with pytest.raises(InputDataError, match="Black_Female_40s"):
        finalize(store, project / "inputs" / "fairface-curated")
    result = finalize(store, project / "inputs" / "fairface-curated", allow_incomplete=True)
    manifest = json.loads((result.folder / "manifest.json").read_text())
    assert manifest["missing"] == ["Black_Female_40s"] and manifest["cells_selected"] == 83
    rows = pd.read_csv(result.manifest).set_index("source_id")
    row = rows.loc["EastAsian_Male_70plus"]
    assert row["candidate_id"] == "EastAsian_Male_70plus_V2"
    assert row["decided_at"] == "2026-01-08T13:08:08.868974"  # the study's own timestamp
    study_file = FAIRFACE_SAMPLE / "candidates" / "V2" / "EastAsian" / "EastAsian_Male_70plus.jpg"
    assert row["sha256_original"] == sha256_file(study_file)
    with Image.open(result.folder / row["file"]) as image:
        assert image.size == (1024, 1024)

    summary = sources_stage.run(StageContext.load(Path("params.yaml")))
    assert summary.count == 83


# ------------------------------------------------ a study-shaped folder, made in the test

STUDY_CELLS = [("Black", "Female", "20-29", "20s"), ("Black", "Female", "more than 70", "70plus"),
               ("White", "Female", "20-29", "20s"), ("White", "Female", "more than 70", "70plus")]


def study_folder(root: Path, with_log: bool = True) -> Path:
    """The curation study's layout: candidates/V1..V2/<Race>/<cell>.jpg with metadata.json,
    its selection log and final selections, and a curated/ folder missing one image."""
    for version in ("V1", "V2"):
        listing = []
        for index, (race, gender, age, code) in enumerate(STUDY_CELLS):
            cell = f"{race}_{gender}_{code}"
            path = root / "candidates" / version / race / f"{cell}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            portrait = draw_portrait(race, gender, code, 64, seed=index * 10 + int(version[1]))
            Image.fromarray(portrait.pixels).save(path, quality=90)
            listing.append({"filename": f"{cell}.jpg", "race": race, "gender": gender,
                            "age": age})
        (root / "candidates" / version / "metadata.json").write_text(
            json.dumps({"images": listing}))
    ticks = dict.fromkeys(CRITERIA, True)
    log = [
        {"timestamp": "2026-01-08T11:00:00", "demo_id": "Black_Female_20s", "version": "V2",
         "criteria": ticks, "notes": "", "action": "select"},
        {"timestamp": "2026-01-08T11:01:00", "demo_id": "White_Female_20s", "version": "V1",
         "criteria": {**ticks, "frontal_face": False}, "notes": "slight turn",
         "action": "select"},
        {"timestamp": "2026-01-08T11:02:00", "demo_id": "White_Female_70plus", "version": "V1",
         "criteria": ticks, "notes": "", "action": "select"},
        {"timestamp": "2026-01-08T11:03:00", "demo_id": "Black_Female_70plus", "version": "V1",
         "criteria": ticks, "notes": "", "action": "select"},
        {"timestamp": "2026-01-08T12:00:00", "demo_id": "Black_Female_70plus",
         "action": "deselect"},
    ]
    if with_log:
        (root / "candidates" / "selection_logs.json").write_text(json.dumps(log))
    final = {"Black_Female_20s": "V2", "White_Female_20s": "V1", "White_Female_70plus": "V2"}
    (root / "candidates" / "selections.json").write_text(
        json.dumps({c: {"version": v} for c, v in final.items()}))
    (root / "curated" / "White").mkdir(parents=True)
    (root / "curated" / "White" / "White_Female_20s.jpg").write_bytes(b"")
    (root / "curated" / "metadata.json").write_text(json.dumps({"source_versions": {
        "Black_Female_20s": "V2", "White_Female_20s": "V1", "Black_Female_70plus": "V1"}}))
    return root


def study_project(project: Path, with_log: bool = True) -> CurationStore:
    study_folder(project / "study", with_log)
    write_params(project, {"sources": {"kind": "fairface", "resolution": 64, "genders":
                                       ["Female"], "fairface": {"dataset": "study", "k": 2}}})
    with pytest.raises(InputDataError, match="no curated set"):
        sources_stage.run(StageContext.load(Path("params.yaml")))
    store = CurationStore(project / "curation", create=True)
    store.load_candidates(project / "data" / "sources" / "candidates")
    return store


def test_study_import_replays_the_log_and_reports_every_disagreement(project: Path) -> None:
    store = study_project(project)
    assert len(store.cells()) == 4
    report = import_study(store, project / "study")
    assert (report.entries, report.selects, report.deselects, report.selected_cells) == (
        5, 4, 1, 3)
    # the log ends with White_Female_70plus at V1, selections.json says V2
    assert report.disagree_with_selections == {"White_Female_70plus": ("V1", "V2")}
    assert report.curated_then_deselected == ["Black_Female_70plus"]
    assert report.curated_file_missing == ["Black_Female_20s", "White_Female_70plus"]
    assert missing_cells(store) == ["Black_Female_70plus"]
    entries = [json.loads(x) for x in store.log.read_text().splitlines()]
    imported = [e for e in entries if e.get("source") == "import:selection_logs.json"]
    assert [e["recorded_at"] for e in imported][:2] == ["2026-01-08T11:00:00",
                                                        "2026-01-08T11:01:00"]
    assert entries[-1]["action"] == "import_study"
    with pytest.raises(InputDataError, match="already holds an import"):
        import_study(store, project / "study")

    result = finalize(store, project / "inputs" / "fairface-curated", size=128,
                      allow_incomplete=True)
    assert result.missing == ["Black_Female_70plus"]
    row = pd.read_csv(result.manifest, keep_default_na=False).set_index("source_id").loc[
        "White_Female_20s"]
    assert row["rationale"] == "slight turn" and not row["frontal_face"]
    assert row["decided_at"] == "2026-01-08T11:01:00"
    assert sources_stage.run(StageContext.load(Path("params.yaml"))).count == 3


def test_study_import_from_selections_alone(project: Path) -> None:
    store = study_project(project, with_log=False)
    report = import_study(store, project / "study")
    assert report.selected_cells == 3 and report.disagree_with_selections == {}
    assert store.selections()["White_Female_70plus"]["candidate_id"] == "White_Female_70plus_V2"
    assert not any(store.selections()["White_Female_20s"]["criteria"].values())
