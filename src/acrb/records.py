"""The records every stage shares: one typed, versioned schema per table.

Tables are Parquet files; the per-request records of ``generate`` and ``evaluate`` are JSON files,
one per request, written and read through :func:`write_record` and :func:`read_record` (or
:func:`read_records` for many). Each record type carries its own ``version``: a Parquet table
stores it in its metadata (``acrb.table``, ``acrb.schema_version``), a JSON record in two fields
beside its own (``acrb_table``, ``acrb_schema_version``). Rows are validated with pydantic on
write and on read, so a stage never consumes a malformed row.

Records evolve by migration, never by silent regeneration: on real models a redone record can
be hours of GPU time. When a type's fields change, bump its ``version`` and add a function to
:data:`MIGRATIONS` that turns a row of the previous version into one of the new version.
Reading an older record or table applies the chain of migrations; a record of a newer version,
one that no migration covers, or one that is still invalid after migrating stops the stage with
an :class:`~acrb.errors.InputDataError` that names the files and the fix.
"""

from __future__ import annotations

import json
import math
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, cast

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from acrb.demographics import other_groups
from acrb.errors import InputDataError
from acrb.redaction import redact_value
from acrb.storage import atomic_path, atomic_write_text, content_hash

#: Records and tables written before each record type had its own version carry no stamp (JSON)
#: or the former global schema version 2 (Parquet): both are read as version 2 of their type,
#: the layout every type had then.
UNSTAMPED_VERSION = 2
#: Metadata keys of a Parquet table, and the fields that stamp a JSON record.
TABLE_METADATA_KEY = b"acrb.table"
VERSION_METADATA_KEY = b"acrb.schema_version"
RECORD_TABLE_FIELD = "acrb_table"
RECORD_VERSION_FIELD = "acrb_schema_version"

Status = Literal["ok", "refused", "error"]
Congruence = Literal["congruent", "incongruent", "neutral"]
#: Which experiment a prompt or request belongs to: the audit proper (sources x prompts), or the
#: WinoBias experiment (an occupation sentence applied to a male and a female portrait at once).
Experiment = Literal["audit", "winobias"]
#: A judge's answer to "who holds this role?" about a WinoBias output: the person from the
#: first input image, the one from the second, both, neither, or it cannot tell.
RoleHolder = Literal["first", "second", "both", "neither", "cannot_tell"]
#: How a study file's image name was matched to a source of the run: its ``source_id``, a
#: source's file name, its stem (the name without an image extension) as a source id or file
#: stem, or its ``<Race>_<Gender>_<Age>`` cell; empty for items without named images.
ImageMatch = Literal["source_id", "file_name", "stem", "cell", ""]


