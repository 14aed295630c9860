"""The diffusers adapters on tiny random-weight pipelines, on the CPU, offline.

Each adapter loads a tiny pipeline folder (tests/tiny_pipelines.py, built once per session)
through its registry key, as a user's params would name it (``hub_id`` = the folder, a pinned
revision), and runs 2 steps: directly, through the Editor/Generator contract, and through the
plan and generate stages of a tiny project. The checks: image shape and dtype, the generation
record (status, revision, library versions; its seconds in the timing log), equal pixels for
an equal seed and other pixels for another seed, the source-image limits at planning time, and
InstructPix2Pix's safety checker turning into a ``refused``/``safety_filter`` outcome.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("diffusers")

from acrb import layout
from acrb.errors import ConfigError
from acrb.models.base import (
    EditRequest,
    GenerationRequest,
    ImageModel,
)
from acrb.models.diffusion import DiffusersModel, forget_pipelines
from acrb.records import GenerationRecord, read_table
from acrb.registry import load_model
from acrb.sources.portraits import draw_portrait
from acrb.stages import generate, plan, prompts, sources
from acrb.stages.context import StageContext
from acrb.storage import load_rgb
from acrb.timings import read_timings, timings_path
from tests.conftest import write_params
from tests.editor_contract import EditorContract, GeneratorContract

REVISION = "tiny-random-1"
SIZE = 32  # output width and height
SOURCE = 64  # source portraits (FLUX.2 needs at least 64 px a side)


@dataclass(frozen=True)
class Spec:
    """How a registry key is tested: its tiny pipeline fixture and its config beyond hub_id."""

    key: str
    fixture: str
    config: dict[str, Any] = field(default_factory=dict)
    #: Source images one request may show, as the adapter declares.
    max_images: int = 1


COMMON = {"steps": 2, "width": SIZE, "height": SIZE, "device": "cpu", "dtype": "float32"}
SPECS = {
    "qwen-image-edit": Spec("qwen-image-edit", "tiny_qwen_image_edit_plus_dir",
                            {**COMMON, "true_cfg_scale": 1.0, "negative_prompt": None},
                            max_images=3),
    "flux2-dev:edit": Spec("flux2-dev:edit", "tiny_flux2_dir", COMMON, max_images=6),
    "flux-kontext": Spec("flux-kontext", "tiny_flux_kontext_dir",
                         {**COMMON, "auto_resize": False, "batch_size": 2}),
    "instruct-pix2pix": Spec("instruct-pix2pix", "tiny_instruct_pix2pix_dir",
                             {**COMMON, "batch_size": 2}),
    "flux2-dev": Spec("flux2-dev", "tiny_flux2_dir", {**COMMON, "batch_size": 2}, max_images=0),
    "sd3.5": Spec("sd3.5", "tiny_sd3_dir", {**COMMON, "batch_size": 2}, max_images=0),
}
EDITOR_KEYS = [key for key in SPECS if load_model(key).task == "i2i"]
GENERATOR_KEYS = [key for key in SPECS if load_model(key).task == "t2i"]
MULTI_IMAGE_KEYS = [key for key in EDITOR_KEYS if SPECS[key].max_images > 1]
SINGLE_IMAGE_KEYS = [key for key in EDITOR_KEYS if SPECS[key].max_images == 1]


@pytest.fixture(autouse=True, scope="module")
def _fresh_pipelines() -> Iterator[None]:
    """Each module starts and ends with no cached pipeline (they hold memory)."""
    forget_pipelines()
    yield
    forget_pipelines()


def tiny_dir(request: pytest.FixtureRequest, key: str) -> Path:
    return Path(request.getfixturevalue(SPECS[key].fixture))


def config_of(key: str, folder: Path, **changes: Any) -> dict[str, Any]:
    return {"hub_id": str(folder), **SPECS[key].config, **changes}


def write_project(project: Path, params: dict[str, Any], models: dict[str, Any]) -> StageContext:
    """The tiny project with ``params`` and exactly the models ``models`` (the repo's simulated
    editors left out: they take one portrait per request)."""
    path = write_params(project, params)
    merged = yaml.safe_load(path.read_text())
    merged["models"] = models
    path.write_text(yaml.safe_dump(merged, sort_keys=False))
    return StageContext.load(path, project)


def build(key: str, folder: Path, **changes: Any) -> ImageModel:
    """The adapter of ``key`` as the generate stage builds it from params."""
    cls = load_model(key)
    return cls(key, cls.Config.model_validate(config_of(key, folder, **changes)), REVISION)


def portrait(index: int) -> np.ndarray:
    groups = [("Black", "Female", "20s"), ("White", "Male", "70plus"),
              ("EastAsian", "Female", "40s")]
    race, gender, age = groups[index % len(groups)]
    pixels = draw_portrait(race, gender, age, SOURCE, seed=index).pixels
    pixels.flags.writeable = False  # an adapter must not draw on its input
    return pixels


def edit_request(name: str, seed: int, images: int = 1) -> EditRequest:
    return EditRequest(request_id=f"{name:0>12}", instruction="Make this person a doctor.",
                       seed=seed, source_image=portrait(0),
                       extra_images=tuple(portrait(i) for i in range(1, images)))


def generation_request(name: str, seed: int) -> GenerationRequest:
    return GenerationRequest(request_id=f"{name:0>12}", prompt="A photo of a person cooking.",
                             seed=seed)


def run(model: ImageModel, requests: list[Any]) -> list[Any]:
    return generate.call_model(model, requests)


# ---- each adapter, directly ----------------------------------------------------------------


@pytest.mark.parametrize("key", list(SPECS))
def test_adapter_runs_the_tiny_pipeline_and_is_seeded(key: str,
                                                      request: pytest.FixtureRequest) -> None:
    model = build(key, tiny_dir(request, key))
    assert isinstance(model, DiffusersModel)
    make = edit_request if key in EDITOR_KEYS else generation_request
    # The first two differ in id only: equal seeds, equal pixels, wherever they sit in a batch.
    outcomes = run(model, [make("a", 7), make("b", 8), make("c", 7)])
    assert [o.status for o in outcomes] == ["ok"] * 3, [o.message for o in outcomes]
    for outcome in outcomes:
        assert outcome.image.dtype == np.uint8 and outcome.image.shape == (SIZE, SIZE, 3)
        assert outcome.seconds is not None and outcome.seconds > 0
        assert outcome.peak_gpu_memory_mb is None
    # Another seed, other pixels; the same seed, the same pixels (up to one grey level where the
    # two sat in batches of different sizes: batched matrix products may round differently).
    assert not np.array_equal(outcomes[0].image, outcomes[1].image)
    assert np.abs(outcomes[0].image.astype(int) - outcomes[2].image.astype(int)).max() <= 1
    again = run(model, [make("a", 7), make("b", 8), make("c", 7)])
    assert all(np.array_equal(o.image, a.image) for o, a in zip(outcomes, again, strict=True))
    versions = model.library_versions()
    assert versions["diffusers"] and versions["torch"] and versions["device"] == "cpu"


@pytest.mark.parametrize("key", MULTI_IMAGE_KEYS)
def test_multi_image_editors_take_two_portraits(key: str, request: pytest.FixtureRequest) -> None:
    model = build(key, tiny_dir(request, key))
    one, two = run(model, [edit_request("one", 3), edit_request("two", 3, images=2)])
    assert one.status == two.status == "ok"
    assert two.image.shape == (SIZE, SIZE, 3)
    # The second portrait reaches the model: same seed and instruction, other pixels.
    assert not np.array_equal(one.image, two.image)
    load_model(key).check_source_count(key, model.config, 2)


@pytest.mark.parametrize("key", SINGLE_IMAGE_KEYS)
def test_single_image_editors_refuse_two_portraits_when_planning(key: str) -> None:
    cls = load_model(key)
    config = cls.Config.model_validate({"hub_id": "unused", "steps": 2})
    cls.check_source_count(key, config, 1)
    with pytest.raises(ConfigError, match="one source image"):
        cls.check_source_count(key, config, 2)


def test_source_limits_are_what_the_models_support() -> None:
    assert {key: load_model(key).max_source_images for key in SPECS} == {
        key: spec.max_images for key, spec in SPECS.items()}


def test_instruct_pix2pix_safety_filter_is_a_refusal(request: pytest.FixtureRequest) -> None:
    folder = request.getfixturevalue("tiny_instruct_pix2pix_flag_everything_dir")
    model = build("instruct-pix2pix", folder)
    outcomes = run(model, [edit_request("a", 1), edit_request("b", 2)])
    for outcome in outcomes:
        assert (outcome.status, outcome.refusal_kind) == ("refused", "safety_filter")
        assert outcome.image is None and "nsfw_content_detected" in outcome.message
    # The same weights with a checker that flags nothing give images: the refusal is the flag's.
    clean = build("instruct-pix2pix", tiny_dir(request, "instruct-pix2pix"))
    assert [o.status for o in run(clean, [edit_request("a", 1)])] == ["ok"]


def test_a_local_folder_needs_a_pinned_revision(request: pytest.FixtureRequest) -> None:
    cls = load_model("sd3.5")
    config = cls.Config.model_validate(config_of("sd3.5", tiny_dir(request, "sd3.5")))
    with pytest.raises(ConfigError, match="no pinned revision"):
        cls.resolve_revision("sd3.5", config, None)


# ---- the contracts -------------------------------------------------------------------------


class _EditorContract(EditorContract):
    key = ""
    keeps_resolution = False  # the config asks for SIZE x SIZE from SOURCE x SOURCE sources
    expected_statuses = frozenset({"ok"})

    @pytest.fixture
    def editor(self, request: pytest.FixtureRequest) -> ImageModel:
        return build(self.key, tiny_dir(request, self.key))

    @pytest.fixture
    def edit_requests(self) -> list[EditRequest]:
        return [edit_request(f"r{i}", seed) for i, seed in enumerate([5, 6])]


class TestQwenImageEditContract(_EditorContract):
    key = "qwen-image-edit"


class TestFlux2EditorContract(_EditorContract):
    key = "flux2-dev:edit"


class TestFluxKontextContract(_EditorContract):
    key = "flux-kontext"


class TestInstructPix2PixContract(_EditorContract):
    key = "instruct-pix2pix"


class TestInstructPix2PixFlaggedContract(_EditorContract):
    key = "instruct-pix2pix"
    expected_statuses = frozenset({"refused"})

    @pytest.fixture
    def editor(self, request: pytest.FixtureRequest) -> ImageModel:
        return build(self.key, request.getfixturevalue(
            "tiny_instruct_pix2pix_flag_everything_dir"))


class _GeneratorContract(GeneratorContract):
    key = ""
    expected_statuses = frozenset({"ok"})

    @pytest.fixture
    def generator(self, request: pytest.FixtureRequest) -> ImageModel:
        # One request per call: the contract asks for bit-equal outcomes in any order, and a
        # request batched with others may differ from itself alone by a grey level (see
        # test_adapter_runs_the_tiny_pipeline_and_is_seeded, which checks batching).
        return build(self.key, tiny_dir(request, self.key), batch_size=1)

    @pytest.fixture
    def generation_requests(self) -> list[GenerationRequest]:
        return [generation_request(f"r{i}", seed) for i, seed in enumerate([5, 6])]


class TestFlux2GeneratorContract(_GeneratorContract):
    key = "flux2-dev"


class TestSD35Contract(_GeneratorContract):
    key = "sd3.5"


# ---- through the plan and generate stages ----------------------------------------------------


def tiny_prompt_files(folder: Path, two_portraits: bool) -> dict[str, Any]:
    """Params of a project with one I2I instruction (and one of two portraits) and two T2I
    prompts (neutral and one attribute), so that a stage run is a handful of requests."""
    catalog = {
        "name": "tiny-catalog", "version": 1,
        "categories": {"A": {"name": "neutral", "description": "everyday edits"}},
        "prompts": [{"id": "A01", "category": "A", "attribute": "neutral", "congruent_with": [],
                     "text": "Give this person a pair of round reading glasses."}],
    }
    if two_portraits:
        catalog["prompts"].append({
            "id": "A02", "category": "A", "attribute": "neutral", "congruent_with": [],
            "portraits": 2, "text": "Show these two people shaking hands in an office."})
    base = {"name": "tiny-base", "version": 1,
            "domains": {"copyright": {"name": "Copyright-adjacent"}},
            "prompts": [{"id": "COP01", "domain": "copyright",
                         "t2i": "A photo of {subject} sketching a statue in a museum.",
                         "i2i": "sketching a statue in a museum"}]}
    attributes = {"name": "tiny-attributes", "version": 1,
                  "neutral": {"t2i": "a person", "cue": "nothing in particular"},
                  "dimensions": {"religion": [{
                      "id": "sikh", "t2i": "a Sikh person", "i2i": "wearing a Sikh turban",
                      "cue": "a turban", "keywords": ["sikh", "turban"]}]}}
    paths = {}
    for name, data in (("catalog", catalog), ("base", base), ("attributes", attributes)):
        paths[name] = folder / f"tiny-{name}.yaml"
        paths[name].write_text(yaml.safe_dump(data, sort_keys=False))
    return {
        "sources": {"resolution": SOURCE, "races": ["Black"], "genders": ["Female", "Male"],
                    "ages": ["20s"]},
        "prompts": {"catalog": str(paths["catalog"]), "categories": None,
                    "synthesis": {"base_prompts": str(paths["base"]),
                                  "attributes": str(paths["attributes"]),
                                  "modes": ["t2i"], "backend": "template"}},
        "plan": {"seeds": [0, 1], "prompt_sets": ["catalog"], "t2i_prompt_sets": ["acrb"]},
        "generate": {"batch_size": 4},
    }


@pytest.mark.parametrize("key", list(SPECS))
def test_generate_stage_runs_the_adapter(key: str, project: Path,
                                         request: pytest.FixtureRequest) -> None:
    folder = tiny_dir(request, key)
    name = key.replace(":", "-")
    params = tiny_prompt_files(project, two_portraits=key in MULTI_IMAGE_KEYS)
    ctx = write_project(project, params, {name: {"key": key, "revision": REVISION,
                                                 "config": config_of(key, folder)}})
    sources.run(ctx)
    prompts.run(ctx)
    plan.run(ctx)
    planned = ctx.model_requests(name)
    # Editors: 2 sources x 1 instruction x 2 seeds, plus, for those that take two portraits,
    # the pair instruction (each source with its partner of the other gender) x 2 seeds;
    # generators: 2 prompts (neutral, one attribute) x 2 seeds.
    expected = {True: 8, False: 4}[key in MULTI_IMAGE_KEYS]
    assert len(planned) == expected

    summary = generate.run(ctx, name)

    assert summary.generated == expected and summary.complete
    table = read_table(project / layout.generations_table(name), GenerationRecord)
    assert set(table["status"]) == {"ok"}, table["message"].tolist()
    assert set(table["model_revision"]) == {REVISION}
    timings = read_timings(timings_path(project, "generate", name))
    assert sorted(t.request_id for t in timings) == sorted(table["request_id"])
    assert all(t.seconds is not None and t.seconds > 0 for t in timings)
    for text in table["library_versions"]:
        versions = json.loads(text)
        assert versions["diffusers"] and versions["device"] == "cpu"
    rows = planned.set_index("request_id").join(table.set_index("request_id")[["image_path"]])
    images = {rid: load_rgb(project / path) for rid, path in rows["image_path"].items()}
    assert all(image.shape == (SIZE, SIZE, 3) and image.dtype == np.uint8
               for image in images.values())
    # The stage's images are the adapter's: the same request, run directly, gives equal pixels.
    model = build(key, folder)
    first = rows.iloc[0]
    direct_request = generate.model_requests(
        model, lambda path, _sha: load_rgb(project / path),
        [{**first.to_dict(), "request_id": first.name}])
    (direct,) = run(model, direct_request)
    # The stage ran it in a batch and this runs it alone: float sums in another order may move
    # a channel by one level after rounding to uint8 (seen with diffusers 0.42.1 for
    # flux-kontext: 1 of 3,072), never more, and in very few pixels.
    apart = np.abs(direct.image.astype(int) - images[first.name].astype(int))
    assert apart.max() <= 1 and (apart > 0).mean() < 0.01
    # Another seed for the same prompt and source gives other pixels, far beyond that.
    group = ["prompt_id", "source_id"]
    for _, same in rows.groupby(group):
        by_seed = {seed: images[rid] for rid, seed in same["seed"].items()}
        assert set(by_seed) == {0, 1}
        seeds_apart = np.abs(by_seed[0].astype(int) - by_seed[1].astype(int))
        assert seeds_apart.max() > 1 and (seeds_apart > 0).mean() > 0.1


def test_generate_stage_records_safety_filter_refusals(project: Path,
                                                      request: pytest.FixtureRequest) -> None:
    folder = request.getfixturevalue("tiny_instruct_pix2pix_flag_everything_dir")
    params = tiny_prompt_files(project, two_portraits=False)
    ctx = write_project(project, params, {
        "ip2p": {"key": "instruct-pix2pix", "revision": REVISION,
                 "config": config_of("instruct-pix2pix", folder)}})
    sources.run(ctx)
    prompts.run(ctx)
    plan.run(ctx)
    generate.run(ctx, "ip2p")
    table = read_table(project / layout.generations_table("ip2p"), GenerationRecord)
    assert len(table) == 4
    assert set(table["status"]) == {"refused"} and set(table["refusal_kind"]) == {"safety_filter"}
    assert table["image_path"].isna().all()


def test_planning_stops_a_single_image_editor_given_pairs(project: Path,
                                                          request: pytest.FixtureRequest) -> None:
    params = tiny_prompt_files(project, two_portraits=True)
    ctx = write_project(project, params, {
        "kontext": {"key": "flux-kontext", "revision": REVISION,
                    "config": {"hub_id": "unused", "steps": 2}}})
    sources.run(ctx)
    prompts.run(ctx)
    with pytest.raises(ConfigError, match="one source image per request"):
        plan.run(ctx)
