"""What makes the transformers-vlm backend batch faster changes no answer and no cache key:
pixels handed over without a PNG round trip, the packed vision attention, the pipelined
processor and the static KV cache, each against the default path on a tiny random model."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from acrb.clients import ChatMessage
from acrb.clients._messages import ImagePart
from acrb.config import LLMBackendParams
from acrb.registry import open_chat_client
from acrb.storage import encode_png

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def pixels(seed: int, height: int = 40, width: int = 48) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def conversation(seed: int) -> tuple[ChatMessage, ...]:
    # Sizes differ by seed, so prompts differ in length and rows are left padded.
    return (ChatMessage.system("rate the edit"),
            ChatMessage.user("source", pixels(seed, 40 + 8 * (seed % 3)), "output",
                             pixels(seed + 100)))


def params(folder: Path | str, **changes: Any) -> LLMBackendParams:
    values: dict[str, Any] = {"kind": "transformers-vlm", "model": str(folder), "device": "cpu",
                              "temperature": 0.0, "seed": 5, "max_tokens": 8}
    values.update(changes)
    return LLMBackendParams(**values)


@pytest.fixture(scope="module")
def qwen25(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2.5-VL with 56 px windows, so a 48 px image has windows of two lengths."""
    from tests.tiny_vlm import write_vlm

    folder = tmp_path_factory.mktemp("qwen2_5_vl")
    write_vlm(folder, "qwen2_5_vl", vision={"window_size": 56}, max_pixels=112 * 112)
    return folder


def replies(folder: Path, cache: Path, count: int = 5,
            setup: Callable[[Any], None] | None = None, **changes: Any) -> list[str]:
    client: Any = open_chat_client("local", params(folder, **changes), cache)
    if setup is not None:
        setup(client)
    with client:
        answers = client.chat_many([conversation(seed) for seed in range(count)])
    assert all(a.status in ("ok", "refused") and not a.cached for a in answers)
    return [a.text for a in answers]


# ---- cache keys -------------------------------------------------------------------------------

def test_pixels_ride_along_without_changing_the_cache_key(tmp_path: Path) -> None:
    image = pixels(7, 24, 32)
    from_array = ImagePart.from_array(image)
    from_bytes = ImagePart(encode_png(image))
    assert from_array.pixels is not None and not from_array.pixels.flags.writeable
    assert np.array_equal(from_array.pixels, image) and from_bytes.pixels is None
    assert from_array == from_bytes and hash(from_array) == hash(from_bytes)
    image[0, 0] = 255 - image[0, 0]  # the caller's array is not the part's
    assert not np.array_equal(from_array.pixels, image)

    messages = (ChatMessage.system("judge"),
                ChatMessage.user("rate this", pixels(7, 24, 32), "and this", pixels(8, 24, 32)))
    as_bytes = (messages[0], ChatMessage("user", tuple(
        ImagePart(p.data) if isinstance(p, ImagePart) else p for p in messages[1].parts)))
    # Keys as computed before images carried their pixels: existing caches keep hitting.
    expected = {"transformers-vlm": ("4a852894e3036c67ff12", "4a852894e3036c67ff12"),
                "openai": ("0a28fbc73f75edbd36d3", "f675654e9108a4651d82")}
    for kind, (plain, with_schema) in expected.items():
        client = open_chat_client("x", LLMBackendParams(
            kind=kind, model="m", temperature=0.0, seed=5, max_tokens=8,
            base_url="http://127.0.0.1:9/v1"), tmp_path)
        assert client.chat_call_id(messages) == client.chat_call_id(as_bytes) == plain
        assert client.chat_call_id(messages, {"type": "object"}) == \
            client.chat_call_id(as_bytes, {"type": "object"}) == with_schema


def test_the_processor_gets_the_pixels_not_a_decoded_png() -> None:
    from acrb.clients.transformers_vlm import hf_conversation

    image = pixels(3)
    turns, images = hf_conversation([ChatMessage.user("look", image)])
    assert turns == [{"role": "user", "content": [{"type": "text", "text": "look"},
                                                  {"type": "image"}]}]
    assert np.array_equal(np.asarray(images[0]), image)
    _, decoded = hf_conversation([ChatMessage.user("look", encode_png(image))])
    assert np.array_equal(np.asarray(decoded[0]), image)


