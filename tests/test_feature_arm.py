"""The feature-prompt arm: paired requests in the plan, simulated editors that honour the feature
prompt with paired draws, and the paired analysis between arms (acrb.analysis.arms)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from pydantic import ValidationError

from acrb import layout
from acrb.config import PlanParams
from acrb.errors import ConfigError
from acrb.records import (
    FeaturePromptRecord,
    RequestRecord,
    SourceRecord,
    read_table,
    write_table,
)
from acrb.stages import plan, prompts, sources
from acrb.stages.context import StageContext
from acrb.storage import canonical_json

EDITORS = ("synthetic-fair", "synthetic-biased")


def write_features(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """A features table for the project's sources, with made-up observable descriptions."""
    table = read_table(root / layout.SOURCES_TABLE, SourceRecord)
    rows, texts = [], {}
    for i, row in enumerate(table.itertuples(index=False)):
        if row.source_id in skip:
            continue
        dims = {"skin_tone": f"tone {i}", "hair": "short dark hair", "eyes": "round eyes"}
        text = f"A person with tone {i}, short dark hair and round eyes."
        texts[row.source_id] = text
        rows.append(FeaturePromptRecord(
            source_id=row.source_id, source_sha256=row.sha256, text=text,
            dimensions=canonical_json(dims), origin="simulated", describer="test"))
    write_table(root / layout.FEATURES_TABLE, rows, FeaturePromptRecord)
    return texts


def planned(root: Path, changes: dict[str, object], *, features: bool = True,
            skip: tuple[str, ...] = ()) -> tuple[StageContext, pd.DataFrame, dict[str, str]]:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["models"] = {m: params["models"][m] for m in (*EDITORS, "synthetic-t2i")}
    params["plan"].update(changes)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ctx = StageContext.load(root / "params.yaml", root)
    sources.run(ctx)
    prompts.run(ctx)
    texts = write_features(root, skip) if features else {}
    plan.run(ctx)
    return ctx, read_table(root / layout.PLAN_TABLE, RequestRecord), texts


# --------------------------------------------------------------------------------------------
# Plan


def test_feature_requests_repeat_their_plain_twin(project: Path) -> None:
    _, requests, texts = planned(project, {"arms": ["none", "feature"],
                                           "feature": {"sample": None}})
    editors = requests[requests["model"].isin(EDITORS)]
    plain = editors[editors["arm"] == "none"].set_index("request_id")
    feature = editors[editors["arm"] == "feature"]
    # Every image-editing cell of every editor (8 sources x 50 prompts), no T2I feature arm.
    assert len(plain) == len(feature) == 2 * 8 * 50
    assert set(requests.loc[requests["model"] == "synthetic-t2i", "arm"]) == {"none"}
    assert (requests.loc[requests["arm"] == "none", "pair_of"] == "").all()
    twins = plain.loc[feature["pair_of"]]
    for column in ("model", "model_revision", "settings", "source_id", "source_sha256",
                   "prompt_id", "seed", "category", "race", "gender", "age", "congruence"):
        assert (feature[column].to_numpy() == twins[column].to_numpy()).all(), column
    expected = [f"{texts[s]} {p}" for s, p in zip(feature["source_id"], twins["prompt_text"],
                                                   strict=True)]
    assert feature["prompt_text"].tolist() == expected
    assert (feature["feature_prompt"].to_numpy()
            == feature["source_id"].map(texts).to_numpy()).all()
    assert not set(feature["request_id"]) & set(plain.index)
    assert requests["request_id"].is_unique


def test_feature_sample_is_stratified_and_the_same_for_every_editor(project: Path) -> None:
    ctx, requests, _ = planned(project, {"arms": ["none", "feature"], "seeds": [0, 1],
                                         "feature": {"sample": 60, "seed": 3}})
    feature = requests[requests["arm"] == "feature"]
    cells = {m: set(zip(f["source_id"], f["prompt_id"], f["seed"], strict=True))
             for m, f in feature.groupby("model")}
    assert set(cells) == set(EDITORS)
    assert cells["synthetic-fair"] == cells["synthetic-biased"]
    assert len(cells["synthetic-fair"]) == 60
    # Proportional allocation over race x category: 2 races x 5 categories of 10 prompts each,
    # equal cells, so 6 cells per stratum (and 30 per race).
    one = feature[feature["model"] == "synthetic-fair"]
    assert one.groupby(["race", "category"]).size().tolist() == [6] * 10
    # Another seed draws other cells; the same seed the same ones.
    again = plan.feature_cells(
        read_table(project / layout.SOURCES_TABLE, SourceRecord),
        read_table(project / layout.PROMPTS_TABLE, prompts.PromptRecord), ctx)
    assert again == cells["synthetic-fair"]
    ctx2 = StageContext.load(project / "params.yaml", project)
    other = ctx2.params.model_copy(update={"plan": ctx2.params.plan.model_copy(update={
        "feature": ctx2.params.plan.feature.model_copy(update={"seed": 4})})})
    drawn = plan.feature_cells(
        read_table(project / layout.SOURCES_TABLE, SourceRecord),
        read_table(project / layout.PROMPTS_TABLE, prompts.PromptRecord),
        StageContext(root=project, params=other, params_hash="x"))
    assert drawn != again and len(drawn) == 60


def test_plain_plan_is_unchanged_by_the_feature_code(project: Path) -> None:
    _, requests, _ = planned(project, {"arms": ["none"]}, features=False)
    assert set(requests["arm"]) == {"none"}
    assert (requests["feature_prompt"] == "").all() and (requests["pair_of"] == "").all()


@pytest.mark.parametrize("arms, message", [
    (["none", "features"], "unknown arm.*'features'.*valid: none, feature"),
    (["feature"], "must include `none`"),
    (["none", "none"], "twice"),
])
def test_bad_arms_are_refused(arms: list[str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PlanParams.model_validate({"seeds": [0], "arms": arms})


def test_missing_features_table_is_named(project: Path) -> None:
    with pytest.raises(ConfigError, match=r"features\.parquet does not exist") as info:
        planned(project, {"arms": ["none", "feature"]}, features=False)
    assert "features" in info.value.fix and "features.describer" in info.value.fix


def test_source_without_feature_prompt_is_named(project: Path) -> None:
    with pytest.raises(ConfigError,
                       match=r"1 source.*no feature prompt: syn-Black-Female-20s-0"):
        planned(project, {"arms": ["none", "feature"], "feature": {"sample": None}},
                skip=("syn-Black-Female-20s-0",))
