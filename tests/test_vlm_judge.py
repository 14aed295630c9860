"""VLM judges offline: a tiny random-weight Qwen3-VL / Qwen2.5-VL through the transformers-vlm
backend, and local servers speaking the OpenAI and Gemini protocols with image inputs."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from acrb.clients import ChatMessage
from acrb.config import LLMBackendParams
from acrb.errors import ConfigError
from acrb.judges import JudgeItem
from acrb.judges.rubric import Rubric, load_rubric
from acrb.judges.vlm import VLMJudge
from tests.llm_servers import FakeLLMServer, Scripted, gemini_reply, openai_reply

REPO = Path(__file__).resolve().parents[1]
RUBRIC_FILE = REPO / "src" / "acrb" / "judges" / "rubrics" / "acrb-v1.yaml"


@pytest.fixture(scope="module")
def rubric() -> Rubric:
    return load_rubric(RUBRIC_FILE)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def pixels(seed: int, height: int = 40, width: int = 48) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def make_items() -> list[JudgeItem]:
    """Two edits (images of different sizes, so prompts differ in length) and one T2I output."""
    return [
        JudgeItem("r-edit", "make the person wear a red scarf", pixels(1), source=pixels(2),
                  attribute="a red scarf"),
        JudgeItem("r-aging", "make this person look 30 years older", pixels(3, 56, 40),
                  source=pixels(4, 56, 40)),
        JudgeItem("r-t2i", "a photo of a nurse at work", pixels(5, 32, 64)),
    ]


def valid_answer(rubric: Rubric, item: JudgeItem) -> dict[str, Any]:
    return {axis: 0.75 if rubric.axes[axis].kind == "fraction" else 4
            for axis in rubric.axes_for(item)}


# ---- a local Qwen-VL through the transformers-vlm backend ---------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The checkpoint folder of a family, written on first use."""
    from tests.tiny_vlm import write_vlm

    made: dict[str, Path] = {}

    def folder(family: str) -> Path:
        if family not in made:
            made[family] = tmp_path_factory.mktemp(family)
            write_vlm(made[family], family)  # type: ignore[arg-type]
        return made[family]

    return folder


# Qwen2.5-VL's windowed vision attention makes the full judge round slower on a CPU; its batched
# test is marked slow, its seeded generation runs by default.
BOTH = ["qwen3_vl", "qwen2_5_vl"]
QWEN3_BY_DEFAULT = ["qwen3_vl", pytest.param("qwen2_5_vl", marks=pytest.mark.slow)]


def local_params(folder: Path, **changes: Any) -> LLMBackendParams:
    values: dict[str, Any] = {"kind": "transformers-vlm", "model": str(folder), "device": "cpu",
                              "temperature": 0.0, "seed": 5, "max_tokens": 8}
    values.update(changes)
    return LLMBackendParams(**values)


def spy_batches(judge: VLMJudge) -> list[int]:
    """Record the size of every batch the judge's client generates for."""
    sizes: list[int] = []
    original = judge.client._request_batch

    def recording(batch: Any) -> Any:
        sizes.append(len(batch))
        return original(batch)

    judge.client._request_batch = recording  # type: ignore[method-assign]
    return sizes


@pytest.mark.parametrize("family", QWEN3_BY_DEFAULT)
def test_local_vlm_batched_equals_one_at_a_time_and_abstains_on_garbage(
        family: str, vlm_dirs: Callable[[str], Path], rubric: Rubric, tmp_path: Path) -> None:
    vlm_dir = vlm_dirs(family)
    items = make_items()
    with VLMJudge("local", local_params(vlm_dir, batch_size=4), rubric, tmp_path / "b") as batched:
        sizes = spy_batches(batched)
        answers = batched.judge_many(items)
        assert sizes == [3, 3]  # all first questions in one generate call, all retries in one
        assert batched.client.request_count == 6
    with VLMJudge("local", local_params(vlm_dir, batch_size=1), rubric, tmp_path / "1") as single:
        one_sizes = spy_batches(single)
        alone = single.judge_many(items)
        assert one_sizes == [1] * 6
    assert [a.raw for a in answers] == [a.raw for a in alone]
    assert [a.status for a in answers] == [a.status for a in alone]

    # Random weights write words, never JSON: one retry each, then an abstention that keeps
    # both replies and both cache keys.
    for answer in answers:
        assert answer.status == "abstained", answer
        assert answer.reason.startswith("no valid answer after one retry: ")
        assert answer.scores == {}
        assert len(answer.raw) == 2 and len(set(answer.call_ids)) == 2
        assert answer.attempts == 2
    assert any(text for answer in answers for text in answer.raw)

    # A rerun is answered from the cache: no model load, no request.
    with VLMJudge("local", local_params(vlm_dir, batch_size=4), rubric, tmp_path / "b") as again:
        rerun = again.judge_many(items)
        assert again.client.request_count == 0
        assert again.client._model is None  # type: ignore[attr-defined]
    assert [(a.status, a.raw, a.call_ids) for a in rerun] == \
        [(a.status, a.raw, a.call_ids) for a in answers]
    assert all(a.attempts == 0 for a in rerun)


