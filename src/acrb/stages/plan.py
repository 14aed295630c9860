"""Stage `plan`: requests = sources x prompts x models x seeds x arms.

Editors (I2I) get every source with every I2I prompt of ``plan.prompt_sets``; an instruction
that shows several portraits gets its partners by ``plan.pairing``, and an editor that takes
fewer images stops the plan with the reason. Generators (T2I) get the T2I prompts of
``plan.t2i_prompt_sets`` with no source.

With the arm ``feature`` in ``plan.arms``, each editor also gets, for the (source, prompt, seed)
cells of ``plan.feature`` (all, or a stratified sample: the same cells for every editor), the
plain request again with the source's feature prompt p_feat (``features`` stage) and the
instruction: prompt text ``p_feat + " " + p`` by default (``plan.feature.template``; the seed study
appended it, ``p + ". " + p_feat``), everything else identical, ``pair_of`` naming the plain
request it repeats. With ``plan.feature.across_models`` the cells are drawn once over all editors
(the study's 500 in total) instead of the same cells for each.

Each request is named by :func:`acrb.records.request_id_for`, a hash of everything that changes
the output, so a request that was already generated keeps its id (and its finished output) when
unrelated params change. Writes data/plan/requests.parquet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import product
from pathlib import Path
from typing import Any, cast

import pandas as pd

from acrb import layout
from acrb.config import FEATURE_TEMPLATE, PairingParams
from acrb.errors import ConfigError
from acrb.prompts.winobias import WinoBiasPlan, plan_winobias
from acrb.records import (
    Congruence,
    FeaturePromptRecord,
    PromptRecord,
    RequestRecord,
    SourceRecord,
    dump_settings,
    read_table,
    request_id_for,
    write_table,
)
from acrb.stages.context import StageContext
from acrb.storage import atomic_write_json, canonical_json
from acrb.stratified import stratified_draw
from acrb.tracking import stage_run


@dataclass(frozen=True)
class TimeEstimate:
    """What one model's planned requests should cost in accelerator time."""

    model: str
    requests: int
    simulated: bool
    seconds_per_request: float | None = None
    hardware: str = ""
    source: str = ""

    @property
    def gpu_hours(self) -> float | None:
        if self.simulated or self.seconds_per_request is None:
            return None
        return self.requests * self.seconds_per_request / 3600

    def describe(self) -> str:
        if self.simulated:
            return f"{self.model}: {self.requests} requests (simulated: no GPU time)"
        if self.gpu_hours is None:
            return (f"{self.model}: {self.requests} requests (no recorded seconds per request: "
                    f"set models.{self.model}.seconds_per_request to estimate GPU-hours)")
        return (f"{self.model}: {self.requests} requests x {self.seconds_per_request:g} s "
                f"= {self.gpu_hours:.1f} GPU-hours on {self.hardware} ({self.source})")


@dataclass(frozen=True)
class PlanSummary:
    count: int
    per_model: dict[str, int]
    table: Path
    estimates: list[TimeEstimate] = field(default_factory=list)

    @property
    def gpu_hours(self) -> float | None:
        """Total estimated GPU-hours; None if a real model has no recorded figure."""
        hours = [e.gpu_hours for e in self.estimates if not e.simulated]
        if any(h is None for h in hours):
            return None
        return float(sum(h for h in hours if h is not None))
    #: Editors left out of the WinoBias experiment (model -> reason).
    winobias_skipped: dict[str, str] = field(default_factory=dict)


def time_estimates(ctx: StageContext, per_model: dict[str, int]) -> list[TimeEstimate]:
    """Each model's planned requests and their GPU time: from the params' own measurement
    (``models.<name>.seconds_per_request``), else the adapter's recorded figure."""
    estimates = []
    for name, entry in ctx.params.models.items():
        model_class = entry.model_class()
        requests = per_model.get(name, 0)
        if model_class.simulated:
            estimates.append(TimeEstimate(name, requests, simulated=True))
        elif entry.seconds_per_request is not None:
            estimates.append(TimeEstimate(name, requests, False, entry.seconds_per_request,
                                          "your hardware", "models."
                                          f"{name}.seconds_per_request in params"))
        elif model_class.recorded_seconds is not None:
            recorded = model_class.recorded_seconds
            estimates.append(TimeEstimate(name, requests, False, recorded.seconds,
                                          recorded.hardware, recorded.source))
        else:
            estimates.append(TimeEstimate(name, requests, simulated=False))
    return estimates


