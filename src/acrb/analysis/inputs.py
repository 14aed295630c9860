"""What the analysis reads from the pipeline's outputs: one model's analysis frame (its planned
requests joined with the detectors' judgements and, when judges ran, their verdicts) and its
verdicts table. Shared by the ``analyze`` and ``review`` stages, so both count the same rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from acrb import layout
from acrb.analysis.frame import AnalysisFrame, check_columns, checked_frame
from acrb.analysis.outcomes import DETECTOR_OUTCOMES, JUDGE_OUTCOMES
from acrb.records import SCORE_AXES, JudgementRecord, VerdictRecord, read_table

if TYPE_CHECKING:
    from acrb.stages.context import StageContext

#: The plan columns of an image-editing audit's frame, and of a text-to-image one.
REQUEST_COLUMNS = ["request_id", "source_id", "prompt_id", "category", "attribute",
                   "congruence", "seed", "race", "gender", "age"]
T2I_REQUEST_COLUMNS = ["request_id", "prompt_id", "base_id", "category", "attribute", "seed"]
#: The arm every audit has (the instruction as written) and the feature-prompt arm (p_feat + p).
PLAIN_ARM = "none"
FEATURE_ARM = "feature"


def analysis_frame(ctx: StageContext, model: str, columns: list[str] | None = None, *,
                   plain_audit: bool = True) -> AnalysisFrame:
    """``model``'s analysis frame, checked once here (:func:`acrb.analysis.frame.checked_frame`):
    one row per planned request (with ``plain_audit``, only the audit's plain-arm requests:
    the feature arm and the WinoBias experiment have analyses of their own): its design
    factors (``columns`` of the plan; those of an I2I audit by default) joined with its
    judgement and, when judges are configured and the judge stage wrote ``model``'s verdicts,
    with the judges' verdict
    (:func:`verdict_columns`: the judge outcomes, the ensemble axis
    scores, ``verdict_status`` and ``judge_needs_review``). Without verdicts the frame has no
    judge column, and every table is exactly what it is without judges."""
    requests = ctx.model_requests(model)
    if plain_audit:
        requests = requests[(requests["arm"] == PLAIN_ARM)
                            & (requests["experiment"] == "audit")]
    requests = requests[columns or REQUEST_COLUMNS]
    judgements = read_table(ctx.path(layout.judgements_table(model)), JudgementRecord)
    frame = requests.merge(
        judgements[["request_id", "status", *DETECTOR_OUTCOMES, "ita_shift", "edit_fraction",
                    "needs_review"]],
        on="request_id", how="left", validate="one_to_one",
    )
    frame["status"] = frame["status"].fillna("missing")
    for column in DETECTOR_OUTCOMES:
        frame[column] = frame[column].astype("boolean")
    verdicts = read_verdicts(ctx, model)
    if verdicts is not None:
        frame = frame.merge(verdict_columns(verdicts), on="request_id", how="left",
                            validate="one_to_one")
        for column in JUDGE_OUTCOMES:
            frame[column] = frame[column].astype("boolean")
    return checked_frame(frame)


def read_verdicts(ctx: StageContext, model: str) -> pd.DataFrame | None:
    """``model``'s verdicts table, or None when no judge is configured (``judge.use`` empty)
    or the judge stage has not written it (then the analysis runs as without judges). Its
    combined scores are checked against the rubric's ranges (a mean of several judges may be
    a fraction): a table edited after the judge stage wrote it is refused, naming the
    requests, never analysed."""
    from acrb.judges.rubric import check_stored_scores, load_rubric, table_answers

    path = ctx.path(layout.verdicts_table(model))
    if not ctx.params.judge.use or not path.exists():
        return None
    verdicts = read_table(path, VerdictRecord)
    check_stored_scores(load_rubric(ctx.path(ctx.params.judge.rubric)), "ensemble", path,
                        table_answers(verdicts, SCORE_AXES), fix=rewritten_by_judge(model),
                        whole=False)
    return verdicts


def rewritten_by_judge(model: str) -> str:
    """How to replace a judge table of ``model`` that fails its check: the judge stage
    rewrites it from the judges' records (``dvc repro`` restores DVC's copy)."""
    return (f"restore it with `dvc checkout` or rerun the judge stage (`dvc repro -f "
            f"judge@{model}`); edit a judge's answer through human review, never in its table")


def verdict_columns(verdicts: pd.DataFrame) -> pd.DataFrame:
    """The columns of a verdicts table that join the analysis frame, named so that none
    collides with a judgement column: ``request_id``, the judge outcomes, the ensemble score
    per axis, ``verdict_status`` (scored / abstained / not_judged), ``judge_needs_review``
    and ``review_axes``."""
    check_columns(verdicts, ["request_id", "status", "needs_review", *JUDGE_OUTCOMES,
                             *SCORE_AXES])
    out = verdicts[["request_id", *JUDGE_OUTCOMES, *SCORE_AXES]].copy()
    for axis in SCORE_AXES:
        out[axis] = pd.to_numeric(out[axis], errors="coerce").astype(float)
    out["verdict_status"] = verdicts["status"].astype(str).to_numpy()
    out["judge_needs_review"] = verdicts["needs_review"].astype("boolean").to_numpy()
    out["review_axes"] = (verdicts["review_axes"].fillna("").astype(str).to_numpy()
                          if "review_axes" in verdicts else "")
    return out
