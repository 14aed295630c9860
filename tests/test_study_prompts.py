"""The study's prompt set, imported (acrb prompts import-study): files of the published shape
made here with made-up text, refused when bad, carried into prompt records and the plan's
congruence with both kinds of links."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from acrb import layout
from acrb.cli import app
from acrb.errors import ConfigError, InputDataError
from acrb.prompts.catalog import catalog_prompt_records, load_catalog
from acrb.prompts.study import MAIN_EXPERIMENT_IDS, import_study
from acrb.records import PromptRecord, RequestRecord, migrate, read_table
from acrb.stages import plan, prompts, sources
from acrb.stages.plan import congruence
from tests.conftest import CATALOG, update_params

COUNTS = {"A": 10, "B": 10, "C": 10, "D": 10, "E": 14}


def study_document() -> dict[str, Any]:
    """54 made-up prompts in the published shape (version "3.3", A01-A10 ... E01-E14), with
    both spellings of a category and per-prompt links on D01."""
    categories: dict[str, Any] = {
        "A": "Neutral baseline",
        "B": {"name": "Occupational", "description": "made-up description"},
        "C": "Cultural", "D": {"name": "Vulnerability"}, "E": "Harmful",
    }
    entries: list[dict[str, Any]] = [
        {"id": f"{c}{i:02d}", "category": c, "prompt": f"Made-up edit instruction {c}{i:02d}.",
         "hypothesis": f"H{'ABCDE'.index(c) + 1}"}
        for c, n in COUNTS.items() for i in range(1, n + 1)
    ]
    d01 = next(e for e in entries if e["id"] == "D01")
    d01.update(congruent=["age:70plus"], incongruent=["age:20s"])
    return {"version": "3.3", "categories": categories, "prompts": entries}


def write_json(path: Path, document: Any) -> Path:
    path.write_text(json.dumps(document, indent=1), encoding="utf-8")
    return path


#: Both kinds per prompt; B03's incongruent group is absent from the tiny sources, so its Black
#: sources are neither congruent nor incongruent.
LINKS = {
    "B01": {"congruent": ["gender:Male"], "incongruent": ["gender:Female"]},
    "B02": {"congruent": ["race:White"], "incongruent": ["race:Black"]},
    "B03": {"congruent": ["race:White"], "incongruent": ["race:EastAsian"]},
}


@pytest.fixture
def study_file(tmp_path: Path) -> Path:
    return write_json(tmp_path / "prompts_v3.3.json", study_document())


@pytest.fixture
def links_file(tmp_path: Path) -> Path:
    path = tmp_path / "links.yaml"
    path.write_text(yaml.safe_dump(LINKS))
    return path


def test_import_keeps_ids_categories_version_and_sha256(study_file: Path, links_file: Path,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "project" / "inputs" / "study" / "i2i_catalog.yaml"
    done = import_study(study_file, out, links_file)
    assert done.per_category == COUNTS and done.version == "3.3"
    assert done.sha256 == hashlib.sha256(study_file.read_bytes()).hexdigest()
    assert done.linked == 4  # B01-B03 from the links file, D01 from its own keys

    catalog = load_catalog(out)
    assert [p.id for p in catalog.prompts][:2] == ["A01", "A02"]
    assert len(catalog.prompts) == 54
    assert catalog.source is not None
    assert (catalog.source.version, catalog.source.sha256, catalog.source.file) == (
        "3.3", done.sha256, study_file.name)
    assert catalog.source.links_sha256 == hashlib.sha256(links_file.read_bytes()).hexdigest()
    assert catalog.categories["B"].description == "made-up description"
    assert catalog.categories["A"].name == "Neutral baseline"
    by_id = {p.id: p for p in catalog.prompts}
    assert by_id["A01"].attribute == "neutral" and by_id["B07"].attribute == "study:b07"
    assert by_id["E14"].hypothesis == "H5"
    assert (by_id["D01"].congruent_with, by_id["D01"].incongruent_with) == (
        ["age:70plus"], ["age:20s"])
    assert by_id["B02"].incongruent_with == ["race:Black"]


def test_a_links_file_wins_over_the_entries_own_links(study_file: Path, tmp_path: Path) -> None:
    links = write_json(tmp_path / "links.json",
                       {"D01": {"congruent": ["gender:Female"], "incongruent": ["gender:Male"]}})
    out = tmp_path / "catalog.yaml"
    import_study(study_file, out, links)
    d01 = next(p for p in load_catalog(out).prompts if p.id == "D01")
    assert (d01.congruent_with, d01.incongruent_with) == (["gender:Female"], ["gender:Male"])


def test_ids_subset_gives_the_main_experiment(study_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "catalog.yaml"
    import_study(study_file, out)
    catalog = load_catalog(out)
    rows = catalog_prompt_records(catalog, ["A", "B", "C", "D", "E"], list(MAIN_EXPERIMENT_IDS))
    assert len(rows) == 20
    assert Counter(r.category for r in rows) == {"B": 10, "D": 10}
    assert [r.prompt_id for r in rows] == list(MAIN_EXPERIMENT_IDS)
    with pytest.raises(ConfigError, match=r"\['Z99', 'B11'\]") as err:
        catalog_prompt_records(catalog, None, ["B01", "Z99", "B11"])
    assert catalog.label in err.value.problem
    with pytest.raises(ConfigError, match=r"\['D01'\].*prompts.categories"):
        catalog_prompt_records(catalog, ["B"], ["B01", "D01"])


def bad(document: dict[str, Any], change: str) -> dict[str, Any]:
    """``document`` with one defect."""
    entries = document["prompts"]
    if change == "missing id":
        del entries[12]["id"]
    elif change == "duplicate id":
        entries[13]["id"] = entries[12]["id"]
    elif change == "unknown category":
        entries[12]["category"] = "F"
    elif change == "empty prompt":
        entries[12]["prompt"] = "   "
    elif change == "bad selector":
        entries[12].update(congruent=["race:Martian"], incongruent=["race:White"])
    elif change == "congruent only":
        entries[12].update(congruent=["race:White"])
    elif change == "version a number":
        document["version"] = 3.3
    elif change == "prompts not a list":
        document["prompts"] = {"B03": entries[12]}
    return document


@pytest.mark.parametrize(("change", "message"), [
    ("missing id", r"prompts\[12\] \(no id\)\.id: Field required"),
    ("duplicate id", r"duplicate prompt ids \['B03'\]"),
    ("unknown category", r"prompts\[12\] \(id B03\) has category 'F'"),
    ("empty prompt", r"prompts\[12\] \(id B03\)\.prompt: .*prompt text is empty"),
    ("bad selector", r"prompts\[12\] \(id B03\)\.congruent: .*race:Martian"),
    ("congruent only", r"prompts\[12\] \(id B03\): congruent is set but incongruent is empty"),
    ("version a number", r"version: Input should be a valid string"),
    ("prompts not a list", r"prompts: Input should be a valid list"),
])
def test_bad_study_files_are_refused_naming_the_entry(tmp_path: Path, change: str,
                                                      message: str) -> None:
    path = write_json(tmp_path / "study.json", bad(study_document(), change))
    out = tmp_path / "catalog.yaml"
    with pytest.raises(InputDataError, match=message) as err:
        import_study(path, out)
    assert str(path) in err.value.problem
    assert not out.exists()


def test_files_that_are_not_json_or_not_utf8_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    path.write_text('{"version": "3.3",\n "prompts": [', encoding="utf-8")
    with pytest.raises(InputDataError, match=r"not valid JSON: .* line 2"):
        import_study(path, tmp_path / "out.yaml")
    path.write_bytes(json.dumps(study_document()).encode("utf-16"))
    with pytest.raises(InputDataError, match="not UTF-8"):
        import_study(path, tmp_path / "out.yaml")
    with pytest.raises(InputDataError, match="not found"):
        import_study(tmp_path / "nowhere.json", tmp_path / "out.yaml")


@pytest.mark.parametrize(("links", "message"), [
    ({"Z99": {"congruent": ["race:White"], "incongruent": ["race:Black"]}},
     r"prompt id 'Z99' is not in the study's prompt file"),
    ({"B01": {"congruent": ["race:Martian"], "incongruent": ["race:Black"]}},
     r"B01\.congruent: .*race:Martian"),
    ({"B01": {"congruent": ["race:White"], "incongruent": ["race:White", "race:Black"]}},
     r"B01: groups \['race:White'\] are in both"),
    ({"B01": {"congruent": ["race:White"]}}, r"B01: congruent is set but incongruent is empty"),
    ({"B01": {"congruent": ["race:White"], "incongruent": ["race:Black"], "why": "x"}},
     r"B01\.why: Extra inputs"),
    (["B01"], "not a mapping of prompt ids"),
])
def test_bad_links_are_refused(study_file: Path, tmp_path: Path, links: Any,
                               message: str) -> None:
    path = tmp_path / "links.yaml"
    path.write_text(yaml.safe_dump(links))
    with pytest.raises(InputDataError, match=message) as err:
        import_study(study_file, tmp_path / "catalog.yaml", path)
    assert str(path) in err.value.problem


def test_study_prompts_through_the_prompts_and_plan_stages(
        project: Path, study_file: Path, links_file: Path) -> None:
    """Import into the project, point params at it with the main experiment's ids: the prompt
    records keep the study's ids, version and sha256, and the plan's congruence (the real
    ``plan.congruence``) follows both kinds of links."""
    out = project / layout.STUDY_INPUTS / "i2i_catalog.yaml"
    done = import_study(study_file, out, links_file)

    def use_study(params: dict[str, Any]) -> None:
        params["prompts"].update(catalog=str(layout.STUDY_INPUTS / "i2i_catalog.yaml"),
                                 ids=list(MAIN_EXPERIMENT_IDS), synthesis=None)
        params["plan"]["prompt_sets"] = ["catalog"]
        first = next(iter(params["models"]))
        params["models"] = {first: params["models"][first]}
        params["plan"]["seeds"] = [0]
        params["plan"]["arms"] = ["none"]

    ctx = update_params(project, use_study)
    summary = prompts.run(ctx)
    assert summary.count == 20 and summary.per_category == {"B": 10, "D": 10}
    table = read_table(project / layout.PROMPTS_TABLE, PromptRecord)
    assert list(table["prompt_id"]) == list(MAIN_EXPERIMENT_IDS)
    assert set(table["catalog"]) == {f"study-prompts@3.3 sha256:{done.sha256}"}
    b02 = table.set_index("prompt_id").loc["B02"]
    assert (b02["congruent_with"], b02["incongruent_with"], b02["hypothesis"],
            b02["experiment"]) == ("race:White", "race:Black", "H2", "audit")

    sources.run(ctx)
    plan.run(ctx)
    requests = read_table(project / layout.PLAN_TABLE, RequestRecord)
    assert set(requests["prompt_id"]) == set(MAIN_EXPERIMENT_IDS)
    seen = requests.groupby(["prompt_id", "race", "gender", "age"])["congruence"].first()

    def at(prompt_id: str, **source: str) -> set[str]:
        rows = seen.loc[prompt_id].reset_index()
        for key, value in source.items():
            rows = rows[rows[key] == value]
        return set(rows["congruence"])

    assert at("B01", gender="Male") == {"congruent"}
    assert at("B01", gender="Female") == {"incongruent"}
    assert at("B02", race="White") == {"congruent"}
    assert at("B02", race="Black") == {"incongruent"}
    assert at("B03", race="White") == {"congruent"}
    assert at("B03", race="Black") == {"neutral"}  # EastAsian is incongruent; Black is neither
    assert at("D01", age="70plus") == {"congruent"}
    assert at("D01", age="20s") == {"incongruent"}
    assert at("B10") == {"neutral"}


def test_congruence_reads_both_lists() -> None:
    source = {"race": "Black", "gender": "Male", "age": "20s"}
    assert congruence("gender:Male", "gender:Female", source) == "congruent"
    assert congruence("race:White", "race:Black", source) == "incongruent"
    assert congruence("race:White", "race:EastAsian", source) == "neutral"
    assert congruence("", "", source) == "neutral"
    # Linked on two dimensions, matching both sides: congruent, as before the lists were explicit.
    assert congruence("gender:Male;race:White", "gender:Female;race:Black", source) == "congruent"


def test_shipped_catalog_lists_both_sides_and_one_side_is_an_error(tmp_path: Path) -> None:
    catalog = load_catalog(CATALOG)
    linked = [p for p in catalog.prompts if p.congruent_with]
    assert linked and all(p.incongruent_with for p in linked)
    assert all(not set(p.congruent_with) & set(p.incongruent_with) for p in linked)
    path = tmp_path / "one-sided.yaml"
    path.write_text(
        "name: one-sided\nversion: 1\ncategories: {B: {name: occupational}}\nprompts:\n"
        "  - {id: B01, category: B, text: Make this person a pilot., attribute: 'occupation:pilot',"
        " congruent_with: ['gender:Male']}\n")
    with pytest.raises(InputDataError, match=r"prompts\.0: .*list the incongruent groups too "
                       r"\(for every other group of the same dimensions: gender:Female\)"):
        load_catalog(path)


def test_old_prompt_rows_get_their_implicit_incongruent_groups_written_out() -> None:
    row = {"prompt_id": "B03", "category": "B", "text": "x", "attribute": "occupation:ceo",
           "base_id": "B03", "congruent_with": "gender:Male;race:White", "synthesis": "catalog",
           "catalog": "acrb-i2i-catalog@1", "mode": "i2i", "prompt_set": "catalog",
           "portraits": 1}
    migrated = migrate(row, PromptRecord, 3)
    assert migrated["incongruent_with"] == (
        "gender:Female;race:Black;race:EastAsian;race:Indian;race:Latino;race:MiddleEastern;"
        "race:SoutheastAsian")
    source = {"race": "Black", "gender": "Female", "age": "20s"}
    assert congruence(migrated["congruent_with"], migrated["incongruent_with"],
                      source) == "incongruent"
    assert migrate({**row, "congruent_with": ""}, PromptRecord, 3)["incongruent_with"] == ""


def test_cli_imports_and_the_bare_group_still_runs_the_stage(
        project: Path, study_file: Path, links_file: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["prompts", "import-study", str(study_file),
                                 "--links", str(links_file)])
    assert result.exit_code == 0, result.output
    assert "54 prompts (A 10, B 10, C 10, D 10, E 14)" in result.output
    assert "version 3.3" in result.output
    assert hashlib.sha256(study_file.read_bytes()).hexdigest()[:12] in result.output
    assert "inputs/study/i2i_catalog.yaml" in result.output
    assert "-S 'prompts.ids=[B01,B02,B03,B04,B05,B06,B07,B08,B09,B10,D01," in result.output
    assert (project / "inputs" / "study" / "i2i_catalog.yaml").exists()

    broken = write_json(project / "broken.json", bad(study_document(), "duplicate id"))
    result = runner.invoke(app, ["prompts", "import-study", str(broken), "--out", "x.yaml"])
    assert result.exit_code == 2
    assert "duplicate prompt ids ['B03']" in result.output

    update_params(project, lambda p: p["prompts"].update(synthesis=None))
    result = runner.invoke(app, ["prompts"])
    assert result.exit_code == 0, result.output
    assert "prompts: catalog 50" in result.output
    assert len(pd.read_parquet(project / layout.PROMPTS_TABLE)) == 50


# ---- the published file's full shape (version 3.3) ------------------------------------------

#: Made-up wording of the subcategories and overt domains (the published file has three of each).
SUBCATEGORIES = ("food and drink", "faith and custom", "gesture")
OVERT_DOMAINS = ("made-up domain one", "made-up domain two", "made-up domain three")


def published_document() -> dict[str, Any]:
    """The published file's shape exactly, with made-up text: ``version`` "3.3",
    ``description``, ``total_prompts`` 54, ``experiment_scale`` (counts, and one text value),
    categories A-E as ``{name, description, expected_refusal, count}`` with
    ``expected_disparity`` on one of them, and 54 prompts ``{id, category, prompt,
    hypothesis}``, with ``subcategory`` on the C prompts and ``overt_domain`` on the E prompts."""
    categories: dict[str, Any] = {
        letter: {"name": f"Made-up category {letter}",
                 "description": f"Made-up description of {letter} – with a non-ASCII dash.",
                 "expected_refusal": refusal, "count": COUNTS[letter]}
        for letter, refusal in zip(COUNTS, ("<2%", "variable by group", "5-15%",
                                            "medium, with erasure", "high"), strict=True)}
    categories["C"]["expected_disparity"] = "> 3pp between groups"
    entries: list[dict[str, Any]] = []
    for letter, n in COUNTS.items():
        for i in range(1, n + 1):
            entry: dict[str, Any] = {"id": f"{letter}{i:02d}", "category": letter,
                                     "prompt": f"Made-up edit instruction {letter}{i:02d}.",
                                     "hypothesis": f"made_up_{letter.lower()}_{i}"}
            if letter == "C":
                entry["subcategory"] = SUBCATEGORIES[(i - 1) % 3]
            if letter == "E":
                entry["overt_domain"] = OVERT_DOMAINS[(i - 1) % 3]
            entries.append(entry)
    return {"version": "3.3", "description": "Made-up prompt set of the published shape",
            "total_prompts": 54,
            "experiment_scale": {"source_images": 84, "prompts_per_image": 54,
                                 "requests_per_model": 4536, "total_models": 3,
                                 "note": "made-up text value"},
            "categories": categories, "prompts": entries}


def published_bytes(document: dict[str, Any]) -> bytes:
    """``document`` laid out as the published file is: the head indented, one prompt per line,
    a blank line between categories, UTF-8 with the non-ASCII characters as they are."""
    head = {k: v for k, v in document.items() if k != "prompts"}
    head_text = json.dumps(head, indent=2, ensure_ascii=False)[:-2]  # without the closing "\n}"
    entries = document["prompts"]
    lines = []
    for index, entry in enumerate(entries):
        if index and entry.get("category") != entries[index - 1].get("category"):
            lines.append("")
        lines.append("    " + json.dumps(entry, ensure_ascii=False)
                     + ("," if index < len(entries) - 1 else ""))
    body = "\n".join(lines)
    return (head_text + ',\n  "prompts": [\n' + body + "\n  ]\n}\n").encode("utf-8")


@pytest.fixture
def published_file(tmp_path: Path) -> Path:
    path = tmp_path / "i2i_prompts.json"
    path.write_bytes(published_bytes(published_document()))
    return path


def test_the_published_layout_is_the_document() -> None:
    data = published_bytes(published_document())
    assert json.loads(data.decode("utf-8")) == published_document()
    assert "–".encode() in data and b'\n\n    {"id": "B01"' in data


def test_the_published_file_imports_through_the_cli_unchanged(project: Path,
                                                              published_file: Path) -> None:
    before = published_file.read_bytes()
    result = CliRunner().invoke(app, ["prompts", "import-study", str(published_file)])
    assert result.exit_code == 0, result.output
    assert "54 prompts (A 10, B 10, C 10, D 10, E 14)" in result.output
    assert "version 3.3" in result.output
    assert hashlib.sha256(before).hexdigest()[:12] in result.output
    assert ("also kept in the catalog: top level description, experiment_scale, total_prompts; "
            "categories count, expected_disparity, expected_refusal; prompts overt_domain, "
            "subcategory") in result.output
    assert published_file.read_bytes() == before  # read, never rewritten
    catalog = load_catalog(project / "inputs" / "study" / "i2i_catalog.yaml")
    assert catalog.source is not None
    assert catalog.source.sha256 == hashlib.sha256(before).hexdigest()


def test_the_published_file_keeps_every_key_in_the_catalog(published_file: Path,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "catalog.yaml"
    done = import_study(published_file, out)
    assert done.sha256 == hashlib.sha256(published_file.read_bytes()).hexdigest()
    assert done.per_category == COUNTS and done.version == "3.3"
    catalog = load_catalog(out)  # as the prompts stage reads it
    source = catalog.source
    assert source is not None and source.sha256 == done.sha256
    assert source.description == "Made-up prompt set of the published shape"
    assert source.total_prompts == 54
    assert source.experiment_scale == published_document()["experiment_scale"]
    assert source.metadata == {}
    published = published_document()
    for letter, category in catalog.categories.items():
        given = published["categories"][letter]
        assert (category.name, category.description, category.expected_refusal,
                category.count) == (given["name"], given["description"],
                                    given["expected_refusal"], given["count"])
        assert category.expected_disparity == given.get("expected_disparity", "")
        assert category.metadata == {}
    by_id = {p.id: p for p in catalog.prompts}
    assert len(by_id) == 54
    assert (by_id["C01"].subcategory, by_id["C05"].subcategory) == (
        SUBCATEGORIES[0], SUBCATEGORIES[1])
    assert (by_id["E01"].overt_domain, by_id["E14"].overt_domain) == (
        OVERT_DOMAINS[0], OVERT_DOMAINS[1])
    assert by_id["B04"].subcategory == by_id["B04"].overt_domain == ""
    assert by_id["E14"].hypothesis == "made_up_e_14"
    assert all(p.metadata == {} for p in catalog.prompts)

    rows = {r.prompt_id: r for r in catalog_prompt_records(catalog)}
    assert (rows["C02"].subcategory, rows["E03"].overt_domain) == (
        SUBCATEGORIES[1], OVERT_DOMAINS[2])
    main = catalog_prompt_records(catalog, None, list(MAIN_EXPERIMENT_IDS))
    assert [r.prompt_id for r in main] == list(MAIN_EXPERIMENT_IDS)


def test_keys_beyond_the_published_ones_are_kept_as_metadata(tmp_path: Path) -> None:
    document = published_document()
    document["license"] = {"name": "made-up", "year": 2026, "open": True}
    document["categories"]["B"]["notes"] = ["one", 2, None]
    document["prompts"][0]["reviewer_score"] = 0.5
    document["prompts"][25]["subcategory"] = 3  # not text, as published: kept, not a field
    document["experiment_scale"] = "about 13k requests"  # not an object: kept, not a field
    path = write_json(tmp_path / "i2i_prompts.json", document)
    out = tmp_path / "catalog.yaml"
    done = import_study(path, out)
    assert done.kept["top level"] == ["description", "experiment_scale", "license",
                                      "total_prompts"]
    assert "notes" in done.kept["categories"] and "reviewer_score" in done.kept["prompts"]
    catalog = load_catalog(out)
    assert catalog.source is not None
    assert catalog.source.metadata == {"experiment_scale": "about 13k requests",
                                       "license": {"name": "made-up", "year": 2026,
                                                   "open": True}}
    assert catalog.source.experiment_scale == {}
    assert catalog.categories["B"].metadata == {"notes": ["one", 2, None]}
    by_id = {p.id: p for p in catalog.prompts}
    assert by_id["A01"].metadata == {"reviewer_score": 0.5}
    assert (by_id["C06"].subcategory, by_id["C06"].metadata) == ("", {"subcategory": 3})


def test_the_old_shape_keeps_an_entry_key_it_does_not_know(tmp_path: Path) -> None:
    document = study_document()
    document["prompts"][12]["notes"] = "x"
    out = tmp_path / "catalog.yaml"
    import_study(write_json(tmp_path / "study.json", document), out)
    b03 = next(p for p in load_catalog(out).prompts if p.id == "B03")
    assert b03.metadata == {"notes": "x"}


def damaged(change: str) -> dict[str, Any]:
    """The published document with one defect."""
    document = published_document()
    entries = document["prompts"]
    if change == "truncated":
        del entries[-1]
    elif change == "category count":
        document["categories"]["E"]["count"] = 13
    elif change == "moved prompt":
        entries[20]["category"] = "B"  # C01 filed under B: B holds 11, C 9
    elif change == "count not a number":
        document["categories"]["B"]["count"] = "ten"
    elif change == "count a boolean":
        document["total_prompts"] = True
    elif change == "no prompt text":
        del entries[13]["prompt"]
    elif change == "no id":
        del entries[13]["id"]
    elif change == "category without a name":
        del document["categories"]["D"]["name"]
    elif change == "no prompts":
        document["prompts"] = []
    return document


@pytest.mark.parametrize(("change", "message"), [
    ("truncated", r"total_prompts is 54, but the file holds 53 prompts"),
    ("category count", r"categories\.E\.count is 13, but the file holds 14 prompts of "
                       r"category E"),
    ("moved prompt", r"categories\.B\.count is 10, but the file holds 11 prompts of category B"),
    ("count not a number", r"categories\.B\.count: Input should be a valid integer"),
    ("count a boolean", r"total_prompts: Input should be a valid integer"),
    ("no prompt text", r"prompts\[13\] \(id B04\)\.prompt: Field required"),
    ("no id", r"prompts\[13\] \(no id\)\.id: Field required"),
    ("category without a name", r"categories\.D\.name: Field required"),
    ("no prompts", r"has no prompts"),
])
def test_a_damaged_published_file_is_refused_naming_entry_and_field(
        tmp_path: Path, change: str, message: str) -> None:
    path = write_json(tmp_path / "i2i_prompts.json", damaged(change))
    out = tmp_path / "catalog.yaml"
    with pytest.raises(InputDataError, match=message) as err:
        import_study(path, out)
    assert str(path) in err.value.problem
    assert not out.exists()


def test_the_published_prompts_through_the_prompts_stage(project: Path,
                                                         published_file: Path) -> None:
    """Every category: the prompt records carry the C subcategories and E overt domains."""
    out = project / layout.STUDY_INPUTS / "i2i_catalog.yaml"
    import_study(published_file, out)
    ctx = update_params(project, lambda p: p["prompts"].update(
        catalog=str(layout.STUDY_INPUTS / "i2i_catalog.yaml"), categories=None, ids=None,
        synthesis=None))
    assert prompts.run(ctx).count == 54
    table = read_table(project / layout.PROMPTS_TABLE, PromptRecord).set_index("prompt_id")
    assert table.loc["C04", "subcategory"] == SUBCATEGORIES[0]
    assert table.loc["E02", "overt_domain"] == OVERT_DOMAINS[1]
    assert (table.loc["A01", "subcategory"], table.loc["A01", "overt_domain"]) == ("", "")


def test_old_prompt_rows_get_no_subcategory_or_overt_domain() -> None:
    row = {"prompt_id": "B03", "category": "B", "text": "x", "attribute": "occupation:ceo",
           "base_id": "B03", "congruent_with": "", "incongruent_with": "",
           "synthesis": "catalog", "catalog": "acrb-i2i-catalog@1", "mode": "i2i",
           "prompt_set": "catalog", "portraits": 1, "hypothesis": "H2", "experiment": "audit"}
    migrated = migrate(row, PromptRecord, 4)
    assert (migrated["subcategory"], migrated["overt_domain"]) == ("", "")
    PromptRecord.model_validate(migrated)


# ---- what JSON cannot read, control characters, repeated keys -------------------------------

def _text_of(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1)


@pytest.mark.parametrize(("damage", "message"), [
    # Python's int() refuses more than 4,300 digits (a ValueError inside json.loads).
    (lambda text: text.replace('"version": "3.3"', '"version": "3.3", "size": ' + "7" * 5000),
     r"cannot be read: it holds a number of 5,000 digits at line 2, more than the 4,300"),
    # 50,000 nested lists (a RecursionError inside json.loads).
    (lambda text: text.replace('"version": "3.3"',
                               '"version": "3.3", "x": ' + "[" * 50_000 + "]" * 50_000),
     r"cannot be read: it holds arrays and objects nested too deeply at line 2 \(50,001 levels"),
    # Brackets and digits inside a string are text, read as published.
    (lambda text: text.replace('"version": "3.3"',
                               '"version": "3.3", "note": "' + "[" * 500 + "9" * 5000 + '"'),
     None),
], ids=["huge-number", "deep-nesting", "inside-a-string"])
def test_what_json_cannot_read_is_refused_naming_the_file(tmp_path: Path, damage: Any,
                                                          message: str | None) -> None:
    path = tmp_path / "study.json"
    path.write_text(damage(_text_of(study_document())), encoding="utf-8")
    out = tmp_path / "catalog.yaml"
    if message is None:
        import_study(path, out)
        return
    with pytest.raises(InputDataError, match=message) as err:
        import_study(path, out)
    assert str(path) in err.value.problem and err.value.fix
    assert not out.exists()


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from acrb import yaml_input

    path = write_json(tmp_path / "study.json", study_document())
    monkeypatch.setattr(yaml_input, "MAX_INPUT_BYTES", path.stat().st_size - 1)
    with pytest.raises(InputDataError, match=r"study prompt file .*study\.json is 0\.0 MiB, "
                       r"more than the 0 MiB an input file may have"):
        import_study(path, tmp_path / "catalog.yaml")


@pytest.mark.parametrize(("raw", "message"), [
    # As JSON escapes: valid JSON, so only the field check can refuse them.
    ('"prompt": "Made-up edit\\u0000 instruction B03."',
     r"prompts\[12\] \(id B03\)\.prompt: text holds the control character U\+0000 at "
     r"character 13"),
    ('"hypothesis": "H2\\u001b[31m"',
     r"prompts\[12\] \(id B03\)\.hypothesis: text holds the control character U\+001B"),
    ('"prompt": "Made-up edit\\r instruction B03."', r"\(id B03\)\.prompt: .*U\+000D"),
    ('"prompt": "Made-up edit\\u0085 instruction B03."', r"\(id B03\)\.prompt: .*U\+0085"),
    # A raw NUL byte in the file: named by entry and field, not by the parser's column.
    ('"prompt": "Made-up edit\x00 instruction B03."',
     r"prompts\[12\] \(id B03\)\.prompt: text holds the control character U\+0000"),
    ('"id": "B\\u000003"', r"prompts\[12\] \(id 'B\\x0003'\)\.id: text holds .*U\+0000"),
], ids=["nul-escaped", "escape-sequence", "carriage-return", "c1-control", "nul-byte",
        "nul-in-id"])
def test_control_characters_are_refused_naming_prompt_and_field(tmp_path: Path, raw: str,
                                                                message: str) -> None:
    document = study_document()
    entry = document["prompts"][12]
    assert entry["id"] == "B03"
    key = raw.split('"')[1]
    entry[key] = "PLACEHOLDER"
    text = _text_of(document).replace(f'"{key}": "PLACEHOLDER"', raw)
    path = tmp_path / "study.json"
    path.write_text(text, encoding="utf-8")
    out = tmp_path / "catalog.yaml"
    with pytest.raises(InputDataError, match=message) as err:
        import_study(path, out)
    assert str(path) in err.value.problem and "\x00" not in str(err.value)
    assert "control character but tab and line feed" in str(err.value.fix)
    assert not out.exists()


def test_tabs_and_line_breaks_in_a_prompt_are_kept(tmp_path: Path) -> None:
    document = study_document()
    document["prompts"][12]["prompt"] = "Made-up edit\tinstruction,\nover two lines."
    path = write_json(tmp_path / "study.json", document)
    out = tmp_path / "catalog.yaml"
    import_study(path, out)
    assert load_catalog(out).prompts[12].text == "Made-up edit\tinstruction,\nover two lines."


def test_a_key_repeated_in_an_entry_is_refused_naming_the_entry(tmp_path: Path) -> None:
    text = _text_of(study_document()).replace(
        '"prompt": "Made-up edit instruction B03."',
        '"prompt": "Made-up edit instruction B03.", "prompt": "Another."')
    path = tmp_path / "study.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputDataError, match=r"prompts\[12\] \(id B03\): key 'prompt' appears "
                       r"twice in one object \(JSON would keep only the last\)"):
        import_study(path, tmp_path / "catalog.yaml")
