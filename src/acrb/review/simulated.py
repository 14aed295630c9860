"""Simulated raters: a human review without people, for the embedded default and for tests.

An instrument with published, planted values (params ``review.simulated``), never a measurement
of people. Each rater starts from what the detectors read in the edit's pixels
(:func:`acrb.judges.simulated.pixel_scores`, where the simulated judges start too) and then

- answers the age question ``review.age_question`` names: ACRB's ``age_change``, or the study's
  bipolar item (``age_direction``, from the detectors' 3 "no change"; its drift is then read
  onto ``age_change`` as a survey import reads it, :func:`acrb.review.scales.age_from_direction`);
- answers "cannot tell" on an axis with probability ``cannot_tell``;
- moves an answer one step up or down (within 1-5) with probability ``noise``;
- on an item shown to them a second time (``repeat``), gives the same answers again with
  probability ``repeat_consistency``, else answers afresh.

These rates are the same for every group, so the judges' planted group-dependent errors are
exactly what the ratings can correct. Each item goes to ``review.raters_per_item`` distinct
raters of a pool of ``count`` (the least-loaded raters first, ties broken at random), and a
share ``review.repeat_fraction`` of each rater's items comes back to that rater once more.
Draws are seeded per (rater, item, output), so adding items never changes earlier ratings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from acrb.config import PixelThresholds, ReviewParams
from acrb.judges.items import PixelReading
from acrb.judges.simulated import pixel_scores
from acrb.records import REVIEW_AXES, RatingRecord
from acrb.review.scales import age_from_direction, asked_axes
from acrb.storage import content_hash


def _rng(seed: int, *parts: Any) -> np.random.Generator:
    digest = content_hash({"seed": seed, "parts": [str(p) for p in parts]}, 16)
    return np.random.default_rng(int(digest, 16))


def rater_names(count: int) -> list[str]:
    return [f"sim-rater-{i + 1:02d}" for i in range(count)]


def assign(item_ids: list[str], raters: list[str], k: int, seed: int) -> dict[str, list[str]]:
    """Item id -> the ``k`` distinct raters it goes to (least-loaded first, random ties)."""
    if k > len(raters):
        k = len(raters)
    load = dict.fromkeys(raters, 0)
    out: dict[str, list[str]] = {}
    for item in item_ids:
        rng = _rng(seed, "assign", item)
        ties = rng.random(len(raters))
        chosen = sorted(raters, key=lambda r: (load[r], ties[raters.index(r)]))[:k]
        for rater in chosen:
            load[rater] += 1
        out[item] = chosen
    return out


def _answers(truth: Mapping[str, float], rng: np.random.Generator, noise: float,
             cannot_tell: float, age_question: str = "change") -> dict[str, int | None]:
    answers: dict[str, int | None] = {}
    for axis in asked_axes(age_question):
        value = int(truth[axis])
        if rng.random() < cannot_tell:
            answers[axis] = None
            continue
        if rng.random() < noise:
            value = int(min(5, max(1, value + (1 if rng.random() < 0.5 else -1))))
        answers[axis] = value
    if age_question == "direction":
        answers.update(age_from_direction(answers.pop("age_direction")))
    return answers


def simulate_ratings(items: pd.DataFrame, readings: Mapping[str, PixelReading],
                     review: ReviewParams, thresholds: PixelThresholds) -> pd.DataFrame:
    """RatingRecord rows for every item of the review set ``items`` (ReviewItemRecord rows).

    ``readings`` maps a request id to the detectors' reading of its edit; an item whose output
    has none (it was not measured) is left unrated, as a rater would skip a broken image.
    """
    cfg = review.simulated
    raters = rater_names(cfg.count)
    ids = [str(i) for i in items["item_id"]]
    assignment = assign(ids, raters, review.raters_per_item, cfg.seed)
    origin = f"simulated:{cfg.seed}"
    rows: list[dict[str, Any]] = []
    seen: dict[str, list[str]] = {r: [] for r in raters}
    for _, item in items.iterrows():
        outputs = [("edited", item["request_id"])]
        paired = item.get("paired_request_id")
        if isinstance(paired, str) and paired:
            outputs.append(("feature", paired))
        if any(str(rid) not in readings for _, rid in outputs):
            continue
        for rater in assignment[str(item["item_id"])]:
            seen[rater].append(str(item["item_id"]))
            order = _rng(cfg.seed, "order", rater, item["item_id"]).random() < 0.5
            for output, rid in outputs:
                truth = pixel_scores(readings[str(rid)], thresholds)
                rng = _rng(cfg.seed, "rate", rater, item["item_id"], output)
                rows.append({
                    "rating_id": content_hash([rater, item["item_id"], output, False], 16),
                    "rater": rater, "item_id": str(item["item_id"]), "output": output,
                    "shown_first": None if len(outputs) == 1 else (output == "edited") == order,
                    **_answers(truth, rng, cfg.noise, cfg.cannot_tell, review.age_question),
                    "repeat": False, "duration_ms": None, "created_at": "", "origin": origin,
                })
    first = {(r["rater"], r["item_id"], r["output"]): r for r in rows}
    repeats: list[dict[str, Any]] = []
    for rater, rated in seen.items():
        count = round(review.repeat_fraction * len(rated))
        if not count:
            continue
        chosen = _rng(cfg.seed, "repeat", rater).choice(len(rated), size=count, replace=False)
        for index in sorted(int(i) for i in chosen):
            item_id = rated[index]
            for (who, iid, output), earlier in first.items():
                if who != rater or iid != item_id:
                    continue
                rng = _rng(cfg.seed, "again", rater, item_id, output)
                if rng.random() < cfg.repeat_consistency:
                    answers = {axis: earlier[axis] for axis in (*REVIEW_AXES, "age_direction")
                               if axis in earlier}
                else:
                    row = items[items["item_id"] == item_id].iloc[0]
                    rid = row["request_id"] if output == "edited" else row["paired_request_id"]
                    answers = _answers(pixel_scores(readings[str(rid)], thresholds), rng,
                                       cfg.noise, cfg.cannot_tell, review.age_question)
                repeats.append({**earlier, **answers, "repeat": True,
                                "rating_id": content_hash([rater, item_id, output, True], 16)})
    frame = pd.DataFrame(rows + repeats, columns=list(RatingRecord.model_fields))
    for axis in {*REVIEW_AXES, *asked_axes(review.age_question)}:
        frame[axis] = frame[axis].astype("Int64")
    frame["duration_ms"] = frame["duration_ms"].astype("Int64")
    return frame
