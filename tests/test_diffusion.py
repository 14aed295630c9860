"""The shared diffusers machinery with a stand-in pipeline: batching, halving on CUDA
out-of-memory, one seeded generator per request, timing, and the config's checks. The real
pipelines are exercised on tiny random weights in tests/test_diffusers_adapters.py."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest
from pydantic import ValidationError

torch = pytest.importorskip("torch")
from PIL import Image  # noqa: E402

from acrb.errors import ConfigError  # noqa: E402
from acrb.models.base import GenerationRequest  # noqa: E402
from acrb.models.diffusion import (  # noqa: E402
    DiffusersConfig,
    DiffusersGenerator,
    quantization_config,
    to_rgb_array,
)


class FakePipeline:
    """Draws a 4x4 image from each generator; raises CUDA OOM when given more than
    ``fits`` prompts at once. Records the prompts of every call."""

    def __init__(self, fits: int) -> None:
        self.fits = fits
        self.calls: list[list[str]] = []
        self.generators: list[list[Any]] = []

    def __call__(self, prompt: list[str], generator: list[Any], output_type: str,
                 **kwargs: Any) -> SimpleNamespace:
        self.calls.append(list(prompt))
        self.generators.append(list(generator))
        assert len(generator) == len(prompt) and output_type == "pil"
        assert kwargs["num_inference_steps"] == 2
        if len(prompt) > self.fits:
            raise torch.cuda.OutOfMemoryError(f"tried to allocate for {len(prompt)} images")
        images = []
        for g in generator:
            pixels = (torch.rand((4, 4, 3), generator=g) * 255).to(torch.uint8).numpy()
            images.append(Image.fromarray(pixels, mode="RGB"))
        return SimpleNamespace(images=images)


class FakeGenerator(DiffusersGenerator):
    pipeline_class: ClassVar[str] = "NotLoaded"


def make(batch_size: int, fits: int) -> tuple[FakeGenerator, FakePipeline]:
    config = DiffusersConfig(hub_id="unused", device="cpu", steps=2, batch_size=batch_size)
    model = FakeGenerator("fake", config, "rev-1")
    pipe = FakePipeline(fits)
    model.use_pipeline(pipe)
    return model, pipe


def requests(seeds: Sequence[int]) -> list[GenerationRequest]:
    return [GenerationRequest(request_id=f"r{i}", prompt=f"prompt {i}", seed=seed)
            for i, seed in enumerate(seeds)]


def test_requests_go_batch_size_at_a_time_in_order() -> None:
    model, pipe = make(batch_size=2, fits=8)
    outcomes = model.generate(requests([1, 2, 3, 4, 5]))
    assert [len(call) for call in pipe.calls] == [2, 2, 1]
    assert [p for call in pipe.calls for p in call] == [f"prompt {i}" for i in range(5)]
    assert [o.status for o in outcomes] == ["ok"] * 5
    assert all(o.image is not None and o.image.dtype == np.uint8 and o.image.shape == (4, 4, 3)
               for o in outcomes)
    assert all(o.seconds is not None and o.seconds >= 0 for o in outcomes)
    assert all(o.peak_gpu_memory_mb is None for o in outcomes)  # CPU: no GPU memory to report
    assert model.generate([]) == []


def test_out_of_memory_halves_the_batch_and_keeps_the_smaller_size() -> None:
    model, pipe = make(batch_size=8, fits=2)
    outcomes = model.generate(requests(range(6)))
    # 6 fails, then 3 fails, then single requests (3 // 2 = 1) fit.
    assert [len(call) for call in pipe.calls] == [6, 3, 1, 1, 1, 1, 1, 1]
    assert [o.status for o in outcomes] == ["ok"] * 6
    # The halved size sticks: the next call does not start with an OOM again.
    assert model.batch_size() == 1
    pipe.calls.clear()
    model.generate(requests(range(3)))
    assert [len(call) for call in pipe.calls] == [1, 1, 1]


def test_halving_stops_at_the_size_that_fits() -> None:
    model, pipe = make(batch_size=8, fits=4)
    model.generate(requests(range(8)))
    assert [len(call) for call in pipe.calls] == [8, 4, 4]
    assert model.batch_size() == 4


def test_one_request_that_does_not_fit_is_an_error_naming_the_memory_options() -> None:
    model, pipe = make(batch_size=2, fits=0)
    outcomes = model.generate(requests([1, 2]))
    assert [o.status for o in outcomes] == ["error", "error"]
    assert all("out of memory" in o.message and "cpu_offload" in o.message
               and o.image is None for o in outcomes)
    assert [len(call) for call in pipe.calls] == [2, 1, 1]


def test_each_request_has_its_own_generator_seeded_with_its_seed() -> None:
    model, pipe = make(batch_size=3, fits=8)
    batched = model.generate(requests([11, 12, 13]))
    assert [g.initial_seed() for g in pipe.generators[0]] == [11, 12, 13]
    assert all(g.device.type == "cpu" for g in pipe.generators[0])
    alone = model.generate(requests([13]))
    # The output depends on its own seed, not on its place in a batch ...
    assert np.array_equal(batched[2].image, alone[0].image)
    # ... and another seed gives other pixels.
    assert not np.array_equal(batched[0].image, batched[1].image)


def test_pipeline_output_becomes_rgb_uint8() -> None:
    rgba = Image.fromarray(np.full((3, 5, 4), 200, dtype=np.uint8), mode="RGBA")
    pixels = to_rgb_array(rgba)
    assert pixels.shape == (3, 5, 3) and pixels.dtype == np.uint8


def test_config_rejects_unknown_keys_and_bad_devices() -> None:
    with pytest.raises(ValidationError, match="extra"):
        DiffusersConfig.model_validate({"hub_id": "x", "steps": 2, "stepz": 3})
    with pytest.raises(ValidationError, match="device"):
        DiffusersConfig.model_validate({"hub_id": "x", "steps": 2, "device": "gpu"})
    assert DiffusersConfig.model_validate({"hub_id": "x", "steps": 2,
                                           "device": "cuda:1"}).device == "cuda:1"


def test_quantization_names_the_package_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("bitsandbytes", "torchao")
                        else real(name, *a))
    config = DiffusersConfig(hub_id="x", steps=2, quantization="bitsandbytes-4bit")
    with pytest.raises(ConfigError, match="pip install bitsandbytes"):
        quantization_config(config, ["transformer"])
    config = DiffusersConfig(hub_id="x", steps=2, quantization="torchao-int8wo")
    with pytest.raises(ConfigError, match="pip install torchao"):
        quantization_config(config, ["transformer"])
    assert quantization_config(DiffusersConfig(hub_id="x", steps=2), ["transformer"]) is None


def test_cpu_offload_on_the_cpu_is_a_config_error() -> None:
    config = DiffusersConfig(hub_id="unused", device="cpu", steps=2, cpu_offload="model")
    model = FakeGenerator("fake", config, "rev-1")
    with pytest.raises(ConfigError, match="cpu_offload"):
        model.load()


def test_library_versions_name_the_stack() -> None:
    model, _ = make(batch_size=1, fits=1)
    versions = model.library_versions()
    assert versions["torch"] == torch.__version__
    assert versions["diffusers"] and versions["device"] == "cpu"
    assert set(versions) == {"torch", "diffusers", "transformers", "accelerate", "device"}


class RecordingPipelineClass:
    """Stands in for a diffusers pipeline class: records how it was loaded and set up."""

    loads: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.vae = SimpleNamespace(enable_tiling=lambda: self.calls.append("vae_tiling"))

    @classmethod
    def from_pretrained(cls, hub_id: str, **kwargs: Any) -> RecordingPipelineClass:
        cls.loads.append((hub_id, kwargs))
        return cls()

    def to(self, device: str) -> None:
        self.calls.append(f"to:{device}")

    def enable_attention_slicing(self) -> None:
        self.calls.append("attention_slicing")

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        self.calls.append("quiet")


@pytest.fixture
def recording_class(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[RecordingPipelineClass]]:
    import diffusers

    from acrb.models.diffusion import forget_pipelines

    monkeypatch.setattr(diffusers, "RecordingPipeline", RecordingPipelineClass, raising=False)
    RecordingPipelineClass.loads.clear()
    forget_pipelines()
    yield RecordingPipelineClass
    forget_pipelines()


class RecordingGenerator(DiffusersGenerator):
    pipeline_class: ClassVar[str] = "RecordingPipeline"


def test_hub_ids_get_the_pinned_revision_and_load_once(
        recording_class: type[RecordingPipelineClass]) -> None:
    config = DiffusersConfig(hub_id="org/model", device="cpu", steps=2, dtype="float32",
                             attention_slicing=True, vae_tiling=True)
    first = RecordingGenerator("k", config, "abc123").load()
    again = RecordingGenerator("k", config, "abc123").load()
    assert first is again and len(recording_class.loads) == 1
    hub_id, kwargs = recording_class.loads[0]
    assert hub_id == "org/model" and kwargs["revision"] == "abc123"
    assert kwargs["dtype"] == torch.float32 and kwargs["local_files_only"] is False
    assert "quantization_config" not in kwargs
    assert first.calls == ["to:cpu", "attention_slicing", "vae_tiling", "quiet"]
    # Another revision is another pipeline.
    RecordingGenerator("k", config, "def456").load()
    assert [k["revision"] for _, k in recording_class.loads] == ["abc123", "def456"]


def test_a_local_folder_is_loaded_without_a_revision(
        recording_class: type[RecordingPipelineClass], tmp_path: Path) -> None:
    config = DiffusersConfig(hub_id=str(tmp_path), device="cpu", steps=2)
    model = RecordingGenerator("k", config, "recorded-only")
    model.load()
    assert "revision" not in recording_class.loads[0][1]
    assert model.revision == "recorded-only"