def congruence(congruent_with: str, incongruent_with: str, source: dict[str, str]
               ) -> Congruence:
    """congruent if the source belongs to a group the prompt is stereotypically linked with
    (``congruent_with``), incongruent if it belongs to one the stereotype sets against it
    (``incongruent_with``), else neutral. Both lists are data (`;`-joined ``race:Indian``);
    congruent wins when a source matches both (as a Male Black source does with congruent
    ``gender:Male`` and incongruent ``race:White``'s others)."""
    def matches(selectors: str) -> bool:
        return any(source.get(dimension) == group
                   for dimension, _, group in (s.partition(":") for s in selectors.split(";")
                                               if s))

    if matches(congruent_with):
        return "congruent"
    if matches(incongruent_with):
        return "incongruent"
    return "neutral"


def partners(source: dict[str, Any], sources: list[dict[str, Any]], count: int,
             pairing: PairingParams) -> list[dict[str, Any]] | None:
    """The further portraits shown with ``source`` by an instruction of ``count`` portraits.

    ``source`` must belong to one of ``pairing.groups`` on ``pairing.dimension``; the partners
    are, for each other group in order, the first source (by id) of that group that shares the
    source's value on every dimension of ``pairing.match``. None when ``source`` is in no
    group, or a partner is missing (the request is then not planned).
    """
    own = source[pairing.dimension]
    if own not in pairing.groups:
        return None
    others = [group for group in pairing.groups if group != own][: count - 1]
    if len(others) < count - 1:
        return None
    chosen = []
    for group in others:
        matches = sorted(
            (candidate for candidate in sources
             if candidate[pairing.dimension] == group
             and all(candidate[d] == source[d] for d in pairing.match)),
            key=lambda candidate: str(candidate["source_id"]))
        if not matches:
            return None
        chosen.append(matches[0])
    return chosen


def _selected(prompts: pd.DataFrame, mode: str, prompt_sets: Sequence[str]) -> pd.DataFrame:
    return prompts[(prompts["mode"] == mode) & prompts["prompt_set"].isin(prompt_sets)]


def build_requests(sources: pd.DataFrame, prompts: pd.DataFrame, ctx: StageContext
                   ) -> list[RequestRecord]:
    """Every planned request: for an editor, sources x I2I prompts x seeds x arms (an
    instruction of several portraits takes its partners by ``plan.pairing``); for a generator,
    T2I prompts x seeds x arms."""
    plan = ctx.params.plan
    source_rows = cast(list[dict[str, Any]], sources.to_dict(orient="records"))
    feature_cells_ = feature_cells(sources, prompts, ctx)
    feature_texts = feature_prompts(ctx, sources, {cell[1] for cell in feature_cells_})
    records = []
    for name, entry in ctx.params.models.items():
        model_class = entry.model_class()
        config = entry.typed_config()
        if model_class.task == "t2i":
            selected = _selected(prompts, "t2i", plan.t2i_prompt_sets)
            if selected.empty:
                raise ConfigError(
                    f"model '{name}' generates from text, but there are no T2I prompts in the "
                    f"prompt sets {plan.t2i_prompt_sets}",
                    "add `t2i` to prompts.synthesis.modes (the ACRB prompts), or remove the "
                    "generator from models",
                )
        else:
            selected = _selected(prompts, "i2i", plan.prompt_sets)
            if selected.empty:
                raise ConfigError(
                    f"no I2I prompts in the prompt sets {plan.prompt_sets}",
                    "for the `acrb` set, add `i2i` to prompts.synthesis.modes, or use "
                    "plan.prompt_sets: [catalog]",
                )
            for count in sorted(set(selected["portraits"])):
                model_class.check_source_count(name, config, int(count))
        model_class.check_categories(name, config, set(selected["category"]))
        revision = entry.resolved_revision()
        settings = dump_settings(entry.settings)
        output_config = model_class.id_config(config, "none", "audit")
        feature_config = model_class.id_config(config, "feature", "audit")
        prompt_rows = cast(list[dict[str, Any]], selected.to_dict(orient="records"))
        # Source-major order, as the plan has always been written: resampling with a fixed seed
        # then draws the same rows on a rerun.
        sources_shown: list[dict[str, Any] | None] = (
            [None] if model_class.task == "t2i" else list(source_rows))
        for source, prompt, seed in product(sources_shown, prompt_rows, plan.seeds):
            extra: list[dict[str, Any]] | None = []
            if source is not None and int(prompt["portraits"]) > 1:
                extra = partners(source, source_rows, int(prompt["portraits"]), plan.pairing)
            if extra is None:
                continue
            plain = _request(name, entry.key, revision, entry.settings, settings, prompt,
                             source, extra, seed, "none", output_config)
            records.append(plain)
            # The feature arm repeats the plain request with p_feat and the instruction (by
            # plan.feature.template) on its drawn cells; never for a generator (no portrait).
            cell = (name, source["source_id"], prompt["prompt_id"], seed) if source else None
            if cell in feature_cells_:
                records.append(_request(
                    name, entry.key, revision, entry.settings, settings, prompt, source, extra,
                    seed, "feature", feature_config,
                    feature_prompt=feature_texts[str(cast(dict[str, Any], source)["source_id"])],
                    pair_of=plain.request_id, template=plan.feature.template))
    return records


