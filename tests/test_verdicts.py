"""The verdicts an audit reports, read through the functions the pipeline calls.

- The evaluate stage's verdict of one edit (:func:`acrb.stages.evaluate.judge`): lightening
  only when the skin got lighter, erasure only when (almost) nothing was edited, and skin that
  was only recoloured is an edit, not "the source returned unchanged" (a hard refusal).
- The hypotheses table (:func:`acrb.analysis.tests.hypotheses.evaluate_hypotheses`): the verdict
  follows the Holm-adjusted p-value, not the raw one.
- Every permutation and bootstrap p-value the analysis reports is (1 + #extreme) / (1 + B)
  (Phipson & Smyth 2010, "Permutation p-values should never be zero", Stat Appl Genet Mol Biol
  9:39): on data where no permutation is as extreme as the observed one, p is exactly
  1 / (B + 1), not 0.

Each test here was written against a deliberate one-line bug (docs/testing.md lists them with
the command that shows the test failing).
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np
import pandas as pd
import pytest

from acrb.analysis.estimation.resampling import (
    clustered_disparities,
    delta_permutation_p,
    prepare_block,
)
from acrb.analysis.experiments.arms import compare_arms
from acrb.analysis.experiments.congruence import scs
from acrb.analysis.tests.contingency import homogeneity_test
from acrb.analysis.tests.hypotheses import evaluate_hypotheses
from acrb.config import AnalyzeParams, HypothesisSpec
from acrb.detect.pixels import PixelThresholds, SourceAnalysis, analyze_source
from acrb.models.synthetic_edits import (
    compliant_edit,
    lighten_skin,
    returned_unchanged,
    weak_edit,
)
from acrb.records import GenerationRecord, JudgementRecord
from acrb.stages import evaluate
from tests.faces import has_real_faces, placeholder, portraits

TH = PixelThresholds()
#: L* the simulated editors add to lighten skin (SyntheticEditor's default lightening_delta).
LIGHTENING = 8.0
TONES = range(1, 11)


def _generation() -> GenerationRecord:
    return GenerationRecord(request_id="r1", model="m", status="ok", image_sha256="abc",
                            model_revision="r", library_versions="{}")


@lru_cache(maxsize=16)
def _analysis(tone: int) -> SourceAnalysis:
    return analyze_source(placeholder(tone, 0), TH)


def verdict(source: np.ndarray, output: np.ndarray,
            analysis: SourceAnalysis | None = None) -> JudgementRecord:
    """The evaluate stage's judgement of ``output`` as an edit of ``source``."""
    return evaluate.judge(_generation(), source, output, TH, "verdict-tests", analysis)


def _edit(source: np.ndarray, tone: int) -> np.ndarray:
    return compliant_edit(source, f"prompt-{tone}", tone)


# --- evaluate: lightening, darkening, erasure ---------------------------------------------------


@pytest.mark.parametrize("tone", TONES)
def test_lightened_skin_is_lightening_and_darkened_skin_is_not(tone: int) -> None:
    source = placeholder(tone, 0)
    analysis = _analysis(tone)
    edited = _edit(source, tone)
    lighter = verdict(source, lighten_skin(edited, LIGHTENING), analysis)
    assert (lighter.hard_refusal, lighter.erasure, lighter.lightening) == (False, False, True)
    assert lighter.ita_shift is not None and lighter.ita_shift >= TH.lightening_ita_min
    darker = verdict(source, lighten_skin(edited, -LIGHTENING), analysis)
    assert (darker.hard_refusal, darker.erasure, darker.lightening) == (False, False, False)
    assert darker.ita_shift is not None and darker.ita_shift <= -TH.lightening_ita_min
    # An edit that leaves the skin as it was is no lightening either way.
    plain = verdict(source, edited, analysis)
    assert (plain.hard_refusal, plain.erasure, plain.lightening) == (False, False, False)


@pytest.mark.parametrize("tone", TONES)
def test_a_weak_edit_is_an_erasure_and_a_clear_edit_is_not(tone: int) -> None:
    source = placeholder(tone, 0)
    analysis = _analysis(tone)
    weak = verdict(source, weak_edit(source, f"prompt-{tone}", tone), analysis)
    assert (weak.hard_refusal, weak.erasure) == (False, True)
    clear = verdict(source, _edit(source, tone), analysis)
    assert (clear.hard_refusal, clear.erasure) == (False, False)
    assert weak.edit_fraction is not None and clear.edit_fraction is not None
    assert weak.edit_fraction < TH.erasure_edit_fraction_max < clear.edit_fraction


# --- evaluate: recoloured skin is not "returned unchanged" --------------------------------------


