"""The tiny pipelines of ``tests/tiny_pipelines.py`` load and run like the real ones.

Adapter tests rely on these folders standing in for hub checkpoints, so each is reloaded here
with the real ``from_pretrained`` (offline), run for two steps, and checked for what would
make an adapter test pass for the wrong reason: a tokenizer that lost its vocabulary on the
way through ``save_pretrained``, an output of another size than asked for, a seed that changes
nothing, a safety checker that never fires.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from tests.tiny_pipelines import (
    build_flux2,
    has_torchvision,
    make_clip_tokenizer,
    make_mistral_tokenizer,
    make_qwen_tokenizer,
    make_t5_tokenizer,
    set_safety_checker_verdict,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")
Image = pytest.importorskip("PIL.Image")

INSTRUCTION = "make this person a doctor"
OTHER_INSTRUCTION = "turn the woman into a nurse"

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def portrait(width: int = 64, height: int = 64, shade: int = 0) -> Any:
    """A plain RGB test picture with a gradient, so that the VAE sees some structure."""
    ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    pixels = np.broadcast_to(ramp, (height, width, 3)).copy()
    pixels[..., 1] = (pixels[..., 1] + shade) % 256
    return Image.fromarray(pixels.astype(np.uint8))


def load(pipeline_class: str, folder: Path) -> Any:
    """Load a pipeline the way an adapter does, with no progress bars."""
    pipe = getattr(diffusers, pipeline_class).from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(pipe: Any, seed: int, **call: Any) -> Any:
    """Run two denoising steps with a seeded generator; returns the pipeline output."""
    return pipe(generator=torch.Generator("cpu").manual_seed(seed), num_inference_steps=2,
                **call)


def assert_seeded_image(pipe: Any, size: tuple[int, int], **call: Any) -> None:
    """Two steps give a ``size`` (width, height) image that the seed and the prompt change,
    and nothing else: the same seed and prompt give the same pixels.

    Compared as the decoder's float output: a random decoder squashes its input, and in
    Qwen-Image-Edit a 50-token prompt is one voice among the 4096 tokens of each input
    image, so the prompt moves the output by about 1e-5, below an 8-bit pixel step.
    """
    def floats(seed: int, **change: Any) -> Any:
        return generate(pipe, seed, **{**call, **change, "output_type": "np"}).images

    first = floats(0)
    picture = pipe.numpy_to_pil(first)[0]  # what output_type="pil", the default, returns
    assert isinstance(picture, Image.Image)
    assert picture.size == size
    assert np.array_equal(first, floats(0)), "same seed, other image"
    assert not np.array_equal(first, floats(1)), "other seed, same image"
    assert not np.array_equal(first, floats(0, prompt=OTHER_INSTRUCTION)), \
        "other prompt, same image"


# What each pipeline is, how to call it small, and which tokenizers it carries.
#   fixture: the folder fixture; cls: diffusers class; call: two-step call arguments;
#   size: the (width, height) that call must give; tokenizers: component -> a fresh build of
#   the same tokenizer (the builders are deterministic), to compare the reload with.
PIPELINES: dict[str, dict[str, Any]] = {
    "qwen_image_edit_plus": {
        "fixture": "tiny_qwen_image_edit_plus_dir", "cls": "QwenImageEditPlusPipeline",
        "call": lambda: {"prompt": INSTRUCTION, "image": portrait(), "height": 32,
                         "width": 48},
        "size": (48, 32),
        "tokenizers": {"tokenizer": make_qwen_tokenizer,
                       "processor.tokenizer": make_qwen_tokenizer},
    },
    "flux2": {
        "fixture": "tiny_flux2_dir", "cls": "Flux2Pipeline",
        "call": lambda: {"prompt": INSTRUCTION, "height": 32, "width": 48},
        "size": (48, 32),
        "tokenizers": ({"tokenizer.tokenizer": make_mistral_tokenizer} if has_torchvision()
                       else {"tokenizer": make_mistral_tokenizer}),
    },
    "flux_kontext": {
        "fixture": "tiny_flux_kontext_dir", "cls": "FluxKontextPipeline",
        "call": lambda: {"prompt": INSTRUCTION, "image": portrait(), "height": 32,
                         "width": 48, "max_area": 32 * 48, "_auto_resize": False},
        "size": (48, 32),
        "tokenizers": {"tokenizer": make_clip_tokenizer, "tokenizer_2": make_t5_tokenizer},
    },
    "instruct_pix2pix": {
        "fixture": "tiny_instruct_pix2pix_dir", "cls": "StableDiffusionInstructPix2PixPipeline",
        "call": lambda: {"prompt": INSTRUCTION, "image": portrait(48, 32)},
        "size": (48, 32),
        "tokenizers": {"tokenizer": make_clip_tokenizer},
    },
    "sd3": {
        "fixture": "tiny_sd3_dir", "cls": "StableDiffusion3Pipeline",
        "call": lambda: {"prompt": INSTRUCTION, "height": 32, "width": 48},
        "size": (48, 32),
        "tokenizers": {"tokenizer": make_clip_tokenizer, "tokenizer_2": make_clip_tokenizer,
                       "tokenizer_3": lambda: make_t5_tokenizer(max_length=256)},
    },
}


def component(pipe: Any, dotted: str) -> Any:
    """``pipe.a.b`` for ``dotted`` = ``"a.b"``."""
    value = pipe
    for name in dotted.split("."):
        value = getattr(value, name)
    return value


class Loaded(NamedTuple):
    """A tiny pipeline's spec (from :data:`PIPELINES`), its folder, and it, reloaded."""

    spec: dict[str, Any]
    folder: Path
    pipe: Any


