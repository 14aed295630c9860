"""A local Hugging Face causal LM as a chat client (text only).

torch and transformers are imported only inside the methods that load and run the model, so
importing this module stays cheap; :data:`acrb.registry.CHAT_BACKENDS` checks that both are
installed (extra ``llm-local``) before it hands out this class. A request carrying an image is
refused with a :class:`ConfigError`: vision-language models need a processor rather than a
tokenizer and have their own kind, ``transformers-vlm`` (:mod:`acrb.clients.transformers_vlm`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acrb.clients._client import AnswerSchema, ChatClient, Conversation, RequestOutcome, short
from acrb.errors import ConfigError

if TYPE_CHECKING:
    from acrb.sections import ChatBackendParams


def _fold_system(turns: list[dict[str, str]]) -> list[dict[str, str]]:
    """The turns with the system text prepended to the first user turn."""
    system = [t["content"] for t in turns if t["role"] == "system"]
    rest = [dict(t) for t in turns if t["role"] != "system"]
    if rest and rest[0]["role"] == "user":
        rest[0]["content"] = "\n\n".join([*system, rest[0]["content"]])
    elif system:
        rest.insert(0, {"role": "user", "content": "\n\n".join(system)})
    return rest


def load_error(name: str, params: ChatBackendParams, exc: Exception) -> ConfigError:
    """The error for a local model that could not be loaded, with how to get it."""
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    return ConfigError(
        f"LLM backend {name!r} could not load the model {params.model!r}"
        f"{f' at revision {params.revision!r}' if params.revision else ''}: "
        f"{type(exc).__name__}: {short(str(exc), 300)}",
        "give a local model folder, or download the model first (`hf download "
        f"{params.model}`) and point HF_HOME at the cache that holds it"
        + ("; HF_HUB_OFFLINE is set, so nothing is downloaded" if offline else
           "; set HF_HUB_OFFLINE=1 to use the local cache only"),
    )


def device_error(name: str, params: ChatBackendParams, device: str, exc: Exception
                 ) -> ConfigError:
    """The error for a model that cannot be moved to the configured device."""
    return ConfigError(
        f"LLM backend {name!r}: cannot move model {params.model!r} to device {device!r}: "
        f"{short(str(exc), 200)}",
        "set device: cpu (or auto) for this backend",
    )


def resolve_device(device: str) -> str:
    """``device`` with ``auto`` made ``cuda`` when a GPU is there, else ``cpu``."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def generation_options(params: ChatBackendParams, pad_token_id: int | None) -> dict[str, Any]:
    """``generate`` keyword arguments for the backend's sampling settings: greedy at
    temperature 0, overriding any sampling defaults of the model's generation_config."""
    options: dict[str, Any] = {"max_new_tokens": params.max_tokens,
                               "do_sample": params.temperature > 0,
                               "pad_token_id": pad_token_id}
    if params.temperature > 0:
        options["temperature"] = params.temperature
    else:
        options.update(temperature=None, top_p=None, top_k=None)
    return options


def seeded_generate(model: Any, inputs: dict[str, Any], options: dict[str, Any], seed: int,
                    device: str) -> Any:
    """``model.generate`` under a private RNG state seeded with ``seed``: the same request gives
    the same reply, and the caller's global random state is left as it was."""
    import torch

    devices = [torch.device(device)] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices), torch.inference_mode():
        torch.manual_seed(seed)
        return model.generate(**inputs, **options)


class TransformersChatClient(ChatClient):
    """A local Hugging Face causal LM, loaded on the first uncached request.

    Requests run one at a time under a lock (a single model instance is not a good fit for
    threads), and each generation is seeded with ``params.seed`` so replies are reproducible.
    Text only: a request with an image raises :class:`ConfigError` before anything is loaded.
    """

    def __init__(self, name: str, params: ChatBackendParams, cache_dir: Path) -> None:
        super().__init__(name, params, cache_dir)
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        self._device: str | None = None

    def _workers(self) -> int:
        return 1

    def check_request(self, messages: Conversation) -> None:
        super().check_request(messages)
        if any(m.images for m in messages):
            raise ConfigError(
                f"LLM backend {self.name!r} (transformers, model {self.params.model!r}) is a "
                "text-only causal LM and was given an image",
                "use kind transformers-vlm for a local vision-language model (Qwen3-VL, "
                "Qwen2.5-VL), or an OpenAI-compatible or Gemini backend serving one",
            )

    def _load(self) -> None:
        if self._model is not None:
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        p = self.params
        device = resolve_device(p.device)
        try:
            tokenizer = AutoTokenizer.from_pretrained(p.model, revision=p.revision)
            model: Any = AutoModelForCausalLM.from_pretrained(p.model, revision=p.revision)
        except (OSError, ValueError) as exc:
            raise load_error(self.name, p, exc) from exc
        try:
            model.to(device)
        except (RuntimeError, AssertionError) as exc:
            raise device_error(self.name, p, device, exc) from exc
        model.eval()
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
            tokenizer.pad_token = tokenizer.eos_token
        self._tokenizer, self._model, self._device = tokenizer, model, device

    def _prompt_ids(self, messages: Conversation) -> Any:
        tokenizer = self._tokenizer
        turns = [{"role": m.role, "content": m.text} for m in messages]
        if getattr(tokenizer, "chat_template", None):
            try:
                text = tokenizer.apply_chat_template(turns, add_generation_prompt=True,
                                                     tokenize=False)
            except Exception:
                # Some chat templates reject a system turn; fold it into the first user turn.
                text = tokenizer.apply_chat_template(_fold_system(turns),
                                                     add_generation_prompt=True, tokenize=False)
            # The template already placed any BOS token.
            return tokenizer(text, return_tensors="pt", add_special_tokens=False)
        return tokenizer("\n\n".join(t["content"] for t in turns) + "\n", return_tensors="pt")

    def _request(self, messages: Conversation, schema: AnswerSchema = None) -> RequestOutcome:
        # No constrained decoding here: the schema is only in the prompt, and the caller
        # validates the answer.
        with self._lock:
            self._load()
            p = self.params
            tokenizer, model = self._tokenizer, self._model
            device = self._device or "cpu"
            encoded = self._prompt_ids(messages)
            # Only what every causal LM accepts (some tokenizers add token_type_ids).
            inputs = {key: encoded[key].to(device)
                      for key in ("input_ids", "attention_mask") if key in encoded}
            options = generation_options(p, tokenizer.pad_token_id)
            self._count_request()
            try:
                output = seeded_generate(model, inputs, options, p.seed, device)
            except RuntimeError as exc:
                return RequestOutcome("error", "", f"generation failed: {short(str(exc), 200)}", 1)
            new_tokens = output[0, inputs["input_ids"].shape[1]:]
            text = tokenizer.decode(new_tokens, skip_special_tokens=True)
        return RequestOutcome("ok", text, "", 1)

    def close(self) -> None:
        with self._lock:
            self._model = None
            self._tokenizer = None

