"""The OpenAI images and Gemini image adapters, through their official SDKs, against local
servers that speak each provider's protocol (tests/image_api_servers.py): success, policy
refusals kept verbatim, retries, errors, timeouts, malformed bodies, several input images per
edit, the Editor/Generator contracts, and a plan + generate run whose every file is searched
for the API key."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from acrb import layout
from acrb.errors import ConfigError
from acrb.models.base import EditRequest, GenerationRequest
from acrb.models.gemini_images import GeminiImageConfig, GeminiImageEditor, GeminiImageGenerator
from acrb.models.openai_images import (
    OpenAIImageEditor,
    OpenAIImageGenerator,
    OpenAIImagesConfig,
)
from acrb.records import read_table
from acrb.registry import EDITORS, GENERATORS, load_model
from acrb.stages import generate, plan, prompts, sources
from acrb.stages.context import StageContext
from tests.conftest import CATALOG, write_params
from tests.editor_contract import EditorContract, GeneratorContract
from tests.image_api_servers import (
    FAST_RETRY,
    FakeImageServer,
    ImageRequest,
    gemini_blocked,
    gemini_image,
    gemini_no_image,
    openai_error,
    openai_image,
    pattern_image,
)
from tests.llm_servers import Scripted
from tests.test_editor_contract import planned_requests

#: Fake keys: long and distinctive, so that finding one anywhere is a real leak.
OPENAI_KEY = "sk-acrbtest-" + "Q7xLm2Vp9TzR4sWn8Kd3Hy6Bf1Jc5Gu0"
GEMINI_KEY = "AIzaacrbtest" + "Xw3Ne8Rt5Yq2Mz7Lp4Ks9Hd6Jf1Vb0Cg"

MODERATION_MESSAGE = ("Your request was rejected as a result of our safety system. Your request "
                      "may contain content that is not allowed by our safety system.")
BLOCK_MESSAGE = "The prompt could not be submitted: it may violate our policies. [ref 42]"


@pytest.fixture(autouse=True)
def api_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("GEMINI_API_KEY", GEMINI_KEY)


def openai_generator(server: FakeImageServer, key: str = "openai:gpt-image-1",
                     **config: Any) -> OpenAIImageGenerator:
    settings = OpenAIImagesConfig.model_validate(
        {"base_url": server.base_url, "max_retries": 1, "timeout_s": 10, **config})
    return OpenAIImageGenerator(key, settings, "2025-04-23")


def openai_editor(server: FakeImageServer, **config: Any) -> OpenAIImageEditor:
    settings = OpenAIImagesConfig.model_validate(
        {"base_url": server.base_url, "max_retries": 1, "timeout_s": 10, **config})
    return OpenAIImageEditor("openai:gpt-image-1:edit", settings, "2025-04-23")


def gemini_config(server: FakeImageServer, **config: Any) -> GeminiImageConfig:
    return GeminiImageConfig.model_validate(
        {"base_url": server.base_url, "max_retries": 1, "timeout_s": 10,
         "retry_initial_delay_s": 0.01, **config})


def gemini_generator(server: FakeImageServer, **config: Any) -> GeminiImageGenerator:
    return GeminiImageGenerator("gemini:image", gemini_config(server, **config), "2025-10-02")


def gemini_editor(server: FakeImageServer, **config: Any) -> GeminiImageEditor:
    return GeminiImageEditor("gemini:image:edit", gemini_config(server, **config), "2025-10-02")


def prompt(text: str, seed: int = 7) -> GenerationRequest:
    return GenerationRequest(request_id=f"{abs(hash(text)):016x}", prompt=text, seed=seed)


def edit_with(images: list[np.ndarray], instruction: str = "Add a red hat.") -> EditRequest:
    return EditRequest(request_id="e" * 16, instruction=instruction, seed=3,
                       source_image=images[0], extra_images=tuple(images[1:]))


@pytest.fixture
def openai_server() -> Iterator[FakeImageServer]:
    with FakeImageServer("openai") as server:
        yield server


@pytest.fixture
def gemini_server() -> Iterator[FakeImageServer]:
    with FakeImageServer("gemini") as server:
        yield server


# ---- registry, config, keys ------------------------------------------------------------------

def test_registry_keys_load_the_adapters_with_the_api_extra() -> None:
    assert load_model("openai:gpt-image-1") is OpenAIImageGenerator
    assert load_model("openai:dall-e-3") is OpenAIImageGenerator
    assert load_model("openai:gpt-image-1:edit") is OpenAIImageEditor
    assert load_model("gemini:image") is GeminiImageGenerator
    assert load_model("gemini:image:edit") is GeminiImageEditor
    for registry, key in [(GENERATORS, "openai:gpt-image-1"), (EDITORS, "gemini:image:edit")]:
        assert registry.entry(key).extra == "api"
        assert registry.entry(key).install_command() == 'pip install -e ".[api]"'


def test_unknown_config_keys_are_rejected() -> None:
    with pytest.raises(ValueError, match="api_key"):
        OpenAIImagesConfig.model_validate({"api_key": "sk-in-params"})
    with pytest.raises(ValueError, match="sizee"):
        GeminiImageConfig.model_validate({"sizee": "1K"})


def test_a_missing_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY") as caught:
        OpenAIImageGenerator("openai:gpt-image-1", OpenAIImagesConfig(), "2025-04-23")
    assert OPENAI_KEY not in str(caught.value)
    monkeypatch.setenv("MY_GEMINI_KEY", "")
    with pytest.raises(ConfigError, match="MY_GEMINI_KEY"):
        GeminiImageGenerator("gemini:image", GeminiImageConfig(api_key_env="MY_GEMINI_KEY"),
                             "2025-10-02")


def test_the_revision_must_be_pinned() -> None:
    with pytest.raises(ConfigError, match="revision"):
        OpenAIImageGenerator.resolve_revision("openai:gpt-image-1", OpenAIImagesConfig(), None)
    assert GeminiImageEditor.resolve_revision("gemini:image:edit", GeminiImageConfig(),
                                              "2025-10-02") == "2025-10-02"


def test_source_image_limits() -> None:
    OpenAIImageEditor.check_source_count("gpt", OpenAIImagesConfig(), 16)
    with pytest.raises(ConfigError, match="at most 16"):
        OpenAIImageEditor.check_source_count("gpt", OpenAIImagesConfig(), 17)
    with pytest.raises(ConfigError, match="at most 3"):
        GeminiImageEditor.check_source_count("gem", GeminiImageConfig(), 4)
    GeminiImageEditor.check_source_count("gem", GeminiImageConfig(max_input_images=14), 14)
    with pytest.raises(ConfigError, match="no source image"):
        OpenAIImageGenerator.check_source_count("gpt", OpenAIImagesConfig(), 1)


# ---- OpenAI ----------------------------------------------------------------------------------

def test_openai_generation_decodes_the_png_and_prices_the_usage(
        openai_server: FakeImageServer) -> None:
    pixels = pattern_image(5, 20)
    openai_server.push(Scripted(body=openai_image(pixels)))
    [outcome] = openai_generator(openai_server, quality="low").generate(
        [prompt("A photo of a chef.")])
    assert outcome.status == "ok" and outcome.image is not None
    assert np.array_equal(outcome.image, pixels)
    # 40 text + 10 image input tokens, 4160 output tokens at $5 / $10 / $40 per million.
    assert outcome.cost_usd == pytest.approx((40 * 5 + 10 * 10 + 4160 * 40) / 1e6)
    assert outcome.seconds is not None and outcome.seconds > 0
    [sent] = openai_server.requests
    assert sent.path == "/v1/images/generations"
    assert sent.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert sent.json == {"prompt": "A photo of a chef.", "model": "gpt-image-1", "n": 1,
                         "size": "1024x1024", "quality": "low"}


def test_dall_e_3_asks_for_b64_and_is_priced_per_image(openai_server: FakeImageServer) -> None:
    openai_server.push(Scripted(body=openai_image(usage=False)))
    [outcome] = openai_generator(openai_server, "openai:dall-e-3", quality="hd",
                                 size="1792x1024").generate([prompt("A lighthouse.")])
    assert outcome.status == "ok" and outcome.cost_usd == pytest.approx(0.12)
    body = openai_server.requests[0].json
    assert body["model"] == "dall-e-3" and body["response_format"] == "b64_json"


@pytest.mark.parametrize("code", ["moderation_blocked", "content_policy_violation"])
def test_openai_policy_rejection_is_a_refusal_kept_verbatim(
        openai_server: FakeImageServer, code: str) -> None:
    openai_server.push(Scripted(status=400, body=openai_error(code, MODERATION_MESSAGE)))
    [outcome] = openai_generator(openai_server).generate([prompt("Something refused.")])
    assert (outcome.status, outcome.refusal_kind, outcome.refusal_code) == \
        ("refused", "policy", code)
    assert outcome.message == MODERATION_MESSAGE and outcome.image is None
    assert openai_server.request_count == 1  # a 400 is not retried


def test_openai_other_400_is_an_error(openai_server: FakeImageServer) -> None:
    openai_server.push(Scripted(status=400, body=openai_error("invalid_size", "Bad size.")))
    [outcome] = openai_generator(openai_server).generate([prompt("x")])
    assert outcome.status == "error" and "invalid_size" in outcome.message


def test_openai_429_then_success(openai_server: FakeImageServer) -> None:
    openai_server.push(Scripted(status=429, body=openai_error("rate_limit_exceeded", "Slow."),
                                headers=FAST_RETRY), Scripted(body=openai_image()))
    [outcome] = openai_generator(openai_server).generate([prompt("x")])
    assert outcome.status == "ok" and openai_server.request_count == 2


def test_openai_500_is_an_error_after_the_retries(openai_server: FakeImageServer) -> None:
    failure = Scripted(status=500, body=openai_error("server_error", "Boom."), headers=FAST_RETRY)
    openai_server.push(failure, failure, failure)
    [outcome] = openai_generator(openai_server, max_retries=2).generate([prompt("x")])
    assert outcome.status == "error" and outcome.refusal_kind is None
    assert "HTTP 500 after 2 retries" in outcome.message
    assert openai_server.request_count == 3


def test_openai_timeout_is_an_error(openai_server: FakeImageServer) -> None:
    openai_server.push(Scripted(body=openai_image(), delay=2.0))
    started = time.perf_counter()
    [outcome] = openai_generator(openai_server, timeout_s=0.3, max_retries=0).generate(
        [prompt("x")])
    assert outcome.status == "error" and "timeout" in outcome.message
    assert time.perf_counter() - started < 1.8


@pytest.mark.parametrize("body", ["{not json", {"created": 1, "data": []},
                                  {"created": 1, "data": [{"b64_json": "bm90IGEgcG5n"}]}])
def test_openai_malformed_bodies_are_errors(openai_server: FakeImageServer,
                                            body: Any) -> None:
    openai_server.push(Scripted(body=body))
    [outcome] = openai_generator(openai_server, max_retries=0).generate([prompt("x")])
    assert outcome.status == "error" and outcome.image is None, outcome


def test_openai_edit_sends_every_source_image(openai_server: FakeImageServer) -> None:
    images = [pattern_image(seed, 16 + seed) for seed in range(3)]
    [outcome] = openai_editor(openai_server, input_fidelity="high").edit([edit_with(images)])
    assert outcome.status == "ok"
    [sent] = openai_server.requests
    assert sent.path == "/v1/images/edits"
    assert sent.headers["content-type"].startswith("multipart/form-data")
    assert [upload.field for upload in sent.files] == ["image[]"] * 3
    assert all(upload.content_type == "image/png" for upload in sent.files)
    for received, original in zip(sent.input_images(), images, strict=True):
        assert np.array_equal(received, original)
    assert sent.form["prompt"] == ["Add a red hat."] and sent.form["model"] == ["gpt-image-1"]
    assert sent.form["input_fidelity"] == ["high"]


def test_an_error_that_echoes_the_key_is_redacted(openai_server: FakeImageServer) -> None:
    echoed = openai_error("invalid_api_key", f"Incorrect API key provided: {OPENAI_KEY}.")
    openai_server.push(Scripted(status=401, body=echoed))
    [outcome] = openai_generator(openai_server).generate([prompt("x")])
    assert outcome.status == "error" and "invalid_api_key" in outcome.message
    assert OPENAI_KEY not in outcome.message and "[redacted]" in outcome.message


def test_a_batch_runs_concurrently_and_in_order(openai_server: FakeImageServer) -> None:
    openai_server.push(*[Scripted(delay=0.4) for _ in range(8)])
    texts = [f"prompt {'x' * n}" for n in range(8)]
    started = time.perf_counter()
    outcomes = openai_generator(openai_server, concurrency=8).generate(
        [prompt(text) for text in texts])
    elapsed = time.perf_counter() - started
    # One at a time they take 3.2 s; the margin keeps a loaded machine from failing this.
    assert elapsed < 8 * 0.4 * 0.75, f"8 requests of 0.4 s took {elapsed:.2f} s, 8 threads"
    for text, outcome in zip(texts, outcomes, strict=True):
        assert np.array_equal(outcome.image, pattern_image(len(text)))


def test_requests_are_paced(openai_server: FakeImageServer) -> None:
    started = time.perf_counter()
    openai_generator(openai_server, concurrency=4, requests_per_minute=600).generate(
        [prompt(f"p{n}") for n in range(5)])
    assert time.perf_counter() - started >= 4 * 0.1 - 0.02  # 5 starts, 0.1 s apart


# ---- Gemini ----------------------------------------------------------------------------------

def test_gemini_generation_decodes_the_inline_image(gemini_server: FakeImageServer) -> None:
    pixels = pattern_image(9, 18)
    gemini_server.push(Scripted(body=gemini_image(pixels, text="Here is your image.")))
    [outcome] = gemini_generator(gemini_server, aspect_ratio="1:1").generate(
        [prompt("A photo of a pilot.", seed=11)])
    assert outcome.status == "ok" and np.array_equal(outcome.image, pixels)
    assert outcome.cost_usd == pytest.approx((20 * 0.30 + 1290 * 30.0) / 1e6)
    [sent] = gemini_server.requests
    assert sent.path.endswith("/models/gemini-2.5-flash-image:generateContent")
    assert sent.headers["x-goog-api-key"] == GEMINI_KEY
    generation = sent.json["generationConfig"]
    assert generation["responseModalities"] == ["TEXT", "IMAGE"]
    assert generation["seed"] == 11 and generation["imageConfig"] == {"aspectRatio": "1:1"}
    assert sent.prompt == "A photo of a pilot."


def test_gemini_blocked_prompt_is_a_policy_refusal(gemini_server: FakeImageServer) -> None:
    gemini_server.push(Scripted(body=gemini_blocked("PROHIBITED_CONTENT", BLOCK_MESSAGE)))
    [outcome] = gemini_generator(gemini_server).generate([prompt("x")])
    assert (outcome.status, outcome.refusal_kind, outcome.refusal_code, outcome.message) == \
        ("refused", "policy", "PROHIBITED_CONTENT", BLOCK_MESSAGE)


@pytest.mark.parametrize("reason", ["IMAGE_SAFETY", "SAFETY", "IMAGE_PROHIBITED_CONTENT"])
def test_gemini_withheld_output_is_a_safety_filter_refusal(
        gemini_server: FakeImageServer, reason: str) -> None:
    # The Gemini Developer API's finishMessage is dropped by google-genai 3.4 (it maps it for
    # Vertex AI only); what the model said is kept verbatim, and without words the code alone.
    note = "I can't show this image: it may violate our policies."
    gemini_server.push(Scripted(body=gemini_no_image(text=note, finish_reason=reason,
                                                     finish_message="not mapped")),
                       Scripted(body=gemini_no_image(finish_reason=reason)))
    said, silent = gemini_generator(gemini_server, concurrency=1).generate(
        [prompt("x"), prompt("y")])
    assert (said.status, said.refusal_kind, said.refusal_code, said.message) == \
        ("refused", "safety_filter", reason, note)
    assert (silent.status, silent.refusal_kind, silent.refusal_code, silent.message) == \
        ("refused", "safety_filter", reason, "")


def test_gemini_blocked_safety_rating_without_image_is_a_safety_filter_refusal(
        gemini_server: FakeImageServer) -> None:
    body = gemini_no_image(text="Sorry.", finish_reason="STOP")
    body["candidates"][0]["safetyRatings"] = [
        {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}]
    gemini_server.push(Scripted(body=body))
    [outcome] = gemini_generator(gemini_server).generate([prompt("x")])
    assert (outcome.status, outcome.refusal_kind, outcome.refusal_code) == \
        ("refused", "safety_filter", "STOP")
    assert outcome.message == "Sorry.\nblocked: HARM_CATEGORY_DANGEROUS_CONTENT"


def test_gemini_text_without_image_is_a_text_only_refusal(
        gemini_server: FakeImageServer) -> None:
    said = "I can't create images of that, but I can describe one for you."
    gemini_server.push(Scripted(body=gemini_no_image(text=said)))
    [outcome] = gemini_generator(gemini_server).generate([prompt("x")])
    assert (outcome.status, outcome.refusal_kind, outcome.refusal_code, outcome.message) == \
        ("refused", "text_only", "STOP", said)


@pytest.mark.parametrize("body", [gemini_no_image(finish_reason="OTHER"),
                                  gemini_no_image(finish_reason="NO_IMAGE"), {},
                                  "<html>bad gateway</html>",
                                  gemini_image(np.zeros((1, 1, 3), np.uint8)) | {
                                      "candidates": [{"content": {"parts": [{"inlineData": {
                                          "mimeType": "image/png", "data": "bm90IGEgcG5n"}}]},
                                          "finishReason": "STOP"}]}])
def test_gemini_replies_without_a_decline_or_an_image_are_errors(
        gemini_server: FakeImageServer, body: Any) -> None:
    gemini_server.push(Scripted(body=body))
    [outcome] = gemini_generator(gemini_server, max_retries=0).generate([prompt("x")])
    assert outcome.status == "error" and outcome.refusal_kind is None, outcome


def test_gemini_429_then_success(gemini_server: FakeImageServer) -> None:
    gemini_server.push(Scripted(status=429, body={"error": {"code": 429, "message": "Quota.",
                                                            "status": "RESOURCE_EXHAUSTED"}}),
                       Scripted(body=gemini_image()))
    [outcome] = gemini_generator(gemini_server).generate([prompt("x")])
    assert outcome.status == "ok" and gemini_server.request_count == 2


def test_gemini_500_is_an_error_after_the_retries(gemini_server: FakeImageServer) -> None:
    failure = Scripted(status=500, body={"error": {"code": 500, "message": "Internal.",
                                                   "status": "INTERNAL"}})
    gemini_server.push(failure, failure, failure)
    [outcome] = gemini_generator(gemini_server, max_retries=2).generate([prompt("x")])
    assert outcome.status == "error" and "HTTP 500 after 2 retries" in outcome.message
    assert gemini_server.request_count == 3


def test_gemini_timeout_is_an_error(gemini_server: FakeImageServer) -> None:
    gemini_server.push(Scripted(body=gemini_image(), delay=2.0))
    started = time.perf_counter()
    [outcome] = gemini_generator(gemini_server, timeout_s=0.3, max_retries=0).generate(
        [prompt("x")])
    assert outcome.status == "error" and "timeout" in outcome.message, outcome
    assert time.perf_counter() - started < 1.8


def test_gemini_edit_sends_every_source_image(gemini_server: FakeImageServer) -> None:
    images = [pattern_image(seed, 16 + seed) for seed in range(3)]
    [outcome] = gemini_editor(gemini_server).edit([edit_with(images, "Add a scarf.")])
    assert outcome.status == "ok" and np.array_equal(outcome.image, images[0][:, ::-1])
    [sent] = gemini_server.requests
    assert sent.prompt == "Add a scarf."
    received = sent.input_images()
    assert len(received) == 3
    for got, original in zip(received, images, strict=True):
        assert np.array_equal(got, original)


# ---- the contracts ---------------------------------------------------------------------------

def refuse_nurses(request: ImageRequest) -> Scripted | None:
    """Policy-refuse every request that mentions a nurse, in the server's own protocol."""
    if "nurse" not in request.prompt.lower():
        return None
    if request.json is not None and "contents" in request.json:
        return Scripted(body=gemini_blocked("SAFETY", BLOCK_MESSAGE))
    return Scripted(status=400, body=openai_error("moderation_blocked", MODERATION_MESSAGE))