def feature_cells(sources: pd.DataFrame, prompts: pd.DataFrame, ctx: StageContext
                  ) -> set[tuple[str, str, str, int]]:
    """The (model, source_id, prompt_id, seed) cases the feature arm repeats: of the
    image-editing audit cells (one portrait, prompts of ``plan.prompt_sets``), all of them or a
    stratified sample of ``plan.feature.sample`` (:func:`acrb.stratified.stratified_draw`,
    strata ``plan.feature.strata``). The same (source, prompt, seed) cells for every editor,
    or with ``plan.feature.across_models`` one draw over every editor's cases together (the
    seed study's 500 in total, stratified by model and prompt). Empty when the plan has no
    feature arm or no editor."""
    plan = ctx.params.plan
    editors = [name for name, entry in ctx.params.models.items()
               if entry.model_class().task != "t2i"]
    if "feature" not in plan.arms or not editors:
        return set()
    selected = _selected(prompts, "i2i", plan.prompt_sets)
    selected = selected[(selected["portraits"] == 1) & (selected["experiment"] == "audit")]
    cells = (sources[["source_id", "race", "gender", "age"]]
             .merge(selected[["prompt_id", "category"]], how="cross")
             .merge(pd.DataFrame({"seed": plan.seeds}), how="cross"))
    if cells.empty:
        return set()
    cells = cells.assign(prompt=cells["prompt_id"])
    if plan.feature.across_models:
        cases = cells.merge(pd.DataFrame({"model": editors}), how="cross")
        drawn = stratified_draw(cases, plan.feature.sample, plan.feature.strata,
                                plan.feature.seed, key=["model", "source_id", "prompt_id", "seed"],
                                balance_last=True)
        return set(zip(drawn["model"].astype(str), drawn["source_id"].astype(str),
                       drawn["prompt_id"].astype(str), drawn["seed"].astype(int), strict=True))
    drawn = stratified_draw(cells, plan.feature.sample, plan.feature.strata, plan.feature.seed,
                            key=["source_id", "prompt_id", "seed"])
    return {(model, *cell) for model in editors
            for cell in zip(drawn["source_id"].astype(str), drawn["prompt_id"].astype(str),
                            drawn["seed"].astype(int), strict=True)}


def feature_prompts(ctx: StageContext, sources: pd.DataFrame, source_ids: set[str]
                    ) -> dict[str, str]:
    """p_feat of each source in ``source_ids``, from the ``features`` stage's table.

    A missing table, a source with no feature prompt, or one whose prompt describes another
    image (its sha256 differs from the source's) stops the plan with the sources named.
    """
    if not source_ids:
        return {}
    path = ctx.path(layout.FEATURES_TABLE)
    fix = ("run the `features` stage first (`dvc repro features`, or `acrb features`), with "
           "`features.describer` set to describe these portraits (or import a published "
           "mapping that covers them); or drop `feature` from plan.arms")
    if not path.exists():
        raise ConfigError(f"plan.arms has `feature`, but there are no feature prompts: {path} "
                          "does not exist", fix)
    table = read_table(path, FeaturePromptRecord)
    texts = dict(zip(table["source_id"].astype(str), table["text"].astype(str), strict=True))
    described = dict(zip(table["source_id"].astype(str), table["source_sha256"].astype(str),
                         strict=True))
    shas = dict(zip(sources["source_id"].astype(str), sources["sha256"].astype(str),
                    strict=True))
    missing = sorted(s for s in source_ids if not texts.get(s, "").strip())
    stale = sorted(s for s in source_ids if s not in missing and described[s]
                   and described[s] != shas[s])
    for problem, names in (("have no feature prompt", missing),
                           ("have a feature prompt of another image (sha256 differs)", stale)):
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5
                                            else "")
            raise ConfigError(f"the feature arm needs a feature prompt per source, but "
                              f"{len(names)} source(s) in {path} {problem}: {shown}", fix)
    return {s: texts[s] for s in source_ids}


