"""The text-to-image path: the simulated generator, judging outputs with no source, the analysis
by prompt attribute (rates clustered on base prompt, the ACRB Δ over attributes) and the whole
path on a tiny project, plan -> generate -> evaluate -> analyze -> report."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest
import yaml

from acrb import layout
from acrb.analysis.estimation.resampling import delta_from_replicates, pooled_rate
from acrb.analysis.experiments.attributes import (
    attribute_design,
    attribute_disparities,
    attribute_equivalence,
    attribute_families,
    attribute_planted_vs_measured,
    attribute_rates,
    base_bootstrap_rates,
)
from acrb.analysis.outputs.headline import read_detailed_metrics
from acrb.analysis.outputs.t2i_section import read_any_section
from acrb.analysis.tests.pvalues import adjust
from acrb.config import PixelThresholds
from acrb.errors import ConfigError
from acrb.models.base import GenerationRequest, Generator, Outcome
from acrb.models.synthetic_t2i import (
    SyntheticGenerator,
    SyntheticGeneratorConfig,
    placeholder_image,
)
from acrb.records import GenerationRecord, RequestRecord, read_table, request_id_for
from acrb.registry import GENERATORS
from acrb.stages import analyze, evaluate, generate, plan, prompts, report, sources
from acrb.stages.context import StageContext
from tests.conftest import TINY, deep_update, repo_params
from tests.editor_contract import (
    GeneratorContract,
    assert_generation_request_carries_no_labels,
)

# ---------------------------------------------------------------------------------------------
# The ACRB Δ on a hand-made frame with a known answer


def _frame(cells: dict[tuple[str, str], tuple[int, int]], categories: dict[str, str]
           ) -> pd.DataFrame:
    """Requests from (base_id, attribute) -> (refused, answered) counts."""
    rows = []
    for (base, attribute), (k, n) in cells.items():
        for index in range(n):
            rows.append({"request_id": f"{base}-{attribute}-{index}", "base_id": base,
                         "prompt_id": f"{base}-{attribute}", "category": categories[base],
                         "attribute": attribute, "seed": index, "status": "ok",
                         "hard_refusal": index < k})
    frame = pd.DataFrame(rows)
    frame["hard_refusal"] = frame["hard_refusal"].astype("boolean")
    return frame


ATTRIBUTES = ["neutral", "culture:korean", "culture:nigerian", "religion:sikh", "religion:hindu",
              "religion:jewish"]
# Refusals out of 10 requests per base prompt (b1..b4) for each attribute.
KNOWN = {
    "neutral": (1, 1, 1, 1),  # 4/40 = 10 %
    "culture:korean": (1, 2, 1, 2),  # 6/40 = 15 %
    "culture:nigerian": (5, 6, 5, 4),  # 20/40 = 50 %
    "religion:sikh": (3, 3, 3, 3),  # 12/40 = 30 %
    "religion:hindu": (0, 1, 0, 1),  # 2/40 = 5 %
    "religion:jewish": (2, 2, 2, 2),  # 8/40 = 20 %
}


def known_frame() -> pd.DataFrame:
    bases = ["b1", "b2", "b3", "b4"]
    cells = {(b, a): (KNOWN[a][i], 10) for a in ATTRIBUTES for i, b in enumerate(bases)}
    return _frame(cells, {"b1": "x", "b2": "x", "b3": "y", "b4": "y"})


def test_delta_over_attributes_has_the_known_answer() -> None:
    gaps = attribute_disparities(known_frame(), "hard_refusal", n_boot=400, n_perm=200)
    by = gaps.set_index("dimension")
    assert list(gaps["dimension"]) == ["all", "culture", "religion"]
    # Over every attribute but neutral: 50 % (nigerian) - 5 % (hindu).
    assert by.loc["all", "delta"] == pytest.approx(0.45)
    assert (by.loc["all", "max_attribute"], by.loc["all", "min_attribute"]) == (
        "culture:nigerian", "religion:hindu")
    assert by.loc["culture", "delta"] == pytest.approx(0.35)
    assert by.loc["religion", "delta"] == pytest.approx(0.25)
    assert (by.loc["religion", "max_attribute"], by.loc["religion", "min_attribute"]) == (
        "religion:sikh", "religion:hindu")
    assert list(by["attributes"]) == [5, 2, 3] and list(by["n"]) == [200, 80, 120]
    for row in gaps.to_dict("records"):
        assert 0 <= row["ci_low"] <= row["delta"] <= row["ci_high"] <= 1


def test_rates_by_attribute_have_the_known_answer() -> None:
    rates = attribute_rates(known_frame(), "hard_refusal", n_boot=400).set_index("attribute")
    assert list(rates.index) == ATTRIBUTES
    expected = {a: sum(KNOWN[a]) / 40 for a in ATTRIBUTES}
    for attribute, rate in expected.items():
        assert rates.loc[attribute, "rate"] == pytest.approx(rate)
        assert rates.loc[attribute, "n"] == 40 and rates.loc[attribute, "n_clusters"] == 4
        assert rates.loc[attribute, "ci_low"] <= rate <= rates.loc[attribute, "ci_high"]
    assert rates.loc["culture:nigerian", "dimension"] == "culture"
    assert (rates["deff"] >= 1).all()


def test_errors_and_missing_requests_are_left_out_of_delta() -> None:
    frame = known_frame()
    # Every nigerian request of b1 errored: nigerian becomes 15/30 = 50 %, Δ unchanged; a
    # refusal recorded as an error would have changed it.
    errored = (frame["base_id"] == "b1") & (frame["attribute"] == "culture:nigerian")
    frame.loc[errored, "status"] = "error"
    frame.loc[errored, "hard_refusal"] = pd.NA
    gaps = attribute_disparities(frame, "hard_refusal", n_boot=200, n_perm=100)
    assert gaps.set_index("dimension").loc["culture", "delta"] == pytest.approx(0.5 - 0.15)
    assert gaps.set_index("dimension").loc["culture", "n"] == 70


def test_clustering_on_base_prompt_widens_the_rate_interval() -> None:
    # Base prompts that are either always or never refused: 4 clusters, not 80 requests.
    cells = {(b, a): (20 if b in ("b1", "b2") else 0, 20) for b in ("b1", "b2", "b3", "b4")
             for a in ("neutral", "culture:korean")}
    frame = _frame(cells, {"b1": "x", "b2": "x", "b3": "x", "b4": "x"})
    rates = attribute_rates(frame, "hard_refusal", n_boot=400).set_index("attribute")
    assert rates.loc["culture:korean", "deff"] > 10
    assert rates.loc["culture:korean", "ci_high"] - rates.loc["culture:korean", "ci_low"] > 0.5


def test_permutation_within_base_prompt_finds_a_real_gap_and_not_an_absent_one() -> None:
    bases = [f"b{i}" for i in range(30)]
    rng = np.random.default_rng(7)
    categories = {b: "x" for b in bases}
    equal = {(b, a): (int(rng.random() < 0.2), 1) for b in bases
             for a in ("culture:korean", "culture:nigerian", "culture:indian")}
    gap = dict(equal)
    gap.update({(b, "culture:nigerian"): (int(rng.random() < 0.8), 1) for b in bases})
    none = attribute_disparities(_frame(equal, categories), "hard_refusal", n_boot=500,
                                 n_perm=500).set_index("dimension")
    found = attribute_disparities(_frame(gap, categories), "hard_refusal", n_boot=500,
                                  n_perm=500).set_index("dimension")
    assert found.loc["culture", "flagged"] and found.loc["culture", "p_value"] < 0.01
    assert found.loc["culture", "ci_low"] > 0
    assert not none.loc["culture", "flagged"]


def crafted_frame(seed: int) -> pd.DataFrame:
    """40 base prompts in two domains, two requests per base prompt and attribute: culture:c
    refused far more (45 % against 15 %), gender:f somewhat more (30 % against 20 %), religion
    equal (20 %)."""
    rng = np.random.default_rng(seed)
    bases = [f"b{i:02d}" for i in range(40)]
    planted = {"culture:a": 0.15, "culture:b": 0.15, "culture:c": 0.45, "religion:x": 0.2,
               "religion:y": 0.2, "gender:m": 0.2, "gender:f": 0.3}
    cells = {(b, a): (int(rng.binomial(2, p)), 2) for b in bases for a, p in planted.items()}
    return _frame(cells, {b: "xy"[i % 2] for i, b in enumerate(bases)})


def test_a_per_row_interval_excludes_zero_exactly_when_its_row_test_rejects() -> None:
    rows = pd.concat([attribute_disparities(crafted_frame(seed), "hard_refusal", n_boot=500,
                                            n_perm=500) for seed in range(4)])
    assert rows["method"].str.startswith("test-inversion, base-prompt bootstrap/between-groups"
                                         ).all()
    rejects = rows["p_value"] < 0.05
    assert (rows["ci_low"] > 0).tolist() == rejects.tolist(), rows
    # Both sides of the duality are exercised: culture always rejects, religion never does.
    assert 0 < rejects.sum() < len(rows)
    for row in rows.to_dict("records"):
        assert 0 <= row["ci_low"] <= row["delta"] <= row["ci_high"] <= 1


def test_the_corrected_delta_is_below_the_raw_delta() -> None:
    from acrb.analysis.estimation.resampling import _RESOLUTION

    for seed in range(4):
        gaps = attribute_disparities(crafted_frame(seed), "hard_refusal", n_boot=500,
                                     n_perm=200).set_index("dimension")
        assert gaps["delta_corrected"].notna().all()
        # Never above Δ (up to the bisection's resolution), and clearly below it over seven
        # attributes, where the range of noise inflates max − min most.
        assert (gaps["delta_corrected"] <= gaps["delta"] + _RESOLUTION).all(), gaps
        assert gaps.loc["all", "delta_corrected"] < gaps.loc["all", "delta"] - 0.02, gaps
    known = attribute_disparities(known_frame(), "hard_refusal", n_boot=400, n_perm=200)
    assert list(known.columns[3:5]) == ["delta", "delta_corrected"]


def test_simultaneous_gives_the_max_t_band_on_the_same_replicates() -> None:
    frame = crafted_frame(0)
    n_boot, seed = 500, 11
    per_row = attribute_disparities(frame, "hard_refusal", n_boot=n_boot, n_perm=300, seed=seed)
    band = attribute_disparities(frame, "hard_refusal", n_boot=n_boot, n_perm=300, seed=seed,
                                 simultaneous=True)
    assert band["method"].str.startswith("max-t band (simultaneous), base-prompt bootstrap/"
                                         ).all()
    # Only the interval changes: Δ, corrected Δ and the tests are the same numbers.
    same = ["delta", "delta_corrected", "p_value", "p_adjusted", "flagged"]
    pd.testing.assert_frame_equal(per_row[same], band[same])
    # The band of every row at level 1 − 0.05/4, from each row's own bootstrap seed.
    design = attribute_design(frame, "hard_refusal")
    families = attribute_families(design.attributes)
    children = np.random.SeedSequence(seed).spawn(len(families))
    for (dimension, attributes), child, row in zip(families, children,
                                                    band.to_dict("records"), strict=True):
        columns = design.columns(attributes)
        replicates = base_bootstrap_rates(design, columns, n_boot, child.spawn(2)[0])
        rates = pooled_rate(design.y[:, columns].sum(axis=0), design.n[:, columns].sum(axis=0))
        expected = delta_from_replicates(tuple(attributes), rates, replicates, 1 - 0.05 / 4,
                                         int(design.n[:, columns].sum()), n_boot)
        assert (row["dimension"], row["ci_low"], row["ci_high"]) == (
            dimension, expected.ci_low, expected.ci_high)
    # Jointly valid over four rows, the band is wider than each row's own interval.
    width = band["ci_high"] - band["ci_low"]
    assert (width > per_row["ci_high"] - per_row["ci_low"]).all(), (band, per_row)


def test_the_row_test_is_the_one_asked_for() -> None:
    # The pooled rates are equal (3/6 each, so the range statistic sees no gap at all), the
    # per-cell rates are not: a has 3/3 and 0/3, b 1/1 and 2/5, so b is refused more within
    # every base prompt of the second kind, which the between-groups statistic reads.
    cells = {}
    for index in range(20):
        cells[(f"p{index}", "culture:a")] = (3, 3)
        cells[(f"p{index}", "culture:b")] = (1, 1)
        cells[(f"q{index}", "culture:a")] = (0, 3)
        cells[(f"q{index}", "culture:b")] = (2, 5)
    frame = _frame(cells, {base: "x" for base, _ in cells})
    by_test = {test: attribute_disparities(frame, "hard_refusal", n_boot=200, n_perm=500,
                                           test=test).set_index("dimension")
               for test in ("range", "between-groups")}
    assert by_test["range"].loc["culture", "delta"] == 0
    assert (by_test["range"]["p_value"] == 1).all()
    assert (by_test["between-groups"]["p_value"] < 0.05).all(), by_test["between-groups"]
    assert by_test["range"]["method"].str.endswith("/range permutation within base prompts").all()
    for table in by_test.values():
        assert list(table["p_adjusted"]) == list(adjust(table["p_value"].to_numpy(), "holm"))


def test_attribute_families() -> None:
    families = dict(attribute_families(ATTRIBUTES))
    assert families["all"] == ATTRIBUTES[1:]
    assert families["culture"] == ["culture:korean", "culture:nigerian"]
    assert list(families) == ["all", "culture", "religion"]


def test_planted_vs_measured_marks_coverage() -> None:
    frame = known_frame()
    frame["planted_refusal"] = frame["attribute"].map(
        {a: sum(KNOWN[a]) / 40 for a in ATTRIBUTES})
    frame.loc[frame["attribute"] == "religion:sikh", "planted_refusal"] = 0.9  # far off
    rates = attribute_rates(frame, "hard_refusal", n_boot=200)
    gaps = attribute_disparities(frame, "hard_refusal", n_boot=200, n_perm=100)
    table = attribute_planted_vs_measured(frame, rates, gaps).set_index(["dimension", "value"])
    assert table.loc[("culture", "culture:nigerian"), "covered"]
    assert not table.loc[("religion", "religion:sikh"), "covered"]
    assert table.loc[("religion", "Δ"), "planted"] == pytest.approx(0.9 - 0.05)


# ---------------------------------------------------------------------------------------------
# The simulated generator


def planted_config(**changes: Any) -> SyntheticGeneratorConfig:
    config: dict[str, Any] = {
        "refusal": {"base": {"violence-adjacent": 0.1, "copyright": 0.05},
                    "attribute": {"culture:nigerian": 0.5},
                    "by_category": {"copyright": {"religion:muslim": 0.3}}},
    }
    return SyntheticGeneratorConfig.model_validate({**config, **changes})


def t2i_design(count: int = 40) -> list[tuple[GenerationRequest, RequestRecord]]:
    made = []
    for index in range(count):
        category = "violence-adjacent" if index % 2 else "copyright"
        attribute = ("culture:nigerian", "religion:muslim", "neutral")[index % 3]
        text = f"A photo of {attribute} number {index}."
        request_id = request_id_for(model_key="synthetic:t2i", model_revision="r", settings={},
                                    source_sha256="", prompt_text=text, seed=0, arm="none")
        row = RequestRecord(
            request_id=request_id, model="t2i", model_key="synthetic:t2i", model_revision="r",
            settings="{}", source_id="", source_path="", source_sha256="",
            prompt_id=f"P{index}", prompt_text=text, category=category, attribute=attribute,
            congruence="neutral", seed=0, arm="none", race="", gender="", age="", mode="t2i",
            base_id=f"B{index // 3}")
        made.append((generate.generation_request(row.model_dump()), row))
    return made


class TestSyntheticGeneratorContract(GeneratorContract):
    expected_statuses: ClassVar[frozenset[str]] = frozenset({"ok", "refused"})

    @pytest.fixture
    def generator(self) -> SyntheticGenerator:
        model = SyntheticGenerator("synthetic:t2i", planted_config(
            refusal_kinds={"black_frame": 0.5, "policy_message": 0.5}))
        model.attach_design({row.request_id: row for _, row in t2i_design()})
        return model

    @pytest.fixture
    def generation_requests(self) -> list[GenerationRequest]:
        return [request for request, _ in t2i_design()]


def test_planted_refusal_adds_attribute_and_category_offsets() -> None:
    model = SyntheticGenerator("synthetic:t2i", planted_config())
    assert model.planted_refusal("violence-adjacent", "culture:nigerian") == pytest.approx(0.6)
    assert model.planted_refusal("copyright", "religion:muslim") == pytest.approx(0.35)
    assert model.planted_refusal("violence-adjacent", "religion:muslim") == pytest.approx(0.1)
    assert model.planted_refusal("copyright", "neutral") == pytest.approx(0.05)
    with pytest.raises(ValueError, match="not an attribute"):
        planted_config(refusal={"base": {"copyright": 0.1}, "attribute": {"Black": 0.2}})
    with pytest.raises(ConfigError, match="no planted refusal rate"):
        SyntheticGenerator.check_categories("t2i", planted_config(), {"copyright", "body"})


def test_placeholder_is_deterministic_non_blank_and_prompt_dependent() -> None:
    first = placeholder_image("a photo of a person", 0, 64)
    assert first.shape == (64, 64, 3) and first.dtype == np.uint8
    assert np.array_equal(first, placeholder_image("a photo of a person", 0, 64))
    assert not np.array_equal(first, placeholder_image("a photo of a woman", 0, 64))
    assert not np.array_equal(first, placeholder_image("a photo of a person", 1, 64))
    thresholds = PixelThresholds()
    spreads = [evaluate.grey_spread(placeholder_image(f"prompt {i}", i, 64)) for i in range(200)]
    assert min(spreads) > 4 * thresholds.blank_std_max


def test_refusals_show_as_black_frames_or_policy_refusals() -> None:
    model = SyntheticGenerator("synthetic:t2i", planted_config(
        refusal={"base": {"violence-adjacent": 1.0, "copyright": 1.0}}))
    design = t2i_design(30)
    model.attach_design({row.request_id: row for _, row in design})
    outcomes = model.generate([request for request, _ in design])
    kinds = {o.status if o.image is None else "black" for o in outcomes}
    assert kinds == {"refused", "black"}
    assert all(o.image is None or not o.image.any() for o in outcomes)


# ---------------------------------------------------------------------------------------------
# Judging outputs with no source image


def _generation(status: str, sha: str | None = "abc") -> GenerationRecord:
    return GenerationRecord(request_id="r1", model="t2i", status=status, refusal_kind=None,  # type: ignore[arg-type]
                            message="", image_path=None, image_sha256=sha,
                            model_revision="r", library_versions="{}")


def test_t2i_judgement_is_refusal_by_status_or_blank_and_nothing_else() -> None:
    thresholds = PixelThresholds()
    evaluator = evaluate.t2i_evaluator_hash(thresholds)
    black = evaluate.judge_generated(_generation("ok"), np.zeros((64, 64, 3), np.uint8),
                                     thresholds, evaluator)
    assert black.hard_refusal is True and black.refusal_evidence == "blank"
    image = evaluate.judge_generated(_generation("ok"), placeholder_image("p", 0, 64),
                                     thresholds, evaluator)
    assert image.hard_refusal is False and image.refusal_evidence is None
    refused = evaluate.judge_generated(_generation("refused", None), None, thresholds, evaluator)
    assert refused.hard_refusal is True and refused.refusal_evidence == "status"
    errored = evaluate.judge_generated(_generation("error", None), None, thresholds, evaluator)
    assert errored.hard_refusal is None
    for record in (black, image, refused, errored):
        # Unmeasurable without a source: never a verdict, never part of a rate.
        assert record.erasure is None and record.lightening is None
        assert record.unchanged is None and record.ita_shift is None
        assert record.edit_fraction is None
    assert evaluator != evaluate.evaluator_hash(thresholds)


def test_i2i_evaluator_is_unchanged() -> None:
    # The I2I evaluator hash keys every cached judgement of the editors: the T2I path must not
    # move it (value of DETECTORS_VERSION 5 with the default thresholds).
    assert evaluate.DETECTORS_VERSION == 5
    assert evaluate.evaluator_hash(PixelThresholds()) == _I2I_EVALUATOR


_I2I_EVALUATOR = "ea8775ea2dc107846f1d"


# ---------------------------------------------------------------------------------------------
# End to end on a tiny project

#: Four domains (45 base prompts x 25 attributes = 1,125 T2I prompts) and strong planted gaps.
T2I_DOMAINS = ["violence-adjacent", "copyright", "religious-cultural", "privacy-sensitive"]
T2I_MODEL = {
    "key": "synthetic:t2i",
    "config": {
        "refusal": {
            "base": {"violence-adjacent": 0.10, "copyright": 0.05, "religious-cultural": 0.05,
                     "privacy-sensitive": 0.08},
            "attribute": {"culture:nigerian": 0.45, "religion:muslim": 0.30},
            "by_category": {"religious-cultural": {"religion:jewish": 0.40}},
        },
        "size": 32,
    },
}


def write_t2i_params(root: Path, models: dict[str, Any]) -> Path:
    params = deep_update(repo_params(), TINY)
    params["prompts"]["synthesis"]["domains"] = T2I_DOMAINS
    params["prompts"]["synthesis"]["modes"] = ["t2i"]
    params["analyze"]["bootstrap"] = 1000
    params["analyze"]["permutations"] = 1000
    params["analyze"]["equivalence_margin"] = 0.25  # not the default: the analysis must read it
    params["models"] = models
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def t2i_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    root = tmp_path_factory.mktemp("t2i") / "project"
    root.mkdir()
    (root / "dvc.yaml").write_text("stages: {}\n")
    write_t2i_params(root, {"synthetic-t2i": T2I_MODEL})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        patch.chdir(root)
        ctx = StageContext.load(root / "params.yaml", root)
        sources.run(ctx)
        prompts.run(ctx)
        plan.run(ctx)
        generate.run(ctx, "synthetic-t2i")
        evaluate.run(ctx, "synthetic-t2i")
        results = analyze.run(ctx)
        report.run(ctx)
        yield root, results[0]


def test_t2i_plan_has_prompts_and_no_sources(t2i_run: tuple[Path, Any]) -> None:
    root, _ = t2i_run
    ctx = StageContext.load(root / "params.yaml", root)
    planned = ctx.model_requests("synthetic-t2i")
    assert len(planned) == 45 * 25 and set(planned["mode"]) == {"t2i"}
    for column in ("source_id", "source_path", "source_sha256", "race", "gender", "age"):
        assert set(planned[column]) == {""}, column
    assert planned["base_id"].nunique() == 45


def test_t2i_measured_rates_match_planted(t2i_run: tuple[Path, Any]) -> None:
    root, result = t2i_run
    planted = result.planted
    rates = planted[planted["value"] != "Δ"]
    assert len(rates) == 25
    assert rates.set_index("value").loc["culture:nigerian", "planted"] == pytest.approx(
        (12 * 0.10 + 11 * 0.05 + 11 * 0.05 + 11 * 0.08) / 45 + 0.45)
    # 95 % intervals, not simultaneous: a miss or two in 25 would be chance, more a fault.
    assert rates["covered"].mean() >= 0.9, rates[~rates["covered"]]
    deltas = planted[planted["value"] == "Δ"].set_index("dimension")
    assert deltas.loc["age", "planted"] == 0 and deltas.loc["gender", "planted"] == 0
    gaps = result.disparities.set_index("dimension")
    assert gaps["method"].str.startswith("test-inversion, base-prompt bootstrap/between-groups"
                                         ).all()
    # Six per-row 95 % intervals: one planted Δ outside would be chance (more: 3 %). A planted
    # 0 is outside exactly when its row's own test rejects (here disability: p = 0.044).
    missed = deltas[~deltas["covered"].astype(bool)]
    assert len(missed) <= 1, deltas
    nothing = missed.index[missed["planted"] == 0]
    assert (gaps.loc[nothing, "p_value"] < 0.05).all(), gaps.loc[nothing]
    assert gaps.loc["culture", "flagged"] and gaps.loc["all", "flagged"]
    assert gaps.loc["culture", "max_attribute"] == "culture:nigerian"
    assert not gaps.loc["age", "flagged"] and not gaps.loc["gender", "flagged"]
    # The max-t bands (analyze.simultaneous_intervals: true) hold every planted Δ at once.
    cfg = StageContext.load(root / "params.yaml", root).params.analyze
    bands = attribute_disparities(result.frame, "hard_refusal", cfg.confidence, cfg.alpha,
                                  cfg.bootstrap, cfg.permutations, cfg.seed, simultaneous=True)
    table = attribute_planted_vs_measured(result.frame, result.rates, bands)
    assert table.loc[table["value"] == "Δ", "covered"].all(), table


def test_t2i_outputs_metrics_report_and_tables(t2i_run: tuple[Path, Any]) -> None:
    root, result = t2i_run
    metrics = read_detailed_metrics(root / layout.detailed_metrics("synthetic-t2i"))
    gaps = result.disparities.set_index("dimension")
    assert metrics["delta_refusal"] == pytest.approx(gaps.loc["all", "delta"], abs=1e-6)
    assert metrics["delta_refusal.culture.ci_low"] == pytest.approx(gaps.loc["culture", "ci_low"],
                                                                    abs=1e-6)
    assert "refusal_rate.culture.nigerian" in metrics and "refusal_rate.neutral" in metrics
    deltas = result.planted[result.planted["value"] == "Δ"]
    assert metrics["planted.delta_refusal.coverage"] == pytest.approx(deltas["covered"].mean(),
                                                                      abs=1e-6)
    assert deltas["covered"].mean() >= 5 / 6  # per-row intervals: one miss in six is chance
    assert not any(key.startswith(("erasure", "lightening", "delta_erasure")) for key in metrics)
    section = read_any_section(root / layout.ANALYSIS_DIR / "synthetic-t2i", root)
    assert section.slug == "synthetic-t2i" and section.planted is not None
    headline = json.loads((root / layout.METRICS_DIR / "synthetic-t2i" / "refusal.json"
                           ).read_text())
    assert headline["all_corrected"] == pytest.approx(gaps.loc["all", "delta_corrected"],
                                                      abs=1e-4)
    html = (root / layout.REPORT_FILE).read_text()
    assert "Text-to-image: refusal by prompt attribute" in html
    assert "culture:nigerian" in html and "SIMULATION" in html
    t2i = html[html.index('id="t2i"'):html.index('id="method"')]
    assert "corrected Δ (pp)" in t2i and "per-row interval (pp)" in t2i
    assert "simultaneous interval" not in t2i
    assert f">{100 * gaps.loc['culture', 'delta_corrected']:.1f}<" in t2i
    assert "/between-groups permutation within base prompts<" in t2i
    assert (root / "reports" / "tables" / "synthetic-t2i-t2i-hard_refusal-delta.tex").exists()
    assert (root / "plots" / "figures" / "synthetic-t2i-t2i-hard_refusal-attribute.png").exists()
    delta_csv = pd.read_csv(root / "plots" / "delta.csv")
    assert set(delta_csv["cell"]) == {"t2i/" + d for d in gaps.index}


def test_t2i_equivalence_is_tested_at_the_margin_in_params_and_reported(
        t2i_run: tuple[Path, Any]) -> None:
    root, result = t2i_run
    cfg = StageContext.load(root / "params.yaml", root).params.analyze
    expected = attribute_equivalence(result.frame, "hard_refusal", cfg.equivalence_margin,
                                     cfg.alpha)
    section = read_any_section(root / layout.ANALYSIS_DIR / "synthetic-t2i", root)
    assert section.equivalence is not None
    pd.testing.assert_frame_equal(section.equivalence, expected)
    table = expected.set_index("dimension")
    assert (table["margin"] == 0.25).all() and (table["n_base_prompts"] == 45).all()
    # the planted 45-point Nigerian offset is far past the margin; gender has no planted gap
    assert not table.loc["culture", "equivalent"] and not table.loc["all", "equivalent"]
    assert table.loc["culture", "p_value"] > 0.5
    assert "culture:nigerian" in (table.loc["culture", "worst_a"],
                                  table.loc["culture", "worst_b"])
    assert table.loc["gender", "equivalent"], table
    metrics = read_detailed_metrics(root / layout.detailed_metrics("synthetic-t2i"))
    assert metrics["delta_refusal.gender.equivalent"] == 1.0
    assert metrics["delta_refusal.equivalent"] == 0.0
    assert metrics["delta_refusal.culture.equivalence_p"] == pytest.approx(
        table.loc["culture", "p_value"], abs=1e-6)
    html = (root / layout.REPORT_FILE).read_text()
    t2i = html[html.index('id="model-synthetic-t2i-t2i-equivalence"'):html.index('id="method"')]
    assert "shown: every attribute gap is below 25.0 pp" in t2i
    assert "not shown: a gap of 25.0 pp or more cannot be excluded" in t2i
    tex = (root / "reports" / "tables" / "synthetic-t2i-t2i-hard_refusal-delta.tex").read_text()
    assert "Gap $<$ 25 pp ($p$)" in tex
    gender = next(line for line in tex.splitlines() if line.startswith("gender &"))
    culture = next(line for line in tex.splitlines() if line.startswith("culture &"))
    assert "& yes (" in gender and "& no (" in culture


def test_an_offset_for_an_attribute_no_prompt_has_stops_analyze(
        t2i_run: tuple[Path, Any]) -> None:
    root, _ = t2i_run
    model = deep_update(T2I_MODEL, {"config": {"refusal": {"attribute": {"culture:martian": 0.1}}}})
    ctx = StageContext.load(write_t2i_params(root, {"synthetic-t2i": model}), root)
    frame = analyze.analysis_frame(ctx, "synthetic-t2i", ["request_id", "prompt_id", "base_id",
                                                          "category", "attribute", "seed"])
    with pytest.raises(ConfigError, match="culture:martian"):
        analyze.add_planted_refusal(frame, ctx.params.model("synthetic-t2i"), "synthetic-t2i")
    write_t2i_params(root, {"synthetic-t2i": T2I_MODEL})


# ---------------------------------------------------------------------------------------------
# An audited generator sees the prompt, never a label


class RecordingGenerator(Generator):
    """A stand-in for a real T2I adapter: records what it is given, generates a placeholder."""

    received: ClassVar[list[GenerationRequest]] = []
    designs: ClassVar[list[Any]] = []

    def attach_design(self, design: Any) -> None:  # would be a leak: never called
        RecordingGenerator.designs.append(design)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Outcome]:
        RecordingGenerator.received.extend(requests)
        return [Outcome(status="ok", image=placeholder_image(r.prompt, r.seed, 16))
                for r in requests]


def test_generate_gives_a_generator_the_prompt_and_no_demographic_field(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "test:recording-t2i"
    GENERATORS.register(key, "tests.test_t2i:RecordingGenerator")
    RecordingGenerator.received.clear()
    RecordingGenerator.designs.clear()
    try:
        root = tmp_path / "project"
        root.mkdir()
        (root / "dvc.yaml").write_text("stages: {}\n")
        monkeypatch.chdir(root)
        monkeypatch.setenv("ACRB_MLFLOW", "0")
        params = write_t2i_params(root, {"recorder": {"key": key, "revision": "r1"}})
        data = yaml.safe_load(params.read_text())
        data["prompts"]["synthesis"]["domains"] = ["copyright"]
        params.write_text(yaml.safe_dump(data, sort_keys=False))
        ctx = StageContext.load(params, root)
        sources.run(ctx)
        prompts.run(ctx)
        plan.run(ctx)
        planned = ctx.model_requests("recorder").set_index("request_id")
        summary = generate.run(ctx, "recorder")
    finally:
        GENERATORS.unregister(key)
    received = RecordingGenerator.received
    assert summary.generated == len(planned) == len(received) == 11 * 25
    assert RecordingGenerator.designs == [], "the simulated channel was opened to a real model"
    for request in received:
        assert_generation_request_carries_no_labels(request)
        row = planned.loc[request.request_id]
        assert request.prompt == row["prompt_text"] and request.seed == row["seed"]
        assert row["race"] == row["gender"] == row["age"] == row["source_path"] == ""
    table = read_table(root / layout.generations_table("recorder"), GenerationRecord)
    assert set(table["status"]) == {"ok"}


# ---------------------------------------------------------------------------------------------
# The editors' results do not change when a generator joins the audit


def _editor_results(root: Path, models: dict[str, Any]) -> tuple[dict[str, Any], pd.DataFrame,
                                                                 pd.DataFrame]:
    root.mkdir()
    (root / "dvc.yaml").write_text("stages: {}\n")
    params = write_t2i_params(root, models)
    data = yaml.safe_load(params.read_text())
    data["prompts"]["synthesis"]["modes"] = ["t2i", "i2i"]
    data["prompts"]["synthesis"]["domains"] = ["copyright"]
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    ctx = StageContext.load(params, root)
    sources.run(ctx)
    prompts.run(ctx)
    plan.run(ctx)
    for model in ctx.params.models:
        generate.run(ctx, model)
        evaluate.run(ctx, model)
    analyze.run(ctx)
    metrics = {model: read_detailed_metrics(root / layout.detailed_metrics(model))
               for model in ctx.params.models}
    judgements = pd.read_parquet(root / layout.judgements_table("synthetic-biased"))
    delta = pd.read_csv(root / "plots" / "delta.csv")
    return metrics, judgements, delta


def test_editor_results_are_unchanged_by_a_generator_beside_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    editor = repo_params()["models"]["synthetic-biased"]
    t2i = deep_update(T2I_MODEL, {"config": {"refusal": {"base": {"copyright": 0.05}}}})
    monkeypatch.chdir(tmp_path)
    alone = _editor_results(tmp_path / "alone", {"synthetic-biased": editor})
    both = _editor_results(tmp_path / "both", {"synthetic-biased": editor, "synthetic-t2i": t2i})
    assert set(both[0]) == {"synthetic-biased", "synthetic-t2i"}
    assert both[0]["synthetic-biased"] == alone[0]["synthetic-biased"]
    pd.testing.assert_frame_equal(alone[1], both[1])
    editors_rows = both[2][both[2]["model"] == "synthetic-biased"].reset_index(drop=True)
    # CSV read back: a column of whole numbers alone (every lower limit 0) reads as int.
    pd.testing.assert_frame_equal(alone[2], editors_rows[alone[2].columns], check_dtype=False)