@pytest.fixture(params=sorted(PIPELINES))
def tiny(request: pytest.FixtureRequest) -> Loaded:
    """Each tiny pipeline in turn, reloaded from its folder."""
    spec = PIPELINES[request.param]
    folder = request.getfixturevalue(spec["fixture"])
    return Loaded(spec, folder, load(spec["cls"], folder))


def test_folder_is_a_pipeline_snapshot(tiny: Loaded) -> None:
    """``model_index.json`` names the pipeline class and every component has its folder."""
    index = json.loads((tiny.folder / "model_index.json").read_text())
    assert index["_class_name"] == tiny.spec["cls"]
    for name, entry in index.items():
        if name.startswith("_") or not isinstance(entry, list) or entry[0] is None:
            continue  # metadata, a flag, or an optional component left out
        _, class_name = entry
        assert (tiny.folder / name).is_dir(), name
        assert type(getattr(tiny.pipe, name)).__name__ == class_name


def test_every_weight_comes_from_the_folder(tiny: Loaded) -> None:
    """A second load gives the same weights: none is missing from the folder and drawn at
    random on loading (which a config that does not fit its weights would cause)."""
    again = load(tiny.spec["cls"], tiny.folder)
    for name, module in tiny.pipe.components.items():
        if not isinstance(module, torch.nn.Module):
            continue
        first, second = module.state_dict(), getattr(again, name).state_dict()
        assert first.keys() == second.keys(), name
        for key, tensor in first.items():
            assert torch.equal(tensor, second[key]), f"{name}.{key}"


def test_tokenizers_keep_their_vocabulary(tiny: Loaded) -> None:
    """Every tokenizer splits an instruction into words and survives the save and reload.

    A tokenizer class that finds no vocabulary file falls back, silently, to one or two
    special tokens; then every prompt encodes alike and the text encoder sees no prompt.
    """
    for name, make in tiny.spec["tokenizers"].items():
        loaded, built = component(tiny.pipe, name), make()
        ids = loaded(INSTRUCTION).input_ids
        assert len(set(ids)) > 3, f"{name} encodes {INSTRUCTION!r} as {ids}"
        assert len(loaded) == len(built), name
        assert ids == built(INSTRUCTION).input_ids, name
        assert loaded(OTHER_INSTRUCTION).input_ids != ids, name


def test_text_encoders_cover_the_vocabulary(tiny: Loaded) -> None:
    """No id a tokenizer can produce falls outside its text encoder's embedding table."""
    pipe = tiny.pipe
    pairs = [("tokenizer", "text_encoder"), ("tokenizer_2", "text_encoder_2"),
             ("tokenizer_3", "text_encoder_3")]
    for tokenizer_name, encoder_name in pairs:
        tokenizer, encoder = getattr(pipe, tokenizer_name, None), getattr(pipe, encoder_name, None)
        if tokenizer is None or encoder is None:
            continue
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer
        rows = encoder.get_input_embeddings().num_embeddings
        assert rows >= len(tokenizer), (encoder_name, rows, len(tokenizer))


def test_two_steps_give_a_seeded_image_of_the_asked_size(tiny: Loaded) -> None:
    """Two steps on CPU: the asked size; same seed and prompt, same image; else another."""
    assert_seeded_image(tiny.pipe, tiny.spec["size"], **tiny.spec["call"]())


def test_qwen_edit_takes_several_images(tiny_qwen_image_edit_plus_dir: Path) -> None:
    """Qwen-Image-Edit-Plus conditions on two pictures at once: both enter the prompt."""
    pipe = load("QwenImageEditPlusPipeline", tiny_qwen_image_edit_plus_dir)
    pictures = [portrait(), portrait(96, 64, shade=90)]
    both = generate(pipe, 0, prompt=INSTRUCTION, image=pictures, height=32, width=32)
    one = generate(pipe, 0, prompt=INSTRUCTION, image=pictures[:1], height=32, width=32)
    assert both.images[0].size == (32, 32)
    assert not np.array_equal(np.asarray(both.images[0]), np.asarray(one.images[0]))