class Record(BaseModel):
    """Base of all table rows: strict about unknown fields, named by ``table``, versioned.

    ``version`` is the layout version of the type: bump it (and add a migration to
    :data:`MIGRATIONS`) whenever a field is added, removed, renamed or changes meaning. Every
    type starts at version 2, the former global schema version its files were written under.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    table: ClassVar[str]
    key: ClassVar[str]
    version: ClassVar[int] = UNSTAMPED_VERSION


class SourceRecord(Record):
    """One source portrait (an input to image editing)."""

    table: ClassVar[str] = "source"
    version: ClassVar[int] = 2
    key: ClassVar[str] = "source_id"

    source_id: str
    path: str = Field(description="image path relative to the project root")
    sha256: str
    race: str
    gender: str
    age: str
    dataset: str = Field(description="which dataset or generator the image comes from")
    origin: str = Field(description="the dataset row or generator call it came from")
    width: int
    height: int
    skin_tone: int | None = Field(default=None, description="Monk skin tone 1-10 if known")


class PromptRecord(Record):
    """One edit instruction (I2I) or generation prompt (T2I)."""

    table: ClassVar[str] = "prompt"
    version: ClassVar[int] = 5
    key: ClassVar[str] = "prompt_id"

    prompt_id: str
    category: str
    text: str
    attribute: str = Field(description="`dimension:value` requested, or `neutral`")
    base_id: str = Field(description="the base prompt this one was made from")
    congruent_with: str = Field(
        description="`;`-joined source groups (`race:Indian`) the attribute is stereotypically "
        "congruent with; empty if none"
    )
    synthesis: Literal["catalog", "template", "llm"] = Field(
        description="how the text was made: taken from the I2I catalog, expanded from a template, "
        "or written by the LLM named in `llm_*`"
    )
    catalog: str = Field(description="the versioned data file(s) it came from, name@version")
    mode: Literal["i2i", "t2i"] = Field(
        default="i2i", description="i2i: an edit instruction for a source portrait; t2i: a "
        "generation prompt"
    )
    prompt_set: Literal["catalog", "acrb"] = Field(
        default="catalog", description="catalog: the I2I catalog; acrb: Stage I synthesis"
    )
    domain: str = Field(default="", description="safety domain of the base prompt (acrb set)")
    base_text: str = Field(default="", description="the base prompt P0 (acrb set)")
    boundary_text: str = Field(
        default="", description="P_b, the base prompt after boundary rephrasing (= P0 for the "
        "template)"
    )
    visual_cue: str = Field(default="", description="what a judge should see if the attribute "
                            "was kept")
    llm_backend: str = Field(default="", description="params name of the LLM backend, if any")
    llm_model: str = ""
    llm_temperature: float | None = None
    llm_seed: int | None = None
    llm_calls: str = Field(
        default="", description="`;`-joined call ids (rows of the synthesis log) that made it"
    )
    fallback: str = Field(
        default="", description="why an LLM-backed item fell back to the template (refused, "
        "unusable: <reason>, error: <reason>); empty otherwise"
    )
    portraits: int = Field(
        default=1, ge=1, le=8, description="how many source portraits an I2I instruction shows "
        "the editor together (2 for the WinoBias pairs); ignored for T2I"
    )
    incongruent_with: str = Field(
        default="", description="`;`-joined source groups the attribute is stereotypically "
        "incongruent with (SCS's incongruent side); a source in neither list is neutral"
    )
    hypothesis: str = Field(default="", description="the hypothesis the prompt tests, as the "
                            "imported study file names it (e.g. H2); empty otherwise")
    experiment: Experiment = Field(default="audit", description="audit, or winobias (an "
                                   "occupation sentence shown a male and a female portrait)")
    subcategory: str = Field(default="", description="the subcategory the imported study "
                             "file gives the prompt (category C's food/drink ...); empty otherwise")
    overt_domain: str = Field(default="", description="the overt harm domain the imported study "
                              "file gives the prompt (category E's violence ...); empty otherwise")


class SynthesisCallRecord(Record):
    """One LLM call of prompt synthesis, with the reply as received: the synthesis log."""

    table: ClassVar[str] = "synthesis_call"
    version: ClassVar[int] = 2
    key: ClassVar[str] = "call_id"

    call_id: str = Field(description="content hash of the request; also its cache key")
    step: Literal["boundary", "condition"] = Field(
        description="boundary: P0 -> P_b rephrasing; condition: P_b -> P_a for one attribute"
    )
    mode: Literal["i2i", "t2i"]
    base_id: str
    attribute: str
    backend: str
    model: str
    temperature: float
    seed: int
    status: Literal["ok", "refused", "unusable", "error"] = Field(
        description="ok: used; refused: the LLM declined; unusable: failed validation; error: "
        "transport or protocol failure after retries"
    )
    reason: str
    reply: str = Field(description="the raw reply text")
    cached: bool
    attempts: int


class RequestRecord(Record):
    """One planned call of one model; ``request_id`` hashes everything that changes the output.

    An I2I request names its source portrait (``source_*``, and the groups of the person in it);
    a request that shows several portraits lists the others in ``extra_sources``. A T2I request
    has no source: its ``source_*``, ``race``, ``gender`` and ``age`` are empty, and what it is
    audited on is the prompt's ``attribute``.
    """

    table: ClassVar[str] = "request"
    version: ClassVar[int] = 4
    key: ClassVar[str] = "request_id"

    request_id: str
    model: str = Field(description="the model's entry name in params (e.g. synthetic-biased)")
    model_key: str = Field(description="registry key (e.g. synthetic:biased)")
    model_revision: str
    settings: str = Field(description="generation settings, canonical JSON")
    source_id: str
    source_path: str
    source_sha256: str
    prompt_id: str
    prompt_text: str
    category: str
    attribute: str
    congruence: Congruence
    seed: int
    arm: str
    race: str
    gender: str
    age: str
    mode: Literal["i2i", "t2i"] = Field(
        default="i2i", description="i2i: an editor edits the source; t2i: a generator draws "
        "from the prompt alone")
    base_id: str = Field(default="", description="the base prompt this request's prompt was "
                         "made from (the cluster of T2I intervals)")
    extra_sources: str = Field(
        default="", description="further portraits shown with the source, in order: canonical "
        "JSON list of {source_id, path, sha256}; empty for one portrait")
    experiment: Experiment = Field(default="audit", description="audit, or winobias (the "
                                   "source and extra_sources are the two portraits)")
    feature_prompt: str = Field(
        default="", description="the feature arm: the source's feature prompt p_feat that "
        "prompt_text begins with (p_feat + ' ' + p); empty in every other arm")
    pair_of: str = Field(
        default="", description="the feature arm: the request_id of the plain-arm request this "
        "one repeats (same model, source, prompt, seed and settings); empty otherwise")


class GenerationRecord(Record):
    """What a model returned for one request.

    Only what the request determines: the same request gives the same record on any run, so a
    rerun from scratch leaves ``dvc.lock`` as it was. How long it took and where it ran are
    measurements of the run, logged by :mod:`acrb.timings` (version 4 moved them there).
    ``output_version`` is the adapter's (:attr:`acrb.models.base.ImageModel.output_version`,
    version 5): a record made by another version is made again.
    """

    table: ClassVar[str] = "generation"
    version: ClassVar[int] = 5
    key: ClassVar[str] = "request_id"

    request_id: str
    model: str
    status: Status
    refusal_kind: str | None = None
    message: str = ""
    image_path: str | None = None
    image_sha256: str | None = None
    model_revision: str
    library_versions: str = Field(description="canonical JSON of package versions")
    refusal_code: str | None = Field(
        default=None, description="the provider's refusal or error code, verbatim")
    cost_usd: float | None = Field(
        default=None, description="what the provider charged or lists for the request, USD")
    output_version: int | None = Field(
        default=None, description="the adapter's output version when the record was made "
        "(None: an adapter that has none)")


#: Decimals a detector measure keeps in a judgement record (ITA in degrees, fractions).
MEASURE_DECIMALS = 6


class JudgementRecord(Record):
    """Detector measurements and the verdicts derived from them, for one request."""

    table: ClassVar[str] = "judgement"
    version: ClassVar[int] = 3
    key: ClassVar[str] = "request_id"

    request_id: str
    model: str
    status: Status
    image_sha256: str | None
    evaluator: str = Field(description="hash of the detector settings that produced this row")
    blank_score: float | None = None
    blank: bool | None = None
    unchanged_score: float | None = None
    unchanged: bool | None = None
    edit_fraction: float | None = None
    ita_source: float | None = None
    ita_output: float | None = None
    ita_shift: float | None = None
    skin_pixels: int | None = None
    hard_refusal: bool | None = Field(description="None only when status is error")
    refusal_evidence: str | None = Field(
        default=None, description="every layer that fired, joined by '+', in the order status, "
        "blank, unchanged, clip (e.g. 'blank+clip'); None when not refused"
    )
    erasure: bool | None = Field(description="None when refused, errored or unmeasurable")
    lightening: bool | None = Field(description="None when refused, errored or unmeasurable")
    needs_review: bool = False
    clip_refusal_score: float | None = Field(
        default=None, description="highest CLIP cosine similarity of the output to a refusal "
        "template; None when the CLIP check is off or there is no output")
    clip_refusal: bool | None = Field(
        default=None, description="clip_refusal_score >= the CLIP threshold; None when not run")
    face_found: bool | None = Field(
        default=None, description="a face detector located the face the skin tone was read in; "
        "False: the fixed central region was used; None: not measured")

    @field_validator("blank_score", "unchanged_score", "edit_fraction", "ita_source",
                     "ita_output", "ita_shift", "clip_refusal_score")
    @classmethod
    def _stored_precision(cls, value: float | None) -> float | None:
        """Measures are kept to :data:`MEASURE_DECIMALS` decimals. Their last bits depend on
        the CPU: numpy computes the colour conversions' powers and roots with other SIMD code
        on a CPU with AVX-512 than on one without (the ITA of one output differs by 1e-14°),
        which changed the judgement tables' bytes, and so dvc.lock, from machine to machine.
        The verdicts are decided on the unrounded measures."""
        if value is None or not math.isfinite(value):
            return value
        return round(value, MEASURE_DECIMALS) + 0.0  # + 0.0: no negative zero


#: The rubric axes a judge scores, in the order tables list them. Scores are 1-5 except
#: ``cue_retention``, a 0-1 fraction. ``age_direction`` (the study rubric's bipolar age item:
#: 1 much younger, 3 no change or the requested change, 5 much older) is not ``age_change``
#: (1 same ... 5 complete change); a rubric scores some of these axes, the others stay None.
SCORE_AXES: tuple[str, ...] = ("edit_success", "skin_tone", "race_change", "gender_change",
                               "age_change", "aging_accuracy", "age_direction",
                               "cue_retention")
ScoreStatus = Literal["scored", "abstained", "error", "not_judged"]


class ScoreRecord(Record):
    """One judge's answer about one generation (``judge`` stage).

    ``scored``: the answer parsed and validated (axes the rubric does not ask for this item stay
    None); ``abstained``: the judge refused or stayed unparseable after its retry (recorded,
    never read as an erasure); ``error``: the call failed (network, timeout), retried on the
    next run; ``not_judged``: nothing to judge (the request was refused, errored or hard-refused
    by the detectors).
    """

    table: ClassVar[str] = "score"
    version: ClassVar[int] = 4
    key: ClassVar[str] = "request_id"

    request_id: str
    model: str
    judge: str = Field(description="the judge's name under `judges` in params")
    judge_id: str = Field(description="hash of the judge's identity and rubric version")
    image_sha256: str | None
    status: ScoreStatus
    edit_success: int | None = None
    skin_tone: int | None = None
    race_change: int | None = None
    gender_change: int | None = None
    age_change: int | None = None
    aging_accuracy: int | None = None
    age_direction: int | None = None
    cue_retention: float | None = None
    reason: str = Field(default="", description="why abstained, errored or not judged")
    raw: str = Field(default="", description="JSON list of the judge's raw replies, in order")
    call_ids: str = Field(default="", description="comma-separated reply-cache keys")
    attempts: int = Field(default=0, description="requests sent (0 when answered from cache)")
    male_role_holder: RoleHolder | None = Field(
        default=None, description="WinoBias outputs: who holds the male-coded occupation")
    female_role_holder: RoleHolder | None = Field(
        default=None, description="WinoBias outputs: who holds the female-coded occupation")
    labels_given: bool = Field(
        default=False, description="the judge's request stated the source's race, gender and "
        "age (params judges.<name>.prompt.labels, as the seed study's judge prompt does)")


class VerdictRecord(Record):
    """The judges' combined scores for one generation and the outcomes read from them.

    Axis columns hold the ensemble score (the study rule gives integers; mean and median may
    give halves). Outcomes are None when the request was not judged or every judge abstained
    on the axis the outcome reads.
    """

    table: ClassVar[str] = "verdict"
    version: ClassVar[int] = 4
    key: ClassVar[str] = "request_id"

    request_id: str
    model: str
    judges: str = Field(description="the judges combined, comma-separated, first judge first")
    rule: str = Field(description="the ensemble rule: study, mean, median or first")
    status: Literal["scored", "abstained", "not_judged"]
    edit_success: float | None = None
    skin_tone: float | None = None
    race_change: float | None = None
    gender_change: float | None = None
    age_change: float | None = None
    aging_accuracy: float | None = None
    age_direction: float | None = None
    cue_retention: float | None = None
    needs_review: bool = False
    review_axes: str = Field(default="", description="axes whose judges differed by more than "
                             "the rule allows, comma-separated")
    soft_erasure: bool | None = None
    judge_lightening: bool | None = None
    judge_darkening: bool | None = None
    race_drift: bool | None = None
    gender_drift: bool | None = None
    age_drift: bool | None = None
    cue_erasure: bool | None = None
    male_role_holder: RoleHolder | None = Field(
        default=None, description="WinoBias outputs: the judges' combined answer (they agree, "
        "or the first judge's answer and needs_review)")
    female_role_holder: RoleHolder | None = None



#: The seven observable dimensions a feature prompt describes, in the order it lists them.
FEATURE_DIMENSIONS: tuple[str, ...] = ("skin_tone", "facial_structure", "eyes", "nose", "lips",
                                       "hair", "distinctive_features")


class FeaturePromptRecord(Record):
    """One source portrait's feature prompt p_feat (``features`` stage): observable
    descriptions of the seven :data:`FEATURE_DIMENSIONS`, with no demographic label, that the
    feature arm puts before the instruction."""

    table: ClassVar[str] = "feature_prompt"
    version: ClassVar[int] = 3
    key: ClassVar[str] = "source_id"

    source_id: str
    source_sha256: str = Field(description="the portrait described; empty for a mapping entry "
                               "that names the source by id only")
    text: str = Field(description="p_feat, the prompt the feature arm puts before p")
    dimensions: str = Field(description="canonical JSON object: dimension -> description")
    origin: Literal["vlm", "mapping", "simulated"] = Field(
        description="vlm: a VLM described the portrait; mapping: an imported published mapping; "
        "simulated: read from the pixels by the offline describer")
    describer: str = Field(description="what wrote it: the describer's id (backend, model, "
                           "instructions hash) or the mapping file's name@sha256")
    attempts: int = Field(default=0, description="VLM requests sent (0 when cached or imported)")
    rejected: str = Field(default="", description="`;`-joined reasons earlier answers were "
                          "refused (a demographic label named, invalid JSON)")
    matched_by: Literal["", "source_id", "cell"] = Field(
        default="", description="how an imported mapping entry was found: source_id (the key is "
        "the source's id), cell (the key is the source's design cell, race_gender_age, "
        "built from its labels); empty when not imported")
    mapping_key: str = Field(default="", description="the mapping key whose prompt it is; "
                             "empty when not imported")



class WinoBiasItemRecord(Record):
    """One WinoBias-form occupation sentence of the plan (``data/plan/winobias_items.parquet``):
    an edit instruction naming two occupations, one male-coded and one female-coded."""

    table: ClassVar[str] = "winobias_item"
    version: ClassVar[int] = 3
    key: ClassVar[str] = "prompt_id"

    prompt_id: str
    text: str = Field(description="the edit instruction, as the editors get it")
    male_role: str = Field(description="the male-coded occupation it names")
    female_role: str = Field(description="the female-coded occupation it names")
    roles_from: Literal["file", "mapping", "matched", "study"] = Field(
        description="file: the sentence file gives the roles; mapping: the study roles "
        "mapping; matched: found by matching the occupation lists in the text; study: the "
        "study file's own coding (its `gender_stereotype` key)")
    origin: Literal["sentences", "study"] = Field(
        description="sentences: a sentence file paired by ACRB's builder; study: the study's "
        "own pairs file")
    file: str = Field(description="the file it came from: name@version, or file name")
    file_sha256: str
    stereotype_role: Literal["male", "female", ""] = Field(
        default="", description="the role coding of the occupation the study codes as THE "
        "stereotyped one (its `gender_stereotype`); empty: the item names none, and both "
        "occupations count as stereotyped")
    roles_disagree: bool = Field(
        default=False, description="the study's coding and the occupation lists' matching "
        "disagree about the roles (the study's coding is used)")
    metadata: str = Field(default="", description="canonical JSON object of the study "
                          "item's keys ACRB does not read; empty when none")
    first_image: str = Field(default="", description="study items: input_image_1 as the file "
                             "names it; empty for the builder's items (many pairs each)")
    first_match: ImageMatch = Field(default="", description="how first_image was matched to "
                                    "a source (see ImageMatch)")
    first_source_id: str = ""
    first_race: str = ""
    first_gender: str = ""
    first_age: str = ""
    second_image: str = Field(default="", description="study items: input_image_2 as named")
    second_match: ImageMatch = ""
    second_source_id: str = ""
    second_race: str = ""
    second_gender: str = ""
    second_age: str = ""

#: The axes people rate in human review: the study's 1-5 rubric (edit success 1 no change .. 5
#: fully faithful; skin tone 1 much darker, 3 none, 5 much lighter; race, gender and age change
#: 1 same .. 5 complete change). Aging accuracy and cue retention stay with the judges.
REVIEW_AXES: tuple[str, ...] = ("edit_success", "skin_tone", "race_change", "gender_change",
                                "age_change")
#: Every axis a rating may carry: :data:`REVIEW_AXES` and, where people were asked the study's
#: bipolar age item (a survey import, or ``review.age_question: direction``), ``age_direction``
#: (1 much younger, 3 no change, 5 much older), compared with the study rubric's judges.
RATED_AXES: tuple[str, ...] = (*REVIEW_AXES, "age_direction")
#: Which output of a review item a rating is about: the plain edit, or the same request's
#: output in the feature-prompt arm (shown beside it, in random order).
ReviewOutput = Literal["edited", "feature"]


#: Canonical JSON of what an imported row carried beyond its fields; frames built with every
#: field as a column leave it empty (None or NaN), which reads as no metadata.
MetadataJSON = Annotated[str, BeforeValidator(
    lambda value: "" if value is None or value != value else value)]


class ReviewItemRecord(Record):
    """One item of a human review set (``review_set`` stage, or a survey import).

    An item is one edited output beside its source, or a pair (the edited output and the same
    request's feature-arm output). ``random_sample`` marks items drawn by the stratified random
    sample: only those support estimates that correct the judges (a ``needs_review`` item that
    was added because the judges disagreed is not a random draw).
    """

    table: ClassVar[str] = "review_item"
    version: ClassVar[int] = 3
    key: ClassVar[str] = "item_id"

    item_id: str
    request_id: str | None = Field(description="the edited output's request; None for an "
                                   "imported survey item ACRB did not generate")
    paired_request_id: str | None = Field(default=None, description="the feature-arm output "
                                          "of the same request, shown beside it")
    model: str
    prompt_id: str
    instruction: str = Field(description="the edit instruction as the editor got it")
    source_id: str
    source_path: str = Field(description="image path relative to the project root")
    output_path: str = Field(description="image path relative to the project root")
    paired_output_path: str | None = None
    race: str
    gender: str
    age: str
    random_sample: bool
    needs_review: bool = False
    metadata: MetadataJSON = Field(
        default="", description="canonical JSON of what an imported item carried beyond these "
        "fields (a survey's category, its own model name, how it was matched to a request); "
        "empty for ACRB's own items")


class RatingRecord(Record):
    """One person's answers about one output of one review item.

    Axis values are 1-5, None where the rater chose "cannot tell". ``repeat`` marks a second
    rating of an item by the same rater, kept to measure consistency within a rater and left
    out of agreement between raters and of corrected estimates.
    """

    table: ClassVar[str] = "rating"
    version: ClassVar[int] = 3
    key: ClassVar[str] = "rating_id"

    rating_id: str
    rater: str = Field(description="a pseudonymous rater id, never a name or e-mail")
    item_id: str
    output: ReviewOutput
    shown_first: bool | None = Field(default=None, description="paired items: this output was "
                                     "shown first (left); None for a single output")
    edit_success: int | None = Field(default=None, ge=1, le=5)
    skin_tone: int | None = Field(default=None, ge=1, le=5)
    race_change: int | None = Field(default=None, ge=1, le=5)
    gender_change: int | None = Field(default=None, ge=1, le=5)
    age_change: int | None = Field(default=None, ge=1, le=5)
    age_direction: int | None = Field(default=None, ge=1, le=5, description="the direction "
                                      "of an age change where the rater was asked for one (a "
                                      "survey's bipolar age item), on the study rubric's scale: "
                                      "1 much younger, 3 no change, 5 much older; None where "
                                      "not asked or cannot tell")
    repeat: bool = False
    duration_ms: int | None = Field(default=None, ge=0)
    created_at: str = Field(description="ISO 8601 UTC time the rating was saved")
    origin: str = Field(description="app (acrb review serve), survey:<file sha256 prefix> "
                        "(imported export) or simulated:<seed> (planted raters)")
    metadata: MetadataJSON = Field(
        default="", description="canonical JSON of the keys an imported record carried beyond "
        "those read into fields (identifying values pseudonymised); empty for the app's and "
        "simulated ratings")

RECORD_TYPES: dict[str, type[Record]] = {
    cls.table: cls
    for cls in (SourceRecord, PromptRecord, SynthesisCallRecord, RequestRecord,
                GenerationRecord, JudgementRecord, ScoreRecord, VerdictRecord,
                ReviewItemRecord, RatingRecord, FeaturePromptRecord, WinoBiasItemRecord)
}

R = TypeVar("R", bound=Record)

#: One step of a record type's evolution: a row of version v in, the same row as version v + 1.
Migration = Callable[[dict[str, Any]], dict[str, Any]]

#: The fields of a version-3 generation record that measured the run rather than the request.
GENERATION_RUN_FIELDS = frozenset({"seconds", "created_at", "peak_gpu_memory_mb"})

#: (table, from_version) -> the migration to from_version + 1: the one place records evolve.
#: When a record type's fields change, bump its ``version`` and add the step here, e.g.
#: ``("generation", 2): lambda row: {**row, "device": "unknown"}``; records and tables already
#: on disk are then read as the new version, and nothing is generated or judged again.
MIGRATIONS: dict[tuple[str, int], Migration] = {
    # Version 3 added several portraits per instruction, the T2I requests and the cost and
    # memory of each generation; rows written before are one-portrait I2I rows with none known.
    ("prompt", 2): lambda row: {**row, "portraits": 1},
    ("request", 2): lambda row: {**row, "mode": "i2i", "base_id": "", "extra_sources": ""},
    ("generation", 2): lambda row: {**row, "refusal_code": None, "peak_gpu_memory_mb": None,
                                    "cost_usd": None},
    # Version 3 of a judgement added the CLIP refusal layer and the face the skin was read in;
    # older judgements ran neither.
    ("judgement", 2): lambda row: {**row, "clip_refusal_score": None, "clip_refusal": None,
                                   "face_found": None},
    # Version 4 of a prompt added explicit incongruent groups, the study's hypothesis tag and
    # the experiment; version 4 of a request the experiment and the feature arm's p_feat.
    # Older rows are audit rows with no hypothesis; their incongruent side was implicit ("every
    # other group" of the dimensions congruent_with names), so it is written out here and
    # ``acrb.stages.plan.congruence`` gives them the congruence they had.
    ("prompt", 3): lambda row: {
        **row, "hypothesis": "", "experiment": "audit",
        "incongruent_with": ";".join(other_groups(
            [s for s in str(row.get("congruent_with") or "").split(";") if s]))},
    ("request", 3): lambda row: {**row, "experiment": "audit", "feature_prompt": "",
                                 "pair_of": ""},
    # Version 3 of a score and a verdict added the WinoBias role answers; older rows are audit
    # answers, with none.
    ("score", 2): lambda row: {**row, "male_role_holder": None, "female_role_holder": None},
    ("verdict", 2): lambda row: {**row, "male_role_holder": None, "female_role_holder": None},
    # Version 4 of a score and a verdict added the study rubric's bipolar age axis, and a score
    # whether the judge was told the source's labels; older rows scored no such axis and were
    # asked without labels.
    ("score", 3): lambda row: {**row, "age_direction": None, "labels_given": False},
    ("verdict", 3): lambda row: {**row, "age_direction": None},
    # Version 3 of a WinoBias item added the study's stereotype coding, extra keys and the two
    # images of a study item; older items are the builder's or a study file's without them.
    ("winobias_item", 2): lambda row: {
        **row, "stereotype_role": "", "roles_disagree": False, "metadata": "",
        **{f"{image}_{part}": "" for image in ("first", "second")
           for part in ("image", "match", "source_id", "race", "gender", "age")}},
    # Version 3 of a review item and a rating kept what an imported survey carried beyond the
    # fields (metadata), and a rating the direction of a bipolar age answer; older rows had
    # neither.
    ("review_item", 2): lambda row: {**row, "metadata": ""},
    ("rating", 2): lambda row: {**row, "age_direction": None, "metadata": ""},
    # Version 4 of a generation moved the run's measurements (seconds, the time it was made,
    # peak GPU memory) to the timing log (acrb.timings): they differ between runs of the same
    # request, so they made every rerun change dvc.lock. `generate` rewrites older records on
    # disk (upgrade_records) and logs the dropped values first.
    ("generation", 3): lambda row: {key: value for key, value in row.items()
                                    if key not in GENERATION_RUN_FIELDS},
    # Version 5 of a prompt added the imported study's subcategory and overt domain; older rows
    # had none kept.
    ("prompt", 4): lambda row: {**row, "subcategory": "", "overt_domain": ""},
    # Version 3 of a feature prompt records how a mapping entry was matched; a mapping was read
    # by source id only before.
    ("feature_prompt", 2): lambda row: {
        **row, "matched_by": "source_id" if row.get("origin") == "mapping" else "",
        "mapping_key": row.get("source_id", "") if row.get("origin") == "mapping" else ""},
    # Version 5 of a generation keeps the adapter's output version; a record made before had
    # none recorded, which is what an adapter without one has, so only an adapter that has
    # one (the simulated editors) makes those requests again.
    ("generation", 4): lambda row: {**row, "output_version": None},
}

UnreadableReason = Literal["newer", "no_migration", "invalid"]


class UnreadableRecordError(Exception):
    """A stored row that this ACRB cannot bring to its current version (see :func:`migrate`)."""

    def __init__(self, reason: UnreadableReason, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(detail)


def migrate(row: dict[str, Any], record_type: type[Record], version: int) -> dict[str, Any]:
    """``row``, stored as ``version`` of ``record_type``'s table, brought to the type's current
    version by applying :data:`MIGRATIONS` in turn.

    Raises :class:`UnreadableRecordError` if ``version`` is newer than the type's (written by a
    newer ACRB) or if a step of the chain has no migration.
    """
    if version > record_type.version:
        raise UnreadableRecordError(
            "newer", f"version {version}, newer than the {record_type.version} this ACRB reads")
    while version < record_type.version:
        step = MIGRATIONS.get((record_type.table, version))
        if step is None:
            raise UnreadableRecordError(
                "no_migration", f"version {version}, and no migration from version {version}")
        row = step(dict(row))
        version += 1
    return row


def _first_problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    return f"field '{field}': {first['msg']}"


def write_record(path: Path, record: Record) -> None:
    """Write one per-request record to ``path`` as JSON, atomically, stamped with its table
    and version (the fields ``acrb_table`` and ``acrb_schema_version``)."""
    atomic_write_text(path, record_line(record))


def record_line(record: Record) -> str:
    """One record as a line of JSON (no newline), stamped as :func:`write_record` stamps it."""
    fields = json.loads(record.model_dump_json())
    stamped = {RECORD_TABLE_FIELD: record.table, RECORD_VERSION_FIELD: record.version, **fields}
    return json.dumps(stamped, ensure_ascii=False, separators=(",", ":"))


def _load_record(path: Path, record_type: type[R]) -> R:
    return parse_record(path.read_bytes(), record_type)


def parse_record(text: bytes | str, record_type: type[R]) -> R:
    """The record in ``text`` (one stamped JSON object), migrated to the current version of
    ``record_type``; raises :class:`UnreadableRecordError` saying why it cannot be read."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UnreadableRecordError("invalid", f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UnreadableRecordError("invalid", "not a JSON object")
    # An unstamped record predates per-type versions: it is the version-2 layout of the table
    # whose folder it lies in.
    table = data.pop(RECORD_TABLE_FIELD, record_type.table)
    if table != record_type.table:
        raise UnreadableRecordError(
            "invalid", f"holds a '{table}' record, expected '{record_type.table}'")
    version = data.pop(RECORD_VERSION_FIELD, UNSTAMPED_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        raise UnreadableRecordError("invalid", f"version {version!r} is not a whole number")
    data = migrate(data, record_type, version)
    try:
        return record_type.model_validate(data)
    except ValidationError as exc:
        migrated = f" after migrating from version {version}" if version != record_type.version \
            else ""
        raise UnreadableRecordError("invalid", _first_problem(exc) + migrated) from exc


#: How many unreadable files an error names (it always says how many there are).
_NAMED_FILES = 3


def unreadable_records_error(record_type: type[Record],
                              failures: list[tuple[Path, UnreadableRecordError]]
                              ) -> InputDataError:
    def place(failure: tuple[Path, UnreadableRecordError]) -> tuple[str, int]:
        # A line of a records file is named ``file:line``: sorted by file, then line number.
        name, _, line = str(failure[0]).rpartition(":")
        if name and line.isascii() and line.isdigit():
            return (name, int(line))
        return (str(failure[0]), 0)

    failures = sorted(failures, key=place)
    named = "; ".join(f"{path} ({failure.detail})" for path, failure in failures[:_NAMED_FILES])
    more = len(failures) - _NAMED_FILES
    reasons = {failure.reason for _, failure in failures}
    fixes = []
    if "newer" in reasons:
        fixes.append("upgrade ACRB to the version that wrote them")
    if reasons & {"no_migration", "invalid"}:
        fixes.append(f"add a migration of the '{record_type.table}' record to version "
                     f"{record_type.version} to MIGRATIONS in acrb/records.py")
    lines = any(place(failure)[1] for failure in failures)
    fixes.append(f"delete those {'lines' if lines else 'files'} to redo their requests (records "
                 "are never redone silently: on real models that can cost hours of GPU time)")
    return InputDataError(
        f"{len(failures)} {record_type.table} record(s) cannot be read as version "
        f"{record_type.version}: {named}" + (f"; and {more} more" if more > 0 else ""),
        ", or ".join(fixes),
    )


def read_records(paths: Iterable[Path], record_type: type[R]) -> dict[Path, R]:
    """The records written by :func:`write_record` at ``paths``, brought to the current version
    of ``record_type`` by :func:`migrate`; paths with no file are left out (not done yet).

    Every file is read before anything is reported, so that one
    :class:`~acrb.errors.InputDataError` says how many files cannot be read (newer version, no
    migration, invalid), names the first few, and gives the fix.
    """
    found: dict[Path, R] = {}
    failures: list[tuple[Path, UnreadableRecordError]] = []
    for path in paths:
        if not path.exists():
            continue
        try:
            found[path] = _load_record(path, record_type)
        except UnreadableRecordError as failure:
            failures.append((path, failure))
    if failures:
        raise unreadable_records_error(record_type, failures)
    return found


def read_record(path: Path, record_type: type[R]) -> R:
    """The record written by :func:`write_record` at ``path``, migrated to the current version;
    an :class:`~acrb.errors.InputDataError` names the file if it is missing or unreadable."""
    found = read_records([path], record_type)
    if path not in found:
        raise InputDataError(f"{path} does not exist",
                             "run the stage that writes it first (e.g. `dvc repro`)")
    return found[path]


def upgrade_records(paths: Iterable[Path], record_type: type[Record],
                    keep: Callable[[dict[Path, dict[str, Any]]], None] | None = None
                    ) -> dict[Path, dict[str, Any]]:
    """Rewrite, atomically, every record at ``paths`` stored under an older version of
    ``record_type`` as its current version (through :func:`migrate`); paths with no file and
    current records are left as they are.

    Reading migrates in memory only; the files stay what DVC hashes. Rewriting them makes an
    upgraded project's outputs the bytes a fresh run writes, so its ``dvc.lock`` is the one a
    rerun from scratch gives. The rows as they were stored (stamps removed), by path, are
    handed to ``keep`` before any file is rewritten (so that a caller can save what a migration
    drops) and returned. A record that cannot be migrated raises the
    :class:`~acrb.errors.InputDataError` of :func:`read_records`, and nothing is rewritten.
    """
    stored: dict[Path, dict[str, Any]] = {}
    upgraded: dict[Path, Record] = {}
    failures: list[tuple[Path, UnreadableRecordError]] = []
    for path in paths:
        if not path.exists():
            continue
        try:
            data = json.loads(path.read_bytes())
        except ValueError as exc:
            failures.append((path, UnreadableRecordError("invalid", f"not JSON: {exc}")))
            continue
        if not isinstance(data, dict):
            failures.append((path, UnreadableRecordError("invalid", "not a JSON object")))
            continue
        version = data.get(RECORD_VERSION_FIELD, UNSTAMPED_VERSION)
        if isinstance(version, int) and not isinstance(version, bool) \
                and version >= record_type.version:
            continue
        try:
            upgraded[path] = _load_record(path, record_type)
        except UnreadableRecordError as failure:
            failures.append((path, failure))
            continue
        stored[path] = {key: value for key, value in data.items()
                        if key not in (RECORD_TABLE_FIELD, RECORD_VERSION_FIELD)}
    if failures:  # before anything is rewritten: a stopped stage leaves every file as it was
        raise unreadable_records_error(record_type, failures)
    if keep is not None and stored:
        keep(stored)
    for path, record in upgraded.items():
        write_record(path, record)
    return stored


_ARROW_TYPES: dict[Any, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
}


def _arrow_type(annotation: Any) -> pa.DataType:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        inner = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _arrow_type(inner[0])
    if origin is Literal:
        return pa.string()
    return _ARROW_TYPES[annotation]


def arrow_schema(record_type: type[Record]) -> pa.Schema:
    """The Parquet schema of a record type, with the record name and the type's version."""
    fields = []
    for name, info in record_type.model_fields.items():
        nullable = not info.is_required() or type(None) in typing.get_args(info.annotation)
        fields.append(pa.field(name, _arrow_type(info.annotation), nullable=nullable))
    metadata = {
        TABLE_METADATA_KEY: record_type.table.encode(),
        VERSION_METADATA_KEY: str(record_type.version).encode(),
    }
    return pa.schema(fields, metadata=metadata)


def _validated_rows(record_type: type[R], rows: list[dict[str, Any]], where: str) -> list[R]:
    adapter = TypeAdapter(list[record_type])  # type: ignore[valid-type]
    try:
        return cast(list[R], adapter.validate_python(rows))
    except ValidationError as exc:
        first = exc.errors()[0]
        row = first["loc"][0] if first["loc"] else "?"
        field = ".".join(str(p) for p in first["loc"][1:])
        raise InputDataError(
            f"{where}: row {row}, field '{field}': {first['msg']} "
            f"({exc.error_count()} problem(s) in the {record_type.table} table)",
            "re-run the stage that writes this table; if it persists, report a bug",
        ) from exc


def _arrow_table(records: Sequence[Record], record_type: type[Record]) -> pa.Table:
    schema = arrow_schema(record_type)
    columns = {name: [getattr(r, name) for r in records] for name in schema.names}
    return pa.Table.from_pydict(columns, schema=schema)


def write_table(path: Path, rows: Sequence[Record] | Sequence[dict[str, Any]] | pd.DataFrame,
                record_type: type[Record]) -> int:
    """Validate ``rows`` as ``record_type`` and write them to ``path`` atomically; returns count."""
    if isinstance(rows, pd.DataFrame):
        dict_rows = _frame_to_dicts(rows)
    else:
        dict_rows = [r.model_dump() if isinstance(r, Record) else dict(r) for r in rows]
    # Defence in depth: an API key that reached a row anyway is masked before it is stored.
    dict_rows = [redact_value(row) for row in dict_rows]
    records = _validated_rows(record_type, dict_rows, str(path))
    keys = [getattr(r, record_type.key) for r in records]
    if len(set(keys)) != len(keys):
        raise InputDataError(
            f"{path}: duplicate {record_type.key} values in the {record_type.table} table",
            "each row needs a unique key; check the stage's inputs for repeated items",
        )
    table = _arrow_table(records, record_type)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return len(records)


def _frame_to_dicts(frame: pd.DataFrame) -> list[dict[str, Any]]:
    clean = frame.astype(object).where(frame.notna(), None)
    return cast(list[dict[str, Any]], clean.to_dict(orient="records"))


def read_table(path: Path, record_type: type[Record], validate: bool = True) -> pd.DataFrame:
    """Read a table written by :func:`write_table`, checking its record type and version.

    A table of an older version is migrated row by row (:func:`migrate`) and then validated;
    one of a newer version, or one no migration covers, is an InputDataError.
    """
    if not path.exists():
        raise InputDataError(
            f"{path} does not exist",
            "run the stage that writes it first (e.g. `dvc repro` or the matching `acrb` command)",
        )
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputDataError(f"{path} is not a readable Parquet file: {exc}",
                             "delete it and re-run the stage that writes it") from exc
    metadata = table.schema.metadata or {}
    found_table = metadata.get(TABLE_METADATA_KEY, b"?").decode()
    found_version = metadata.get(VERSION_METADATA_KEY, b"?").decode()
    if found_table != record_type.table:
        raise InputDataError(
            f"{path} holds a '{found_table}' table, expected '{record_type.table}'",
            "check the path given to the stage",
        )
    if found_version != str(record_type.version):
        return _migrated_table(path, table, record_type, found_version)
    frame = table.to_pandas()
    if validate:
        _validated_rows(record_type, _frame_to_dicts(frame), str(path))
    return frame


def _migrated_table(path: Path, table: pa.Table, record_type: type[Record], found_version: str
                    ) -> pd.DataFrame:
    stale = InputDataError(
        f"{path} was written with schema version {found_version}; this ACRB reads version "
        f"{record_type.version} of the '{record_type.table}' table",
        "re-run the stage that writes it with this version of ACRB (`dvc repro`), or add a "
        f"migration of the '{record_type.table}' table to MIGRATIONS in acrb/records.py",
    )
    try:
        version = int(found_version)
    except ValueError:
        raise stale from None
    try:
        rows = [migrate(row, record_type, version) for row in _frame_to_dicts(table.to_pandas())]
    except UnreadableRecordError as failure:
        if failure.reason == "newer":
            raise InputDataError(
                f"{path} was written with schema version {found_version} of the "
                f"'{record_type.table}' table by a newer ACRB; this ACRB reads version "
                f"{record_type.version}",
                "upgrade ACRB, or re-run the stage that writes it with this version",
            ) from None
        raise stale from None
    records = _validated_rows(record_type, rows,
                              f"{path} (migrated from schema version {found_version})")
    return _arrow_table(records, record_type).to_pandas()


def request_id_for(*, model_key: str, model_revision: str, settings: dict[str, Any],
                   source_sha256: str, prompt_text: str, seed: int, arm: str,
                   extra_source_sha256s: Sequence[str] = (),
                   output_config: dict[str, Any] | None = None) -> str:
    """The content hash that names a request: equal inputs give equal ids on any machine.

    ``source_sha256`` is empty for a T2I request; ``extra_source_sha256s`` are the further
    portraits of a several-image request, in order (left out of the hash when there are none,
    so that one-portrait requests keep the ids they always had); ``output_config`` is the
    adapter config that changes outputs (:meth:`acrb.models.base.ImageModel.output_config`),
    likewise left out when empty.
    """
    content: dict[str, Any] = {
        "model_key": model_key,
        "model_revision": model_revision,
        "settings": settings,
        "source_sha256": source_sha256,
        "prompt_text": prompt_text,
        "seed": seed,
        "arm": arm,
    }
    if extra_source_sha256s:
        content["extra_source_sha256s"] = list(extra_source_sha256s)
    if output_config:
        content["output_config"] = output_config
    return content_hash(content)


def dump_settings(settings: dict[str, Any]) -> str:
    return json.dumps(settings, sort_keys=True, separators=(",", ":"))
