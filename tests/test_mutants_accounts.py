"""Kill tests for acrb.web.accounts: what a store does for its token holders, and what it logs.

Each action is checked by its effect (which token and which session cookie work afterwards,
including a session id replayed after logout or a token replacement) and by the exact audit
line it appends, on the curation store (holders are "curators") and the review store
("raters")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from acrb.curation.store import CurationStore
from acrb.errors import ConfigError, InputDataError
from acrb.review.store import ReviewStore


def audit(store: CurationStore | ReviewStore) -> list[dict[str, Any]]:
    """The audit lines without the chain's own fields (time, sequence, hashes)."""
    chain = {"at", "seq", "prev", "hash"}
    if not store.log.exists():
        return []
    return [{k: v for k, v in json.loads(line).items() if k not in chain}
            for line in store.log.read_text().splitlines()]


def test_a_folder_is_made_with_its_parents_and_reopened(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b"
    store = CurationStore(folder, create=True)
    assert store.workdir == folder and isinstance(store.workdir, Path)
    assert store.database == folder / "curation.sqlite" and store.database.is_file()
    assert store.log == folder / "audit.jsonl"
    store.add_user("alice")
    store.close()
    # An existing folder opens without create, with what it holds.
    again = CurationStore(folder)
    assert again.users() == ["alice"]
    assert again.verify().ok
    again.close()
    # And create=True on an existing folder keeps it too.
    assert CurationStore(folder, create=True).users() == ["alice"]


def test_a_missing_folder_is_refused_without_create(tmp_path: Path) -> None:
    with pytest.raises(InputDataError) as err:
        CurationStore(tmp_path / "nowhere")
    assert err.value.problem == f"no curation database in {tmp_path / 'nowhere'}"
    assert not (tmp_path / "nowhere").exists()


def test_the_verify_command_names_the_tool_and_folder(tmp_path: Path) -> None:
    store = CurationStore(tmp_path, create=True)
    assert store.role.tool_command == "acrb curate"
    assert store._audit.verify_command == f"acrb curate verify {tmp_path}"
    review = ReviewStore(tmp_path / "review", create=True)
    assert review._audit.verify_command == f"acrb review verify {tmp_path / 'review'}"


def test_add_user_logs_the_holder_in_the_role_s_words(tmp_path: Path) -> None:
    store = CurationStore(tmp_path, create=True)
    token = store.add_user("bob")
    store.add_user("alice")
    assert store.users() == ["alice", "bob"]
    assert store.user_for_token(token) == "bob"
    assert store.user_for_token("acrb_not-a-token") is None
    assert audit(store) == [{"action": "add_curator", "curator": "bob"},
                            {"action": "add_curator", "curator": "alice"}]
    assert store.head()[0] == 2


def test_add_user_refuses_a_bad_or_taken_name(tmp_path: Path) -> None:
    store = CurationStore(tmp_path, create=True)
    with pytest.raises(ConfigError) as err:
        store.add_user("no spaces")
    assert err.value.problem == ("curator name 'no spaces' is not 1-40 letters, digits, '.', '_' "
                                 "or '-' starting with a letter or digit")
    assert err.value.fix == "choose a short name such as `alice` or `j.doe`"
    store.add_user("alice")
    with pytest.raises(ConfigError) as err:
        store.add_user("alice")
    assert err.value.problem == "curator 'alice' already exists"
    assert err.value.fix == ("pick another name; a lost token is replaced with "
                             "`acrb curate add-curator NAME --replace-token`")
    assert audit(store) == [{"action": "add_curator", "curator": "alice"}]


def test_login_session_and_logout_with_a_replayed_cookie(tmp_path: Path) -> None:
    store = CurationStore(tmp_path, create=True)
    token = store.add_user("alice")
    assert store.login("acrb_wrong") is None
    assert store.login("") is None
    found = store.login(token)
    assert found is not None
    sid, session = found
    assert session.user == "alice"
    assert store.session(sid) == session
    assert store.session(None) is None
    other = store.login(token)
    assert other is not None and other[0] != sid
    store.logout(sid)
    # The logged-out cookie, sent again, opens nothing; the other session lives on.
    assert store.session(sid) is None
    assert store.session(other[0]) == other[1]
    store.logout(sid)  # ignored: unknown by now, and not logged again
    store.logout("never-issued")
    assert audit(store) == [{"action": "add_curator", "curator": "alice"},
                            {"action": "login", "curator": "alice"},
                            {"action": "login", "curator": "alice"},
                            {"action": "logout", "curator": "alice"}]
    assert store.verify().ok and store.head()[0] == 4


def test_replace_token_ends_the_old_token_and_every_session(tmp_path: Path) -> None:
    store = ReviewStore(tmp_path, create=True)
    old = store.add_user("r01")
    keep = store.add_user("r02")
    first, second = store.login(old), store.login(old)
    kept = store.login(keep)
    assert first is not None and second is not None and kept is not None
    new = store.replace_token("r01")
    assert new != old and new.startswith("acrb_")
    assert store.user_for_token(old) is None and store.user_for_token(new) == "r01"
    # Both cookies of r01, replayed, are dead; r02's session is not touched.
    assert store.session(first[0]) is None and store.session(second[0]) is None
    assert store.session(kept[0]) == kept[1]
    assert store.login(old) is None
    assert store.login(new) is not None
    assert audit(store)[-5:] == [{"action": "login", "rater": "r01"},
                                 {"action": "login", "rater": "r01"},
                                 {"action": "login", "rater": "r02"},
                                 {"action": "replace_token", "rater": "r01"},
                                 {"action": "login", "rater": "r01"}]


def test_replace_token_of_nobody_is_refused(tmp_path: Path) -> None:
    store = CurationStore(tmp_path, create=True)
    with pytest.raises(ConfigError) as err:
        store.replace_token("carol")
    assert (err.value.problem, err.value.fix) == ("no curator named 'carol'", "add them first")
    assert audit(store) == []


def test_lines_past_the_head_are_set_aside_and_resolved_by_name(tmp_path: Path) -> None:
    store = CurationStore(tmp_path, create=True)
    store.add_user("alice")
    store.close()
    with store.log.open("a") as handle:  # a write that never committed (a crash), torn
        handle.write('{"action": "login", "cur')
    # The store cannot tell whether it committed, so the line waits for a person.
    reopened = CurationStore(tmp_path)
    check = reopened.verify()
    assert not check.ok and len(check.set_aside) == 1
    logged = reopened.resolve_set_aside("bob")
    assert [(e["action"], e["by"], e["file"]) for e in logged] == [
        ("resolve_set_aside", "bob", check.set_aside[0])]
    assert reopened.verify().ok
    assert reopened.resolve_set_aside() == []


def test_set_aside_lines_resolved_without_a_name_log_an_empty_one(tmp_path: Path) -> None:
    store = CurationStore(tmp_path, create=True)
    store.add_user("alice")
    store.close()
    with store.log.open("a") as handle:
        handle.write('{"action": "login"}\n')  # a whole line nobody recorded
    reopened = CurationStore(tmp_path)
    assert [(e["action"], e["by"]) for e in reopened.resolve_set_aside()] == [
        ("resolve_set_aside", "")]
