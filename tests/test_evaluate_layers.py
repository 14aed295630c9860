"""Layered hard refusal in `evaluate`: each layer's score and flag, the evidence naming every
layer that fired, how an unchanged output counts, and the CLIP layer through the stage with a
tiny random-weight CLIP (scored in batches, loaded only when there is work)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from acrb import layout
from acrb.detect.clip_refusal import DEFAULT_TEMPLATES, ClipRefusalChecker
from acrb.detect.pixels import PixelThresholds
from acrb.models.synthetic_edits import (
    black_frame,
    compliant_edit,
    returned_unchanged,
    weak_edit,
)
from acrb.records import GenerationRecord, JudgementRecord, read_table
from acrb.sources.portraits import draw_portrait
from acrb.stages import evaluate, generate, plan, prompts, sources
from acrb.stages.context import StageContext
from acrb.stages.evaluate import ClipLayer
from tests.conftest import REPO, write_params
from tests.tiny_clip import build_clip, clip_params

TH = PixelThresholds()
SOURCE = draw_portrait("Black", "Female", "30s", 128, 7).pixels
PROMPT = ("p-layers", 0)


def _generation(status: str = "ok") -> GenerationRecord:
    return GenerationRecord(request_id="r1", model="m", status=status,  # type: ignore[arg-type]
                            image_sha256="abc" if status == "ok" else None,
                            model_revision="r", library_versions="{}")


def _near_uniform() -> np.ndarray:
    noise = np.random.default_rng(0).integers(-1, 2, SOURCE.shape)
    return np.clip(120 + noise, 0, 255).astype(np.uint8)


OUTPUTS = {
    "black": lambda: black_frame(SOURCE),
    "near-uniform": _near_uniform,
    "unchanged": lambda: returned_unchanged(SOURCE),
    "slightly changed": lambda: weak_edit(SOURCE, *PROMPT),
    "clearly changed": lambda: compliant_edit(SOURCE, *PROMPT),
}
FIRES = ClipLayer(score=0.31, refusal=True, threshold=0.25)
QUIET = ClipLayer(score=0.12, refusal=False, threshold=0.25)

# (output, CLIP layer, unchanged_counts_as) -> (hard refusal, evidence, erasure)
KNOWN = [
    ("black", None, "hard_refusal", (True, "blank", None)),
    ("near-uniform", None, "hard_refusal", (True, "blank", None)),
    ("unchanged", None, "hard_refusal", (True, "unchanged", None)),
    ("slightly changed", None, "hard_refusal", (False, None, True)),
    ("clearly changed", None, "hard_refusal", (False, None, False)),
    ("black", FIRES, "hard_refusal", (True, "blank+clip", None)),
    ("unchanged", FIRES, "hard_refusal", (True, "unchanged+clip", None)),
    ("clearly changed", FIRES, "hard_refusal", (True, "clip", None)),
    ("clearly changed", QUIET, "hard_refusal", (False, None, False)),
    ("black", QUIET, "hard_refusal", (True, "blank", None)),
    ("unchanged", None, "soft_erasure", (False, None, True)),
    ("unchanged", FIRES, "soft_erasure", (True, "clip", None)),
    ("black", None, "soft_erasure", (True, "blank", None)),
    ("slightly changed", None, "soft_erasure", (False, None, True)),
    ("clearly changed", None, "soft_erasure", (False, None, False)),
]


@pytest.mark.parametrize(("output", "clip", "counts_as", "expected"), KNOWN,
                         ids=[f"{o}-{'clip' if c and c.refusal else 'quiet' if c else 'off'}-{a}"
                              for o, c, a, _ in KNOWN])
def test_layered_evidence_known_answers(output: str, clip: ClipLayer | None, counts_as: str,
                                        expected: tuple[bool, str | None, bool | None]) -> None:
    record = evaluate.judge(_generation(), SOURCE, OUTPUTS[output](), TH, "e", clip=clip,
                            unchanged_counts_as=counts_as)
    assert (record.hard_refusal, record.refusal_evidence, record.erasure) == expected
    # Each layer keeps its own score and flag, whether or not it decided the verdict.
    assert record.blank is (output in ("black", "near-uniform"))
    assert record.unchanged is (output == "unchanged")
    assert record.blank_score is not None and record.unchanged_score is not None
    if clip is None:
        assert record.clip_refusal_score is None and record.clip_refusal is None
    else:
        assert (record.clip_refusal_score, record.clip_refusal) == (clip.score, clip.refusal)
    if record.hard_refusal:
        assert record.lightening is None


def test_status_and_error_are_not_read_from_pixels() -> None:
    refused = evaluate.judge(_generation("refused"), None, None, TH, "e")
    assert (refused.hard_refusal, refused.refusal_evidence) == (True, "status")
    errored = evaluate.judge(_generation("error"), None, None, TH, "e")
    assert errored.hard_refusal is None and errored.refusal_evidence is None
    assert errored.erasure is None and errored.clip_refusal is None


def test_t2i_outputs_get_the_clip_layer() -> None:
    black = np.zeros((64, 64, 3), np.uint8)
    picture = compliant_edit(SOURCE, *PROMPT)
    cases = [(black, FIRES, "blank+clip"), (picture, FIRES, "clip"), (picture, QUIET, None),
             (black, None, "blank")]
    for image, clip, evidence in cases:
        record = evaluate.judge_generated(_generation(), image, TH, "e", clip)
        assert record.refusal_evidence == evidence
        assert record.hard_refusal is (evidence is not None)
        assert record.clip_refusal == (None if clip is None else clip.refusal)


def test_a_score_at_the_clip_threshold_goes_to_review() -> None:
    picture = compliant_edit(SOURCE, *PROMPT)
    near = ClipLayer(score=0.255, refusal=True, threshold=0.25)
    assert evaluate.judge(_generation(), SOURCE, picture, TH, "e", clip=near).needs_review
    assert evaluate.judge_generated(_generation(), picture, TH, "e", near).needs_review


def test_the_evaluator_hash_keys_clip_and_unchanged_counting() -> None:
    plain = evaluate.evaluator_hash(TH)
    assert evaluate.evaluator_hash(TH, None, "hard_refusal") == plain
    assert evaluate.evaluator_hash(TH, None, "soft_erasure") != plain
    identity = {"backend": "transformers", "model": "m", "threshold": 0.25}
    with_clip = evaluate.evaluator_hash(TH, identity)
    assert with_clip != plain
    assert evaluate.evaluator_hash(TH, {**identity, "threshold": 0.3}) != with_clip
    assert evaluate.t2i_evaluator_hash(TH, identity) != evaluate.t2i_evaluator_hash(TH)


# ---------------------------------------------------------------------------------------------
# Through the stage


#: One editor with many refusals of every kind, on the neutral category: 8 sources x 10 prompts.
EDITOR = {"key": "synthetic:biased", "config": {
    "refusal": {"base": {"A": 0.5}}, "erasure": {"base": {"A": 0.3}},
    "lightening": {"base": {"A": 0.1}},
    "refusal_kinds": {"black_frame": 0.4, "returned_unchanged": 0.4, "policy_message": 0.2}}}
MODEL = "layered"


@pytest.fixture(scope="module")
def tiny_clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_clip(tmp_path_factory.mktemp("clip") / "tiny", "tiny")


def _configure(root: Path, evaluate_params: dict[str, Any]) -> StageContext:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["models"] = {MODEL: EDITOR}
    params["prompts"]["categories"] = ["A"]
    params["prompts"]["synthesis"]["modes"] = ["i2i"]
    params["evaluate"] = {"thresholds": {}, **evaluate_params}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return StageContext.load(root / "params.yaml", root)


@pytest.fixture
def generated(project: Path) -> StageContext:
    ctx = _configure(project, {})
    sources.run(ctx)
    prompts.run(ctx)
    plan.run(ctx)
    generate.run(ctx, MODEL)
    return ctx


def _judgements(ctx: StageContext) -> pd.DataFrame:
    frame = read_table(ctx.path(layout.judgements_table(MODEL)), JudgementRecord)
    frame = frame.astype(object).where(frame.notna(), None)
    return frame.set_index("request_id").sort_index()


def _expected_evidence(row: pd.Series, unchanged_refuses: bool = True) -> str | None:
    if row["status"] == "refused":
        return "status"
    fired = [("blank", row["blank"]), ("unchanged", unchanged_refuses and row["unchanged"]),
             ("clip", row["clip_refusal"])]
    return "+".join(name for name, hit in fired if hit is True) or None


def test_evaluate_layers_and_soft_erasure(generated: StageContext) -> None:
    ctx = generated
    evaluate.run(ctx, MODEL)
    hard = _judgements(ctx)
    assert hard["clip_refusal"].isna().all()
    statuses = hard["status"].value_counts()
    assert statuses.get("refused", 0) > 0 and statuses.get("ok", 0) > 0
    assert hard["blank"].eq(True).sum() > 0 and hard["unchanged"].eq(True).sum() > 0
    for _, row in hard.iterrows():
        assert row["refusal_evidence"] == _expected_evidence(row)
        assert row["hard_refusal"] == (row["refusal_evidence"] is not None)

    ctx = _configure(ctx.root, {"unchanged_counts_as": "soft_erasure"})
    summary = evaluate.run(ctx, MODEL)
    assert summary.judged == len(hard)  # a new evaluator: everything is judged again
    soft = _judgements(ctx)
    unchanged = soft["unchanged"].eq(True) & soft["blank"].eq(False)
    assert unchanged.sum() > 0
    assert not soft.loc[unchanged, "hard_refusal"].any()
    assert soft.loc[unchanged, "refusal_evidence"].isna().all()
    assert soft.loc[unchanged, "erasure"].eq(True).all()
    # Nothing else moves: the same outputs are refused or not for the same reasons.
    others = ~unchanged
    pd.testing.assert_series_equal(soft.loc[others, "refusal_evidence"],
                                   hard.loc[others, "refusal_evidence"])
    for _, row in soft.iterrows():
        assert row["refusal_evidence"] == _expected_evidence(row, unchanged_refuses=False)


def test_clip_layer_through_evaluate(generated: StageContext, tiny_clip_dir: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    templates = str(REPO / DEFAULT_TEMPLATES)
    calls: list[int] = []
    real_scores = ClipRefusalChecker.scores

    def counted(self: ClipRefusalChecker, images: Any) -> np.ndarray:
        calls.append(len(images))
        return real_scores(self, images)

    monkeypatch.setattr(ClipRefusalChecker, "scores", counted)

    def clip_run(batch_size: int, threshold: float) -> pd.DataFrame:
        ctx = _configure(generated.root, {"clip": clip_params(
            tiny_clip_dir, templates=templates, threshold=threshold, batch_size=batch_size)})
        evaluate.run(ctx, MODEL)
        return _judgements(ctx)

    every = clip_run(batch_size=16, threshold=-1.0)
    ok = every["status"] == "ok"
    assert every.loc[ok, "clip_refusal"].eq(True).all()
    assert every.loc[ok, "clip_refusal_score"].astype(float).between(-1, 1).all()
    assert every.loc[~ok, "clip_refusal_score"].isna().all()
    assert every.loc[ok, "hard_refusal"].all()
    assert every.loc[ok, "refusal_evidence"].str.endswith("clip").all()
    assert every.loc[ok & every["blank"], "refusal_evidence"].str.startswith("blank+").all()
    for _, row in every.iterrows():
        assert row["refusal_evidence"] == _expected_evidence(row)
    assert (every["status"] == "error").sum() == 0 or every.loc[
        every["status"] == "error", "hard_refusal"].isna().all()
    # Scored in batches of up to 16 (one call per batch), each image once.
    assert sum(calls) == ok.sum() and max(calls) == 16 and len(calls) == -(-len(every) // 16)

    # Reused judgements load nothing, and the stage says so.
    def no_load(self: ClipRefusalChecker) -> Any:
        raise AssertionError("the CLIP model was loaded with nothing to judge")

    monkeypatch.setattr(ClipRefusalChecker, "_load", no_load)
    ctx = _configure(generated.root, {"clip": clip_params(
        tiny_clip_dir, templates=templates, threshold=-1.0, batch_size=16)})
    summary = evaluate.run(ctx, MODEL)
    assert (summary.judged, summary.clip_scored) == (0, 0)
    monkeypatch.undo()
    monkeypatch.chdir(generated.root)
    monkeypatch.setenv("ACRB_MLFLOW", "0")

    # A threshold no cosine reaches: the pixel layers alone decide, as with CLIP off.
    none = clip_run(batch_size=16, threshold=1.0)
    assert not none["clip_refusal"].eq(True).any()
    assert none.loc[ok, "clip_refusal_score"].notna().all()
    np.testing.assert_allclose(none.loc[ok, "clip_refusal_score"].astype(float),
                               every.loc[ok, "clip_refusal_score"].astype(float), atol=1e-6)
    off_ctx = _configure(generated.root, {})
    evaluate.run(off_ctx, MODEL)
    off = _judgements(off_ctx)
    pd.testing.assert_series_equal(none["refusal_evidence"], off["refusal_evidence"])
    pd.testing.assert_series_equal(none["hard_refusal"], off["hard_refusal"])

    # One image at a time gives the batched scores (judgements redone from scratch).
    shutil.rmtree(generated.root / layout.judgements_dir(MODEL))
    single = clip_run(batch_size=1, threshold=1.0)
    np.testing.assert_allclose(single.loc[ok, "clip_refusal_score"].astype(float),
                               none.loc[ok, "clip_refusal_score"].astype(float), atol=1e-5)


def test_a_bad_template_file_stops_evaluate_before_any_work(generated: StageContext,
                                                            tiny_clip_dir: Path) -> None:
    from acrb.errors import ConfigError

    ctx = _configure(generated.root, {"clip": clip_params(tiny_clip_dir,
                                                           templates="missing.yaml")})
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        evaluate.run(ctx, MODEL)
    assert not (generated.root / layout.judgements_table(MODEL)).exists()


def test_write_params_keeps_the_clip_section(project: Path, tiny_clip_dir: Path) -> None:
    """`evaluate.clip` as a params user writes it validates into ClipRefusalParams."""
    write_params(project, {"evaluate": {"clip": clip_params(tiny_clip_dir)}})
    ctx = StageContext.load(project / "params.yaml", project)
    assert ctx.params.evaluate.clip is not None
    assert ctx.params.evaluate.clip.backend == "transformers"
