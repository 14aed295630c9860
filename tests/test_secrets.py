"""An endpoint that echoes the API key: the key reaches no file the run writes, nor stderr.

A fake OpenAI-compatible server hands the presented key back in every way a misbehaving or
hostile endpoint can: inside a JSON reply's content, in a refusal, in a body that is not JSON
(with the key placed across the 80-character cut of the error message), in an error body, and
in a response header. The real stages run through the real CLI with MLflow on (prompt
synthesis with the LLM writer, the VLM feature describer, a VLM judge), and then every file
under the project (tables, caches, samples, mlflow.db, MLflow artifacts) and everything printed
is searched for the key and for every piece of it 12 characters long (an endpoint that echoes
a 16-character middle piece, in the judge's answers and the writer's prompts, leaks none).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from acrb import redaction
from acrb.cli import app
from tests.conftest import REPO, write_params
from tests.llm_servers import FakeLLMServer, Scripted, openai_reply

ENV = "ACRB_TEST_ECHO_KEY"
KEY = "sk-echo-7Hq2Vx9LmZ4pR8sT1wY6bN3cK5dF0gJ"
PREFIX = KEY[:12]
SUFFIX = KEY[-12:]
#: A piece from the middle of the key, which an endpoint echoes without the rest.
MIDDLE = KEY[10:26]
#: A second key, named by an entry the run never uses: it is masked all the same.
IDLE_ENV, IDLE_KEY = "ACRB_TEST_IDLE_KEY", "gm-idle-Xc83Jd02LqPz71NvBw5Ka"
#: Every 12-character piece of either key: none may be left anywhere.
PIECES = tuple(key[i:i + 12] for key in (KEY, IDLE_KEY) for i in range(len(key) - 11))


def leaks(data: bytes | str) -> list[str]:
    """Which 12-character pieces of the keys (their starts and ends among them) occur in
    ``data``."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return [part for part in PIECES if part in text]


def leaking_files(root: Path) -> dict[str, list[str]]:
    """Files under ``root`` whose bytes hold a piece of a key, or, for Parquet (compressed, so
    its bytes may hide one), whose rows do."""
    import pandas as pd

    def content(path: Path) -> bytes:
        data = path.read_bytes()
        if path.suffix == ".parquet":
            data += pd.read_parquet(path).to_csv().encode()
        return data

    return {str(path.relative_to(root)): found for path in sorted(root.rglob("*"))
            if path.is_file() and (found := leaks(content(path)))}


# ---- the masking layer --------------------------------------------------------------------------


def test_redact_masks_keys_their_ends_and_ignores_placeholders() -> None:
    assert redaction.redact(f"a {KEY} b") == f"a {KEY} b"  # nothing registered: unchanged
    assert redaction.register_secret(ENV, KEY)
    assert not redaction.register_secret("LOCAL", "EMPTY")  # a placeholder, not a key
    masked = redaction.redact(f"key={KEY}; shown as {KEY[:8]}...{KEY[-8:]}; EMPTY")
    assert masked == (f"key=[redacted:{ENV}]; shown as [redacted:{ENV}]...[redacted:{ENV}]; "
                      "EMPTY")
    # A key cut by a length limit loses its start to the mask all the same.
    assert not leaks(redaction.redact(("x" * 70 + KEY)[:80]))
    assert redaction.redact_value({"a": [KEY, (1, KEY)], KEY: None}) == {
        "a": [f"[redacted:{ENV}]", (1, f"[redacted:{ENV}]")], f"[redacted:{ENV}]": None}


def test_every_piece_of_twelve_characters_or_more_is_masked() -> None:
    """An endpoint may echo any part of the key: every run of 12 or more of its characters is
    masked wherever it stands in the key, one mask per run; 11 are left (ordinary text could
    hold them), unless they are a long key's first or last 8, or a short key whole."""
    hidden = f"[redacted:{ENV}]"
    assert redaction.register_secret(ENV, KEY)
    assert redaction.redact(f"ref {MIDDLE}.") == f"ref {hidden}."
    for name, piece in {"start": KEY[:12], "middle": KEY[13:25], "end": KEY[-12:]}.items():
        assert redaction.redact(f"x{piece}y") == f"x{hidden}y", name
        assert redaction.contains_secret(f"x{piece}y".encode()), name
    eleven = KEY[12:23]  # clear of the masked first and last 8 characters
    assert redaction.redact(f"ref {eleven}.") == f"ref {eleven}."
    assert not redaction.contains_secret(eleven)
    # Two pieces side by side are two masks; overlapping ones are one.
    assert redaction.redact(KEY[:20] + KEY[5:30]) == hidden * 2
    assert redaction.redact(KEY[2:20] + KEY[20:33]) == hidden
    # Every piece, at every offset, between other text: nothing of 12 characters is left.
    for start in range(len(KEY) - 11):
        for end in range(start + 12, len(KEY) + 1):
            masked = redaction.redact(f"a={KEY[start:end]}&b")
            assert masked == f"a={hidden}&b", (start, end)
    # A key shorter than 12 characters is masked whole only.
    assert redaction.register_secret("SHORT", "Zq81-kLm0x")
    assert redaction.redact("k=Zq81-kLm0x, Zq81-kLm0") == "k=[redacted:SHORT], Zq81-kLm0"