def test_qwen_prompt_survives_the_template_cut(tiny_qwen_image_edit_plus_dir: Path) -> None:
    """The pipeline drops the first ``prompt_template_encode_start_idx`` (64) prompt tokens,
    the length of its system preamble in Qwen's own vocabulary; the tiny tokenizer must make
    the preamble at least that long, or the cut would eat the instruction itself."""
    pipe = load("QwenImageEditPlusPipeline", tiny_qwen_image_edit_plus_dir)
    preamble = pipe.prompt_template_encode.split("{}")[0]
    assert len(pipe.tokenizer(preamble).input_ids) >= pipe.prompt_template_encode_start_idx


def test_flux2_edits_with_reference_images(tiny_flux2_dir: Path) -> None:
    """FLUX.2 takes one or several reference images (each at least 64 px a side)."""
    pipe = load("Flux2Pipeline", tiny_flux2_dir)
    text_only = generate(pipe, 0, prompt=INSTRUCTION, height=32, width=32).images[0]
    one = generate(pipe, 0, prompt=INSTRUCTION, image=portrait(), height=32,
                   width=32).images[0]
    two = generate(pipe, 0, prompt=INSTRUCTION, image=[portrait(), portrait(96, 64, 90)],
                   height=32, width=32).images[0]
    assert one.size == two.size == (32, 32)
    arrays = [np.asarray(image) for image in (text_only, one, two)]
    assert not np.array_equal(arrays[0], arrays[1])
    assert not np.array_equal(arrays[1], arrays[2])


def test_flux2_folder_carries_the_processor_where_torchvision_is(tmp_path: Path) -> None:
    """The FLUX.2 ``tokenizer`` component is a ``PixtralProcessor`` when torchvision is
    installed (as in FLUX.2-dev) and the bare tokenizer, with the chat template, otherwise."""
    folder = build_flux2(tmp_path / "flux2")
    index = json.loads((folder / "model_index.json").read_text())
    expected = "PixtralProcessor" if has_torchvision() else "TokenizersBackend"
    assert index["tokenizer"] == ["transformers", expected]
    tokenizer = load("Flux2Pipeline", folder).tokenizer
    assert tokenizer.chat_template, "FLUX.2 encodes prompts through apply_chat_template"


def test_safety_checker_blacks_out_what_it_flags(
        tiny_instruct_pix2pix_flag_everything_dir: Path) -> None:
    """With the flag-everything checker the edit comes back flagged and black."""
    pipe = load("StableDiffusionInstructPix2PixPipeline",
                tiny_instruct_pix2pix_flag_everything_dir)
    out = generate(pipe, 0, prompt=INSTRUCTION, image=portrait(32, 32))
    assert out.nsfw_content_detected == [True]
    assert not np.asarray(out.images[0]).any(), "a flagged image is all black"


def test_safety_checker_passes_what_it_does_not_flag(tiny_instruct_pix2pix_dir: Path) -> None:
    """The default checker flags nothing; its verdict can be switched after loading."""
    pipe = load("StableDiffusionInstructPix2PixPipeline", tiny_instruct_pix2pix_dir)
    out = generate(pipe, 0, prompt=INSTRUCTION, image=portrait(32, 32))
    assert out.nsfw_content_detected == [False]
    assert np.asarray(out.images[0]).any()
    set_safety_checker_verdict(pipe.safety_checker, flag_everything=True)
    flagged = generate(pipe, 0, prompt=INSTRUCTION, image=portrait(32, 32))
    assert flagged.nsfw_content_detected == [True]
    assert not np.asarray(flagged.images[0]).any()


@pytest.mark.parametrize("builder", ["build_qwen_image_edit_plus", "build_flux2",
                                     "build_flux_kontext", "build_instruct_pix2pix", "build_sd3"])
def test_builds_are_reproducible(builder: str, tmp_path: Path) -> None:
    """Two builds give identical files, weights and tokenizers alike, so what a test saw once
    it sees again."""
    import tests.tiny_pipelines as tiny_pipelines

    if builder == "build_qwen_image_edit_plus" and not has_torchvision():
        pytest.skip("Qwen2VLProcessor needs torchvision")
    build: Callable[[Path], Path] = getattr(tiny_pipelines, builder)
    first, second = build(tmp_path / "a"), build(tmp_path / "b")
    files = sorted(path.relative_to(first) for path in first.rglob("*") if path.is_file())
    assert any(path.suffix == ".safetensors" for path in files)
    assert files == sorted(path.relative_to(second) for path in second.rglob("*") if path.is_file())
    for relative in files:
        assert (first / relative).read_bytes() == (second / relative).read_bytes(), relative