class TestOpenAIEditorContract(EditorContract):
    @pytest.fixture
    def editor(self) -> Iterator[OpenAIImageEditor]:
        with FakeImageServer("openai", refuse_nurses) as server:
            yield openai_editor(server)

    @pytest.fixture
    def edit_requests(self) -> list[EditRequest]:
        return [request for request, _ in planned_requests()]


class TestGeminiEditorContract(EditorContract):
    @pytest.fixture
    def editor(self) -> Iterator[GeminiImageEditor]:
        with FakeImageServer("gemini", refuse_nurses) as server:
            yield gemini_editor(server)

    @pytest.fixture
    def edit_requests(self) -> list[EditRequest]:
        return [request for request, _ in planned_requests()]


GENERATION_PROMPTS = ["A portrait of a nurse at work.", "A portrait of an airline pilot.",
                      "A portrait of a gardener.", "A portrait of a nurse on a night shift."]


class TestOpenAIGeneratorContract(GeneratorContract):
    @pytest.fixture
    def generator(self) -> Iterator[OpenAIImageGenerator]:
        with FakeImageServer("openai", refuse_nurses) as server:
            yield openai_generator(server)

    @pytest.fixture
    def generation_requests(self) -> list[GenerationRequest]:
        return [prompt(text) for text in GENERATION_PROMPTS]