def test_every_api_key_env_in_the_params_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, KEY)
    monkeypatch.setenv(IDLE_ENV, IDLE_KEY)
    monkeypatch.delenv("ACRB_TEST_UNSET_KEY", raising=False)
    raw = {"models": {"m": {"config": {"api_key_env": ENV}}},
           "judges": {"j": {"backend": {"api_key_env": "ACRB_TEST_UNSET_KEY"}}},
           "features": {"vlm": {"api_key_env": None}},
           "stand_ins": {"judges.j": [{"backend": {"api_key_env": IDLE_ENV}}]}}
    assert redaction.register_params_secrets(raw) == [ENV, IDLE_ENV]
    assert not leaks(redaction.redact(f"{KEY} {IDLE_KEY}"))


def test_log_records_and_written_text_are_masked(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from acrb.storage import atomic_write_json, atomic_write_text

    redaction.register_secret(ENV, KEY)
    with caplog.at_level(logging.WARNING):
        logging.getLogger("acrb.test").warning("server said %s", KEY)
    assert not leaks(caplog.text) and f"[redacted:{ENV}]" in caplog.text
    atomic_write_json(tmp_path / "a.json", {"reply": KEY})
    atomic_write_text(tmp_path / "b.md", f"| {KEY} |")
    assert not leaking_files(tmp_path)


# ---- the stages, through the CLI ----------------------------------------------------------------

_CONDITION = re.compile(r"^(?:Prompt|Editing instruction):\n(?P<text>.+)\n\nRewrite it so that "
                        r"(?:the person is|the edit also shows this person) (?P<phrase>.+?)\.",
                        re.S)
FEATURES = {"skin_tone": "medium tan skin", "facial_structure": "an oval face",
            "eyes": "dark brown eyes", "nose": "a straight nose", "lips": "full lips",
            "hair": f"short hair, signed {KEY}", "distinctive_features": "none"}


def echoing(user: str) -> Scripted:
    """A reply for ``user`` that carries the key in one of several ways, chosen by the text."""
    header = {"x-echo-key": KEY}
    if "skin_tone" in user and "distinctive_features" in user:  # the feature describer
        return Scripted(body=openai_reply(json.dumps(FEATURES)), headers=header)
    if "exactly the keys" in user:  # a judge question: a valid answer with the key in a note
        keys = re.findall(r'"(\w+)"', user.rsplit("exactly the keys", 1)[1])
        values = {"edit_success": 4, "skin_tone": 3, "race_change": 1, "gender_change": 1,
                  "age_change": 1, "aging_accuracy": 4, "cue_retention": 1.0}
        answer = {k: values.get(k, 1) for k in keys}
        answer["note"] = f"judged with {KEY}" if len(user) % 2 else f"key id {MIDDLE}"
        return Scripted(body=openai_reply(json.dumps(answer) + f" {KEY} ({MIDDLE})"),
                        headers=header)
    way = sum(user.encode()) % 5
    match = _CONDITION.match(user)
    text = (match["text"].rstrip(".") + f", {match['phrase']}" if match
            else user.split("\n", 1)[-1].rstrip("."))
    if way == 0:
        return Scripted(body=openai_reply(f"{text}, authorised by {KEY} (ref {MIDDLE})."),
                        headers=header)
    if way == 1:
        return Scripted(body=openai_reply(f"I'm sorry, but I can't help with that ({KEY})."))
    if way == 2:  # not JSON: the key straddles the 80th character of the message
        return Scripted(body="upstream proxy error " + "x" * 50 + f" {KEY} end", headers=header)
    if way == 3:
        return Scripted(status=400, body={"error": {"message": f"bad request for key {KEY}"}})
    return Scripted(body=openai_reply(text + "."))


def backend(server: FakeLLMServer, model: str) -> dict[str, Any]:
    return {"kind": "openai", "model": model, "base_url": server.base_url, "api_key_env": ENV,
            "temperature": 0.0, "max_tokens": 400, "timeout_s": 5.0, "max_attempts": 1,
            "backoff_s": 0.0, "backoff_max_s": 0.0, "requests_per_minute": 600_000.0,
            "concurrency": 4}


def echo_project(root: Path, server: FakeLLMServer) -> Path:
    """A tiny project (one portrait, category A, one domain of T2I synthesis) whose LLM writer,
    feature describer and first judge all talk to ``server``."""
    root.mkdir(parents=True)
    (root / "dvc.yaml").write_text("stages: {}\n")
    base = yaml.safe_load((REPO / "params.yaml").read_text())
    model = "synthetic-biased"
    write_params(root, {
        "sources": {"races": ["Black"], "genders": ["Female"], "ages": ["20s"]},
        "prompts": {"categories": ["A"], "synthesis": {
            "domains": ["copyright"], "modes": ["t2i"], "backend": "echo",
            "backends": {"echo": backend(server, "writer-1"),
                         "idle": {"kind": "gemini", "model": "g", "api_key_env": IDLE_ENV}}}},
        "features": {"describer": "vlm", "vlm": backend(server, "describer-1"),
                     "instructions": str(REPO / "src/acrb/features/data/describer-v1.yaml")},
        "judges": {"echo-judge": {"kind": "vlm", "backend": backend(server, "judge-1")}},
        "judge": {"use": ["echo-judge", "sim-judge-b"]},
    })
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["models"] = {model: base["models"][model]}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


@pytest.fixture
def echo_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv(ENV, KEY)
    monkeypatch.setenv(IDLE_ENV, IDLE_KEY)
    monkeypatch.setenv("ACRB_MLFLOW", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("ACRB_CACHE_DIR", raising=False)
    return tmp_path


def test_an_echoed_key_reaches_no_file_and_no_output(echo_env: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    printed: list[str] = []
    with FakeLLMServer("openai", responder=echoing) as server:
        # The first (probe) request must succeed, or synthesis stops at once.
        server.push(Scripted(body=openai_reply(f"A photo of a person {KEY} holding a sign.")))
        root = echo_project(echo_env / "project", server)
        monkeypatch.chdir(root)
        for command in (["sources"], ["prompts"], ["features"], ["plan"],
                        ["generate", "-m", "synthetic-biased"],
                        ["evaluate", "-m", "synthetic-biased"],
                        ["judge", "-m", "synthetic-biased"]):
            result = runner.invoke(app, command)
            printed.append(result.output + (result.stderr if result.stderr_bytes else ""))
            assert result.exit_code == 0, (command, result.output, result.exception)
        # Each stage's backend was asked (the writer most; one portrait, a few edits).
        asked = [r.body["model"] for r in server.requests]
        assert {m: asked.count(m) > 0 for m in ("writer-1", "describer-1", "judge-1")} == \
            {"writer-1": True, "describer-1": True, "judge-1": True}
        # The server really was given the key and really echoed it.
        assert all(r.headers.get("authorization") == f"Bearer {KEY}" for r in server.requests)
    assert (root / "mlflow.db").exists() and (root / "mlruns").is_dir()
    assert any(root.joinpath("mlruns").rglob("sample.md"))  # the prompts artifact was logged
    assert not leaking_files(root)
    assert not leaks("\n".join(printed))
    masked = "\n".join(p.read_text(errors="replace") for p in root.rglob("*.json*"))
    assert f"[redacted:{ENV}]" in masked  # the echoes were there, masked
    assert f"key id [redacted:{ENV}]" in masked  # the judge's middle piece too (its cache)


@pytest.mark.parametrize("reply", [
    # The key starts 19 (23) characters before the 80 (200) characters a message keeps.
    Scripted(body="<html>gateway says " + "x" * 40 + f" {KEY} and more</html>"),
    Scripted(status=400, body={"error": {"message": "x" * 140 + f" invalid key {KEY}"}}),
    Scripted(status=418, body=f"{KEY}", headers={"x-echo-key": KEY}),
], ids=["not-json", "error-json", "error-text"])
def test_a_first_reply_that_echoes_the_key_fails_without_printing_it(
        echo_env: Path, reply: Scripted) -> None:
    """The stage stops on its probe request with exit 2 and a message quoting the body: the
    key is masked before the body is cut, in a real process (stderr, logging, excepthook)."""
    with FakeLLMServer("openai") as server:
        server.push(reply)
        root = echo_project(echo_env / "project", server)
        env = {**os.environ, "ACRB_MLFLOW": "0"}  # MLflow is searched in the test above
        done = subprocess.run([sys.executable, "-m", "acrb", "prompts"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "error: " in done.stderr and "the first request" in done.stderr
    assert not leaks(done.stdout + done.stderr), done.stderr
    assert "[redact" in done.stderr  # the mask (cut or whole) stands where the key stood
    assert not leaking_files(root)



def test_an_artifact_holding_a_key_is_logged_from_a_masked_copy(tmp_path: Path) -> None:
    from acrb.tracking import _redacted_copy

    folder = tmp_path / "report"
    folder.mkdir()
    (folder / "clean.md").write_text("nothing to hide")
    (folder / "leaky.html").write_text(f"<p>{KEY}</p>")
    with _redacted_copy(folder) as logged:
        assert logged == folder  # nothing registered: the folder itself
    redaction.register_secret(ENV, KEY)
    with _redacted_copy(folder / "clean.md") as logged:
        assert logged == folder / "clean.md"
    with _redacted_copy(folder) as logged:
        assert logged != folder and logged.name == "report"
        assert not leaking_files(logged)
        assert (logged / "leaky.html").read_text() == f"<p>[redacted:{ENV}]</p>"
    assert (folder / "leaky.html").read_text() == f"<p>{KEY}</p>"  # the original is untouched
