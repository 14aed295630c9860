"""The paper profile (profiles/paper.yaml) with its stand-ins, run end to end on a CPU.

`-S profile.stand_ins=true` swaps the real editors, judges, FairFace set, people's ratings and
the study's files for the simulated stand-ins the profile lists; everything else is the paper's
design. Here the design is shrunk (two ages, one seed, a smaller feature sample and review) so
the run takes about a minute; the full-size stand-in run is measured in the README.
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
    assert params["plan"]["seeds"] == [0, 1, 2]  # 84 x 20 x 3 = 5,040 edits per editor
    assert params["plan"]["arms"] == ["none", "feature"]
    assert params["plan"]["feature"]["sample"] == 500
    assert params["judge"]["ensemble"] == "study" and len(params["judge"]["use"]) == 2
    assert params["review"]["sample_size"] == 500 and params["review"]["ratings"] == "inputs"
    assert params["winobias"]["study_file"]
    assert params["profile"]["simulation"] is False


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
    assert requests[requests["arm"] == "feature"].groupby("model").size().eq(84).all()
    assert (requests["experiment"] == "winobias").any()
    html = (stand_in_run / layout.REPORT_FILE).read_text()
    assert STAND_IN_MARK.strip() in html


def test_stand_ins_produce_every_paper_table(stand_in_run: Path) -> None:
    index = json.loads((stand_in_run / layout.TABLES_DIR / "index.json").read_text())
    assert index["simulated"] is True and index["profile"] == "paper"
    statuses = {t["id"]: t["status"] for t in index["tables"]}
    assert len(statuses) == 7 and set(statuses.values()) == {"written"}, statuses
    summary = json.loads((stand_in_run / layout.PLAN_SUMMARY).read_text())
    assert set(summary["per_model"]) == EDITORS