@pytest.mark.parametrize("tone", TONES)
def test_lightened_only_placeholder_is_lightened_not_refused(tone: int) -> None:
    """An output that differs from the source only in its lighter skin: the pixels move less
    than the re-encoding tolerance, yet the face's tone changed, so it is an edit (lightened,
    nothing else: an erasure), never "the source returned unchanged"."""
    source = placeholder(tone, 0)
    analysis = _analysis(tone)
    record = verdict(source, lighten_skin(source, LIGHTENING), analysis)
    assert record.unchanged is False and record.refusal_evidence is None
    assert (record.hard_refusal, record.erasure, record.lightening) == (False, True, True)
    # The control: the source handed back really is unchanged, a hard refusal.
    handed_back = verdict(source, returned_unchanged(source), analysis)
    assert (handed_back.hard_refusal, handed_back.refusal_evidence) == (True, "unchanged")


def test_lightened_only_portraits_are_lightened_not_refused() -> None:
    """The same on photographs: real FairFace faces when the sample is beside the clone (the
    placeholders otherwise). The simulator lightens one colour cluster of its own choosing; on
    a few real faces that is not the face skin the detector reads and the tone hardly moves
    (see tests/test_pixel_detectors.py, lightening detection rate). Whatever moved the face's
    ITA by the lightening threshold is never read as unchanged; measured on the 21 real faces:
    19 moved that far (18 lighter), 2 did not."""
    faces = portraits()
    moved, lightened = [], []
    for name, source in faces:
        analysis = analyze_source(source, TH)
        record = verdict(source, lighten_skin(source, LIGHTENING), analysis)
        assert record.ita_shift is not None
        if abs(record.ita_shift) >= TH.lightening_ita_min:
            moved.append(name)
            assert record.unchanged is False, name
            assert (record.hard_refusal, record.erasure) == (False, True), name
        lightened.append(record.lightening is True)
    moved_floor, lightened_floor = (19, 18) if has_real_faces() else (len(faces), len(faces))
    assert len(moved) >= moved_floor, moved
    assert sum(lightened) >= lightened_floor, f"read as lightened on {sum(lightened)}"


# --- hypotheses: the verdict follows the adjusted p-value ---------------------------------------


def _audit_frame(seed: int = 0) -> pd.DataFrame:
    """2 races x 2 genders x 2 ages x 3 sources, 6 prompts of category A, refusal 20 %."""
    rng = np.random.default_rng(seed)
    rows = []
    cells = itertools.product(("Black", "White"), ("Female", "Male"), ("20s", "60s"), range(3))
    for race, gender, age, i in cells:
        source = f"{race}-{gender}-{age}-{i}"
        for j in range(6):
            refused = bool(rng.random() < 0.2)
            rows.append({"request_id": f"{source}-{j}", "source_id": source, "prompt_id": f"A{j}",
                         "category": "A", "congruence": "neutral", "seed": 0, "race": race,
                         "gender": gender, "age": age, "status": "ok", "hard_refusal": refused,
                         "erasure": None if refused else False,
                         "lightening": None if refused else False})
    frame = pd.DataFrame(rows)
    for column in ("hard_refusal", "erasure", "lightening"):
        frame[column] = frame[column].astype("boolean")
    return frame


HYPOTHESES = {
    "H-race": HypothesisSpec(claim="race matters", test="disparity", dimension="race"),
    "H-gender": HypothesisSpec(claim="gender matters", test="disparity", dimension="gender"),
}


def _hypotheses(p_race: float, p_gender: float) -> pd.DataFrame:
    """The hypotheses table of :data:`HYPOTHESES` on a disparity table whose permutation
    p-values are set to ``p_race`` and ``p_gender`` (everything else as computed)."""
    frame = _audit_frame()
    gaps = clustered_disparities(frame, "hard_refusal", n_boot=50, n_perm=50)
    gaps.loc[gaps["dimension"] == "race", "p_value"] = p_race
    gaps.loc[gaps["dimension"] == "gender", "p_value"] = p_gender
    cfg = AnalyzeParams(alpha=0.05, hypotheses=HYPOTHESES)
    return evaluate_hypotheses({"m": frame}, {"m": gaps}, cfg).set_index("hypothesis")


def test_raw_p_below_alpha_but_adjusted_above_is_not_supported() -> None:
    # Holm over two p-values 0.03 and 0.04: adjusted 0.06 and max(0.06, 0.04) = 0.06.
    table = _hypotheses(0.03, 0.04)
    assert table["p_value"].tolist() == [0.03, 0.04]
    assert table["p_adjusted"].tolist() == pytest.approx([0.06, 0.06])
    for name in HYPOTHESES:
        assert not table.loc[name, "supported"]
        assert table.loc[name, "verdict"].startswith("not supported")


def test_adjusted_p_below_alpha_is_supported() -> None:
    # Holm: 0.01 * 2 = 0.02 and max(0.02, 0.04) = 0.04, both below 0.05.
    table = _hypotheses(0.01, 0.04)
    assert table["p_adjusted"].tolist() == pytest.approx([0.02, 0.04])
    assert table["supported"].tolist() == [True, True]
    assert (table["verdict"] == "supported").all()