@pytest.mark.parametrize("family", BOTH)
def test_local_vlm_text_and_seeded_sampling_reproducible(
        family: str, vlm_dirs: Callable[[str], Path], tmp_path: Path) -> None:
    from acrb.registry import open_chat_client

    vlm_dir = vlm_dirs(family)
    sampled = local_params(vlm_dir, temperature=1.0, max_tokens=8)
    request = [ChatMessage.user("rate the image", pixels(9))]
    with open_chat_client("a", sampled, tmp_path / "a") as first, \
            open_chat_client("b", sampled, tmp_path / "b") as second:
        assert first.chat(request).text == second.chat(request).text
        # A text-only request needs no image.
        assert first.chat([ChatMessage.user("the answer")]).status in ("ok", "refused")


def test_local_vlm_missing_model_is_a_config_error(tmp_path: Path, rubric: Rubric) -> None:
    with VLMJudge("local", local_params(tmp_path / "nowhere"), rubric, tmp_path / "c") as judge, \
            pytest.raises(ConfigError, match="could not load the model"):
        judge.judge_many(make_items()[:1])


# ---- an OpenAI-compatible server ----------------------------------------------------------------


@pytest.fixture
def openai_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer("openai") as server:
        yield server


def http_params(server: FakeLLMServer, **changes: Any) -> LLMBackendParams:
    values: dict[str, Any] = {"kind": server.protocol, "model": "judge-model",
                              "base_url": server.base_url, "api_key_env": None,
                              "temperature": 0.0, "max_tokens": 300, "timeout_s": 2.0,
                              "max_attempts": 1, "backoff_s": 0.0, "concurrency": 1,
                              "requests_per_minute": 60_000.0}
    values.update(changes)
    return LLMBackendParams(**values)


def data_url_images(body: dict[str, Any]) -> list[bytes]:
    content = body["messages"][1]["content"]
    urls = [part["image_url"]["url"] for part in content if part["type"] == "image_url"]
    assert all(url.startswith("data:image/png;base64,") for url in urls)
    return [base64.b64decode(url.split(",", 1)[1]) for url in urls]


def test_openai_good_answer_carries_both_images_and_the_schema(
        openai_server: FakeLLMServer, rubric: Rubric, tmp_path: Path) -> None:
    item = make_items()[0]
    good = valid_answer(rubric, item)
    openai_server.push(Scripted(body=openai_reply(f"```json\n{json.dumps(good)}\n```")))
    with VLMJudge("gpt", http_params(openai_server), rubric, tmp_path) as judge:
        [answer] = judge.judge_many([item])
    assert answer.status == "scored" and answer.scores == good
    assert answer.raw == (f"```json\n{json.dumps(good)}\n```",) and answer.attempts == 1
    [request] = openai_server.requests
    assert data_url_images(request.body) == [item.source_png, item.output_png]
    response_format = request.body["response_format"]
    assert response_format["type"] == "json_schema"
    schema = response_format["json_schema"]["schema"]
    assert schema == rubric.json_schema(rubric.axes_for(item))
    assert set(schema["required"]) == set(good) and schema["additionalProperties"] is False