class TestGeminiGeneratorContract(GeneratorContract):
    @pytest.fixture
    def generator(self) -> Iterator[GeminiImageGenerator]:
        with FakeImageServer("gemini", refuse_nurses) as server:
            yield gemini_generator(server)

    @pytest.fixture
    def generation_requests(self) -> list[GenerationRequest]:
        return [prompt(text) for text in GENERATION_PROMPTS]


# ---- a whole run: the key is nowhere -----------------------------------------------------------

def small_catalog(folder: Path) -> Path:
    """The catalog with three prompts (one of which the servers refuse)."""
    catalog = yaml.safe_load(CATALOG.read_text())
    keep = {"A02", "B02", "B06"}
    catalog["prompts"] = [p for p in catalog["prompts"] if p["id"] in keep]
    path = folder / "catalog.yaml"
    path.write_text(yaml.safe_dump(catalog, sort_keys=False))
    return path


def leaky(server_protocol: str, key: str) -> Any:
    """A responder that refuses nurses, and answers pilots with an error that echoes the key
    (as a provider might); the adapter must keep the first and redact the second."""
    def respond(request: ImageRequest) -> Scripted | None:
        if "pilot" in request.prompt.lower():
            return Scripted(status=401, body={"error": {
                "code": 401 if server_protocol == "gemini" else "invalid_api_key",
                "status": "UNAUTHENTICATED", "message": f"API key {key} is not valid."}})
        return refuse_nurses(request)
    return respond