def _request(name: str, key: str, revision: str, settings: dict[str, Any], settings_json: str,
             prompt: dict[str, Any], source: dict[str, Any] | None,
             extra: list[dict[str, Any]], seed: int, arm: str,
             output_config: dict[str, Any], *, feature_prompt: str = "",
             pair_of: str = "", template: str = FEATURE_TEMPLATE) -> RequestRecord:
    extra_shas = [other["sha256"] for other in extra]
    prompt_text = (template.format(feature=feature_prompt, instruction=prompt["text"])
                   if feature_prompt else prompt["text"])
    request_id = request_id_for(
        model_key=key, model_revision=revision, settings=settings,
        source_sha256=source["sha256"] if source else "", prompt_text=prompt_text,
        seed=seed, arm=arm, extra_source_sha256s=extra_shas, output_config=output_config,
    )
    extra_sources = canonical_json(
        [{"source_id": o["source_id"], "path": o["path"], "sha256": o["sha256"]} for o in extra]
    ) if extra else ""
    blank = {"source_id": "", "path": "", "sha256": "", "race": "", "gender": "", "age": ""}
    shown = source or blank
    return RequestRecord(
        request_id=request_id, model=name, model_key=key, model_revision=revision,
        settings=settings_json, source_id=shown["source_id"], source_path=shown["path"],
        source_sha256=shown["sha256"], prompt_id=prompt["prompt_id"],
        prompt_text=prompt_text, category=prompt["category"], attribute=prompt["attribute"],
        congruence=(congruence(prompt["congruent_with"], prompt["incongruent_with"], source)
                    if source else "neutral"),
        seed=seed, arm=arm, race=shown["race"], gender=shown["gender"], age=shown["age"],
        mode="t2i" if source is None else "i2i", base_id=prompt["base_id"],
        extra_sources=extra_sources, feature_prompt=feature_prompt, pair_of=pair_of,
    )


def run(ctx: StageContext) -> PlanSummary:
    ctx.params.check_model_configs()  # the first stage that uses models: fail before any work
    sources = read_table(ctx.path(layout.SOURCES_TABLE), SourceRecord)
    prompts = read_table(ctx.path(layout.PROMPTS_TABLE), PromptRecord)
    with stage_run("plan", profile=ctx.profile, params_hash=ctx.params_hash,
                   params=ctx.params) as tracker:
        winobias = plan_winobias(sources, ctx)
        records = build_requests(sources, prompts, ctx) + winobias.requests
        table = ctx.path(layout.PLAN_TABLE)
        write_table(table, records, RequestRecord)
        per_model = dict(Counter(r.model for r in records))
        write_winobias_plan(winobias, ctx)
        atomic_write_json(ctx.path(layout.PLAN_STOPPING), {"rule": ctx.params.stopping_rule()})
        summary = PlanSummary(count=len(records), per_model=per_model, table=table,
                              estimates=time_estimates(ctx, per_model),
                              winobias_skipped=winobias.skipped)
        atomic_write_json(ctx.path(layout.PLAN_SUMMARY), {
            "requests": len(records), "per_model": per_model, "gpu_hours": summary.gpu_hours,
            "winobias_role_disagreements": winobias.role_disagreements,
            "estimates": [{**asdict(e), "gpu_hours": e.gpu_hours} for e in summary.estimates]})
        tracker.log_dataset(table, "plan")  # plan.* params: logged by stage_run
        tracker.log_metrics({"plan.requests": len(records),
                             **{f"plan.requests.{m}": n for m, n in per_model.items()},
                             **({"plan.gpu_hours": summary.gpu_hours}
                                if summary.gpu_hours is not None else {})})
    return summary


def write_winobias_plan(part: WinoBiasPlan, ctx: StageContext) -> None:
    """Write the WinoBias items and the editors left out (removed without the experiment)."""
    from acrb.prompts.winobias import ITEMS_TABLE, SKIPPED_TABLE, write_skipped
    from acrb.records import WinoBiasItemRecord

    if ctx.params.winobias is None:
        ctx.path(ITEMS_TABLE).unlink(missing_ok=True)
        ctx.path(SKIPPED_TABLE).unlink(missing_ok=True)
        return
    write_table(ctx.path(ITEMS_TABLE), part.items, WinoBiasItemRecord)
    write_skipped(ctx.path(SKIPPED_TABLE), part.skipped)