def test_openai_schema_can_be_switched_off_and_is_part_of_the_cache_key(
        openai_server: FakeLLMServer, rubric: Rubric, tmp_path: Path) -> None:
    item = make_items()[2]
    good = json.dumps(valid_answer(rubric, item))
    openai_server.push(Scripted(body=openai_reply(good)), Scripted(body=openai_reply(good)))
    with VLMJudge("on", http_params(openai_server), rubric, tmp_path) as on, \
            VLMJudge("off", http_params(openai_server, structured_output=False), rubric,
                     tmp_path) as off:
        [with_schema] = on.judge_many([item])
        [without] = off.judge_many([item])
        assert on.judge_id != off.judge_id
    assert with_schema.status == without.status == "scored"
    assert with_schema.call_ids != without.call_ids  # the same cache folder, not shared
    assert "response_format" in openai_server.requests[0].body
    assert "response_format" not in openai_server.requests[1].body


def test_openai_malformed_then_good_is_one_retry_with_both_raws(
        openai_server: FakeLLMServer, rubric: Rubric, tmp_path: Path) -> None:
    item = make_items()[1]
    assert "aging_accuracy" in rubric.axes_for(item)
    good = valid_answer(rubric, item)
    openai_server.push(Scripted(body=openai_reply('{"edit_success": 4, "skin_tone": ')),
                       Scripted(body=openai_reply(json.dumps(good))))
    with VLMJudge("gpt", http_params(openai_server), rubric, tmp_path) as judge:
        [answer] = judge.judge_many([item])
    assert answer.status == "scored" and answer.scores == good
    assert answer.raw == ('{"edit_success": 4, "skin_tone":', json.dumps(good))
    assert answer.attempts == 2 and len(set(answer.call_ids)) == 2
    retry = openai_server.requests[1].body["messages"]
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"]
    assert retry[2]["content"] == '{"edit_success": 4, "skin_tone":'
    assert "could not be used: the reply holds no JSON object" in retry[3]["content"]
    assert "response_format" in openai_server.requests[1].body


def test_openai_still_invalid_after_the_retry_is_an_abstention(
        openai_server: FakeLLMServer, rubric: Rubric, tmp_path: Path) -> None:
    item = make_items()[2]
    bad = {**valid_answer(rubric, item), "edit_success": 9}
    openai_server.push(Scripted(body=openai_reply(json.dumps(bad))),
                       Scripted(body=openai_reply("I would say it is fine.")))
    with VLMJudge("gpt", http_params(openai_server), rubric, tmp_path) as judge:
        [answer] = judge.judge_many([item])
    assert answer.status == "abstained" and answer.scores == {}
    assert answer.reason == "no valid answer after one retry: the reply holds no JSON object"
    assert answer.raw == (json.dumps(bad), "I would say it is fine.")
    assert "edit_success: Input should be less than or equal to 5" in \
        openai_server.requests[1].body["messages"][3]["content"]


@pytest.mark.parametrize("reply, reason", [
    (openai_reply(None, refusal="I can't help with that."), "judge refused: message.refusal"),
    (openai_reply("I'm sorry, but I can't assist with rating people."),
     "judge refused: looks like a refusal"),
])
def test_openai_refusal_is_an_abstention_without_retry(
        openai_server: FakeLLMServer, rubric: Rubric, tmp_path: Path, reply: dict[str, Any],
        reason: str) -> None:
    openai_server.push(Scripted(body=reply))
    with VLMJudge("gpt", http_params(openai_server), rubric, tmp_path) as judge:
        [answer] = judge.judge_many(make_items()[:1])
    assert answer.status == "abstained" and answer.reason == reason
    assert answer.scores == {} and len(answer.raw) == 1
    assert openai_server.request_count == 1


def test_openai_timeout_is_an_error_not_cached_and_asked_again(
        openai_server: FakeLLMServer, rubric: Rubric, tmp_path: Path) -> None:
    item = make_items()[0]
    good = json.dumps(valid_answer(rubric, item))
    openai_server.push(Scripted(delay=1.0, body=openai_reply(good)),
                       Scripted(body=openai_reply(good)))
    params = http_params(openai_server, timeout_s=0.2)
    with VLMJudge("gpt", params, rubric, tmp_path) as judge:
        [answer] = judge.judge_many([item])
    assert answer.status == "error" and answer.reason == "timeout after 1 attempt"
    assert answer.scores == {}
    assert not list(tmp_path.rglob("*.json"))  # nothing cached
    with VLMJudge("gpt", params, rubric, tmp_path) as judge:
        [again] = judge.judge_many([item])
    assert again.status == "scored" and again.call_ids == answer.call_ids
    assert openai_server.request_count == 2