def test_plan_and_generate_leave_the_key_nowhere(
        project: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    # MLflow on, into the project, so that its database is searched too.
    monkeypatch.setenv("ACRB_MLFLOW", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    caplog.set_level(logging.DEBUG)
    with FakeImageServer("openai", leaky("openai", OPENAI_KEY)) as openai_server, \
            FakeImageServer("gemini", leaky("gemini", GEMINI_KEY)) as gemini_server:
        write_params(project, {
            "prompts": {"catalog": str(small_catalog(project))},
            "generate": {"batch_size": 8},
            "models": {
                "gpt": {"key": "openai:gpt-image-1:edit", "revision": "2025-04-23",
                        "config": {"base_url": openai_server.base_url, "max_retries": 0,
                                   "concurrency": 4}},
                "gem": {"key": "gemini:image:edit", "revision": "2025-10-02",
                        "config": {"base_url": gemini_server.base_url, "max_retries": 0,
                                   "concurrency": 4}},
            }})
        ctx = StageContext.load(project / "params.yaml", project)
        sources.run(ctx)
        prompts.run(ctx)
        plan.run(ctx)
        summaries = {name: generate.run(ctx, name) for name in ("gpt", "gem")}
        sent = openai_server.requests + gemini_server.requests
    for name, summary in summaries.items():
        # 8 portraits x 3 prompts: pilots error (the echoed key), nurses refused, glasses ok.
        assert summary.planned == 24 and summary.complete, name
        assert summary.status_counts == {"ok": 8, "refused": 8, "error": 8}, name
        table = read_table(project / layout.generations_table(name), generate.GenerationRecord)
        refused = table[table["status"] == "refused"]
        assert set(refused["refusal_code"]) == {"moderation_blocked" if name == "gpt"
                                                else "SAFETY"}
        errors = table[table["status"] == "error"]
        assert errors["message"].str.contains(r"\[redacted\]").all()
        assert table[table["status"] == "ok"]["cost_usd"].notna().all()
    # The key did reach the servers (the check below can fail), in its header only.
    assert len(sent) == 48
    assert all(OPENAI_KEY in r.headers.get("authorization", "") or
               r.headers.get("x-goog-api-key") == GEMINI_KEY for r in sent)

    files = [path for path in project.rglob("*") if path.is_file()]
    assert any(path.name == "mlflow.db" for path in files)
    assert any(path.suffix == ".parquet" for path in files)
    assert any(path.suffix == ".png" for path in files)
    for path in files:
        data = path.read_bytes()
        for key in (OPENAI_KEY, GEMINI_KEY):
            assert key.encode() not in data, f"{key[:6]}... found in {path}"
    captured = capfd.readouterr()
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for key in (OPENAI_KEY, GEMINI_KEY):
        assert key not in captured.out + captured.err + logged