# ---- attention --------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_packed_vision_attention_equals_the_per_window_loop(family: str, tmp_path: Path) -> None:
    """Qwen2.5-VL: windows of two lengths (a 12 x 16 and an 8 x 6 patch grid, 56 px windows)
    and full-attention blocks; Qwen3-VL: one sequence per image."""
    from acrb.clients.transformers_vlm import (
        PACKED_SDPA,
        PACKED_SDPA_KERNEL,
        apply_attention,
        attention_summary,
    )
    from tests.tiny_vlm import write_vlm

    vision = {"window_size": 56} if family == "qwen2_5_vl" else {}
    model = write_vlm(tmp_path, family, vision=vision, save_weights=False)  # type: ignore[arg-type]
    patch = 14 if family == "qwen2_5_vl" else 16
    grid = torch.tensor([[1, 12, 16], [1, 8, 6]])
    patches = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * patch * patch,
                          generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert attention_summary(model)["vision_config"] == "sdpa"
        looped = model.model.visual(patches, grid_thw=grid).pooler_output
        apply_attention(model, PACKED_SDPA)
        assert attention_summary(model) == {"": "sdpa", "text_config": "sdpa",
                                            "vision_config": PACKED_SDPA_KERNEL}
        packed = model.model.visual(patches, grid_thw=grid).pooler_output
    torch.testing.assert_close(packed, looped, rtol=1e-5, atol=1e-5)


def test_packed_attention_batches_windows_of_one_length() -> None:
    from acrb.clients.transformers_vlm import packed_sdpa_attention

    generator = torch.Generator().manual_seed(1)
    query, key, value = (torch.randn(1, 2, 20, 4, generator=generator) for _ in range(3))
    bounds = torch.tensor([0, 4, 8, 11, 15, 20], dtype=torch.int32)
    calls: list[tuple[int, ...]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting(q: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(tuple(q.shape))
        return sdpa(q, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
        out, _ = packed_sdpa_attention(None, query, key, value, None, scaling=0.5,
                                       cu_seq_lens_q=bounds, cu_seq_lens_k=bounds)
    # Lengths 4, 4, 3, 4, 5: three calls (one per length), not five.
    assert sorted(calls) == [(1, 2, 3, 4), (1, 2, 5, 4), (3, 2, 4, 4)]
    starts = bounds.tolist()
    expected = torch.cat([sdpa(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], scale=0.5)
                          for a, b in itertools.pairwise(starts)], dim=2)
    torch.testing.assert_close(out, expected.transpose(1, 2))


def test_the_attention_and_cache_options_come_from_the_params(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from acrb.clients.transformers_vlm import TransformersVLMChatClient

    client = TransformersVLMChatClient("local", params("m"), tmp_path)
    assert (client.attn_implementation, client.cache_implementation) == ("sdpa_packed",
                                                                         "dynamic")
    chosen = params("m").model_copy(update={"attn_implementation": "eager",
                                            "cache_implementation": "static"})
    client = TransformersVLMChatClient("local", chosen, tmp_path)
    assert (client.attn_implementation, client.cache_implementation) == ("eager", "static")
    with pytest.raises(ValidationError, match="cache_implementation"):
        LLMBackendParams.model_validate({**params("m").model_dump(),
                                         "cache_implementation": "paged"})


# ---- whole replies (greedy) -------------------------------------------------------------------

def test_batched_pipelined_replies_equal_one_at_a_time_and_the_sdpa_default(
        qwen25: Path, tmp_path: Path) -> None:
    """Five conversations at batch size 2 (three generate calls, the processor one batch ahead)
    answer as one at a time does, with packed attention as with transformers' sdpa."""
    calls: list[int] = []

    def count_generate(client: Any) -> None:
        client._load()
        original = client._model.generate

        def counted(**kwargs: Any) -> Any:
            calls.append(kwargs["input_ids"].shape[0])
            return original(**kwargs)

        client._model.generate = counted

    batched = replies(qwen25, tmp_path / "b", setup=count_generate, batch_size=2)
    assert calls == [2, 2, 1]
    alone = replies(qwen25, tmp_path / "1", batch_size=1)

    def sdpa(client: Any) -> None:
        client.attn_implementation = "sdpa"

    looped = replies(qwen25, tmp_path / "s", setup=sdpa, batch_size=2)
    assert batched == alone == looped
    assert any(batched)


def test_static_kv_cache_gives_the_same_greedy_replies(qwen25: Path, tmp_path: Path) -> None:
    def static(client: Any) -> None:
        client.cache_implementation = "static"

    dynamic = replies(qwen25, tmp_path / "d", count=3, batch_size=3)
    assert replies(qwen25, tmp_path / "s", count=3, setup=static, batch_size=3) == dynamic
