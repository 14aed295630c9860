"""The Step1X-Edit-v1p2 adapter.

Step1X-Edit-v1p2 runs only on its authors' diffusers fork, which is not on PyPI (see
docs/step1x.md), and no installable package can build the model small: so these tests check
(1) the error a user without the fork gets, against the diffusers installed here; (2) the
config and the revision; (3) everything the adapter itself does with requests (seeding, the call
it makes, resizing, errors, loading once) against a stand-in pipeline with the fork's call
signature. The stand-in draws its output from the generator it is given, so determinism under a
seed is a property of the adapter's seeding, not of the stand-in. The real pipeline's pixels are
checked on a GPU machine (docs/step1x.md).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest
from pydantic import ValidationError

from acrb.errors import ConfigError
from acrb.models import step1x
from acrb.models.base import EditRequest
from acrb.models.step1x import Step1XEdit, Step1XEditConfig
from tests.editor_contract import EditorContract

KEY = "step1x-edit-v1p2"
PIN = "0123456789abcdef0123456789abcdef01234567"


def portrait(seed: int, height: int = 40, width: int = 56) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def request(index: int, seed: int = 7, instruction: str = "Give this person a red scarf.",
            ) -> EditRequest:
    return EditRequest(request_id=f"{index:040x}", instruction=instruction, seed=seed,
                       source_image=portrait(index))


class StandInPipeline:
    """Has the fork's loading and call signature; its image is the source, resized as the real
    pipeline resizes it, blended with noise drawn from the ``generator`` it is given."""

    loads: ClassVar[list[dict[str, Any]]] = []
    calls: ClassVar[list[dict[str, Any]]] = []

    def __init__(self) -> None:
        self.device: str | None = None

    @classmethod
    def from_pretrained(cls, model: str, **kwargs: Any) -> StandInPipeline:
        cls.loads.append({"model": model, **kwargs})
        return cls()

    def to(self, device: str) -> StandInPipeline:
        self.device = device
        return self

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        pass

    def __call__(self, *, image: Any, prompt: str, generator: Any, size_level: int,
                 enable_thinking_mode: bool, **kwargs: Any) -> SimpleNamespace:
        import torch
        from PIL import Image

        StandInPipeline.calls.append({"image": image, "prompt": prompt, "generator": generator,
                                      "size_level": size_level,
                                      "enable_thinking_mode": enable_thinking_mode, **kwargs})
        if "fail" in prompt:
            raise RuntimeError("CUDA out of memory (stand-in)")
        width, height = image.size
        scale = size_level / max(width, height)
        size = (max(16, round(width * scale) // 16 * 16), max(16, round(height * scale) // 16 * 16))
        base = np.asarray(image.resize(size), dtype=np.float32)
        noise = torch.rand((size[1], size[0], 3), generator=generator).numpy() * 255.0
        pixels = np.clip(0.5 * base + 0.5 * noise, 0, 255).astype(np.uint8)
        edited = Image.fromarray(pixels)
        return SimpleNamespace(images=[edited], final_images=[edited],
                               reformat_prompt=f"rewritten: {prompt}" if enable_thinking_mode
                               else None)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[StandInPipeline]]:
    pytest.importorskip("torch")
    pytest.importorskip("PIL")
    StandInPipeline.loads.clear()
    StandInPipeline.calls.clear()
    step1x.forget_pipelines()
    monkeypatch.setattr(step1x, "pipeline_class", lambda: StandInPipeline)
    yield StandInPipeline
    step1x.forget_pipelines()


def make_editor(**config: Any) -> Step1XEdit:
    settings = {"device": "cpu", "size_level": 256, "steps": 2, **config}
    return Step1XEdit(KEY, Step1XEditConfig(**settings), PIN)


# ---- without the fork ---------------------------------------------------------------------------

def test_importing_the_adapter_imports_no_model_library() -> None:
    code = ("import sys, acrb.registry, acrb.models.step1x\n"
            "heavy = [m for m in ('torch', 'diffusers', 'transformers', 'diffsynth', 'RegionE') "
            "if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_without_the_fork_building_the_editor_names_the_install() -> None:
    try:
        diffusers: Any = importlib.import_module("diffusers")
    except ImportError:
        diffusers = None  # the error then says the same install
    if diffusers is not None and hasattr(diffusers, step1x.PIPELINE_CLASS):
        pytest.skip("this environment has the Step1X fork of diffusers")
    with pytest.raises(ConfigError) as caught:
        Step1XEdit(KEY, Step1XEditConfig(), PIN)
    error = caught.value
    assert "Step1XEditPipelineV1P2" in error.problem
    assert error.fix is not None
    for needed in ("pip install", step1x.FORK_REQUIREMENT, "step1xedit_v1p2",
                   step1x.TRANSFORMERS_REQUIREMENT, "environment of its own",
                   "no diffusers release", "diffsynth 2.1.12 runs only Step1X-Edit v1.0"):
        assert needed in error.fix, needed


def test_a_diffusers_that_cannot_be_imported_gives_the_same_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "diffusers", None)  # what an uninstalled package looks like
    with pytest.raises(ConfigError) as caught:
        step1x.pipeline_class()
    assert "cannot be imported" in caught.value.problem
    assert step1x.INSTALL_COMMAND in (caught.value.fix or "")


def test_regione_that_is_not_installed_names_its_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "RegionE", None)
    with pytest.raises(ConfigError) as caught:
        step1x.regione_helper_class()
    assert "pip install --no-deps regione==0.1.0" in (caught.value.fix or "")


# ---- config and revision ------------------------------------------------------------------------

def test_config_rejects_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ValidationError, match="num_steps"):
        Step1XEditConfig(num_steps=20)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        Step1XEditConfig(dtype="int8")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="regione runs exactly 28 steps"):
        Step1XEditConfig(regione=True, steps=50)
    with pytest.raises(ValidationError, match="regione needs a CUDA device"):
        Step1XEditConfig(regione=True, device="cpu")
    assert Step1XEditConfig(regione=True).steps == 28


def test_revision_pins_the_weights_and_every_setting_that_changes_pixels() -> None:
    def revision(**config: Any) -> str:
        return Step1XEdit.resolve_revision(KEY, Step1XEditConfig(**config), PIN)

    base = revision()
    assert base.startswith(PIN + "+")
    assert base == revision()
    for changed in ({"steps": 50}, {"true_cfg_scale": 4.0}, {"guidance_scale": 3.0},
                    {"size_level": 768}, {"dtype": "float16"}, {"thinking": True},
                    {"reflection": True}, {"regione": True}):
        assert revision(**changed) != base, changed
    for neutral in ({"model": "/weights/step1x-v1p2"}, {"device": "cuda:1"},
                    {"cpu_offload": "model"}):
        assert revision(**neutral) == base, neutral
    with pytest.raises(ConfigError, match="no pinned revision"):
        Step1XEdit.resolve_revision(KEY, Step1XEditConfig(), None)


# ---- the adapter's own work, on a stand-in pipeline ---------------------------------------------

class TestStep1XEditContract(EditorContract):
    expected_statuses: ClassVar[frozenset[str]] = frozenset({"ok"})  # the model has no filter

    @pytest.fixture
    def editor(self, stand_in: type[StandInPipeline]) -> Step1XEdit:
        return make_editor()

    @pytest.fixture
    def edit_requests(self) -> list[EditRequest]:
        return [request(index, seed=index % 2) for index in range(3)]


def test_same_seed_same_pixels_other_seed_other_pixels(stand_in: type[StandInPipeline]) -> None:
    editor = make_editor()
    first, again, other = editor.edit([request(1, seed=7), request(1, seed=7),
                                       request(1, seed=8)])
    assert first.status == again.status == other.status == "ok"
    assert first.image is not None and again.image is not None and other.image is not None
    assert np.array_equal(first.image, again.image)
    assert not np.array_equal(first.image, other.image)
    assert first.image.shape == request(1).source_image.shape  # back at the source's size


def test_the_pipeline_gets_the_configured_call(stand_in: type[StandInPipeline]) -> None:
    editor = make_editor(steps=3, true_cfg_scale=4.5, guidance_scale=2.0, size_level=512,
                         thinking=True, reflection=True, dtype="float32")
    sent = request(4, seed=11, instruction="Make this person a firefighter.")
    editor.edit([sent])
    (load,) = stand_in.loads
    assert load["model"] == "stepfun-ai/Step1X-Edit-v1p2" and load["revision"] == PIN
    assert str(load["torch_dtype"]) == "torch.float32"
    (call,) = stand_in.calls
    assert call["prompt"] == sent.instruction
    assert call["num_inference_steps"] == 3 and call["size_level"] == 512
    assert call["true_cfg_scale"] == 4.5 and call["guidance_scale"] == 2.0
    assert call["enable_thinking_mode"] is True and call["enable_reflection_mode"] is True
    assert call["image"].mode == "RGB"
    assert np.array_equal(np.asarray(call["image"]), sent.source_image)
    assert call["generator"].initial_seed() == 11
    assert str(call["generator"].device) == "cpu"


def test_thinking_mode_keeps_the_rewritten_instruction(stand_in: type[StandInPipeline]) -> None:
    (outcome,) = make_editor(thinking=True).edit([request(2, instruction="Add a hat.")])
    assert outcome.status == "ok"
    assert outcome.message == "thinking mode rewrote the instruction as: rewritten: Add a hat."
    (plain,) = make_editor().edit([request(2, instruction="Add a hat.")])
    assert plain.message == ""


def test_a_failing_request_is_an_error_and_the_others_go_on(
        stand_in: type[StandInPipeline]) -> None:
    outcomes = make_editor().edit([request(1), request(2, instruction="please fail"),
                                   request(3)])
    assert [outcome.status for outcome in outcomes] == ["ok", "error", "ok"]
    assert outcomes[1].message == "RuntimeError: CUDA out of memory (stand-in)"
    assert outcomes[1].image is None and outcomes[1].refusal_kind is None


def test_the_model_loads_once_per_process(stand_in: type[StandInPipeline]) -> None:
    assert make_editor().edit([]) == []
    assert stand_in.loads == []  # nothing to edit: nothing loaded
    make_editor().edit([request(1)])
    make_editor(steps=5).edit([request(2)])  # another call setting, the same loaded weights
    assert len(stand_in.loads) == 1
    make_editor(dtype="float32").edit([request(3)])  # other weights in memory: a second load
    assert len(stand_in.loads) == 2


def test_cuda_without_a_gpu_is_a_config_error(stand_in: type[StandInPipeline]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(ConfigError, match="sees no CUDA GPU"):
        make_editor(device="cuda").edit([request(1)])


def test_library_versions_name_the_pipeline_without_loading_it(
        stand_in: type[StandInPipeline]) -> None:
    versions = make_editor().library_versions()
    assert versions["pipeline"].endswith("StandInPipeline")
    assert versions["torch"]
    assert stand_in.loads == []
