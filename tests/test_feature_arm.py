"""The feature-prompt arm: paired requests in the plan, simulated editors that honour the feature
prompt with paired draws, and the paired analysis between arms (acrb.analysis.experiments.arms)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from pydantic import ValidationError

from acrb import layout
from acrb.analysis.outputs.headline import read_detailed_metrics
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
    assert {(m, *c) for m in EDITORS for c in cells["synthetic-fair"]} == again
    ctx2 = StageContext.load(project / "params.yaml", project)
    other = ctx2.params.model_copy(update={"plan": ctx2.params.plan.model_copy(update={
        "feature": ctx2.params.plan.feature.model_copy(update={"seed": 4})})})
    drawn = plan.feature_cells(
        read_table(project / layout.SOURCES_TABLE, SourceRecord),
        read_table(project / layout.PROMPTS_TABLE, prompts.PromptRecord),
        StageContext(root=project, params=other, params_hash="x"))
    assert drawn != again and len(drawn) == 60 * len(EDITORS)


def test_feature_sample_across_models_holds_both_margins(project: Path) -> None:
    # The seed study's draw: one sample over every editor's cases together, stratified by
    # prompt and editor, so each prompt gets its share and each editor its share (within one).
    _, requests, _ = planned(project, {"arms": ["none", "feature"], "feature": {
        "sample": 101, "seed": 5, "across_models": True, "strata": ["prompt", "model"]}})
    feature = requests[requests["arm"] == "feature"]
    assert len(feature) == 101
    per_model = feature.groupby("model").size()
    assert set(per_model.index) == set(EDITORS) and sorted(per_model) == [50, 51]
    per_prompt = feature.groupby("prompt_id").size()
    assert len(per_prompt) == 50 and set(per_prompt) <= {2, 3}
    # 101 over 50 prompts: 2 each and one prompt with 3
    assert (per_prompt == 3).sum() == 1
    # Each editor repeats its own cases: not the same cells for both.
    cells = {m: set(zip(f["source_id"], f["prompt_id"], strict=True))
             for m, f in feature.groupby("model")}
    assert cells["synthetic-fair"] != cells["synthetic-biased"]
    twins = requests.set_index("request_id").loc[feature["pair_of"]]
    assert (twins["model"].to_numpy() == feature["model"].to_numpy()).all()


def test_balanced_allocation_holds_the_last_margin() -> None:
    from acrb.stratified import allocate

    sizes = pd.Series(84, index=pd.MultiIndex.from_product(
        [[f"P{i:02d}" for i in range(20)], ["a", "b", "c"]], names=["prompt", "model"]))
    balanced = allocate(sizes, 500, seed=0, balance_last=True)
    assert balanced.groupby(level="prompt").sum().eq(25).all()
    assert sorted(balanced.groupby(level="model").sum()) == [166, 167, 167]
    # Without it only the first margin is held: the same editor wins every prompt's tie.
    loose = allocate(sizes, 500, seed=0)
    assert loose.groupby(level="prompt").sum().eq(25).all()
    assert sorted(loose.groupby(level="model").sum()) == [160, 160, 180]


def test_feature_template_puts_the_sentence_where_the_study_did(project: Path) -> None:
    _, requests, texts = planned(project, {"arms": ["none", "feature"], "feature": {
        "sample": 10, "template": "{instruction}. {feature}"}})
    feature = requests[requests["arm"] == "feature"]
    plain = requests.set_index("request_id").loc[feature["pair_of"]]
    expected = [f"{p}. {texts[s]}" for s, p in zip(feature["source_id"], plain["prompt_text"],
                                                    strict=True)]
    assert feature["prompt_text"].tolist() == expected


@pytest.mark.parametrize("feature, message", [
    ({"template": "{feature} then {feature}"}, "once each"),
    ({"template": "{instruction}"}, "once each"),
    ({"template": "{feature} {instruction} {race}"}, "nothing else"),
    ({"strata": ["model"]}, "across_models"),
])
def test_bad_feature_settings_are_refused(feature: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PlanParams.model_validate({"seeds": [0], "arms": ["none", "feature"],
                                   "feature": feature})


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


# --------------------------------------------------------------------------------------------
# Simulated editors


def test_simulated_editor_lightens_feature_output_only_where_its_twin_was(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from acrb.models import synthetic
    from acrb.models.base import EditRequest
    from acrb.storage import load_rgb

    # A high planted lightening rate, so that 100 pairs show enough lightenings.
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["models"]["synthetic-biased"]["config"]["lightening"]["base"] = {
        c: 0.5 for c in "ABCDE"}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ctx, requests, _ = planned(project, {"arms": ["none", "feature"],
                                         "feature": {"sample": 100}})
    rows = requests[requests["model"] == "synthetic-biased"]
    rows = rows[(rows["arm"] == "feature") | rows["request_id"].isin(rows["pair_of"])]
    editor = ctx.params.model("synthetic-biased").build()
    assert isinstance(editor, synthetic.SyntheticEditor)
    assert editor.planted.feature_arm.lightening == pytest.approx(0.35)
    editor.attach_design({r["request_id"]: RequestRecord.model_validate(r)
                          for r in rows.to_dict("records")})
    lightened: list[str] = []
    current: list[str] = []

    def recording(image: np.ndarray, delta: float,
                  face_in: np.ndarray | None = None) -> np.ndarray:
        # Records the decision; painting it (face detection) is tested in test_synthetic_edits.
        lightened.append(current[0])
        return image

    monkeypatch.setattr(synthetic.synthetic_edits, "lighten_skin", recording)
    images = {s: load_rgb(project / p) for s, p in zip(rows["source_id"], rows["source_path"],
                                                       strict=True)}
    for row in rows.itertuples(index=False):
        current[:] = [row.request_id]
        editor.edit([EditRequest(request_id=row.request_id, instruction=row.prompt_text,
                                 seed=int(row.seed), source_image=images[row.source_id])])
    twin_of = dict(zip(rows["request_id"], rows["pair_of"], strict=True))
    plain_lightened = {r for r in lightened if not twin_of[r]}
    feature_lightened = {r for r in lightened if twin_of[r]}
    assert plain_lightened and feature_lightened
    assert {twin_of[r] for r in feature_lightened} <= plain_lightened
    # 0.35 of the plain rate, within binomial noise of the ~60 plain lightenings.
    ratio = len(feature_lightened) / len(plain_lightened)
    assert 0.15 < ratio < 0.6
    # The planted probabilities publish the multiplier.
    groups = {"race": "Black", "gender": "Female", "age": "20s"}
    plain_p = editor.planted_probabilities("B", groups)
    feature_p = editor.planted_probabilities("B", groups, "feature")
    assert feature_p["lightening"] == pytest.approx(0.35 * plain_p["lightening"])
    assert feature_p["refusal"] == plain_p["refusal"]


# --------------------------------------------------------------------------------------------
# Paired analysis


def _frame(cells: list[dict[str, object]]) -> pd.DataFrame:
    """An analysis frame of both arms from per-cell dicts with ``*_none`` / ``*_feature``."""
    rows = []
    for i, cell in enumerate(cells):
        for arm in ("none", "feature"):
            row = {"request_id": f"{arm}-{i}", "arm": arm, "experiment": "audit",
                   "status": cell.get(f"status_{arm}", "ok"), "seed": 0,
                   "source_id": cell["source_id"], "prompt_id": cell["prompt_id"],
                   "race": cell["race"], "gender": "Female", "age": "20s", "category": "B"}
            row.update({k[: -len(arm) - 1]: v for k, v in cell.items()
                        if k.endswith(f"_{arm}") and not k.startswith("status")})
            rows.append(row)
    return pd.DataFrame(rows)


def test_mcnemar_and_wilcoxon_against_hand_counts_and_scipy() -> None:
    from scipy import stats
    from statsmodels.stats.contingency_tables import mcnemar

    from acrb.analysis.experiments.arms import compare_arms

    # 12 cells: lightening none/feature = (T,T) x2, (T,F) x5, (F,T) x1, (F,F) x3, and one cell
    # errored in the feature arm (not a pair).
    pattern = [(True, True)] * 2 + [(True, False)] * 5 + [(False, True)] + [(False, False)] * 4
    scores_none = [5, 4, 4, 3, 5, 4, 2, 3, 4, 3, 3, 5]
    scores_feature = [3, 4, 3, 3, 2, 3, 2, 4, 3, 3, 1, 1]
    cells = [{"source_id": f"s{i % 4}", "prompt_id": f"p{i}", "race": "Black" if i % 2 else
              "White", "lightening_none": a, "lightening_feature": b,
              "skin_tone_none": float(x), "skin_tone_feature": float(y)}
             for i, ((a, b), x, y) in enumerate(zip(pattern, scores_none, scores_feature,
                                                    strict=True))]
    cells[-1]["status_feature"] = "error"
    tables = compare_arms({"m": _frame(cells)}, n_boot=200, n_perm=200)
    row = tables.mcnemar.set_index("outcome").loc["lightening"]
    assert (row["n_pairs"], row["both"], row["none_only"], row["feature_only"],
            row["neither"]) == (11, 2, 5, 1, 3)
    assert row["rate_none"] == pytest.approx(7 / 11)
    assert row["rate_feature"] == pytest.approx(3 / 11)
    assert row["p_value"] == pytest.approx(
        mcnemar([[2, 5], [1, 3]], exact=True).pvalue)
    # The exact McNemar p-value is the two-sided binomial test of 1 in 6 discordant pairs.
    assert row["p_value"] == pytest.approx(stats.binomtest(1, 6, 0.5).pvalue)
    axis = tables.axes.set_index("axis").loc["skin_tone"]
    expected = stats.wilcoxon(scores_feature[:11], scores_none[:11], zero_method="wilcox")
    assert axis["n_pairs"] == 11
    assert axis["statistic"] == pytest.approx(expected.statistic)
    assert axis["p_value"] == pytest.approx(expected.pvalue)
    assert axis["change"] == pytest.approx(np.mean(scores_feature[:11])
                                           - np.mean(scores_none[:11]))
    # Group rates: Black is the odd cells.
    black = tables.group_rates.set_index(["outcome", "group"]).loc[("lightening", "Black")]
    odd = [pattern[i] for i in range(11) if i % 2]
    assert black["n_pairs"] == len(odd)
    assert black["rate_none"] == pytest.approx(np.mean([a for a, _ in odd]))
    assert black["change"] == pytest.approx(np.mean([b for _, b in odd])
                                            - np.mean([a for a, _ in odd]))


def _simulated_pairs(multiplier: float, *, paired: bool, seed: int) -> pd.DataFrame:
    """Lightening per pair, planted by race: the plain rate p_race, the feature arm
    multiplier x p_race, 20 sources per race x 15 prompts; paired draws share the uniform."""
    rng = np.random.default_rng(seed)
    planted = {"White": 0.05, "Black": 0.45, "Indian": 0.35}
    cells = []
    for race, p in planted.items():
        for s in range(20):
            face = rng.normal(0, 0.05)  # a source effect: pairs of one face are correlated
            for prompt in range(15):
                u = rng.random()
                v = u if paired else rng.random()
                cells.append({"source_id": f"{race}-{s}", "prompt_id": f"p{prompt}",
                              "race": race, "lightening_none": u < p + face,
                              "lightening_feature": v < multiplier * (p + face)})
    return _frame(cells)


def test_planted_narrowing_is_recovered() -> None:
    from acrb.analysis.experiments.arms import compare_arms

    tables = compare_arms({"m": _simulated_pairs(0.35, paired=True, seed=1)}, n_boot=500,
                          n_perm=500)
    gap = tables.gap.set_index("outcome").loc["lightening"]
    planted = (0.45 - 0.05) * (1 - 0.35)
    assert gap["low"] <= planted <= gap["high"]
    assert gap["low"] > 0 and gap["p_value"] < 0.01
    assert gap["narrowing"] == pytest.approx(gap["delta_none"] - gap["delta_feature"])
    mcnemar_row = tables.mcnemar.set_index("outcome").loc["lightening"]
    assert mcnemar_row["feature_only"] == 0 and mcnemar_row["p_value"] < 1e-6
    black = tables.group_rates.set_index("group").loc["Black"]
    assert black["high"] < 0 and black["low"] <= -0.45 * 0.65 <= black["high"]


def test_no_narrowing_when_the_multiplier_is_one() -> None:
    from acrb.analysis.experiments.arms import compare_arms

    # Independent draws at the same planted rates: the arms differ by chance only.
    tables = compare_arms({"m": _simulated_pairs(1.0, paired=False, seed=2)}, n_boot=500,
                          n_perm=500)
    gap = tables.gap.set_index("outcome").loc["lightening"]
    assert gap["low"] <= 0 <= gap["high"]
    assert gap["p_value"] > 0.05
    changes = tables.group_rates
    assert ((changes["low"] <= 0) & (changes["high"] >= 0)).all()


def test_analyze_writes_the_arm_tables(project: Path) -> None:
    """The stages in process on 2 sources x the 10 B prompts with the feature arm on every cell:
    analyze writes the four tables and the headline metrics."""
    from acrb.stages import analyze, evaluate, generate, judge

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["sources"].update(genders=["Female"], ages=["20s"])
    params["prompts"]["categories"] = ["B"]
    params["models"] = {"synthetic-biased": params["models"]["synthetic-biased"]}
    params["plan"].update(arms=["none", "feature"], feature={"sample": None})
    params["analyze"].update(bootstrap=200, permutations=200)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ctx = StageContext.load(project / "params.yaml", project)
    sources.run(ctx)
    prompts.run(ctx)
    write_features(project)
    plan.run(ctx)
    generate.run(ctx, "synthetic-biased")
    evaluate.run(ctx, "synthetic-biased")
    judge.run(ctx, "synthetic-biased")
    results = analyze.run(ctx)
    out = project / layout.ARMS_DIR
    mcnemar = pd.read_csv(out / "mcnemar.csv")
    assert set(mcnemar["model"]) == {"synthetic-biased"}
    assert {"hard_refusal", "erasure", "lightening", "soft_erasure"} <= set(mcnemar["outcome"])
    assert (mcnemar["n_pairs"] <= 20).all() and mcnemar["n_pairs"].max() > 0
    axes = pd.read_csv(out / "axes.csv")
    assert "skin_tone" in set(axes["axis"])
    groups = pd.read_csv(out / "group_rates.csv")
    assert set(groups["group"]) == {"Black", "White"}
    gap = pd.read_csv(out / "gap.csv")
    assert list(gap.columns) == ["model", "outcome", "dimension", "delta_none", "delta_feature",
                                 "narrowing", "low", "high", "p_value", "confidence"]
    metrics = read_detailed_metrics(project / layout.detailed_metrics("synthetic-biased"))
    assert "feature_arm.narrowing.lightening.race" in metrics
    # The audit's own tables count the plain arm only.
    biased = next(r for r in results if r.model == "synthetic-biased")
    assert len(biased.frame) == 20
    # A plan without the arm leaves no arm tables behind.
    update = yaml.safe_load((project / "params.yaml").read_text())
    update["plan"]["arms"] = ["none"]
    (project / "params.yaml").write_text(yaml.safe_dump(update, sort_keys=False))
    ctx = StageContext.load(project / "params.yaml", project)
    plan.run(ctx)
    analyze.compare_feature_arm(ctx, results)
    assert not (out / "gap.csv").exists()


def test_arm_values_change_only_the_ids_of_the_requests_they_act_on() -> None:
    """The planted feature-arm and WinoBias values enter only the ids of feature-arm and
    WinoBias requests: changing them redoes those requests, never the audit's own."""
    from acrb.models.synthetic import SyntheticEditor, SyntheticEditorConfig

    rates = {outcome: {"base": {"A": 0.1}} for outcome in ("refusal", "erasure", "lightening")}
    base = SyntheticEditorConfig.model_validate(rates)
    changed = SyntheticEditorConfig.model_validate(
        {**rates, "feature_arm": {"lightening": 0.9}, "winobias": {"stereotype": {"base": 0.9}}})
    revision = SyntheticEditor.resolve_revision
    assert revision("synthetic:biased", base, None) == revision("synthetic:biased", changed, None)
    ids = SyntheticEditor.id_config
    assert ids(base, "none", "audit") == ids(changed, "none", "audit") == {}
    assert ids(base, "feature", "audit") != ids(changed, "feature", "audit")
    assert ids(base, "none", "winobias") != ids(changed, "none", "winobias")
