"""The params sections that more than :mod:`acrb.config` reads: the strict base every section
derives from (an unknown key is refused, naming it), the seed type, and the params of a chat
backend (:class:`ChatBackendParams`, what a :class:`acrb.clients.ChatClient` is opened with).
Here rather than in ``acrb.config`` so that the clients never import the params module, and
loading params never imports the clients."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

#: A seed: what NumPy's and torch's generators take (0 to 2**32 - 1). A negative or larger one
#: is refused here, by name, rather than failing as a NumPy error mid-stage.
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]


class Section(BaseModel):
    """A params section: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


class ChatBackendParams(Section):
    """One chat endpoint (LLM or VLM): what prompt synthesis (``prompts.synthesis.backends``),
    the feature describer (``features.vlm``) and a VLM judge (``judges.<name>.backend``) use.

    API keys are never written here: ``api_key_env`` names the environment variable that holds
    the key, and the key is read from the environment at call time only.
    """

    kind: str = Field(
        description="a chat backend kind (`acrb models` lists them): openai: any "
        "OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, llama.cpp server); "
        "gemini: Google's Gemini REST API; transformers: a local Hugging Face causal LM; "
        "transformers-vlm: a local vision-language model (Qwen3-VL, Qwen2.5-VL)"
    )
    model: str = Field(min_length=1, description="model name, or for transformers a hub id or "
                       "local folder")
    revision: str | None = Field(default=None, description="transformers: pinned hub revision")
    base_url: str | None = Field(
        default=None, description="endpoint root (openai default https://api.openai.com/v1, "
        "gemini default https://generativelanguage.googleapis.com)"
    )
    api_key_env: str | None = Field(
        default=None, description="environment variable holding the API key; null for a local "
        "server that needs none"
    )
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    seed: Seed = Field(default=20261123, description="sampling seed sent with every request")
    max_tokens: int = Field(default=160, ge=8, le=4096, description="longest reply, in tokens")
    timeout_s: float = Field(default=60.0, gt=0, description="per-request timeout, seconds")
    max_attempts: int = Field(default=5, ge=1, description="tries per request on 429/5xx/timeout")
    backoff_s: float = Field(default=1.0, ge=0, description="first retry wait; doubles each try")
    backoff_max_s: float = Field(default=30.0, ge=0, description="longest single retry wait")
    requests_per_minute: float = Field(default=60.0, gt=0, description="rate cap (uncached calls)")
    concurrency: int = Field(default=4, ge=1, le=64, description="requests in flight at once")
    device: str = Field(default="auto", description="transformers: cpu, cuda or auto")
    structured_output: bool = Field(
        default=True, description="for requests that carry an answer schema (the VLM judges): "
        "openai sends response_format json_schema, gemini responseMimeType application/json; "
        "false for a server that rejects them")
    batch_size: int = Field(default=8, ge=1, le=256, description="transformers-vlm: "
                            "conversations per generate call (docs/judges.md: choosing it)")
    attn_implementation: str = Field(
        default="sdpa_packed", description="transformers-vlm: sdpa_packed (text model sdpa, "
        "the vision tower's windows batched into one SDPA call), or any attn_implementation "
        "transformers takes for the whole model (sdpa, eager, flash_attention_2 where installed)")
    cache_implementation: Literal["dynamic", "static"] = Field(
        default="dynamic", description="transformers-vlm: generate's KV cache")
