"""The local ``transformers`` chat client, on a tiny random-weight model built in the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from acrb.config import LLMBackendParams
from acrb.errors import ConfigError
from acrb.registry import open_chat_client

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SYSTEM = "You write short image prompts."
USER = "a nurse at work in a hospital"
SPECIALS = ["<unk>", "<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
WORDS = [
    "a", "an", "the", "of", "in", "at", "on", "with", "and", "nurse", "doctor", "teacher",
    "portrait", "photo", "hospital", "work", "school", "street", "light", "soft", "warm",
    "smiling", "calm", "young", "old", "person", "woman", "man", "write", "short", "image",
    "prompts", "you", "red", "blue", "green", "scarf", "coat", "city", "park", "night", "day",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_model(folder: Path, *, chat_template: bool) -> Path:
    """Save a tiny Llama and a word-level tokenizer into ``folder``; nothing from a hub."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for word in [*WORDS, *".,:;!?'\"-", *(f"w{i}" for i in range(200))]:
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.WordPiece()  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
        eos_token="</s>", additional_special_tokens=SPECIALS[4:],
    )
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        bos_token_id=2, eos_token_id=3, pad_token_id=1,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    root = tmp_path_factory.mktemp("tiny-llm")
    return {flag: build_model(root / f"chat-{flag}", chat_template=flag) for flag in (True, False)}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def params(model: Path | str, **changes: object) -> LLMBackendParams:
    values: dict[str, object] = {"kind": "transformers", "model": str(model), "max_tokens": 12,
                                 "temperature": 0.0, "seed": 11, "device": "cpu"}
    values.update(changes)
    return LLMBackendParams(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("chat_template", [True, False])
def test_generates_deterministically(model_dirs: dict[bool, Path], tmp_path: Path,
                                     chat_template: bool) -> None:
    model = model_dirs[chat_template]
    backend = open_chat_client("local", params(model), tmp_path / "c1")
    reply = backend.complete(SYSTEM, USER)
    assert reply.status == "ok", reply
    assert isinstance(reply.text, str)
    assert (reply.cached, reply.attempts, reply.reason) == (False, 1, "")
    assert backend.request_count == 1
    assert backend.describe()["kind"] == "transformers"

    # Same request, fresh cache and fresh model load: the same text.
    fresh = open_chat_client("local", params(model), tmp_path / "c2")
    assert fresh.complete(SYSTEM, USER).text == reply.text
    fresh.close()

    # Second call on the same cache: served from it without generating.
    reopened = open_chat_client("local", params(model), tmp_path / "c1")
    again = reopened.complete(SYSTEM, USER)
    assert (again.cached, again.attempts, again.text) == (True, 0, reply.text)
    assert reopened.request_count == 0
    backend.close()


def test_sampling_is_seeded(model_dirs: dict[bool, Path], tmp_path: Path) -> None:
    sampled = params(model_dirs[True], temperature=0.7, max_tokens=16)
    backend = open_chat_client("local", sampled, tmp_path / "a")
    before = torch.random.get_rng_state()
    first = backend.complete(SYSTEM, USER)
    # The caller's global RNG is left as it was.
    assert torch.equal(torch.random.get_rng_state(), before)
    second = open_chat_client("local", sampled, tmp_path / "b").complete(SYSTEM, USER)
    assert first.status == second.status == "ok"
    assert first.text == second.text
    # complete_many runs sequentially and keeps order.
    replies = backend.complete_many([(SYSTEM, USER), (SYSTEM, "an old man"), (SYSTEM, USER)])
    assert replies[0].cached and replies[0].text == first.text
    assert replies[2].text == first.text
    assert backend.request_count == 2


def test_missing_model_folder_is_a_config_error(tmp_path: Path) -> None:
    backend = open_chat_client("local", params(tmp_path / "no-such-model"), tmp_path / "cache")
    with pytest.raises(ConfigError, match="no-such-model"):
        backend.complete(SYSTEM, USER)

