"""The `prompts` stage with an LLM writer, against local servers speaking the real protocols.

The server plays a rewriting LLM: it rephrases base prompts and puts the requested attribute
into them, and is scripted to refuse, answer off-task, fail or garble for chosen items, so the
fallback to the template, the synthesis log and the cache can be checked item by item.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from acrb.errors import ConfigError
from acrb.prompts.synthesis import BOUNDARY_USER, load_base_prompts
from acrb.records import PromptRecord, SynthesisCallRecord, read_table
from acrb.stages import prompts as prompts_stage
from acrb.stages.context import StageContext
from tests.conftest import CATALOG, write_params
from tests.llm_servers import FakeLLMServer, Scripted, reply_body

KEY = "sk-test-0123456789abcdef"
DOMAIN = "copyright"
BASE = [p for p in load_base_prompts(CATALOG.parent / "base_prompts.yaml").prompts
        if p.domain == DOMAIN]
REFUSED_BASE = BASE[0]  # its T2I boundary rephrasing is refused
_CONDITION = re.compile(r"^(?:Prompt|Editing instruction):\n(?P<text>.+)\n\nRewrite it so that "
                        r"(?:the person is|the edit also shows this person) (?P<phrase>.+?)\.",
                        re.S)


def rewriter(protocol, failures: bool):
    """A responder that rewrites like a cooperative LLM; with ``failures``, it misbehaves on
    chosen items in every way the stage must survive."""

    def respond(user: str) -> Scripted:
        def ok(text: str) -> Scripted:
            return Scripted(body=reply_body(protocol, text))

        match = _CONDITION.match(user)
        if match is None:  # boundary rephrasing: "<header>:\n<text>"
            text = user.split("\n", 1)[1]
            if failures and REFUSED_BASE.t2i.split("{subject}")[1].strip() in text \
                    and user.startswith(BOUNDARY_USER["t2i"].split(":")[0]):
                return ok("I'm sorry, but I can't help with that request.")
            return ok(text.replace("A photo", "A candid documentary photo"))
        text, phrase = match["text"], match["phrase"]
        if failures:
            if phrase == "a Sikh person wearing a turban":
                return ok(text)  # off-task: the attribute is missing
            if phrase == "a woman":
                return Scripted(status=500, body={"error": "overloaded"})
            if phrase == "a Korean person":
                return Scripted(body="{not json")
            if phrase == "an elderly person in their eighties":
                return ok("")
            if phrase == "wearing a kippah":
                return ok(text.rstrip(".") + ", wearing a kippah, and make them look younger.")
        if user.startswith("Prompt:"):
            return ok(text.replace("a person", phrase, 1))
        return ok(text.rstrip(".") + f", {phrase}.")

    return respond


def configure(project: Path, server: FakeLLMServer, monkeypatch) -> StageContext:
    monkeypatch.setenv("ACRB_TEST_LLM_KEY", KEY)
    monkeypatch.delenv("ACRB_CACHE_DIR", raising=False)
    write_params(project, {"prompts": {"synthesis": {
        "domains": [DOMAIN], "backend": "fake",
        "backends": {"fake": {
            "kind": server.protocol, "base_url": server.base_url, "model": "rewriter-1",
            "api_key_env": "ACRB_TEST_LLM_KEY", "temperature": 0.3, "seed": 7,
            "max_attempts": 2, "backoff_s": 0.01, "backoff_max_s": 0.01, "timeout_s": 5,
            "requests_per_minute": 60000, "concurrency": 8}},
    }}})
    return StageContext.load(Path("params.yaml"), root=project)


def prompts_table(project: Path) -> pd.DataFrame:
    return read_table(project / "data" / "prompts" / "prompts.parquet", PromptRecord)


@pytest.mark.parametrize("protocol", ["openai", "gemini"])
def test_llm_writer_provenance_and_a_cached_rerun_sends_nothing(project, monkeypatch, protocol):
    with FakeLLMServer(protocol, responder=rewriter(protocol, failures=False)) as server:
        ctx = configure(project, server, monkeypatch)
        summary = prompts_stage.run(ctx)
        sent = server.request_count
        # One boundary call per base prompt and mode, one condition call per attribute item.
        assert sent == summary.llm_requests == 2 * 11 + 11 * 24 + 11 * 17
        assert summary.per_synthesis == {"llm": 11 * 25 + 11 * 18} and not summary.fallbacks
        frame = prompts_table(project)
        acrb = frame[frame["prompt_set"] == "acrb"]
        assert (acrb["llm_backend"] == "fake").all() and (acrb["llm_model"] == "rewriter-1").all()
        assert (acrb["llm_temperature"] == 0.3).all() and (acrb["llm_seed"] == 7).all()
        sikh = acrb.set_index("prompt_id").loc[f"t2i-{BASE[1].id}-religion-sikh"]
        assert sikh["text"].startswith("A candid documentary photo of a Sikh person")
        assert sikh["boundary_text"].startswith("A candid documentary photo of a person")
        assert len(sikh["llm_calls"].split(";")) == 2
        body = server.requests[0].body
        if protocol == "openai":
            assert body["temperature"] == 0.3 and body["seed"] == 7
            assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
        else:
            assert body["generationConfig"]["seed"] == 7
            assert server.requests[0].headers["x-goog-api-key"] == KEY

        before = {p.name: p.read_bytes() for p in (project / "data" / "prompts").iterdir()}
        again = prompts_stage.run(ctx)
        assert server.request_count == sent  # the cache answered everything
        assert again.llm_requests == 0
        after = {p.name: p.read_bytes() for p in (project / "data" / "prompts").iterdir()}
        assert before.keys() == after.keys()
        assert prompts_table(project).equals(frame)
    for path in [*(project / "data" / "prompts").iterdir(),
                 *(project / ".acrb-cache").rglob("*.json")]:
        assert KEY.encode() not in path.read_bytes(), path


def test_llm_failures_fall_back_to_the_template_visibly(project, monkeypatch):
    with FakeLLMServer("openai", responder=rewriter("openai", failures=True)) as server:
        ctx = configure(project, server, monkeypatch)
        summary = prompts_stage.run(ctx)
        first = server.request_count
        rows = prompts_table(project).set_index("prompt_id")
        calls = read_table(project / "data" / "prompts" / "synthesis_calls.parquet",
                           SynthesisCallRecord)

        def row(base, attribute, mode="t2i"):
            return rows.loc[f"{mode}-{base.id}-{attribute}"]

        other = BASE[1]
        # A refused boundary rephrasing: every T2I item of that base prompt uses the template.
        refused = rows[(rows["base_id"] == REFUSED_BASE.id) & (rows["mode"] == "t2i")]
        assert len(refused) == 25 and (refused["synthesis"] == "template").all()
        assert refused["fallback"].str.startswith("boundary refused").all()
        assert row(REFUSED_BASE, "neutral", "i2i")["synthesis"] == "llm"
        expected = {
            "religion-sikh": "unusable: attribute not expressed",
            "gender-female": "error: HTTP 500 after 2 attempts",
            "culture-korean": "error: malformed response",
            "age-elderly": "unusable: empty reply",
        }
        for attribute, reason in expected.items():
            item = row(other, attribute)
            assert item["synthesis"] == "template" and item["fallback"].startswith(reason)
            template = rows.loc[f"t2i-{other.id}-{attribute}"]["text"]
            assert template.startswith("A photo of")  # the template's own wording
        kippah = row(other, "religion-jewish", "i2i")
        assert kippah["fallback"].startswith("unusable: asks to change the person's identity")
        assert kippah["text"].endswith("wearing a kippah.")
        assert row(other, "religion-muslim")["synthesis"] == "llm"

        log = calls.set_index(["step", "mode", "base_id", "attribute"])
        refusal = log.loc[("boundary", "t2i", REFUSED_BASE.id, "neutral")]
        assert refusal["status"] == "refused" and "sorry" in refusal["reply"]
        assert log.loc[("condition", "t2i", other.id, "religion:sikh")]["status"] == "unusable"
        assert log.loc[("condition", "t2i", other.id, "gender:female")]["status"] == "error"

        # 24 T2I items of the refused base, and the scripted failures on the 10 other bases
        # (4 T2I attributes each, plus the I2I kippah edit on all 11).
        assert sum(summary.fallbacks.values()) == 25 + 10 * 4 + 11
        assert summary.fallbacks == {"refused": 25, "unusable": 10 * 2 + 11, "error": 10 * 2}
        sample = (project / "data" / "prompts" / "sample.md").read_text()
        assert "fell back to the template" in sample

        # A rerun answers ok and refused replies from the cache and resends only the errors.
        prompts_stage.run(ctx)
        # 10 HTTP 500s (2 attempts each) and 10 malformed replies (not retried).
        assert server.request_count - first == 10 * 2 + 10


def test_stage_with_a_local_transformers_model(project, monkeypatch, tmp_path):
    """The whole stage through the local-model backend: a tiny random-weight Llama writes
    word salad, which validation rejects, so every item falls back and says why."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.test_clients_transformers import build_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = build_model(tmp_path / "tiny-llama", chat_template=True)
    write_params(project, {"prompts": {"synthesis": {
        "domains": [DOMAIN], "modes": ["t2i"], "backend": "local",
        "backends": {"local": {"kind": "transformers", "model": str(model), "device": "cpu",
                               "max_tokens": 16, "temperature": 0.0}},
    }}})
    ctx = StageContext.load(Path("params.yaml"), root=project)
    summary = prompts_stage.run(ctx)
    assert summary.llm_requests == 11  # one boundary rephrasing per base prompt
    assert summary.synthesized == {"t2i": 11 * 25}
    frame = prompts_table(project)
    acrb = frame[frame["prompt_set"] == "acrb"]
    assert (acrb["synthesis"] == "template").all()
    assert acrb["fallback"].str.startswith("boundary unusable").all()
    assert (acrb["llm_model"] == str(model)).all()
    calls = read_table(project / "data" / "prompts" / "synthesis_calls.parquet",
                       SynthesisCallRecord)
    assert len(calls) == 11 and (calls["attempts"] == 1).all()
    assert calls["reply"].str.len().gt(0).all()  # the model's own words are kept


def test_an_unreachable_server_stops_the_stage_at_once(project, monkeypatch):
    with FakeLLMServer("openai") as server:
        ctx = configure(project, server, monkeypatch)
        url = server.base_url
    # The server is gone: its port refuses connections.
    with pytest.raises(ConfigError) as info:
        prompts_stage.run(ctx)
    assert url in info.value.problem and "connection error" in info.value.problem
    assert "backend: template" in info.value.fix
    assert not (project / "data" / "prompts" / "prompts.parquet").exists()


def test_a_first_request_with_http_500_stops_the_stage(project, monkeypatch):
    with FakeLLMServer("openai") as server:
        server.push(Scripted(status=500), Scripted(status=500))
        ctx = configure(project, server, monkeypatch)
        with pytest.raises(ConfigError, match="HTTP 500 after 2 attempts"):
            prompts_stage.run(ctx)
        assert server.request_count == 2
