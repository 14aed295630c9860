"""ACRB prompt synthesis: the data files, the template writer and reply validation."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from acrb.errors import ConfigError, InputDataError
from acrb.prompts.synthesis import (
    BasePrompt,
    clean_reply,
    identity_change,
    keyword_found,
    load_attributes,
    load_base_prompts,
    plan_items,
    template_prompts,
    validate_reply,
)
from acrb.records import PromptRecord, SynthesisCallRecord, read_table
from acrb.stages import prompts as prompts_stage
from acrb.stages.context import StageContext
from tests.conftest import REPO, write_params

DATA = REPO / "src" / "acrb" / "prompts" / "data"
BASE = load_base_prompts(DATA / "base_prompts.yaml")
ATTRIBUTES = load_attributes(DATA / "attributes.yaml")


def test_base_prompts_cover_nine_domains_with_one_hundred_prompts():
    assert len(BASE.prompts) == 100
    per_domain = Counter(p.domain for p in BASE.prompts)
    assert len(per_domain) == 9 and set(per_domain) == set(BASE.domains)
    assert min(per_domain.values()) >= 11


def test_attributes_are_twenty_four_over_five_dimensions():
    per_dimension = Counter(key.split(":")[0] for key, _ in ATTRIBUTES.attributes())
    assert per_dimension == {"culture": 7, "gender": 3, "disability": 4, "religion": 6, "age": 4}
    # Who the person *is* has no edit form: an I2I edit must never change gender or age.
    for key, spec in ATTRIBUTES.attributes():
        assert (spec.i2i is None) == (key.split(":")[0] in {"gender", "age"}), key


@pytest.mark.parametrize("mode", ["t2i", "i2i"])
def test_every_template_prompt_passes_the_checks_an_llm_prompt_must_pass(mode):
    rows = template_prompts(plan_items(BASE, ATTRIBUTES, [mode]), ATTRIBUTES, "test")
    specs = dict(ATTRIBUTES.attributes())
    problems = {}
    for row in rows:
        problem = validate_reply(row.text, mode=mode, spec=specs.get(row.attribute),
                                 min_chars=20, max_chars=400)
        if problem:
            problems[row.prompt_id] = (row.text, problem)
    assert not problems


def test_template_expansion_counts_and_ids():
    items = plan_items(BASE, ATTRIBUTES, ["t2i", "i2i"])
    rows = template_prompts(items, ATTRIBUTES, "test")
    t2i = [r for r in rows if r.mode == "t2i"]
    i2i = [r for r in rows if r.mode == "i2i"]
    assert len(t2i) == 2500
    assert set(Counter(r.attribute for r in t2i).values()) == {100}
    assert len(Counter(r.attribute for r in t2i)) == 25
    assert len(i2i) == 100 * (7 + 4 + 6 + 1)
    assert len({r.prompt_id for r in rows}) == len(rows)
    neutral = next(r for r in t2i if r.prompt_id == "t2i-VIO01-neutral")
    assert neutral.text == neutral.base_text == neutral.boundary_text
    assert "a person" in neutral.text
    sikh = next(r for r in t2i if r.prompt_id == "t2i-VIO01-religion-sikh")
    assert "Sikh" in sikh.text and sikh.base_id == "VIO01" and sikh.synthesis == "template"
    edit = next(r for r in i2i if r.prompt_id == "i2i-VIO01-religion-muslim")
    assert edit.text.startswith("Show this person ") and edit.text.endswith("kufi.")
    assert edit.congruent_with == "race:MiddleEastern"
    assert all(r.congruent_with == "" for r in t2i)


def test_domain_filter_and_unknown_domain():
    items = plan_items(BASE, ATTRIBUTES, ["t2i"], domains=["copyright"])
    assert len(items) == 11 * 25
    with pytest.raises(InputDataError, match="not-a-domain"):
        plan_items(BASE, ATTRIBUTES, ["t2i"], domains=["not-a-domain"])


def test_base_prompt_needs_exactly_one_subject_slot():
    with pytest.raises(ValueError, match="subject"):
        BasePrompt(id="VIO99", domain="x", t2i="A photo of a person fencing in a hall.",
                   i2i="fencing in a hall")


def test_bad_data_file_names_file_and_entry(tmp_path: Path):
    bad = tmp_path / "attributes.yaml"
    bad.write_text("name: x\nversion: 1\nneutral: {t2i: a person}\n"
                   "dimensions:\n  culture:\n    - {id: Bad Id, t2i: a b c, i2i: null, cue: abc,"
                   " keywords: [x]}\n")
    with pytest.raises(InputDataError) as info:
        load_attributes(bad)
    assert str(bad) in info.value.problem and "dimensions.culture.0.id" in info.value.problem
    with pytest.raises(InputDataError, match="not found"):
        load_base_prompts(tmp_path / "missing.yaml")


@pytest.mark.parametrize(("reply", "cleaned"), [
    ('"A photo of a person fencing."', "A photo of a person fencing."),
    ("Prompt: A photo of a person fencing.", "A photo of a person fencing."),
    ("Rewritten prompt: “A photo of a person fencing.”", "A photo of a person fencing."),
    ("```\nA photo of a person fencing.\n```", "A photo of a person fencing."),
    ("```text\nA photo of a person fencing.\n```", "A photo of a person fencing."),
    ("  A photo of a person fencing.  ", "A photo of a person fencing."),
])
def test_clean_reply(reply, cleaned):
    assert clean_reply(reply) == cleaned


@pytest.mark.parametrize("text", [
    "Show this person fencing, and change their skin to a lighter tone.",
    "Show this person fencing and lighten their skin.",
    "Show this person with lighter skin at a fencing club.",
    "Make them look younger while fencing.",
    "Show this person fencing, and alter the facial features to look Korean.",
    "Transform this person into a different ethnicity wearing a hanbok.",
    "Show this person as a woman in a hijab.",
])
def test_identity_change_is_caught(text):
    assert identity_change(text) is not None


@pytest.mark.parametrize("text", [
    "Show this person fencing in a sports hall, wearing a kippah.",
    "Show this person changing a tyre at a garage, wearing a Sikh turban (dastar).",
    "Show this person at a skin-care routine in front of a bathroom mirror.",
    "Show this person at a face-painting stall at a street festival.",
    "Show this person replacing a bicycle chain, using a wheelchair.",
])
def test_ordinary_edits_are_not_identity_changes(text):
    assert identity_change(text) is None


def test_keywords_match_whole_words_only():
    assert keyword_found("A photo of a man fencing", ["man"])
    assert not keyword_found("A photo of a woman fencing", ["man"])
    assert keyword_found("A non-binary person fencing", ["non-binary"])
    assert keyword_found("someone with hearing aids", ["hearing aids"])


def test_validate_reply_reasons():
    sikh = dict(ATTRIBUTES.attributes())["religion:sikh"]
    ok = "A photo of a Sikh person wearing a turban fencing in a sports hall."
    assert validate_reply(ok, mode="t2i", spec=sikh, min_chars=20, max_chars=400) is None
    cases = {
        "": "empty",
        "A photo.\nAnother line with a Sikh person.": "more than one line",
        "Sikh.": "shorter",
        "A photo of a person fencing in a sports hall.": "attribute not expressed",
        "A photo of {subject} who is Sikh and fencing.": "braces",
        "A Sikh person fencing " + "very " * 100: "longer",
    }
    for text, reason in cases.items():
        problem = validate_reply(text, mode="t2i", spec=sikh, min_chars=20, max_chars=400)
        assert problem is not None and reason in problem, (text, problem)
    change = "Show this person fencing, wearing a turban, and make them look younger."
    assert "identity" in validate_reply(change, mode="i2i", spec=sikh, min_chars=20,
                                        max_chars=400)
    assert "no person" in validate_reply("A photo of a fencing hall at dawn.", mode="t2i",
                                         spec=None, min_chars=20, max_chars=400)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_prompts_stage_with_template_is_deterministic(project: Path):
    ctx = StageContext.load(Path("params.yaml"), root=project)
    summary = prompts_stage.run(ctx)
    assert summary.synthesized == {"i2i": 1800, "t2i": 2500}
    assert summary.per_synthesis == {"template": 4300} and summary.llm_requests == 0
    table = project / "data" / "prompts" / "prompts.parquet"
    frame = read_table(table, PromptRecord)
    t2i = frame[frame["mode"] == "t2i"]
    assert len(t2i) == 2500
    assert set(t2i.groupby("attribute").size()) == {100}
    assert set(t2i.groupby("domain").size() % 25) == {0}
    assert (frame["prompt_set"] == "catalog").sum() == 50
    assert read_table(project / "data" / "prompts" / "synthesis_calls.parquet",
                      SynthesisCallRecord).empty
    first = {p.name: _sha(p) for p in (project / "data" / "prompts").iterdir()}
    prompts_stage.run(ctx)
    second = {p.name: _sha(p) for p in (project / "data" / "prompts").iterdir()}
    assert first == second
    sample = (project / "data" / "prompts" / "sample.html").read_text()
    assert sample.count("<tr>") == 1 + 2 * 9 * 3  # header + 3 rows per domain and mode


def test_plan_uses_catalog_by_default_and_acrb_edits_on_request(project: Path):
    from acrb.stages import plan as plan_stage
    from acrb.stages import sources as sources_stage

    ctx = StageContext.load(Path("params.yaml"), root=project)
    sources_stage.run(ctx)
    prompts_stage.run(ctx)
    plan = plan_stage.run(ctx)
    # The editors get the catalog; the simulated generator the 2,500 ACRB T2I prompts.
    assert plan.per_model == {"synthetic-fair": 8 * 50, "synthetic-biased": 8 * 50,
                              "synthetic-t2i": 100 * 25}
    changes = {"plan": {"prompt_sets": ["acrb"]},
               "prompts": {"synthesis": {"domains": ["copyright"]}}}
    write_params(project, changes)
    ctx = StageContext.load(Path("params.yaml"), root=project)
    prompts_stage.run(ctx)
    # The simulated editors have planted rates for the catalog's categories only.
    with pytest.raises(ConfigError, match=r"no planted refusal rate .*\['copyright'\]"):
        plan_stage.run(ctx)
    rates = {"config": {o: {"base": {"copyright": 0.1}}
                        for o in ("refusal", "erasure", "lightening")}}
    changes["models"] = {"synthetic-fair": rates, "synthetic-biased": rates}
    write_params(project, changes)
    ctx = StageContext.load(Path("params.yaml"), root=project)
    plan = plan_stage.run(ctx)
    assert plan.per_model == {"synthetic-fair": 8 * 11 * 18, "synthetic-biased": 8 * 11 * 18,
                              "synthetic-t2i": 11 * 25}
    requests = pd.read_parquet(project / "data" / "plan" / "requests.parquet")
    requests = requests[requests["mode"] == "i2i"]
    assert requests["prompt_id"].str.startswith("i2i-COP").all()
    assert set(requests["congruence"]) == {"congruent", "incongruent", "neutral"}
