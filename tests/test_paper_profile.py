"""The paper profile (profiles/paper.yaml) with its stand-ins, run end to end on a CPU.

`-S profile.stand_ins=true` swaps the real editors, judges, FairFace set, people's ratings and
the study's files for the simulated stand-ins the profile lists; everything else is the paper's
design. Here the design is shrunk (two ages, one seed, a smaller feature sample and review) so
the run takes about a minute; the full-size stand-in run is measured in
docs/reproducing-the-paper.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from acrb import layout
from acrb.config import STAND_IN_MARK
from acrb.stages.context import StageContext
from tests.conftest import REPO, run_pipeline

PAPER = REPO / "profiles" / "paper.yaml"
EDITORS = {"flux2-dev", "step1x-edit-v1p2", "qwen-image-edit-2511"}


def _paper_params(stand_ins: bool) -> dict:
    params = yaml.safe_load(PAPER.read_text())
    params["profile"]["stand_ins"] = stand_ins
    return params


def test_the_profile_describes_the_papers_run() -> None:
    params = _paper_params(stand_ins=False)
    assert set(params["models"]) == EDITORS
    assert params["prompts"]["ids"] == [f"B{i:02d}" for i in range(1, 11)] + [
        f"D{i:02d}" for i in range(1, 11)]
    # One run per cell: 84 x 20 = 1,680 edits per editor (the paper's 5,040 is three editors).
    assert params["plan"]["seeds"] == [0]
    assert params["plan"]["arms"] == ["none", "feature"]
    feature = params["plan"]["feature"]
    assert feature["sample"] == 500 and feature["across_models"] is True
    assert feature["strata"] == ["prompt", "model"]
    assert feature["template"] == "{instruction}. {feature}"
    assert params["judge"]["ensemble"] == "study" and len(params["judge"]["use"]) == 2
    assert params["review"]["items"] == "feature-pairs" and params["review"]["ratings"] == "inputs"
    assert params["review"]["include_needs_review"] is False
    assert params["winobias"]["study_file"]
    assert params["profile"]["simulation"] is False


def test_the_stand_in_plan_with_the_studys_files_has_the_papers_design(tmp_path: Path) -> None:
    # The full-size plan (no generation) of a stand-in run that reads files of the study's
    # published shapes (made up here): its prompt set imported unchanged, its cell-keyed feature
    # mapping and its WinoBias pairs with their role coding. 84 portraits x 20 prompts = 1,680
    # audit edits per editor, and 500 feature pairs in total, 25 per prompt, 167/167/166.
    from acrb.prompts.study import import_study
    from acrb.stages import features, plan, prompts, sources
    from tests.test_feature_mapping import sentence, write_mapping
    from tests.test_study_prompts import published_bytes, published_document
    from tests.test_winobias_study import published_list

    params = _paper_params(stand_ins=True)
    for section in ("prompts", "features", "winobias"):  # the paper's own sections stay
        params["stand_ins"][section] = {}
    study = tmp_path / "study"
    study.mkdir()
    (study / "i2i_prompts.json").write_bytes(published_bytes(published_document()))
    inputs = tmp_path / "inputs" / "study"
    import_study(study / "i2i_prompts.json", tmp_path / params["prompts"]["catalog"])
    write_mapping(tmp_path / params["features"]["mapping"])
    (tmp_path / params["winobias"]["study_file"]).write_text(
        json.dumps(published_list(coding=True), indent=4))
    assert sorted(p.name for p in inputs.iterdir()) == [
        "i2i_catalog.yaml", "identity_prompt_mapping.json",
        "winobias_prompts_with_stereotype.json"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (tmp_path / "src").symlink_to(REPO / "src")
    ctx = StageContext.load(tmp_path / "params.yaml", tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        patch.chdir(tmp_path)
        for stage in (sources, prompts, features, plan):
            stage.run(ctx)
    requests = pd.read_parquet(tmp_path / layout.PLAN_TABLE)
    audit = requests[requests["experiment"] == "audit"]
    plain = audit[audit["arm"] == "none"]
    assert plain.groupby("model").size().to_dict() == dict.fromkeys(EDITORS, 1680)
    assert set(plain["prompt_id"]) == {f"{c}{i:02d}" for c in "BD" for i in range(1, 11)}
    assert plain["prompt_text"].str.startswith("Made-up edit instruction").all()
    feature = audit[audit["arm"] == "feature"]
    assert len(feature) == 500
    assert sorted(feature.groupby("model").size()) == [166, 167, 167]
    assert feature.groupby("prompt_id").size().eq(25).all()
    assert feature["category"].value_counts().to_dict() == {"B": 250, "D": 250}
    # Each placeholder portrait got its cell's sentence (runs of spaces made one), appended
    # after the instruction.
    cells = feature["race"] + "_" + feature["gender"] + "_" + feature["age"]
    assert feature["feature_prompt"].tolist() == [" ".join(sentence(c).split()) for c in cells]
    twins = plain.set_index("request_id").loc[feature["pair_of"]]
    assert [f"{t}. {f}" for t, f in zip(twins["prompt_text"], feature["feature_prompt"],
                                        strict=True)] == feature["prompt_text"].tolist()
    # The 50 WinoBias pairs for every stand-in editor (the simulated ones all take two images;
    # the real Step1X-Edit would be skipped), the study's coding used.
    wino = requests[requests["experiment"] == "winobias"]
    assert wino.groupby("model").size().to_dict() == dict.fromkeys(EDITORS, 50)
    items = pd.read_parquet(tmp_path / "data" / "plan" / "winobias_items.parquet")
    assert set(items["roles_from"]) == {"study"}


@pytest.fixture(scope="module")
def stand_in_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("paper")
    params = _paper_params(stand_ins=True)
    # Shrink the design (the stand-ins, not the paper's sections, say what runs).
    params["stand_ins"]["sources"]["ages"] = ["20s", "60s"]
    params["stand_ins"]["sources"]["resolution"] = 64
    params["stand_ins"]["winobias"]["pairs_per_race"] = 1
    params["stand_ins"]["review"]["sample_size"] = 60
    params["plan"]["seeds"] = [0]
    params["plan"]["feature"]["sample"] = 84
    params["analyze"].update(bootstrap=200, permutations=200, ordinal_model=False)
    params["stand_ins"]["review"]["bootstrap"] = 100
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "dvc.yaml").write_text("stages: {}\n")
    (root / "src").symlink_to(REPO / "src")  # the shipped catalog, sentences and rubrics
    run_pipeline(StageContext.load(root / "params.yaml", root))
    return root


def test_stand_ins_run_the_paper_profile_end_to_end_and_say_so(stand_in_run: Path) -> None:
    ctx = StageContext.load(stand_in_run / "params.yaml", stand_in_run)
    assert ctx.params.profile.simulation is True
    assert {entry.key for entry in ctx.params.models.values()} <= {"synthetic:fair",
                                                                   "synthetic:biased"}
    requests = pd.read_parquet(stand_in_run / layout.PLAN_TABLE)
    assert set(requests["model"]) == EDITORS
    audit = requests[(requests["experiment"] == "audit") & (requests["arm"] == "none")]
    # 28 placeholder portraits (7 races x 2 genders x 2 ages) x the 20 prompts x 1 seed
    assert audit.groupby("model").size().eq(28 * 20).all()
    assert set(audit["prompt_id"]) == {f"{c}{i:02d}" for c in "BD" for i in range(1, 11)}
    # 84 feature cases in total over the three editors: 28 each, 4 or 5 per prompt
    per_model = requests[requests["arm"] == "feature"].groupby("model").size()
    assert per_model.sum() == 84 and per_model.eq(28).all()
    per_prompt = requests[requests["arm"] == "feature"].groupby("prompt_id").size()
    assert set(per_prompt) == {4, 5}
    # People rate exactly the feature pairs whose two outputs were judged.
    items = pd.read_parquet(stand_in_run / layout.REVIEW_SET)
    assert items["paired_request_id"].notna().all() and items["random_sample"].all()
    assert 0 < len(items) <= 84
    assert (requests["experiment"] == "winobias").any()
    html = (stand_in_run / layout.REPORT_FILE).read_text()
    assert STAND_IN_MARK.strip() in html


def test_stand_ins_produce_every_paper_table(stand_in_run: Path) -> None:
    index = json.loads((stand_in_run / layout.TABLES_DIR / "index.json").read_text())
    assert index["simulated"] is True and index["profile"] == "paper"
    statuses = {t["id"]: t["status"] for t in index["tables"]}
    assert len(statuses) == 9 and set(statuses.values()) == {"written"}, statuses
    summary = json.loads((stand_in_run / layout.PLAN_SUMMARY).read_text())
    assert set(summary["per_model"]) == EDITORS


def test_stand_ins_fill_table_7s_age_row_on_the_studys_scale(stand_in_run: Path) -> None:
    """The simulated raters are asked the study's bipolar age item (``review.age_question:
    direction``), the study rubric's judges score ``age_direction``: table 7 compares them per
    editor, beside ACRB's age_change."""
    ratings = pd.read_parquet(stand_in_run / layout.REVIEW_ANALYSIS_DIR / "ratings.parquet")
    assert ratings["age_direction"].notna().any()
    table = pd.read_csv(stand_in_run / layout.TABLES_DIR / "judge_human.csv")
    age = table[table["axis"] == "age_direction"]
    assert set(EDITORS) <= set(age["model"])
    assert age["judge_mean"].notna().all() and age["human_mean"].notna().all()
    assert (age["n"] > 0).all()