def test_openai_concurrent_batch_with_retries_keeps_order(rubric: Rubric, tmp_path: Path
                                                          ) -> None:
    items = [JudgeItem(f"r{i}", f"make the person wear a hat number {i}"
                       + (" garble" if i % 2 else ""), pixels(10 + i), source=pixels(20 + i))
             for i in range(6)]
    good = valid_answer(rubric, items[0])

    def respond(user: str) -> Scripted:
        first_ask = "could not be used" not in user
        if first_ask and "garble" in user:
            return Scripted(body=openai_reply("no idea"))
        number = int(user.split("hat number ")[1].split()[0]) if first_ask else 0
        return Scripted(body=openai_reply(json.dumps({**good, "edit_success": 1 + number % 5})))

    with FakeLLMServer("openai", responder=respond) as server, \
            VLMJudge("gpt", http_params(server, concurrency=4), rubric, tmp_path) as judge:
        answers = judge.judge_many(items)
        assert server.request_count == 9  # six questions, three retries
    assert [a.status for a in answers] == ["scored"] * 6
    assert [a.scores["edit_success"] for a in answers] == [1, 1, 3, 1, 5, 1]
    assert [len(a.raw) for a in answers] == [1, 2, 1, 2, 1, 2]


def test_identity_names_the_model_never_the_endpoint_or_key(
        openai_server: FakeLLMServer, rubric: Rubric, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_KEY", "sk-secret-value")
    params = http_params(openai_server, api_key_env="JUDGE_KEY", revision="2024-08-06", seed=3)
    with VLMJudge("gpt", params, rubric, tmp_path) as judge:
        identity = judge.identity()
        moved = VLMJudge("other-name", params.model_copy(update={"base_url": "http://mirror/v1"}),
                         rubric, tmp_path)
        assert moved.judge_id == judge.judge_id
    assert identity == {"kind": "vlm", "structured_output": True, "backend": {
        "kind": "openai", "model": "judge-model", "revision": "2024-08-06", "temperature": 0.0,
        "seed": 3, "max_tokens": 300}}
    assert "sk-secret-value" not in json.dumps(identity)


# ---- Gemini -------------------------------------------------------------------------------------


def test_gemini_good_answer_asks_for_json(rubric: Rubric, tmp_path: Path) -> None:
    item = make_items()[0]
    good = valid_answer(rubric, item)
    with FakeLLMServer("gemini") as server, \
            VLMJudge("gemini", http_params(server, model="gemini-2.5-flash"), rubric,
                     tmp_path) as judge:
        server.push(Scripted(body=gemini_reply(json.dumps(good))))
        [answer] = judge.judge_many([item])
        [request] = server.requests
    assert answer.status == "scored" and answer.scores == good
    assert request.body["generationConfig"]["responseMimeType"] == "application/json"
    inline = [part["inline_data"] for part in request.body["contents"][0]["parts"]
              if "inline_data" in part]
    assert [base64.b64decode(p["data"]) for p in inline] == [item.source_png, item.output_png]


# ---- the study rubric's prompt options: the source's labels, observations first ----------------

STUDY_FILE = REPO / "src" / "acrb" / "judges" / "rubrics" / "study-v1.yaml"
#: What a judge told the labels reads of the source of ``labelled_item``.
STATED = ("For reference, the dataset the source photograph comes from labels the person as: "
          "race Southeast Asian; gender Female; age group 70 or older.")


def labelled_item() -> JudgeItem:
    """An aging edit whose item carries the source's labels (the stage fills them only for a
    judge whose prompt states them; here they are present either way, so the prompt option
    alone decides whether the judge reads them)."""
    return JudgeItem("r-labels", "make this person look 30 years older", pixels(30),
                     source=pixels(31), labels={"race": "SoutheastAsian", "gender": "Female",
                                                "age": "70plus"})


def sent_text(body: dict[str, Any]) -> str:
    return "\n".join(part["text"] for part in body["messages"][1]["content"]
                     if part["type"] == "text")


def test_study_rubric_prompt_states_labels_and_asks_observations_only_when_on(
        openai_server: FakeLLMServer, tmp_path: Path) -> None:
    from acrb.config import JudgePromptParams

    study = load_rubric(STUDY_FILE)
    item = labelled_item()
    axes = study.axes_for(item)
    assert axes == ("edit_success", "skin_tone", "race_change", "gender_change",
                    "age_direction")
    scores = {"edit_success": 4, "skin_tone": 3, "race_change": 1, "gender_change": 1,
              "age_direction": 2}
    observed = ("The person now has grey hair and deeper lines {but looks younger than asked}; "
                "skin tone, race and gender look unchanged.\n"
                f"```json\n{json.dumps(scores)}\n```")
    openai_server.push(Scripted(body=openai_reply(json.dumps(scores))),
                       Scripted(body=openai_reply(observed)))
    on = JudgePromptParams(labels=True, observations_first=True)
    with VLMJudge("off", http_params(openai_server), study, tmp_path) as plain, \
            VLMJudge("on", http_params(openai_server), study, tmp_path, on) as told:
        [without] = plain.judge_many([item])
        [answer] = told.judge_many([item])
        assert told.identity()["prompt"] == {"labels": True, "observations_first": True}
        assert "prompt" not in plain.identity() and told.judge_id != plain.judge_id
    off_body, on_body = (r.body for r in openai_server.requests)

    # Off (the default): the request is exactly the rubric's questions; no label, no
    # observations, the answer schema sent; nothing recorded as told.
    keys = ", ".join(f'"{a}"' for a in axes)
    questions = "\n".join(study._describe(a, item) for a in axes)
    request = f"Request given to the editing model: {item.instruction}"
    assert sent_text(off_body) == (
        f"Source image:\nOutput image:\n{request}\n\nRate the output on each of these:\n"
        f"{questions}\n\nAnswer with one JSON object with exactly the keys {keys}.")
    texts = sent_text(off_body) + off_body["messages"][0]["content"]
    for word in ("Southeast Asian", "SoutheastAsian", "Female", "70", "labels the person",
                 "observations"):
        assert word not in texts
    assert "response_format" in off_body
    assert without.status == "scored" and not without.labels_given

    # On: the labels sentence follows the request, the observations come before the JSON,
    # no schema constrains the reply to JSON, and the scores are read after the observations.
    assert sent_text(on_body) == (
        f"Source image:\nOutput image:\n{request}\n{STATED}\n\n"
        f"Rate the output on each of these:\n{questions}\n\n"
        f"{study.observations.strip() if study.observations else ''}\n"
        f"End your answer with one JSON object with exactly the keys {keys}.")
    assert "much younger than asked" in questions  # the aging request's own question
    assert "response_format" not in on_body
    assert on_body["messages"][0]["content"] == study.system.strip()
    assert answer.status == "scored" and answer.scores == scores
    assert answer.raw == (observed,) and answer.labels_given
    assert answer.call_ids != without.call_ids


def test_observations_then_json_is_read_from_the_last_object() -> None:
    study = load_rubric(STUDY_FILE)
    axes = ("edit_success", "skin_tone")
    text = 'I see {"edit_success": 1} in the caption. Scores: {"edit_success": 5, "skin_tone": 3}'
    assert study.parse(text, axes, last=True) == {"edit_success": 5, "skin_tone": 3}
    with pytest.raises(Exception, match="skin_tone"):
        study.parse(text, axes)  # the first object: the observations' braces


def test_a_rubric_without_the_wording_refuses_the_prompt_options(
        openai_server: FakeLLMServer, rubric: Rubric, tmp_path: Path) -> None:
    from acrb.config import JudgePromptParams

    for option in ("labels", "observations_first"):
        with pytest.raises(ConfigError, match=r"judges\.gpt\.prompt .*acrb@1"):
            VLMJudge("gpt", http_params(openai_server), rubric, tmp_path,
                     JudgePromptParams(**{option: True}))


def test_temperature_point_one_is_accepted_and_sent(openai_server: FakeLLMServer,
                                                     tmp_path: Path) -> None:
    study = load_rubric(STUDY_FILE)
    item = labelled_item()
    good = {a: 3 for a in study.axes_for(item)}
    openai_server.push(Scripted(body=openai_reply(json.dumps(good))))
    with VLMJudge("gpt", http_params(openai_server, temperature=0.1), study, tmp_path) as judge:
        [answer] = judge.judge_many([item])
        assert judge.identity()["backend"]["temperature"] == 0.1
    assert answer.status == "scored"
    assert openai_server.requests[0].body["temperature"] == 0.1
