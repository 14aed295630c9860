"""Editors and generators side by side: the shared key namespace, T2I requests planned and
generated with no source, and requests that show an editor two portraits."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from acrb import layout
from acrb.config import PairingParams
from acrb.errors import AcrbError, ConfigError
from acrb.journal import RecordStore
from acrb.records import GenerationRecord, PromptRecord, SourceRecord, read_table
from acrb.registry import EDITORS, GENERATORS, load_model, model_registry
from acrb.stages import generate, plan, prompts, sources
from acrb.stages.context import StageContext
from acrb.stages.plan import partners
from acrb.storage import load_rgb
from tests.conftest import CATALOG, repo_params, write_params
from tests.editor_contract import (
    PairEditor,
    RecordingEditor,
    RecordingGenerator,
    assert_generation_request_carries_no_labels,
    assert_request_carries_no_labels,
)

T2I_KEY = "test:recording-t2i"
PAIR_KEY = "test:pair-editor"
ONE_KEY = "test:one-image-editor"


@pytest.fixture
def test_models() -> Iterator[None]:
    GENERATORS.register(T2I_KEY, "tests.editor_contract:RecordingGenerator")
    EDITORS.register(PAIR_KEY, "tests.editor_contract:PairEditor")
    EDITORS.register(ONE_KEY, "tests.editor_contract:RecordingEditor")
    RecordingGenerator.forget()
    RecordingEditor.forget()
    yield
    GENERATORS.unregister(T2I_KEY)
    EDITORS.unregister(PAIR_KEY)
    EDITORS.unregister(ONE_KEY)
    RecordingGenerator.forget()
    RecordingEditor.forget()


def test_model_keys_share_one_namespace(test_models: None) -> None:
    assert model_registry(T2I_KEY) is GENERATORS and model_registry(PAIR_KEY) is EDITORS
    assert load_model(T2I_KEY) is RecordingGenerator and load_model(PAIR_KEY) is PairEditor
    with pytest.raises(ConfigError) as err:
        model_registry("no-such:model")
    assert "editors: " in err.value.fix and "generators: " in err.value.fix
    assert T2I_KEY in err.value.fix and PAIR_KEY in err.value.fix
    GENERATORS.register(PAIR_KEY, "tests.editor_contract:RecordingGenerator")
    try:
        with pytest.raises(ConfigError, match="both an editor and a generator"):
            model_registry(PAIR_KEY)
    finally:
        GENERATORS.unregister(PAIR_KEY)


def test_builtin_model_keys_are_unique_across_kinds() -> None:
    assert not set(EDITORS.keys()) & set(GENERATORS.keys())


def run_until_plan(project: Path, models: dict[str, dict[str, str]],
                   extra: dict[str, object] | None = None) -> StageContext:
    path = write_params(project, extra or {})
    params = yaml.safe_load(path.read_text())
    params["models"] = models  # only these models: the simulated ones take one portrait
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    ctx = StageContext.load(project / "params.yaml", project)
    sources.run(ctx)
    prompts.run(ctx)
    plan.run(ctx)
    return ctx


def test_a_generator_gets_the_t2i_prompts_with_no_source(project: Path,
                                                         test_models: None) -> None:
    ctx = run_until_plan(project, {"t2i": {"key": T2I_KEY, "revision": "r1"},
                                   "one": {"key": ONE_KEY, "revision": "r1"}})
    planned = ctx.model_requests("t2i").set_index("request_id")
    prompts_table = read_table(project / layout.PROMPTS_TABLE, PromptRecord)
    t2i_prompts = prompts_table[prompts_table["mode"] == "t2i"]
    assert len(planned) == len(t2i_prompts) == 2500
    assert set(planned["mode"]) == {"t2i"}
    assert (planned["source_id"] == "").all() and (planned["race"] == "").all()
    assert set(planned["base_id"]) == set(t2i_prompts["base_id"])
    # The editors of the same plan still get sources x I2I prompts.
    editor_rows = ctx.model_requests("one")
    assert set(editor_rows["mode"]) == {"i2i"} and (editor_rows["source_id"] != "").all()

    summary = generate.run(ctx, "t2i")
    received = RecordingGenerator.received
    assert summary.generated == len(received) == 2500
    for request in received:
        assert_generation_request_carries_no_labels(request)
        assert request.prompt == planned.loc[request.request_id, "prompt_text"]
    assert RecordingGenerator.designs == [], "the simulated channel was opened to a real model"
    table = read_table(project / layout.generations_table("t2i"), GenerationRecord)
    refused = table[table["status"] == "refused"]
    assert len(refused) and set(refused["refusal_code"]) == {"test_policy"}
    ok = table[table["status"] == "ok"]
    assert (ok["cost_usd"] == 0.01).all()
    assert load_rgb(project / ok["image_path"].iloc[0]).shape == (8, 8, 3)


def test_a_generator_without_t2i_prompts_stops_the_plan(project: Path,
                                                        test_models: None) -> None:
    with pytest.raises(ConfigError, match="no T2I prompts") as err:
        run_until_plan(project, {"t2i": {"key": T2I_KEY, "revision": "r1"}},
                       {"prompts": {"synthesis": {"modes": ["i2i"]}}})
    assert "prompts.synthesis.modes" in err.value.fix


def pair_catalog(folder: Path) -> Path:
    """The I2I catalog plus one instruction that shows two portraits."""
    catalog = yaml.safe_load(CATALOG.read_text())
    first = catalog["prompts"][0]
    catalog["prompts"].append({**first, "id": "pair-1", "portraits": 2,
                               "text": "Make the person on the left the manager of the other"})
    path = folder / "pair_catalog.yaml"
    path.write_text(yaml.safe_dump(catalog, sort_keys=False))
    return path


def test_an_editor_gets_two_portraits_paired_by_gender(project: Path,
                                                       test_models: None) -> None:
    catalog = pair_catalog(project)
    ctx = run_until_plan(project, {"pair": {"key": PAIR_KEY, "revision": "r1"}},
                         {"prompts": {"catalog": str(catalog)}})
    planned = ctx.model_requests("pair").set_index("request_id")
    paired = planned[planned["prompt_id"] == "pair-1"]
    # 8 sources (2 races x 2 genders x 2 ages): each is first once, its partner the source of
    # the other gender in the same race and age.
    assert len(paired) == 8
    sources_table = read_table(project / layout.SOURCES_TABLE, SourceRecord)
    by_id = sources_table.set_index("source_id")
    for _, row in paired.iterrows():
        (other,) = json.loads(row["extra_sources"])
        partner = by_id.loc[other["source_id"]]
        assert partner["gender"] != row["gender"]
        assert (partner["race"], partner["age"]) == (row["race"], row["age"])
        assert other["sha256"] == partner["sha256"]
    single = planned[planned["prompt_id"] != "pair-1"]
    assert (single["extra_sources"] == "").all()

    generate.run(ctx, "pair")
    two = [r for r in RecordingEditor.received if r.request_id in paired.index]
    assert len(two) == 8
    for request in two:
        assert_request_carries_no_labels(request)
        assert len(request.source_images) == 2
        (other,) = json.loads(paired.loc[request.request_id, "extra_sources"])
        assert np.array_equal(request.extra_images[0], load_rgb(project / other["path"]))
    assert all(len(r.source_images) == 1 for r in RecordingEditor.received
               if r.request_id not in paired.index)


def test_an_editor_of_one_image_refuses_a_pair_at_planning_time(project: Path,
                                                               test_models: None) -> None:
    catalog = pair_catalog(project)
    with pytest.raises(ConfigError, match="takes one source image per request") as err:
        run_until_plan(project, {"one": {"key": ONE_KEY, "revision": "r1"}},
                       {"prompts": {"catalog": str(catalog)}})
    assert "'one'" in err.value.problem and "requests with 2" in err.value.problem


def test_partners_follow_the_pairing_rule() -> None:
    people = [
        {"source_id": "a", "race": "Black", "gender": "Male", "age": "20s"},
        {"source_id": "c", "race": "Black", "gender": "Female", "age": "20s"},
        {"source_id": "b", "race": "Black", "gender": "Female", "age": "20s"},
        {"source_id": "d", "race": "White", "gender": "Female", "age": "20s"},
        {"source_id": "e", "race": "White", "gender": "Male", "age": "70plus"},
    ]
    rule = PairingParams()
    assert [p["source_id"] for p in partners(people[0], people, 2, rule) or []] == ["b"]
    assert [p["source_id"] for p in partners(people[1], people, 2, rule) or []] == ["a"]
    assert partners(people[3], people, 2, rule) is None  # no White Male in their 20s
    assert partners(people[4], people, 2, rule) is None
    by_race = PairingParams(dimension="race", groups=["Black", "White"], match=["gender"])
    assert [p["source_id"] for p in partners(people[0], people, 2, by_race) or []] == ["e"]


def wrapper_python(folder: Path, log: Path | None = None, status: int | None = None) -> Path:
    """An executable standing for another environment's interpreter: it logs its arguments
    and the delegation marker, then exits with ``status`` or runs this interpreter."""
    script = folder / "other-env" / "bin" / "python"
    script.parent.mkdir(parents=True)
    lines = ["#!/bin/sh"]
    if log is not None:
        lines.append(f'echo "$@ marker=${generate.DELEGATED_ENV}" >> "{log}"')
    lines.append(f"exit {status}" if status is not None else f'exec "{sys.executable}" "$@"')
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script


def test_generate_runs_in_the_environment_a_model_names(project: Path, test_models: None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    log = project / "calls.log"
    wrapper_python(project, log, status=3)
    ctx = run_until_plan(project, {"other": {"key": ONE_KEY, "revision": "r1",
                                             "python": "other-env/bin/python"}})
    monkeypatch.delenv(generate.DELEGATED_ENV, raising=False)
    status = generate.delegate(ctx, "other", Path("params.yaml"), generate.Shard(1, 2))
    assert status == 3
    assert log.read_text().split() == ["-m", "acrb", "generate", "--model", "other",
                                       "--params", "params.yaml", "--shard", "1/2", "marker=1"]
    # Inside the delegated process (the marker set), the stage runs the model itself.
    monkeypatch.setenv(generate.DELEGATED_ENV, "1")
    assert generate.delegate(ctx, "other", Path("params.yaml")) is None


def test_a_delegated_generate_writes_the_records(project: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    wrapper_python(project)
    ctx = run_until_plan(project, {"fair": {"key": "synthetic:fair",
                                            "config": repo_params()["models"]["synthetic-fair"]
                                            ["config"], "python": "other-env/bin/python"}})
    monkeypatch.delenv(generate.DELEGATED_ENV, raising=False)
    assert generate.delegate(ctx, "fair", Path("params.yaml")) == 0
    table = read_table(project / layout.generations_table("fair"), GenerationRecord)
    assert len(table) == len(ctx.model_requests("fair"))


def test_a_missing_environment_is_named(project: Path, test_models: None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = run_until_plan(project, {"other": {"key": ONE_KEY, "revision": "r1",
                                             "python": ".venv-missing/bin/python"}})
    monkeypatch.delenv(generate.DELEGATED_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"models.other.python is \.venv-missing/bin/python"):
        generate.delegate(ctx, "other", Path("params.yaml"))


def test_the_config_that_changes_outputs_names_the_request(project: Path,
                                                           test_models: None) -> None:
    from acrb.models.image_api import ApiImageConfig

    class Configured(RecordingGenerator):
        Config = ApiImageConfig

    config = ApiImageConfig(model="m-1")
    assert Configured.output_config(config) == {"model": "m-1"}
    ids = {}
    for name, changes in {"base": {}, "other-model": {"model": "m-2"},
                          "faster": {"concurrency": 16, "timeout_s": 5.0}}.items():
        changed = ApiImageConfig(**{"model": "m-1", **changes})
        ids[name] = plan.request_id_for(
            model_key=T2I_KEY, model_revision="r1", settings={}, source_sha256="",
            prompt_text="a doctor", seed=0, arm="none",
            output_config=Configured.output_config(changed))
    assert ids["other-model"] != ids["base"]
    assert ids["faster"] == ids["base"]  # how fast it runs changes nothing it returns


class UnloadableGenerator(RecordingGenerator):
    """A generator whose weights are not there."""

    def load(self) -> None:
        raise OSError("weights not found in the cache")


def test_a_model_that_cannot_load_stops_generate(project: Path, test_models: None) -> None:
    GENERATORS.register("test:unloadable", "tests.test_model_kinds:UnloadableGenerator")
    try:
        ctx = run_until_plan(project, {"broken": {"key": "test:unloadable", "revision": "r1"}})
        with pytest.raises(AcrbError, match="could not be loaded: OSError: weights not found"):
            generate.run(ctx, "broken")
    finally:
        GENERATORS.unregister("test:unloadable")
    store = RecordStore(project / layout.generations_dir("broken"), GenerationRecord)
    assert store.load() == {}, "no request may be written off as an error"
    assert not store.records_file.exists() and not store.journal_dir.exists()
