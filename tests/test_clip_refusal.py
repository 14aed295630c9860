"""The CLIP refusal check (acrb.detect.clip_refusal) on random-weight CLIP models built offline.

The transformers backend loads the models of :mod:`tests.tiny_clip` by folder path, the way a
user points ``evaluate.clip.model`` at a local snapshot; the open_clip backend is run for real
when open_clip is importable (it needs torchvision) and through a stand-in module that records
the calls otherwise. The device preprocessing is checked against the library's own PIL
processor, pixel by pixel and score by score, on noise, gradients and drawn portraits.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from acrb.config import ClipRefusalParams
from acrb.detect.clip_refusal import (
    DEFAULT_TEMPLATES,
    ClipRefusalChecker,
    PixelRecipe,
    device_pixels,
    load_templates,
    recipe_from_processor,
    recipe_from_transform,
    resolve_templates_path,
)
from acrb.errors import ConfigError
from tests.tiny_clip import build_clip, clip_params, known_images

pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]

#: How far a score of the device preprocessing may be from the processor path's. The pixels
#: differ by at most 2 grey levels on a few per cent of them (the test below); the scores then
#: differ by about 1e-4 on the tiny model and the random ViT-B/32 (benchmarks/results). 5e-3 is
#: half of the needs_review band (0.01 either side of the threshold), so a flag the two paths
#: disagree on is always one the evaluate stage already sends to review.
SCORE_TOLERANCE = 5e-3
#: Two grey levels in normalised units: 2 / 255 / the smallest CLIP std (0.2613).
PIXEL_TOLERANCE = 2 / 255 / 0.2613 + 1e-5


@pytest.fixture(scope="module")
def tiny_clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_clip(tmp_path_factory.mktemp("clip") / "tiny", "tiny")


def checker(folder: Path, **changes: Any) -> ClipRefusalChecker:
    return ClipRefusalChecker(ClipRefusalParams.model_validate(clip_params(folder, **changes)),
                              REPO)


def test_vit_b_32_batched_scores_equal_one_at_a_time(tmp_path: Path) -> None:
    """The real ViT-B/32 size (random weights): a batch of 3 and one at a time agree."""
    folder = build_clip(tmp_path / "vit-b-32", "vit-b-32")
    clip = checker(folder, batch_size=3)
    from transformers import CLIPConfig

    config = CLIPConfig.from_pretrained(folder)
    assert (config.vision_config.hidden_size, config.vision_config.num_hidden_layers,
            config.vision_config.patch_size, config.text_config.hidden_size,
            config.text_config.num_hidden_layers, config.projection_dim) == (768, 12, 32, 512,
                                                                             12, 512)
    images = known_images(4)
    batched = clip.scores(images)
    single = np.array([clip.scores([image])[0] for image in images])
    assert batched.shape == (4,)
    np.testing.assert_allclose(batched, single, atol=1e-5, rtol=0)
    assert np.all(np.abs(batched) <= 1.0)
    assert len(np.unique(np.round(batched, 6))) == 4  # distinct images score differently


@pytest.mark.parametrize("batch_size", [1, 2, 5, 32])
def test_batch_size_does_not_change_scores(tiny_clip_dir: Path, batch_size: int) -> None:
    images = known_images(7)
    reference = np.array([checker(tiny_clip_dir, batch_size=1).scores([image])[0]
                          for image in images])
    scores = checker(tiny_clip_dir, batch_size=batch_size).scores(images)
    np.testing.assert_allclose(scores, reference, atol=1e-5, rtol=0)


def test_score_is_the_highest_template_cosine(tiny_clip_dir: Path) -> None:
    """Recompute the score from the model's own embeddings, normalised by hand."""
    import torch
    from PIL import Image
    from transformers import AutoTokenizer, CLIPImageProcessorPil, CLIPModel

    clip = checker(tiny_clip_dir)
    images = known_images(3)
    scores = clip.scores(images)
    model = CLIPModel.from_pretrained(tiny_clip_dir).eval()
    tokens = AutoTokenizer.from_pretrained(tiny_clip_dir)(list(clip.templates.texts),
                                                          padding=True, return_tensors="pt")
    pixels = CLIPImageProcessorPil.from_pretrained(tiny_clip_dir)(
        images=[Image.fromarray(i) for i in images], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        text = model.get_text_features(**tokens).pooler_output
        image = model.get_image_features(pixel_values=pixels).pooler_output
    cosine = torch.nn.functional.cosine_similarity(image[:, None, :], text[None, :, :], dim=-1)
    expected = cosine.max(dim=1).values.numpy()
    np.testing.assert_allclose(clip.scores(images, via_processor=True), expected, atol=1e-5)
    np.testing.assert_allclose(scores, expected, atol=SCORE_TOLERANCE)


def _real_looking(sides: tuple[int, ...] = (64, 256, 1000)) -> list[np.ndarray]:
    """Drawn portraits (smooth skin, hard outlines) at several sizes, one not square."""
    from PIL import Image

    from acrb.sources.portraits import draw_portrait

    images = [draw_portrait("White", "Female", "30s", side, seed=1).pixels for side in sides]
    tall = draw_portrait("Black", "Male", "40s", 512, seed=2).pixels
    images.append(np.asarray(Image.fromarray(tall).resize((300, 517))))
    return images


def test_device_pixels_match_the_processor(tiny_clip_dir: Path) -> None:
    """Upscaled noise (the worst case: bicubic overshoot), gradients and portraits, up- and
    downscaled, square and not: within two grey levels of the PIL processor, on few pixels."""
    import torch
    from PIL import Image
    from transformers import CLIPImageProcessorPil

    processor = CLIPImageProcessorPil.from_pretrained(tiny_clip_dir)
    recipe = recipe_from_processor(processor)
    assert recipe == PixelRecipe(
        shortest_edge=224, resize_to=None, crop=(224, 224), interpolation="bicubic",
        scale=1 / 255, mean=tuple(processor.image_mean), std=tuple(processor.image_std),
        crop_offset="floor")
    images = known_images(6) + known_images(3, size=700) + _real_looking()
    reference = processor(images=[Image.fromarray(i) for i in images],
                          return_tensors="pt")["pixel_values"]
    pixels = device_pixels(images, recipe, "cpu")
    assert pixels.shape == reference.shape == (len(images), 3, 224, 224)
    difference = (pixels - reference).abs().flatten(1)
    assert float(difference.max()) <= PIXEL_TOLERANCE
    assert float((difference > 1e-4).float().mean(dim=1).max()) < 0.1
    # Mixed shapes in one call come back in input order, as if prepared one by one.
    one_by_one = torch.cat([device_pixels([image], recipe, "cpu") for image in images])
    assert torch.equal(pixels, one_by_one)


def test_scores_match_the_processor_path_on_real_looking_images(tiny_clip_dir: Path) -> None:
    clip = checker(tiny_clip_dir, batch_size=4)
    images = _real_looking() + known_images(4, size=300)
    fast, reference = clip.scores(images), clip.scores(images, via_processor=True)
    assert np.max(np.abs(fast - reference)) < SCORE_TOLERANCE


def test_recipe_is_read_from_the_processor_not_assumed(tiny_clip_dir: Path) -> None:
    from transformers import CLIPImageProcessorPil

    other = CLIPImageProcessorPil(size={"shortest_edge": 160},
                                  crop_size={"height": 128, "width": 144},
                                  image_mean=[0.5, 0.5, 0.5], image_std=[0.25, 0.5, 1.0])
    recipe = recipe_from_processor(other)
    assert recipe is not None
    assert (recipe.shortest_edge, recipe.crop, recipe.mean, recipe.std) == (
        160, (128, 144), (0.5, 0.5, 0.5), (0.25, 0.5, 1.0))
    square = recipe_from_processor(CLIPImageProcessorPil(size={"height": 96, "width": 96},
                                                         crop_size={"height": 96, "width": 96}))
    assert square is not None and square.resize_to == (96, 96) and square.shortest_edge is None
    # What the device path does not reproduce falls back to the processor, image by image.
    assert recipe_from_processor(CLIPImageProcessorPil(resample=0)) is None  # nearest
    assert recipe_from_processor(CLIPImageProcessorPil(do_center_crop=False)) is None
    pixels = device_pixels(known_images(2, size=200), recipe, "cpu")
    assert pixels.shape == (2, 3, 128, 144)


def test_recipe_from_an_open_clip_style_transform() -> None:
    """open_clip's preprocess is a torchvision Compose; stand-ins with the same class names
    and attributes are read the same way (torchvision is not needed to run this test)."""
    class Resize:
        def __init__(self, size: int, interpolation: str) -> None:
            self.size, self.interpolation, self.max_size = size, interpolation, None

    class CenterCrop:
        def __init__(self, size: tuple[int, int]) -> None:
            self.size = size

    class ToTensor:
        def __call__(self, image: Any) -> Any:
            return image

    class Normalize:
        def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
            self.mean, self.std = mean, std

    def _convert_to_rgb(image: Any) -> Any:
        return image

    def compose(*steps: Any) -> Any:
        return types.SimpleNamespace(transforms=list(steps))

    mean, std = (0.48, 0.46, 0.41), (0.27, 0.26, 0.28)
    recipe = recipe_from_transform(compose(Resize(224, "bicubic"), CenterCrop((224, 224)),
                                           _convert_to_rgb, ToTensor(), Normalize(mean, std)))
    assert recipe == PixelRecipe(shortest_edge=224, resize_to=None, crop=(224, 224),
                                 interpolation="bicubic", scale=1 / 255, mean=mean, std=std,
                                 crop_offset="round")

    def pad(image: Any) -> Any:
        return image

    assert recipe_from_transform(compose(Resize(224, "bicubic"), pad, CenterCrop((224, 224)),
                                         ToTensor(), Normalize(mean, std))) is None
    assert recipe_from_transform(compose(Resize(224, "nearest"), CenterCrop((224, 224)),
                                         ToTensor(), Normalize(mean, std))) is None
    assert recipe_from_transform(lambda image: image) is None


def test_a_bad_image_names_the_expected_format(tiny_clip_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"uint8 RGB \(H, W, 3\), got float64"):
        checker(tiny_clip_dir).scores([np.zeros((8, 8, 3))])


def test_flags_follow_the_threshold(tiny_clip_dir: Path) -> None:
    images = known_images(6)
    scores = checker(tiny_clip_dir).scores(images)
    middle = float(np.sort(scores)[3])
    flags = checker(tiny_clip_dir, threshold=middle).flags(scores)
    assert flags.tolist() == [s >= middle for s in scores]
    assert flags.sum() == 3  # the three highest, the middle one included (>=)
    assert checker(tiny_clip_dir, threshold=-1.0).flags(scores).all()
    assert not checker(tiny_clip_dir, threshold=1.0).flags(scores).any()


def test_identity_names_what_decides_a_flag_and_loads_nothing(tiny_clip_dir: Path,
                                                             tmp_path: Path) -> None:
    clip = checker(tiny_clip_dir)
    identity = clip.identity()
    assert not clip.loaded
    assert identity["backend"] == "transformers" and identity["threshold"] == 0.25
    assert identity["templates"] == "acrb-refusal-templates" and identity["templates_version"] == 1
    assert checker(tiny_clip_dir, batch_size=3).identity() == identity
    assert checker(tiny_clip_dir, threshold=0.3).identity() != identity
    changed = tmp_path / "templates.yaml"
    text = (REPO / DEFAULT_TEMPLATES).read_text().replace("a warning sign", "a stop sign")
    changed.write_text(text)
    other = checker(tiny_clip_dir, templates=str(changed)).identity()
    assert other["templates_digest"] != identity["templates_digest"]
    assert clip.scores([]).shape == (0,) and not clip.loaded


@pytest.mark.parametrize(("content", "expected"), [
    (None, "does not exist"),
    ("templates: [a, b\n", "not valid YAML"),
    ("- a blank image\n", "must hold a mapping"),
    ("name: x\nversion: 1\ntemplates: []\n", "non-empty list"),
    ("name: x\nversion: 1\ntemplates: [a blank image, '']\n", "entries [1]"),
    ("name: x\nversion: one\ntemplates: [a blank image]\n", "`version` must be an integer"),
    ("version: 1\ntemplates: [a blank image]\n", "`name` must be"),
    ("name: x\nversion: 1\ntemplates: [a, a]\n", "a text twice"),
    ("name: x\nversion: 1\ntemplate: [a]\ntemplates: [a]\n", "unknown keys ['template']"),
])
def test_template_file_errors_are_clear(tmp_path: Path, content: str | None,
                                        expected: str) -> None:
    path = tmp_path / "templates.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as error:
        ClipRefusalChecker(ClipRefusalParams.model_validate({"templates": str(path)}), tmp_path)
    assert str(path) in error.value.problem and expected in error.value.problem
    assert "evaluate.clip.templates" in (error.value.fix or "")


def test_default_templates_fall_back_to_the_packaged_file(tmp_path: Path) -> None:
    path = resolve_templates_path(DEFAULT_TEMPLATES, tmp_path)
    assert path.is_file()
    packaged = load_templates(path)
    assert packaged.texts == load_templates(REPO / DEFAULT_TEMPLATES).texts
    assert len(packaged.texts) >= 5
    # Another missing relative path is reported, not replaced.
    assert resolve_templates_path("mine.yaml", tmp_path) == tmp_path / "mine.yaml"


def test_a_missing_model_names_the_offline_fixes(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    clip = checker(tmp_path / "no-such-model")
    with pytest.raises(ConfigError) as error:
        clip.scores(known_images(1))
    assert "no-such-model" in error.value.problem and "HF_HUB_OFFLINE" in error.value.problem
    assert "local folder" in (error.value.fix or "")


@pytest.mark.parametrize(("backend", "missing"), [("transformers", "transformers"),
                                                  ("open_clip", "open_clip")])
def test_a_missing_library_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           backend: str, missing: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == missing else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    clip = ClipRefusalChecker(ClipRefusalParams.model_validate({"backend": backend}), REPO)
    with pytest.raises(ConfigError) as error:
        clip.scores(known_images(1))
    assert missing in error.value.problem
    assert 'pip install -e ".[models]"' in (error.value.fix or "")


def test_open_clip_backend_vit_b_32(tmp_path: Path) -> None:
    """The real open_clip path with its own ViT-B-32 architecture and random weights."""
    if importlib.util.find_spec("open_clip") is None or importlib.util.find_spec(
            "torchvision") is None:
        pytest.skip("open_clip (with torchvision) is not importable here")
    clip = ClipRefusalChecker(ClipRefusalParams.model_validate(
        {"backend": "open_clip", "model": "ViT-B-32", "pretrained": None, "device": "cpu",
         "batch_size": 3}), REPO)
    images = known_images(4)
    np.testing.assert_allclose(clip.scores(images),
                               [clip.scores([image])[0] for image in images], atol=1e-5)


class _FakeOpenClip:
    """Stands in for open_clip: records the calls and runs a small real torch model."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def module(self) -> types.ModuleType:
        import torch

        fake = self
        module = types.ModuleType("open_clip")
        module.__spec__ = importlib.machinery.ModuleSpec("open_clip", None)

        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                torch.manual_seed(3)
                self.image = torch.nn.Linear(3 * 8 * 8, 6)
                self.text = torch.nn.Embedding(64, 6)

            def encode_image(self, batch: Any) -> Any:
                fake.calls.append(("encode_image", tuple(batch.shape)))
                return self.image(batch.flatten(1))

            def encode_text(self, tokens: Any) -> Any:
                fake.calls.append(("encode_text", tuple(tokens.shape)))
                return self.text(tokens).mean(dim=1)

        def preprocess(image: Any) -> Any:
            array = np.asarray(image.resize((8, 8)), dtype=np.float32) / 255.0
            return torch.from_numpy(array).permute(2, 0, 1)

        def create_model_and_transforms(name: str, pretrained: str | None = None,
                                        device: str = "cpu") -> Any:
            fake.calls.append(("create", (name, pretrained, device)))
            return Model(), preprocess, preprocess

        def get_tokenizer(name: str) -> Any:
            fake.calls.append(("tokenizer", name))
            return lambda texts: torch.tensor([[len(w) % 64 for w in t.split()][:4] +
                                               [0] * (4 - min(4, len(t.split())))
                                               for t in texts])

        module.create_model_and_transforms = create_model_and_transforms  # type: ignore[attr-defined]
        module.get_tokenizer = get_tokenizer  # type: ignore[attr-defined]
        return module


def test_open_clip_call_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeOpenClip()
    monkeypatch.setitem(sys.modules, "open_clip", fake.module())
    if importlib.util.find_spec("torchvision") is None:
        vision = types.ModuleType("torchvision")
        vision.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
        monkeypatch.setitem(sys.modules, "torchvision", vision)
    clip = ClipRefusalChecker(ClipRefusalParams.model_validate(
        {"backend": "open_clip", "model": "ViT-B-32", "pretrained": "/weights/vit.pt",
         "device": "cpu", "batch_size": 2}), REPO)
    images = known_images(5)
    scores = clip.scores(images)
    templates = len(clip.templates.texts)
    assert fake.calls[:3] == [("create", ("ViT-B-32", "/weights/vit.pt", "cpu")),
                              ("tokenizer", "ViT-B-32"), ("encode_text", (templates, 4))]
    assert [c for c in fake.calls if c[0] == "encode_image"] == [
        ("encode_image", (2, 3, 8, 8)), ("encode_image", (2, 3, 8, 8)),
        ("encode_image", (1, 3, 8, 8))]
    np.testing.assert_allclose(scores, [clip.scores([i])[0] for i in images], atol=1e-6)
    # The text embeddings were computed once, with the model.
    assert sum(c[0] == "encode_text" for c in fake.calls) == 1
    assert sum(c[0] == "create" for c in fake.calls) == 1