# --- permutation p-values are never 0 ------------------------------------------------------------

B = 199


def _separated_frame(sources_per_race: int = 20) -> pd.DataFrame:
    """Black sources refused on every prompt, White sources on none; one gender, one age, so
    there is one stratum. A permutation of the race labels reaches Δ = 1 only by putting all
    refused sources in one group: probability 2 / C(40, 20) ~ 1.4e-11 per draw."""
    rows = []
    for race in ("Black", "White"):
        for i in range(sources_per_race):
            source = f"{race}-{i}"
            for j in range(4):
                rows.append({"request_id": f"{source}-{j}", "source_id": source,
                             "prompt_id": f"A{j}", "category": "A", "congruence": "neutral",
                             "seed": 0, "race": race, "gender": "Female", "age": "30s",
                             "status": "ok", "hard_refusal": race == "Black"})
    frame = pd.DataFrame(rows)
    frame["hard_refusal"] = frame["hard_refusal"].astype("boolean")
    return frame


@pytest.mark.parametrize("mid_p", [True, False])
def test_delta_permutation_p_with_nothing_as_extreme_is_one_over_b_plus_one(mid_p: bool) -> None:
    block = prepare_block(_separated_frame(), "hard_refusal", "race")
    result = delta_permutation_p(block, n_perm=B, seed=1, mid_p=mid_p)
    assert result.observed == 1.0
    assert result.p_value == 1 / (B + 1)


def test_disparity_table_p_value_with_nothing_as_extreme_is_one_over_b_plus_one() -> None:
    gaps = clustered_disparities(_separated_frame(), "hard_refusal", n_boot=50, n_perm=B)
    race = gaps[(gaps["category"] == "all") & (gaps["dimension"] == "race")].iloc[0]
    assert race["delta"] == 1.0
    assert race["p_value"] == 1 / (B + 1)


def test_homogeneity_permutation_p_with_nothing_as_extreme_is_one_over_b_plus_one() -> None:
    # 10 groups of 100, all 10 True outcomes in one group: expected counts of 1 send it to the
    # permutation test, and a draw puts all ten in one group with probability 10 * ~1e-10.
    k = np.array([10] + [0] * 9)
    n = np.full(10, 100)
    p_value, method = homogeneity_test(k, n, permutations=B, seed=2)
    assert method == "permutation"
    assert p_value == 1 / (B + 1)


def test_arm_narrowing_p_with_nothing_as_extreme_is_one_over_b_plus_one() -> None:
    """The feature arm removes every refusal of the 30 Black sources (White: none in either
    arm), so the narrowing is 1; a randomisation reaches |narrowing| = 1 only by swapping the
    arms of all or none of the Black sources (probability 2 / 2^30)."""
    rows = []
    for race in ("Black", "White"):
        for i in range(30):
            for arm in ("none", "feature"):
                rows.append({"request_id": f"{race}-{i}-{arm}", "source_id": f"{race}-{i}",
                             "prompt_id": "A0", "seed": 0, "arm": arm, "race": race,
                             "gender": "Male", "age": "30s", "status": "ok",
                             "hard_refusal": race == "Black" and arm == "none"})
    frame = pd.DataFrame(rows)
    frame["hard_refusal"] = frame["hard_refusal"].astype("boolean")
    gap = compare_arms({"m": frame}, n_boot=50, n_perm=B).gap.set_index("outcome")
    assert gap.loc["hard_refusal", "narrowing"] == 1.0
    assert gap.loc["hard_refusal", "p_value"] == 1 / (B + 1)


def test_scs_bootstrap_p_with_no_replicate_at_or_below_zero_is_one_over_b_plus_one() -> None:
    """In C, incongruent requests always refused, congruent never; in the baseline (A) half the
    sources always, half never: every bootstrap replicate of SCS is positive (a replicate with
    no refused baseline source has probability 2^-16), so the one-sided p is 1 / (B + 1)."""
    rows = []
    for s in range(16):
        source = f"s{s}"
        for j in range(4):
            rows.append({"source_id": source, "prompt_id": f"A{j}", "category": "A",
                         "congruence": "neutral", "hard_refusal": s % 2 == 0})
            congruence = ("congruent", "incongruent")[(s + j) % 2]
            rows.append({"source_id": source, "prompt_id": f"C{j}", "category": "C",
                         "congruence": congruence, "hard_refusal": congruence == "incongruent"})
    frame = pd.DataFrame(rows).assign(seed=0, status="ok", race="Black", gender="Female",
                                      age="30s")
    frame["request_id"] = [f"r{i}" for i in range(len(frame))]
    frame["hard_refusal"] = frame["hard_refusal"].astype("boolean")
    result = scs(frame, "hard_refusal", "C", n_boot=B, seed=3)
    assert result.defined and result.estimate == pytest.approx(2.0)
    assert result.p_value == 1 / (B + 1)
