"""Data rules a planted bug once broke without any test failing (issue 31): every word of the
feature prompts' demographic label list, the version 3 -> 4 migration of a generation record
with every field set, and the face search's rule that a loose detector's box must be the
portrait's subject (checked on a drawn image, without the FairFace sample).

Each test fails with its bug planted (``benchmarks/planted_bugs.py``, the bugs
``label-word-dropped``, ``migration-drops-refusal-code`` and ``face-loose-box-anywhere``) and
passes without it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from acrb.detect import face
from acrb.features.labels import LABELS_FILE, demographic_labels
from acrb.records import (
    GENERATION_RUN_FIELDS,
    RECORD_TABLE_FIELD,
    RECORD_VERSION_FIELD,
    GenerationRecord,
    parse_record,
    upgrade_records,
)

# ---- the label list: every word, not a sample ------------------------------------------------

#: The group words of ``features/data/demographic_labels.yaml`` (version 1), written out here
#: so that a word deleted from the file fails a test: each must be found in a description.
GROUP_WORDS = (
    "african american", "african", "afro-caribbean", "alaska native", "arab", "arabic",
    "asian", "biracial", "caucasian", "caucasoid", "east asian", "european", "hispanic",
    "indian", "indigenous", "latin american", "latina", "latino", "latinx", "mediterranean",
    "middle eastern", "mixed race", "mixed-race", "mongoloid", "native american", "negroid",
    "nordic", "north african", "oriental", "pacific islander", "persian", "scandinavian",
    "semitic", "slavic", "south asian", "southeast asian", "sub-saharan", "west african",
    "ethnic", "ethnicity", "racial", "race", "nationality", "american", "bangladeshi",
    "brazilian", "british", "chinese", "colombian", "cuban", "dominican", "egyptian", "english",
    "ethiopian", "filipina", "filipino", "french", "german", "ghanaian", "greek", "haitian",
    "indonesian", "iranian", "iraqi", "irish", "italian", "jamaican", "japanese", "kenyan",
    "korean", "lebanese", "malaysian", "mexican", "moroccan", "nepali", "nigerian", "pakistani",
    "polish", "puerto rican", "russian", "saudi", "somali", "spanish", "sri lankan", "syrian",
    "thai", "turkish", "vietnamese",
)
COLOUR_LABELS = ("black", "white", "brown", "yellow", "red")
SKIN_LABELS = ("black", "white", "yellow", "red")
PERSON_NOUNS = (
    "man", "men", "woman", "women", "person", "persons", "people", "individual", "individuals",
    "guy", "guys", "girl", "girls", "boy", "boys", "male", "males", "female", "females", "lady",
    "ladies", "gentleman", "gentlemen", "adult", "adults", "child", "children", "kid", "kids",
    "teen", "teenager", "family", "americans", "descent", "heritage", "ancestry", "origin",
    "origins", "background", "community",
)


@pytest.mark.parametrize("word", GROUP_WORDS)
def test_every_group_word_is_a_label(word: str) -> None:
    assert demographic_labels(f"{word.title()} facial features, short dark hair") == [word]
    assert demographic_labels(f"a face with {word} features") == [word]


def test_the_shipped_list_keeps_every_word_and_each_of_its_words_is_found() -> None:
    shipped = yaml.safe_load(LABELS_FILE.read_text(encoding="utf-8"))
    assert set(GROUP_WORDS) <= set(shipped["groups"])
    assert set(COLOUR_LABELS) <= set(shipped["colour_labels"])
    assert set(SKIN_LABELS) <= set(shipped["skin_labels"])
    assert {*PERSON_NOUNS, "american"} <= set(shipped["person_nouns"])
    for word in shipped["groups"]:  # words added since: found too
        assert demographic_labels(f"{word.title()} facial features") == [word], word


@pytest.mark.parametrize("colour", COLOUR_LABELS)
def test_every_colour_is_a_label_before_every_person_noun(colour: str) -> None:
    for noun in PERSON_NOUNS:
        assert demographic_labels(f"a {colour} {noun} with short hair") == [f"{colour} {noun}"]
    # "american" is a person noun and a group word: both labels.
    assert demographic_labels(f"a {colour} american") == [f"{colour} american", "american"]
    assert demographic_labels(f"{colour} hair and {colour} eyebrows") == []


@pytest.mark.parametrize("colour", SKIN_LABELS)
def test_every_person_colour_is_a_label_on_skin(colour: str) -> None:
    for skin in ("skin", "skinned", "complexion"):
        assert demographic_labels(f"{colour} {skin}, round face") == [f"{colour} {skin}"]


# ---- generation records: version 3 -> 4 keeps every field but the run's measurements ---------


def generation_v3() -> dict[str, Any]:
    """A version-3 generation record with every field set to a value that is not its default
    (a refused API request: the provider's code and cost included), stamped as written."""
    return {RECORD_TABLE_FIELD: "generation", RECORD_VERSION_FIELD: 3,
            "request_id": "req-1", "model": "api-model", "status": "refused",
            "refusal_kind": "hard", "message": "blocked by the safety system",
            "image_path": "images/req-1.png", "image_sha256": "ab" * 32,
            "model_revision": "2025-01-01", "library_versions": '{"acrb":"1"}',
            "refusal_code": "content_policy_violation", "cost_usd": 0.04,
            "seconds": 3.5, "created_at": "2026-01-01T00:00:00Z", "peak_gpu_memory_mb": 812.0}


def expected_now(row: dict[str, Any]) -> dict[str, Any]:
    """A version-3 row read as the current version: the run's fields gone (version 4), no
    output version recorded (version 5)."""
    return {**{key: value for key, value in row.items()
               if key not in GENERATION_RUN_FIELDS | {RECORD_TABLE_FIELD, RECORD_VERSION_FIELD}},
            "output_version": None}


def test_a_version_3_generation_with_every_field_keeps_each_one_but_the_run_s() -> None:
    assert GenerationRecord.version == 5
    row = generation_v3()
    assert set(expected_now(row)) == set(GenerationRecord.model_fields)  # every field set
    record = parse_record(json.dumps(row), GenerationRecord)
    assert record.model_dump() == expected_now(row)


def test_upgrading_a_version_3_file_rewrites_every_field(tmp_path: Path) -> None:
    path = tmp_path / "req-1.json"
    row = generation_v3()
    path.write_text(json.dumps(row), encoding="utf-8")
    kept: dict[Path, dict[str, Any]] = {}
    upgrade_records([path], GenerationRecord, keep=kept.update)
    assert kept[path]["seconds"] == 3.5  # the run's values, handed over before rewriting
    rewritten = json.loads(path.read_text(encoding="utf-8"))
    assert rewritten[RECORD_VERSION_FIELD] == 5
    assert expected_now(rewritten) == expected_now(row)


# ---- the face search: a loose detector's box counts only as the portrait's subject -----------

SIDE = face.WORK_SIZE


class FakeCascade:
    """A cascade that finds ``box`` (in the searched image's pixels) only in the last-resort
    round (one detection window: ``minNeighbors`` 1) and nothing in any earlier round."""

    def __init__(self, box: tuple[int, int, int, int]) -> None:
        self.box = box

    def detectMultiScale(self, image: np.ndarray, *, scaleFactor: float, minNeighbors: int,
                         minSize: tuple[int, int]) -> list[tuple[int, int, int, int]]:
        return [self.box] if minNeighbors == 1 else []


def drawn_portrait() -> np.ndarray:
    """A grey square portrait already :data:`~acrb.detect.face.WORK_SIZE` px on a side, so
    that boxes need no scaling (what is in it is the fake cascades' to say)."""
    return np.full((SIDE, SIDE, 3), 150, dtype=np.uint8)


@pytest.fixture
def cascades(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(face, "_LOCATED", OrderedDict())  # no answer remembered from before

    def use(box: tuple[int, int, int, int]) -> None:
        monkeypatch.setattr(face, "_cascade", lambda name: FakeCascade(box))
    return use


def test_a_loose_detector_s_box_in_a_corner_is_no_face(cascades: Any) -> None:
    """Only the loosest detectors (one window) find anything, and it is a face-sized box in the
    top-left corner: a hand or a background face, not the subject. No face is found."""
    cascades((4, 4, SIDE // 3, SIDE // 3))
    assert face.detect_faces(drawn_portrait()[:, :, 0]) == ([], "")
    assert face.locate_face(drawn_portrait()) is None


def test_a_loose_detector_s_box_over_the_centre_is_the_face(cascades: Any) -> None:
    """The same detectors' box where a face-centred portrait's subject is: it is the face."""
    side = SIDE // 3
    box = (SIDE // 2 - side // 2, SIDE // 2 - side // 2, side, side)
    cascades(box)
    faces, detector = face.detect_faces(drawn_portrait()[:, :, 0])
    assert faces == [box] and detector.endswith(":n1")
    found = face.locate_face(drawn_portrait())
    assert found is not None and (found.x, found.y, found.width, found.height) == box
