"""Match imported survey items to the requests of this run, so that people's ratings of them
can be set against the judges' verdicts.

A survey item names its model in the survey's own words (``flux``, ``qwen``, ``step1x``), its
prompt (``promptId``, e.g. ``B03``) and its source cell (``originalItemId`` and the race,
gender and age labels). A request of the run names its model by the entry name in params
(``flux2-dev``, ...) and registry key, its ``prompt_id``, its source (``source_id``) and the
source's labels. An item matches the one plain-arm (``none``) image-editing request with:

- the model: ``review.model_aliases`` [survey name] if declared (an entry name of the run);
  otherwise the one model of the run whose entry name or registry key contains the survey's
  name, case-insensitively (``flux`` -> ``flux2-dev``). None or several such models: unmatched.
- the prompt: the same ``prompt_id``.
- the source: the same ``source_id`` as the item's ``originalItemId`` where a request has it;
  else the same race, gender and age (one portrait per cell in the study's FairFace grid).

Exactly one request must match (several seeds or portraits of the cell: ambiguous, left
unmatched). The matched item takes the request's ``request_id``, the run's model name and, if
its feature-prompt output was rated, the feature-arm request of the same plain request
(``pair_of``) as ``paired_request_id``. Every imported item is listed in the match table with
its status and, when unmatched, why: nothing is dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pandas as pd

from acrb.analysis.frame import check_columns

#: The plain arm's name in the plan (the arm whose outputs the audit's rates count).
PLAIN_ARM = "none"
#: Columns of the match table.
MATCH_COLUMNS: tuple[str, ...] = ("item_id", "survey_model", "model", "prompt_id", "source_id",
                                  "race", "gender", "age", "status", "request_id",
                                  "paired_request_id", "note")
_REQUEST_COLUMNS = ("request_id", "model", "model_key", "prompt_id", "source_id", "race",
                    "gender", "age", "arm", "mode", "pair_of")


def _run_model(name: str, requests: pd.DataFrame, aliases: Mapping[str, str]
               ) -> tuple[str | None, str]:
    """The run's model for a survey model name, or None and why."""
    models = requests[["model", "model_key"]].drop_duplicates("model")
    if name in aliases:
        target = aliases[name]
        if target in set(models["model"]):
            return target, ""
        return None, (f"review.model_aliases maps {name!r} to {target!r}, which is not a "
                      f"model of this run ({sorted(models['model'])})")
    needle = name.lower()
    hits = sorted({str(m) for m, k in zip(models["model"], models["model_key"], strict=True)
                   if needle in str(m).lower() or needle in str(k).lower()})
    if len(hits) == 1:
        return hits[0], ""
    if not hits:
        return None, (f"no model of this run has {name!r} in its name or key "
                      f"({sorted(models['model'])}); declare it in review.model_aliases")
    return None, (f"several models of this run contain {name!r} ({hits}); declare which in "
                  "review.model_aliases")


def match_survey_items(items: pd.DataFrame, requests: pd.DataFrame,
                       aliases: Mapping[str, str] | None = None
                       ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(items, matches): ``items`` (:class:`acrb.records.ReviewItemRecord` rows) with every
    imported item (``request_id`` None) that matches one request of ``requests``
    (:class:`acrb.records.RequestRecord` rows) given its request ids and the run's model name;
    and one row per imported item (:data:`MATCH_COLUMNS`; ``status`` ``matched`` or
    ``unmatched`` with the reason in ``note``). See the module docstring for the rule."""
    aliases = dict(aliases or {})
    imported = items["request_id"].isna()
    if not imported.any():
        return items, pd.DataFrame(columns=list(MATCH_COLUMNS))
    check_columns(requests, list(_REQUEST_COLUMNS))
    plain = requests.loc[(requests["arm"] == PLAIN_ARM) & (requests["mode"] == "i2i")]
    feature = requests.loc[(requests["arm"] != PLAIN_ARM) & (requests["pair_of"] != "")]
    feature_of = dict(zip(feature["pair_of"], feature["request_id"], strict=True))
    items = items.copy()
    rows = []
    for index in items.index[imported]:
        item = items.loc[index]
        row = {"item_id": item["item_id"], "survey_model": item["model"], "model": "",
               "prompt_id": item["prompt_id"], "source_id": item["source_id"],
               "race": item["race"], "gender": item["gender"], "age": item["age"],
               "status": "unmatched", "request_id": "", "paired_request_id": "", "note": ""}
        model, why = _run_model(str(item["model"]), requests, aliases) if len(requests) \
            else (None, "the run has no requests (data/plan/requests.parquet)")
        if model is None:
            rows.append({**row, "note": why})
            continue
        row["model"] = model
        found = plain.loc[(plain["model"] == model) & (plain["prompt_id"] == item["prompt_id"])]
        by_source = found.loc[found["source_id"] == item["source_id"]]
        how = "source_id"
        if by_source.empty:
            how = "source cell"
            by_source = found.loc[(found["race"] == item["race"])
                                  & (found["gender"] == item["gender"])
                                  & (found["age"] == item["age"])]
        if len(by_source) != 1:
            cell = f"{item['race']}_{item['gender']}_{item['age']}"
            rows.append({**row, "note": (
                f"no plain-arm request of {model} with prompt {item['prompt_id']!r} and source "
                f"cell {cell}" if by_source.empty else
                f"{len(by_source)} plain-arm requests of {model} with prompt "
                f"{item['prompt_id']!r} and source cell {cell} (seeds or portraits): ambiguous")})
            continue
        request_id = str(by_source["request_id"].iloc[0])
        has_feature = item["paired_output_path"] is not None \
            and not pd.isna(item["paired_output_path"])
        paired = feature_of.get(request_id) if has_feature else None
        metadata = json.loads(item["metadata"]) if item.get("metadata") else {}
        metadata.update({"survey_model": str(item["model"]), "matched_by": how})
        items.loc[index, ["request_id", "paired_request_id", "model", "metadata"]] = [
            request_id, paired, model, json.dumps(metadata, sort_keys=True,
                                                  separators=(",", ":"))]
        rows.append({**row, "status": "matched", "request_id": request_id,
                     "paired_request_id": paired or "",
                     "note": "its feature-prompt output was rated but the run has no "
                     "feature-arm request for it" if has_feature and paired is None else ""})
    return items, pd.DataFrame(rows, columns=list(MATCH_COLUMNS))


__all__ = ["MATCH_COLUMNS", "match_survey_items"]
