"""Feature prompts: the label check, the three describers and the `features` stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from acrb import layout
from acrb.config import FeaturesParams, LLMBackendParams
from acrb.errors import InputDataError
from acrb.features.describe import (
    AnswerRejected,
    VLMDescriber,
    feature_text,
    load_instructions,
    parse_answer,
)
from acrb.features.labels import demographic_labels
from acrb.features.mapping import read_mapping
from acrb.features.simulated import describe_pixels, eye_colour_name, hair_colour_name
from acrb.records import (
    FEATURE_DIMENSIONS,
    FeaturePromptRecord,
    SourceRecord,
    read_table,
)
from acrb.sources.portraits import draw_portrait
from acrb.stages import features, sources
from tests.conftest import REPO, update_params
from tests.llm_servers import FakeLLMServer, Scripted, openai_reply

INSTRUCTIONS = REPO / "src" / "acrb" / "features" / "data" / "describer-v1.yaml"

#: A clean answer in the describer's format (made-up wording).
CLEAN = {
    "skin_tone": "medium tan skin with warm undertones",
    "facial_structure": "an oval face with high cheekbones",
    "eyes": "dark brown almond-shaped eyes",
    "nose": "a straight nose with a rounded tip",
    "lips": "full lips of a muted rose colour",
    "hair": "short curly black hair",
    "distinctive_features": "a thin moustache",
}


# ---- the label check ---------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "label"), [
    ("a Black man with short hair", "black man"),
    ("a white woman", "white woman"),
    ("a black young man", "black young man"),
    ("of black descent", "black descent"),
    ("she is white", "she is white"),
    ("the person appears to be Black", "person appears to be black"),
    ("pale white skin", "white skin"),
    ("black-skinned", "black-skinned"),
    ("skin is very white", "skin is very white"),
    ("typical East Asian features", "east asian"),
    ("an African-American face", "african-american"),
    ("Asian-looking eyes", "asian"),
    ("a Caucasian jaw", "caucasian"),
    ("Hispanic complexion", "hispanic"),
    ("a Latina woman", "latina"),
    ("of Indian origin", "indian"),
    ("Middle Eastern nose", "middle eastern"),
    ("a Nigerian man", "nigerian"),
    ("ethnic features", "ethnic"),
])
def test_labels_are_found(text: str, label: str) -> None:
    assert label in demographic_labels(text)


@pytest.mark.parametrize("text", [
    "short black hair", "jet-black hair", "the hair is black", "Her hair is black",
    "black eyebrows and dark brown eyes", "black-rimmed glasses", "a black beard",
    "the whites of the eyes are clear", "white teeth", "white hair at the temples",
    "a white-haired man", "brown skin with warm undertones", "deep brown skin", "brown eyes",
    "a red beard", "yellowish undertones", "an afro", "a French braid", "a Roman nose",
    "a man with black hair", "a woman in a white shirt",
])
def test_colour_words_for_hair_eyes_and_skin_depth_are_not_labels(text: str) -> None:
    assert demographic_labels(text) == []


# ---- the simulated describer -------------------------------------------------------------------


def test_simulated_describer_is_deterministic_label_free_and_reads_the_skin() -> None:
    light = draw_portrait("White", "Female", "20s", 128, 3, skin_tone=1).pixels
    dark = draw_portrait("White", "Female", "20s", 128, 3, skin_tone=10).pixels
    first = describe_pixels(light)
    assert describe_pixels(light.copy()) == first
    assert tuple(first) == FEATURE_DIMENSIONS and all(first.values())
    other = describe_pixels(dark)
    # Same seed and cell, only the skin differs: so does the skin description.
    assert first["skin_tone"] != other["skin_tone"]
    assert "fair" in first["skin_tone"] and "deep brown" in other["skin_tone"]
    for described in (first, other):
        assert demographic_labels(" ".join(described.values())) == []


def test_simulated_describer_never_sees_the_labels() -> None:
    # The same pixels under another race label describe the same: only pixels are read.
    portrait = draw_portrait("Black", "Male", "50s", 96, 11)
    assert describe_pixels(portrait.pixels) == describe_pixels(
        draw_portrait("Black", "Male", "50s", 96, 11).pixels)
    texts = {feature_text(describe_pixels(draw_portrait(race, "Male", "30s", 64, 2).pixels),
                          FeaturesParams().template)
             for race in ("Black", "EastAsian", "White", "Indian")}
    assert all(demographic_labels(t) == [] for t in texts)


def test_colour_names_on_the_placeholder_palette() -> None:
    import numpy as np
    from skimage.color import rgb2lab

    def lab(rgb: tuple[int, int, int]) -> Any:
        return rgb2lab(np.array(rgb, dtype=np.uint8).reshape(1, 1, 3))[0, 0]

    assert hair_colour_name(lab((10, 9, 11))) == "black"
    assert hair_colour_name(lab((45, 30, 22))) == "dark brown"
    assert hair_colour_name(lab((126, 56, 30))) == "auburn"
    assert hair_colour_name(lab((205, 175, 115))) == "blond"
    assert hair_colour_name(lab((228, 228, 232))) == "white"
    assert eye_colour_name(lab((80, 100, 60))) == "green"
    assert eye_colour_name(lab((70, 90, 110))) == "blue-grey"
    assert eye_colour_name(lab((58, 38, 26))) == "dark brown"


# ---- the VLM describer -------------------------------------------------------------------------


def http_params(server: FakeLLMServer, **changes: Any) -> LLMBackendParams:
    values: dict[str, Any] = {"kind": "openai", "model": "describer-model",
                              "base_url": server.base_url, "api_key_env": None,
                              "temperature": 0.0, "max_tokens": 400, "timeout_s": 2.0,
                              "max_attempts": 1, "backoff_s": 0.0, "concurrency": 1,
                              "requests_per_minute": 60_000.0}
    values.update(changes)
    return LLMBackendParams(**values)


def portrait_png(seed: int) -> bytes:
    from acrb.storage import encode_png

    return encode_png(draw_portrait("Latino", "Female", "30s", 64, seed).pixels)


def test_parse_answer_refuses_missing_extra_long_and_labelled() -> None:
    instructions = load_instructions(INSTRUCTIONS)
    assert parse_answer(f"```json\n{json.dumps(CLEAN)}\n```", instructions) == CLEAN
    with pytest.raises(AnswerRejected, match="no JSON object"):
        parse_answer("I see a person.", instructions)
    with pytest.raises(AnswerRejected, match="lips"):
        parse_answer(json.dumps({k: v for k, v in CLEAN.items() if k != "lips"}), instructions)
    with pytest.raises(AnswerRejected, match="ethnicity"):
        parse_answer(json.dumps({**CLEAN, "ethnicity": "x"}), instructions)
    with pytest.raises(AnswerRejected, match="nose"):
        parse_answer(json.dumps({**CLEAN, "nose": "a" * 500}), instructions)
    with pytest.raises(AnswerRejected, match="skin_tone: white skin"):
        parse_answer(json.dumps({**CLEAN, "skin_tone": "white skin"}), instructions)


def test_vlm_labelled_answer_is_retried_and_the_cache_makes_a_rerun_free(
        tmp_path: Path) -> None:
    from acrb.registry import open_chat_client

    instructions = load_instructions(INSTRUCTIONS)
    labelled = {**CLEAN, "facial_structure": "typical Hispanic facial structure"}
    images = {"a": portrait_png(1), "b": portrait_png(2)}
    with FakeLLMServer("openai") as server:
        server.push(Scripted(body=openai_reply(json.dumps(labelled))),
                    Scripted(body=openai_reply(json.dumps(CLEAN))),
                    Scripted(body=openai_reply(json.dumps(CLEAN))))
        with open_chat_client("features", http_params(server), tmp_path) as client:
            outcomes = VLMDescriber(client, instructions, retries=2).describe_many(images)
        assert server.request_count == 3
        retry = server.requests[2].body["messages"]
        assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"]
        assert "hispanic" in retry[3]["content"].lower()
        assert "response_format" in server.requests[0].body
        first, second = outcomes
        assert first.dimensions == CLEAN and first.attempts == 2
        assert len(first.rejected) == 1 and "facial_structure: hispanic" in first.rejected[0]
        assert second.dimensions == CLEAN and second.attempts == 1 and not second.rejected

        # The same requests again: every reply, the refused one included, is cached.
        with open_chat_client("features", http_params(server), tmp_path) as client:
            again = VLMDescriber(client, instructions, retries=2).describe_many(images)
            assert client.request_count == 0
        assert server.request_count == 3
        assert [o.dimensions for o in again] == [CLEAN, CLEAN]
        assert [o.attempts for o in again] == [0, 0] and again[0].rejected == first.rejected


def test_vlm_still_labelled_after_the_retries_is_a_failure(tmp_path: Path) -> None:
    from acrb.registry import open_chat_client

    labelled = json.dumps({**CLEAN, "hair": "hair typical of a black woman"})
    with FakeLLMServer("openai") as server:
        server.push(*[Scripted(body=openai_reply(labelled)) for _ in range(2)])
        with open_chat_client("features", http_params(server), tmp_path) as client:
            [outcome] = VLMDescriber(client, load_instructions(INSTRUCTIONS), retries=1
                                     ).describe_many({"x": portrait_png(3)})
        assert server.request_count == 2
    assert outcome.dimensions is None and len(outcome.rejected) == 2
    assert "black woman" in outcome.failure


# ---- the mapping importer ----------------------------------------------------------------------


def write_json(path: Path, value: Any) -> Path:
    path.write_text(value if isinstance(value, str) else json.dumps(value), encoding="utf-8")
    return path


def cell_sources(*cells: str) -> list[SourceRecord]:
    """Sources named by their design cell, as the curated FairFace sources are."""
    rows = []
    for cell in cells:
        race, gender, age = cell.split("_")
        rows.append(SourceRecord(source_id=cell, path=f"{cell}.png", sha256="0" * 64, race=race,
                                 gender=gender, age=age, dataset="test", origin=cell,
                                 width=64, height=64))
    return rows


def test_mapping_import_keeps_the_run_sources_counts_extras_and_warns_on_labels(
        tmp_path: Path) -> None:
    path = write_json(tmp_path / "mapping.json", {
        "Black_Male_20s": "The person has deep brown skin and short coiled hair.",
        "White_Female_70plus": "A Caucasian woman with silver hair.",
        "Indian_Male_30s": "Unused here."})
    imported = read_mapping(path, cell_sources("Black_Male_20s", "White_Female_70plus"))
    assert [r.source_id for r in imported.records] == ["Black_Male_20s", "White_Female_70plus"]
    assert imported.records[0].text == "The person has deep brown skin and short coiled hair."
    assert all(r.origin == "mapping" for r in imported.records)
    assert imported.describer.startswith("mapping.json@") and len(imported.describer) > 70
    assert imported.labelled == {"White_Female_70plus": ["caucasian"]}
    assert imported.extra_ids == 1


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not valid JSON"),
    (["a list"], "not an object"),
    ({"Black_Male_20s": 3}, "of type int, not a string"),
    ({"Black_Male_20s": "   "}, "is empty"),
    ('{"Black_Male_20s": "a", "Black_Male_20s": "b"}', "repeats source id"),
    ({"White_Male_20s": "a prompt"}, "no feature prompt for 1 of"),
])
def test_bad_mappings_are_refused(tmp_path: Path, content: Any, message: str) -> None:
    path = write_json(tmp_path / "mapping.json", content)
    with pytest.raises(InputDataError, match=message):
        read_mapping(path, cell_sources("Black_Male_20s"))


# ---- the stage ---------------------------------------------------------------------------------


def test_stage_writes_one_simulated_prompt_per_source(project: Path) -> None:
    ctx = update_params(project, lambda p: p["sources"].update(ages=["20s"]))
    sources.run(ctx)
    summary = features.run(ctx)
    table = read_table(project / layout.FEATURES_TABLE, FeaturePromptRecord)
    source_table = pd.read_parquet(project / layout.SOURCES_TABLE)
    assert sorted(table["source_id"]) == sorted(source_table["source_id"]) == sorted(
        table["source_id"].unique())
    assert summary.count == len(table) == 4
    assert set(table["origin"]) == {"simulated"}
    assert (table.set_index("source_id")["source_sha256"]
            == source_table.set_index("source_id")["sha256"]).all()
    assert all(set(json.loads(d)) == set(FEATURE_DIMENSIONS) for d in table["dimensions"])
    assert all(t.endswith("keep these features unchanged.") for t in table["text"])
    written = json.loads((project / layout.FEATURES_DIR / "summary.json").read_text())
    assert written["simulation"] is True and written["count"] == 4


def test_stage_with_a_vlm_and_without_features(project: Path, monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("ACRB_CACHE_DIR", str(tmp_path / "cache"))
    with FakeLLMServer("openai", responder=lambda _: Scripted(
            body=openai_reply(json.dumps(CLEAN)))) as server:
        backend = http_params(server).model_dump()
        ctx = update_params(project, lambda p: (
            p["sources"].update(ages=["20s"], races=["Black"]),
            p.update(features={"describer": "vlm", "vlm": backend,
                              "instructions": str(INSTRUCTIONS)})))
        sources.run(ctx)
        summary = features.run(ctx)
        assert server.request_count == 2 and summary.requests_sent == 2
        assert (tmp_path / "cache" / "features").is_dir()
        assert features.run(ctx).requests_sent == 0  # cached
    table = read_table(project / layout.FEATURES_TABLE, FeaturePromptRecord)
    assert set(table["origin"]) == {"vlm"} and len(table) == 2
    assert table["text"].iloc[0] == feature_text(CLEAN, FeaturesParams().template)

    ctx = update_params(project, lambda p: p.pop("features"))
    assert features.run(ctx).count == 0
    assert read_table(project / layout.FEATURES_TABLE, FeaturePromptRecord).empty


def test_stage_names_sources_the_mapping_lacks(project: Path) -> None:
    write_json(project / "mapping.json", {"White_Male_20s": "short straight hair"})
    ctx = update_params(project, lambda p: (
        p["sources"].update(ages=["20s"], races=["White"]),
        p.update(features={"describer": "mapping", "mapping": "mapping.json"})))
    sources.run(ctx)
    with pytest.raises(InputDataError, match=r"syn-White-Female-20s-0 \(cell "
                       r"White_Female_20s\)") as error:
        features.run(ctx)
    assert "features.describer: vlm" in error.value.fix
    assert "syn-White-Male-20s-0" not in error.value.problem  # found by its cell


def test_params_refuse_an_unknown_template_field_and_a_missing_backend() -> None:
    with pytest.raises(ValueError, match="skin_colour"):
        FeaturesParams(template="The person has {skin_colour}.")
    with pytest.raises(ValueError, match="`vlm`"):
        FeaturesParams(describer="vlm")
    with pytest.raises(ValueError, match="`mapping`"):
        FeaturesParams(describer="mapping")


# ---- the label check compiled from its word lists (not the process's cached copy) ------------
#
# demographic_labels compiles the shipped lists once per process (label_check is cached), so
# these tests compile them anew: LabelCheck.load on the shipped file and on a small file of
# their own, each pattern at its edges.

SMALL_LABELS = """\
version: "3"
groups: [Asian, East Asian, african, African American, french, indian]
colour_labels: [black, White]
person_nouns: [man, woman, descent]
between: [young]
subjects: [he, she, person]
verbs: [is, looks, appears]
skin_words: [skin, skinned, complexion]
skin_labels: [white, black]
allowed: [french braid, indian ink]
"""


@pytest.fixture
def small_check(tmp_path: Path) -> Any:
    from acrb.features.labels import LabelCheck

    path = tmp_path / "labels.yaml"
    path.write_text(SMALL_LABELS, encoding="utf-8")
    return LabelCheck.load(path)


def test_a_labels_file_gives_its_version_and_digest(small_check: Any, tmp_path: Path) -> None:
    import hashlib

    assert small_check.version == 3
    assert small_check.sha256 == hashlib.sha256(
        (tmp_path / "labels.yaml").read_bytes()).hexdigest()


@pytest.mark.parametrize(("text", "labels"), [
    # A phrase wins over the word it starts with; words match whole, in any case.
    ("an African American woman", ["african american"]),
    ("an ASIAN face", ["asian"]),
    ("Eurasian", []),
    ("asians", []),
    ("Asian-looking eyes", ["asian"]),
    # A phrase's space may be a hyphen or several spaces; the label is given single-spaced.
    ("East-Asian eyes", ["east-asian"]),
    ("east   asian", ["east asian"]),
    # A colour before a person or descent word, with one word between at most.
    ("a Black young man", ["black young man"]),
    ("of white   descent", ["white descent"]),
    ("a black mane", []),
    ("a white old man", []),
    # A colour as what a person is.
    ("he is white", ["he is white"]),
    ("the person appears to be Black", ["person appears to be black"]),
    ("the hair is black", []),
    # A colour applied to skin.
    ("white skin", ["white skin"]),
    ("black-skinned", ["black-skinned"]),
    ("skin tone looks almost white", ["skin tone looks almost white"]),
    ("the complexion is black", ["complexion is black"]),
    # Allowed phrases are taken out first, where they stand.
    ("a French braid", []),
    ("Indian ink on an indian", ["indian"]),
    # In order of appearance, each once.
    ("a Black man, Asian-looking, and another black man", ["black man", "asian"]),
])
def test_each_pattern_of_a_small_labels_file(small_check: Any, text: str,
                                             labels: list[str]) -> None:
    assert small_check.find(text) == labels


def test_labels_that_start_together_are_ordered_by_their_start() -> None:
    from acrb.features.labels import LABELS_FILE, LabelCheck

    # "black american" (a colour before a person word) and "american" (a nationality) end
    # together; the one that starts first comes first.
    assert LabelCheck.load(LABELS_FILE).find("a black American") == ["black american",
                                                                       "american"]


@pytest.mark.parametrize("text", [
    "a Black man with short hair", "of black descent", "she is white", "pale white skin",
    "skin is very white", "typical East Asian features", "an African-American face",
    "Hispanic complexion", "a Nigerian man", "ethnic features", "a French braid",
    "short black hair", "the whites of the eyes are clear", "brown skin with warm undertones",
])
def test_the_shipped_lists_compiled_again_find_what_the_cached_check_finds(text: str) -> None:
    from acrb.features.labels import LABELS_FILE, LabelCheck, label_check

    label_check.cache_clear()
    assert LabelCheck.load(LABELS_FILE).find(text) == demographic_labels(text)
    assert label_check() is label_check()  # compiled once, then reused


@pytest.mark.parametrize(("text", "labels"), [
    ("A BLACK MAN", ["black man"]),
    ("She Is White", ["she is white"]),
    ("a Black-Skinned man", ["black-skinned"]),
    ("her Skin Tone Looks Almost White", ["skin tone looks almost white"]),
    ("the Complexion Is Black", ["complexion is black"]),
    ("A French Braid", []),
])
def test_every_pattern_of_the_shipped_lists_ignores_case(text: str, labels: list[str]) -> None:
    """Each of the check's patterns (group words, colour + person, subject + colour, colour +
    skin, skin + colour, the allowed phrases) matches whatever the capitals."""
    from acrb.features.labels import LABELS_FILE, LabelCheck

    assert LabelCheck.load(LABELS_FILE).find(text) == labels
