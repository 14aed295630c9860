"""Security properties a planted bug once switched off without any test failing (issue 31):
a logged-out session cookie replayed, and an API key fed straight to two masking layers that
the end-to-end secrets test only ever reached with the key already masked upstream.

Each test fails with its bug planted (``benchmarks/planted_bugs.py``, the bugs
``logout-keeps-session``, ``write-table-unmasked`` and ``cached-reply-unmasked``) and passes
without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from acrb import redaction
from acrb.clients import AnswerSchema, ChatClient, Conversation, text_messages
from acrb.clients._client import RequestOutcome
from acrb.config import LLMBackendParams
from acrb.curation.store import CurationStore
from acrb.records import GenerationRecord, read_table, write_table
from acrb.review.store import ReviewStore
from acrb.review.web import create_app
from tests.live_server import csrf_of
from tests.review_fixtures import make_review_store
from tests.test_secrets import ENV, KEY, MIDDLE, leaking_files, leaks

SESSION_COOKIE = "acrb_review_session"


# ---- logout: the server forgets the session, whoever still holds the cookie ---------------------


@pytest.fixture
def review(tmp_path: Path) -> tuple[ReviewStore, dict[str, str]]:
    return make_review_store(tmp_path, ("r01",), items=2, k=1, paired_every=2)


@pytest.fixture
def client(review: tuple[ReviewStore, dict[str, str]]) -> Iterator[TestClient]:
    with TestClient(create_app(review[0], allowed_hosts=["testserver"]),
                    follow_redirects=False) as test_client:
        yield test_client


def test_a_session_cookie_replayed_after_logout_is_refused(
        client: TestClient, review: tuple[ReviewStore, dict[str, str]]) -> None:
    store, tokens = review
    page = client.get("/login")
    assert client.post("/login", data={"token": tokens["r01"],
                                       "csrf": csrf_of(page.text)}).status_code == 303
    stolen = client.cookies[SESSION_COOKIE]
    rate_page = client.get("/")
    assert rate_page.status_code == 200
    assert store.session(stolen) is not None
    out = client.post("/logout", data={"csrf": csrf_of(rate_page.text)})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    # The browser drops the cookie; someone who copied it sends it again.
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, stolen)
    replayed = client.get("/")
    assert replayed.status_code == 303 and replayed.headers["location"] == "/login"
    assert client.get("/image/1/source").status_code == 401
    assert store.session(stolen) is None


@pytest.mark.parametrize("kind", ["curation", "review"])
def test_logout_closes_the_session_on_the_server(
        kind: str, tmp_path: Path, review: tuple[ReviewStore, dict[str, str]]) -> None:
    """Both tools' stores (one :class:`~acrb.web.accounts.AccountStore`): after ``logout`` the
    session id no longer names a session, and the holder's other session is untouched."""
    store: CurationStore | ReviewStore
    if kind == "curation":
        curation = CurationStore(tmp_path / "curation", create=True)
        store, token = curation, curation.add_curator("alice")
    else:
        store, tokens = review
        token = tokens["r01"]
    first, second = store.login(token), store.login(token)
    assert first is not None and second is not None
    store.logout(first[0])
    assert store.session(first[0]) is None
    assert store.session(second[0]) is not None


# ---- masking: a raw registered key fed to each layer directly --------------------------------


def generation(message: str) -> dict[str, object]:
    return {"request_id": "r1", "model": "m", "status": "error", "message": message,
            "model_revision": "v1", "library_versions": "{}", "refusal_code": None}


def test_write_table_masks_a_registered_key_in_any_row(tmp_path: Path) -> None:
    redaction.register_secret(ENV, KEY)
    path = tmp_path / "generations.parquet"
    write_table(path, [generation(f"upstream said {KEY}; ref {MIDDLE}")], GenerationRecord)
    assert not leaking_files(tmp_path)
    message = read_table(path, GenerationRecord)["message"].iloc[0]
    assert message == f"upstream said [redacted:{ENV}]; ref [redacted:{ENV}]"


class EchoingChat(ChatClient):
    """A chat backend whose every reply carries the key; counts what it is asked."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__("echo", LLMBackendParams(kind="openai", model="echo-1"), cache_dir)
        self.asked = 0

    def _request(self, messages: Conversation, schema: AnswerSchema = None
                 ) -> RequestOutcome:
        self.asked += 1
        return RequestOutcome("ok", f"the answer, signed {KEY} ({MIDDLE})", "", 1)


def test_a_cached_reply_written_before_the_key_was_registered_comes_back_masked(
        tmp_path: Path) -> None:
    """A cache file written before the key was known holds it raw (nothing could mask it
    then); read once the key is registered, the reply the program gets is masked."""
    messages = text_messages("system", "a question")
    first = EchoingChat(tmp_path)
    assert KEY in first.chat(messages).text  # not registered yet: nothing to mask
    assert leaking_files(tmp_path)  # the raw key is in the cache file
    redaction.register_secret(ENV, KEY)
    again = EchoingChat(tmp_path)
    reply = again.chat(messages)
    assert reply.cached and again.asked == 0
    assert not leaks(reply.text) and not leaks(reply.reason)
    assert reply.text == f"the answer, signed [redacted:{ENV}] ([redacted:{ENV}])"
