"""The review store: set loading, raters, assignment (k raters, repeats, pair order, resume),
rating validation, 30 raters at once, the export and the `acrb review` commands."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from acrb.cli import app
from acrb.errors import ConfigError, InputDataError
from acrb.records import REVIEW_AXES, RatingRecord, ReviewItemRecord, read_table
from acrb.review import store as review_store
from acrb.review.finalize import finalize, read_manifest
from acrb.review.store import REPEAT_GAP, ReviewStore
from acrb.storage import sha256_file
from tests.conftest import deep_update, repo_params
from tests.review_fixtures import answers_for, make_review_set, make_review_store


def audit_lines(store: ReviewStore) -> int:
    return len(store.log.read_text(encoding="utf-8").splitlines())


def rate_all(store: ReviewStore, rater: str, value: int | None = 3) -> list[review_store.Claim]:
    """Rate whatever ``rater`` is given until nothing is left; return the claims in order."""
    claims = []
    while (claim := store.next_item(rater)) is not None:
        store.rate(rater, claim.item.item_id, answers_for(claim.shown_order, value),
                   claim.shown_order, 1000)
        claims.append(claim)
    return claims


# ----------------------------------------------------------------------------- set, settings


def test_load_set_records_its_hash_and_refuses_another(tmp_path: Path) -> None:
    table = make_review_set(tmp_path, 5)
    store = ReviewStore(tmp_path / "work", create=True, raters_per_item=2, repeat_fraction=0)
    assert store.load_set(table, tmp_path) == 5
    info = store.set_info()
    assert info["sha256"] == sha256_file(table)
    assert info["project_root"] == str(tmp_path.resolve())
    assert [i.item_id for i in store.items()] == \
        read_table(table, ReviewItemRecord)["item_id"].tolist()
    entries = [json.loads(line) for line in store.log.read_text().splitlines()]
    assert [e["action"] for e in entries] == ["init", "load_set"]
    assert entries[1]["set_sha256"] == info["sha256"] and entries[1]["items"] == 5
    assert store.load_set(table, tmp_path) == 0  # the same set again: nothing changes
    other = make_review_set(tmp_path / "other", 4)
    with pytest.raises(InputDataError, match="is not the review set this folder rates"):
        store.load_set(other, tmp_path / "other")
    assert audit_lines(store) == 2


def test_load_set_refuses_images_outside_the_root_or_missing(tmp_path: Path) -> None:
    table = make_review_set(tmp_path, 3)
    rows = read_table(table, ReviewItemRecord)
    rows.loc[0, "output_path"] = "../outside.png"
    rows.loc[1, "source_path"] = "data/images/nothing-here.png"
    bad = tmp_path / "bad.parquet"
    from acrb.records import write_table

    write_table(bad, rows, ReviewItemRecord)
    (tmp_path.parent / "outside.png").write_bytes(b"x")
    store = ReviewStore(tmp_path / "work", create=True)
    with pytest.raises(InputDataError, match="2 image") as caught:
        store.load_set(bad, tmp_path)
    assert "../outside.png" in caught.value.problem and "nothing-here" in caught.value.problem
    assert store.items() == [] and store.set_info()["sha256"] == ""
    with pytest.raises(InputDataError, match="not found"):
        store.load_set(tmp_path / "none.parquet", tmp_path)


def test_settings_are_kept_in_the_folder(tmp_path: Path) -> None:
    ReviewStore(tmp_path / "work", create=True, raters_per_item=2, repeat_fraction=0.1)
    again = ReviewStore(tmp_path / "work")
    assert again.raters_per_item == 2 and again.repeat_fraction == 0.1
    assert ReviewStore(tmp_path / "work", raters_per_item=2).raters_per_item == 2
    with pytest.raises(ConfigError, match="raters_per_item"):
        ReviewStore(tmp_path / "work", raters_per_item=3)
    with pytest.raises(InputDataError, match="acrb review init"):
        ReviewStore(tmp_path / "elsewhere")


def test_raters_tokens_are_stored_hashed(tmp_path: Path) -> None:
    store, tokens = make_review_store(tmp_path, ("r01", "r02"))
    assert store.raters() == ["r01", "r02"]
    assert tokens["r01"].startswith("acrb_") and tokens["r01"] != tokens["r02"]
    raw = store.database.read_bytes() + store.log.read_bytes()
    assert tokens["r01"].encode() not in raw
    with pytest.raises(ConfigError, match="already exists"):
        store.add_rater("r01")
    with pytest.raises(ConfigError, match="pseudonym"):
        store.add_rater("Jane Doe <jane@example.org>")
    with pytest.raises(ConfigError, match="pseudonym"):
        store.add_rater("r01\n")  # would show as a second "r01"
    login = store.login(tokens["r02"])
    assert login is not None and login[1].user == "r02"
    new = store.replace_token("r02")
    assert store.login(tokens["r02"]) is None and store.session(login[0]) is None
    assert store.login(new) is not None


# ----------------------------------------------------------------------------- assignment


def test_each_item_goes_to_k_distinct_raters(tmp_path: Path) -> None:
    store, _ = make_review_store(tmp_path, ("a", "b", "c", "d"), items=6, k=2)
    done = {name: rate_all(store, name) for name in ("a", "b", "c", "d")}
    per_item = Counter(c.item.item_id for claims in done.values() for c in claims)
    assert per_item == dict.fromkeys([i.item_id for i in store.items()], 2)
    for claims in done.values():
        ids = [c.item.item_id for c in claims]
        assert len(ids) == len(set(ids))
    # The first raters fill items before the later ones start new ones: a takes 6, b the
    # same 6, and c and d find nothing left.
    assert [len(done[n]) for n in "abcd"] == [6, 6, 0, 0]
    progress = store.progress()
    assert progress["rated"] == progress["target"] == 12 and progress["complete_items"] == 6
    # The database itself refuses a second claim of an item by one rater.
    con = sqlite3.connect(store.database)
    with pytest.raises(sqlite3.IntegrityError):
        con.execute("INSERT INTO claims (rater, item_id, repeat, shown_order, claimed_at, "
                    "state) VALUES ('a', ?, 0, 'edited', 0, 'done')",
                    (done["a"][0].item.item_id,))
    con.close()


def test_repeats_come_back_later_once(tmp_path: Path) -> None:
    store, _ = make_review_store(tmp_path, ("a",), items=12, k=1, repeat_fraction=0.25)
    claims = rate_all(store, "a")
    fresh = [c for c in claims if not c.repeat]
    repeats = [c for c in claims if c.repeat]
    assert len(fresh) == 12 and len(repeats) == 3  # a quarter of 12
    first_seen = {c.item.item_id: n for n, c in enumerate(claims) if not c.repeat}
    assert len({c.item.item_id for c in repeats}) == 3  # each comes back once
    for n, claim in enumerate(claims):
        if claim.repeat:
            # Only items rated before come back, and not straight after (while fresh
            # items remain).
            assert claim.item.item_id in first_seen and first_seen[claim.item.item_id] < n
            if n < len(claims) - 1 or any(not c.repeat for c in claims[n:]):
                assert n - first_seen[claim.item.item_id] > REPEAT_GAP
    ratings = store.ratings()
    assert sum(r.repeat for r in ratings) == sum(len(c.shown_order) for c in repeats)
    assert store.progress()["repeats"] == 3


def test_pairs_are_shown_in_random_recorded_order(tmp_path: Path) -> None:
    store, _ = make_review_store(tmp_path, tuple(f"r{i}" for i in range(40)), items=1, k=40,
                                 paired_every=1)
    orders = Counter()
    for i in range(40):
        claim = store.next_item(f"r{i}")
        assert claim is not None
        orders[claim.shown_order] += 1
        # The answers follow the outputs, whatever side they were on.
        answers = {"edited": dict.fromkeys(REVIEW_AXES, 5),
                   "feature": dict.fromkeys(REVIEW_AXES, 1)}
        store.rate(f"r{i}", claim.item.item_id, answers, claim.shown_order)
    # Each order has probability 2^-40 of never being drawn.
    assert set(orders) == {("edited", "feature"), ("feature", "edited")}
    assert sum(orders.values()) == 40
    shown_first = Counter()
    for rating in store.ratings():
        assert rating.edit_success == (5 if rating.output == "edited" else 1)
        shown_first[(rating.output, rating.shown_first)] += 1
    assert shown_first[("edited", True)] == orders[("edited", "feature")]
    assert shown_first[("feature", True)] == orders[("feature", "edited")]
    assert shown_first[("edited", True)] + shown_first[("feature", True)] == 40
    assert shown_first[("edited", False)] == orders[("feature", "edited")]


def test_resume_gives_back_the_open_claim(tmp_path: Path) -> None:
    store, _ = make_review_store(tmp_path, ("a",), items=3)
    first = store.next_item("a")
    assert first is not None
    again = ReviewStore(store.workdir).next_item("a")  # another process, later
    assert again == first
    assert store.open_claim("a") == first
    store.rate("a", first.item.item_id, answers_for(first.shown_order), first.shown_order)
    following = store.next_item("a")
    assert following is not None and following.item.item_id != first.item.item_id


def test_an_abandoned_claim_goes_to_someone_else(tmp_path: Path) -> None:
    store, _ = make_review_store(tmp_path, ("a", "b"), items=1, k=1)
    left = store.next_item("a")
    assert left is not None and store.next_item("b") is None
    con = sqlite3.connect(store.database)
    con.execute("UPDATE claims SET claimed_at = claimed_at - ?",
                (review_store.CLAIM_SECONDS + 1,))
    con.commit()
    con.close()
    taken = store.next_item("b")
    assert taken is not None and taken.item == left.item
    seen = audit_lines(store)
    with pytest.raises(InputDataError, match="no open claim"):
        store.rate("a", left.item.item_id, answers_for(left.shown_order), left.shown_order)
    assert audit_lines(store) == seen
    store.rate("b", taken.item.item_id, answers_for(taken.shown_order), taken.shown_order)
    assert store.next_item("a") is None  # k = 1 reached


# ----------------------------------------------------------------------------- rating


def test_rate_validates_and_logs_every_rating(tmp_path: Path) -> None:
    store, _ = make_review_store(tmp_path, ("a", "b"), items=4, k=1, paired_every=1)
    claim = store.next_item("a")
    assert claim is not None and len(claim.shown_order) == 2
    item, order = claim.item.item_id, claim.shown_order
    good = answers_for(order)
    bad = [
        ({**good, "edited": {**good["edited"], "skin_tone": 6}}, order, "skin_tone"),
        ({**good, "edited": {**good["edited"], "skin_tone": 0}}, order, "skin_tone"),
        ({**good, "edited": {**good["edited"], "skin_tone": True}}, order, "skin_tone"),
        ({**good, "edited": {**good["edited"], "skin_tone": "3"}}, order, "skin_tone"),
        ({**good, "edited": {a: 3 for a in REVIEW_AXES[1:]}}, order, "missing"),
        ({**good, "edited": {**good["edited"], "smile": 3}}, order, "unknown axes"),
        ({"edited": good["edited"]}, order, "answer every output"),
        ({**good, "other": good["edited"]}, order, "not one of"),
        (good, tuple(reversed(order)), "not the order recorded"),
        (good, ("edited",), "not the order recorded"),
    ]
    seen = audit_lines(store)
    for answers, shown, message in bad:
        with pytest.raises(InputDataError, match=message):
            store.rate("a", item, answers, shown)
    with pytest.raises(InputDataError, match="no open claim"):
        store.rate("b", item, good, order)  # b holds no claim on it
    with pytest.raises(InputDataError, match="no open claim"):
        store.rate("a", "another-item", good, order)
    assert audit_lines(store) == seen and store.ratings() == []

    cannot = {**good, "feature": {**good["feature"], "race_change": None}}
    entry = store.rate("a", item, cannot, order, duration_ms=60_000)
    assert entry["action"] == "rate" and entry["rater"] == "a" and entry["item_id"] == item
    assert entry["answers"]["feature"]["race_change"] is None
    assert audit_lines(store) == seen + 1
    ratings = {r.output: r for r in store.ratings()}
    assert ratings["feature"].race_change is None and ratings["edited"].race_change == 3
    assert all(r.origin == "app" and not r.repeat for r in ratings.values())
    # A minute is more than the time since the claim (the test is fast): not plausible, so
    # the server's own measure is kept.
    assert ratings["edited"].duration_ms is not None and ratings["edited"].duration_ms < 5000
    assert sorted(entry["rating_ids"]) == sorted(r.rating_id for r in ratings.values())
    with pytest.raises(InputDataError, match="no open claim"):
        store.rate("a", item, good, order)  # rated already
    assert store.verify().ok


def test_duration_is_bounded(tmp_path: Path) -> None:
    store, _ = make_review_store(tmp_path, ("a",), items=3, k=1, paired_every=0)
    con = sqlite3.connect(store.database)

    def age_claim(seconds: float) -> review_store.Claim:
        claim = store.next_item("a")
        assert claim is not None
        con.execute("UPDATE claims SET claimed_at = claimed_at - ? WHERE state = 'open'",
                    (seconds,))
        con.commit()
        return claim

    claim = age_claim(10)
    store.rate("a", claim.item.item_id, answers_for(claim.shown_order), claim.shown_order,
               duration_ms=4_000)  # within the 10 s since the claim: the client's is kept
    claim = age_claim(10)
    store.rate("a", claim.item.item_id, answers_for(claim.shown_order), claim.shown_order)
    claim = age_claim(2 * 3600)  # away for two hours: no rating time
    store.rate("a", claim.item.item_id, answers_for(claim.shown_order), claim.shown_order)
    con.close()
    durations = [r.duration_ms for r in store.ratings()]
    assert durations[0] == 4_000
    assert durations[1] is not None and 10_000 <= durations[1] < 12_000
    assert durations[2] is None


# ----------------------------------------------------------------------------- concurrency


def test_thirty_raters_at_once(tmp_path: Path) -> None:
    """30 raters x 100 ratings, all at once: nothing lost, the chain verifies, no rater
    gets an item twice (other than a marked repeat), no item beyond k raters."""
    raters = tuple(f"r{i:02d}" for i in range(30))
    store, _ = make_review_store(tmp_path, raters, items=1200, k=3, repeat_fraction=0.05,
                                 paired_every=3, distinct_images=4)
    before = audit_lines(store)
    barrier = threading.Barrier(len(raters))
    saved: dict[str, list[tuple[str, bool, int]]] = {}
    failures: list[BaseException] = []

    def work(rater: str) -> None:
        try:
            mine = []
            barrier.wait(timeout=30)
            for _ in range(100):
                claim = store.next_item(rater)
                assert claim is not None
                entry = store.rate(rater, claim.item.item_id, answers_for(claim.shown_order),
                                   claim.shown_order, 500)
                mine.append((claim.item.item_id, claim.repeat, entry["seq"]))
            saved[rater] = mine
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in raters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures[:3]
    assert sum(len(v) for v in saved.values()) == 3000

    verification = store.verify()
    assert verification.ok, verification.message()
    assert verification.entries == before + 3000
    rate_entries = [json.loads(line) for line in store.log.read_text().splitlines()
                    if '"action":"rate"' in line]
    assert len(rate_entries) == 3000

    ratings = store.ratings()
    claims_by_rater: dict[str, Counter[tuple[str, bool]]] = {}
    for rating in ratings:
        claims_by_rater.setdefault(rating.rater, Counter())[(rating.item_id, rating.repeat)] += 1
    first_raters: dict[str, set[str]] = {}
    for rater, mine in saved.items():
        fresh = [item for item, repeat, _ in mine if not repeat]
        repeated = [item for item, repeat, _ in mine if repeat]
        assert len(fresh) == len(set(fresh)), rater  # never the same item twice ...
        assert len(repeated) == len(set(repeated)) and set(repeated) <= set(fresh)  # ... but
        assert len(repeated) == 4  # a marked repeat: 5% of the 96 first ratings, rounded down
        for item in fresh:
            first_raters.setdefault(item, set()).add(rater)
    assert max(len(r) for r in first_raters.values()) <= 3  # never beyond k
    # Every rating each rater was told was saved is in the store: one row per output shown.
    outputs = {i.item_id: 1 + (i.paired_output_path is not None) for i in store.items()}
    assert len(ratings) == sum(outputs[item] for mine in saved.values() for item, _, _ in mine)
    for rater, mine in saved.items():
        held = claims_by_rater[rater]
        assert held == Counter({(item, repeat): outputs[item] for item, repeat, _ in mine})


# ----------------------------------------------------------------------------- export, CLI


def test_finalize_exports_ratings_and_items(tmp_path: Path) -> None:
    store, _ = make_review_store(tmp_path, ("a", "b"), items=5, k=1, repeat_fraction=0.2)
    rate_all(store, "a", value=4)
    ratings = store.ratings()
    result = finalize(store, tmp_path / "inputs" / "review")
    out = result.folder
    table = read_table(out / "ratings.parquet", RatingRecord)
    assert len(table) == len(ratings) == result.ratings
    assert set(table["origin"]) == {"app"} and set(table["rater"]) == {"a"}
    assert table["repeat"].sum() == sum(r.repeat for r in ratings) > 0
    csv = pd.read_csv(out / "ratings.csv")
    assert csv["rating_id"].tolist() == table["rating_id"].tolist()
    assert (csv["edit_success"] == 4).all()
    items = read_table(out / "items.parquet", ReviewItemRecord)
    assert sorted(items["item_id"]) == sorted({r.item_id for r in ratings})
    assert {"race", "gender", "age", "model"} <= set(items.columns)
    manifest = read_manifest(out)
    assert manifest["audit"]["head"] == store.head()[1] == result.audit_head
    assert manifest["review_set"]["sha256"] == store.set_info()["sha256"]
    assert manifest["files"]["ratings.parquet"] == sha256_file(out / "ratings.parquet")
    assert json.loads((out / "audit.jsonl").read_text().splitlines()[-1])["action"] \
        == "finalize"

    # The exported log verifies on its own, and an edit to it is caught.
    runner = CliRunner()
    assert runner.invoke(app, ["review", "verify", str(out)]).exit_code == 0
    lines = (out / "audit.jsonl").read_text().splitlines()
    first_rating = next(n for n, line in enumerate(lines) if '"action":"rate"' in line)
    lines[first_rating] = lines[first_rating].replace('"rater":"a"', '"rater":"z"')
    (out / "audit.jsonl").write_text("\n".join(lines) + "\n")
    failed = runner.invoke(app, ["review", "verify", str(out)])
    assert failed.exit_code == 1 and f"line {first_rating + 1}" in failed.output


def test_finalize_refuses_a_tampered_log_or_no_ratings(tmp_path: Path) -> None:
    store, _ = make_review_store(tmp_path, ("a",), items=2, k=1)
    with pytest.raises(InputDataError, match="no ratings"):
        finalize(store, tmp_path / "out")
    rate_all(store, "a")
    text = store.log.read_text().replace('"rater":"a"', '"rater":"b"', 1)
    store.log.write_text(text)
    with pytest.raises(InputDataError, match="does not verify"):
        finalize(store, tmp_path / "out")
    assert not (tmp_path / "out" / "ratings.parquet").exists()


def test_review_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    for command in ("init", "add-rater", "serve", "status", "verify", "finalize"):
        shown = runner.invoke(app, ["review", command, "--help"])
        assert shown.exit_code == 0 and "Usage" in shown.output, command
    make_review_set(tmp_path, 4, paired_every=0)
    params = deep_update(repo_params(), {"review": {"raters_per_item": 2,
                                                    "repeat_fraction": 0.25}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    init = runner.invoke(app, ["review", "init"])
    assert init.exit_code == 0, init.output
    assert "k=2" in init.output and "4 items added" in init.output
    assert "age question change" in init.output
    store = ReviewStore(tmp_path / "review-work")
    assert store.raters_per_item == 2 and store.repeat_fraction == 0.25
    assert store.set_info()["sha256"] == sha256_file(tmp_path / "data/review/set/items.parquet")
    added = runner.invoke(app, ["review", "add-rater", "r01"])
    assert added.exit_code == 0
    token = added.output.strip().splitlines()[-1]
    assert store.login(token) is not None
    assert runner.invoke(app, ["review", "add-rater", "r01"]).exit_code == 2
    rate_all(store, "r01")
    status = runner.invoke(app, ["review", "status"])
    assert status.exit_code == 0 and "4 / 8 ratings" in status.output
    assert "r01: 4 rated, 1 repeats" in status.output
    assert runner.invoke(app, ["review", "verify"]).exit_code == 0
    done = runner.invoke(app, ["review", "finalize"])
    assert done.exit_code == 0, done.output
    assert len(read_table(tmp_path / "inputs/review/ratings.parquet", RatingRecord)) == 5
    # A changed k in params is refused for the folder under way.
    params["review"]["raters_per_item"] = 3
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    changed = runner.invoke(app, ["review", "init"])
    assert changed.exit_code == 2 and "raters_per_item" in changed.output


# ----------------------------------------------------------------------------- age question

DIRECTION_AXES = ("edit_success", "skin_tone", "race_change", "gender_change", "age_direction")
#: The ratings table as ACRB made it before the age question could be asked as a direction.
OLD_RATINGS_TABLE = """
CREATE TABLE ratings (
    rating_id TEXT PRIMARY KEY, claim_id INTEGER NOT NULL REFERENCES claims (claim_id),
    rater TEXT NOT NULL, item_id TEXT NOT NULL, output TEXT NOT NULL, shown_first INTEGER,
    edit_success INTEGER, skin_tone INTEGER, race_change INTEGER, gender_change INTEGER,
    age_change INTEGER, repeat INTEGER NOT NULL, duration_ms INTEGER,
    created_at TEXT NOT NULL, audit_seq INTEGER NOT NULL);
"""


def test_direction_question_keeps_the_answer_and_its_drift(tmp_path: Path) -> None:
    store, _ = make_review_store(tmp_path, ("a",), items=4, k=1, paired_every=0,
                                 age_question="direction")
    assert store.age_question == "direction"
    assert store.asked_axes == DIRECTION_AXES == review_store.asked_axes("direction")
    # much younger -> a complete change; no change -> the same; somewhat older -> noticeably
    # different; cannot tell -> neither known.
    expected = {1: (1, 5), 3: (3, 1), 4: (4, 3), None: (None, None)}
    entries = []
    for answer in expected:
        claim = store.next_item("a")
        assert claim is not None
        answers = answers_for(claim.shown_order, 2, DIRECTION_AXES)
        answers["edited"]["age_direction"] = answer
        entries.append(store.rate("a", claim.item.item_id, answers, claim.shown_order))
    ratings = store.ratings()
    assert [(r.age_direction, r.age_change) for r in ratings] == list(expected.values())
    assert all(r.edit_success == 2 and r.gender_change == 2 for r in ratings)
    # The audit log keeps what the rater answered, on the question they were asked.
    assert [e["answers"]["edited"]["age_direction"] for e in entries] == list(expected)
    assert all("age_change" not in e["answers"]["edited"] for e in entries)
    assert store.verify().ok

    result = finalize(store, tmp_path / "inputs" / "review")
    table = read_table(result.folder / "ratings.parquet", RatingRecord)
    assert [None if pd.isna(v) else int(v) for v in table["age_direction"]] == list(expected)
    assert [None if pd.isna(v) else int(v) for v in table["age_change"]] == \
        [change for _, change in expected.values()]
    csv = pd.read_csv(result.folder / "ratings.csv")
    assert csv["age_direction"].tolist()[:3] == [1, 3, 4] and pd.isna(csv["age_direction"][3])
    assert read_manifest(result.folder)["age_question"] == "direction"


def test_each_age_question_refuses_the_other(tmp_path: Path) -> None:
    direction, _ = make_review_store(tmp_path / "direction", ("a",), items=1, k=1,
                                     paired_every=0, age_question="direction")
    change, _ = make_review_store(tmp_path / "change", ("a",), items=1, k=1, paired_every=0)
    for store, wrong, right in ((direction, REVIEW_AXES, DIRECTION_AXES),
                                (change, DIRECTION_AXES, REVIEW_AXES)):
        claim = store.next_item("a")
        assert claim is not None
        seen = audit_lines(store)
        asked, other = ("age_direction", "age_change") if store is direction \
            else ("age_change", "age_direction")
        with pytest.raises(InputDataError, match=rf"unknown axes \['{other}'\]; "
                           rf"missing \['{asked}'\]") as caught:
            store.rate("a", claim.item.item_id, answers_for(claim.shown_order, 3, wrong),
                       claim.shown_order)
        assert asked in str(caught.value.fix)
        both = {"edited": {**answers_for(claim.shown_order, 3, right)["edited"], other: 3}}
        with pytest.raises(InputDataError, match=rf"unknown axes \['{other}'\]"):
            store.rate("a", claim.item.item_id, both, claim.shown_order)
        assert audit_lines(store) == seen and store.ratings() == []
        store.rate("a", claim.item.item_id, answers_for(claim.shown_order, 5, right),
                   claim.shown_order)
    # The change question leaves the direction unknown; 5 as a direction is much older.
    assert [(r.age_change, r.age_direction) for r in change.ratings()] == [(5, None)]
    assert [(r.age_change, r.age_direction) for r in direction.ratings()] == [(5, 5)]


def test_the_age_question_is_kept_in_the_folder(tmp_path: Path) -> None:
    work = tmp_path / "work"
    ReviewStore(work, create=True, age_question="direction")
    assert ReviewStore(work).age_question == "direction"
    assert ReviewStore(work, age_question="direction").asked_axes == DIRECTION_AXES
    with pytest.raises(ConfigError) as caught:
        ReviewStore(work, age_question="change")
    assert "review.age_question = direction" in caught.value.problem
    assert "params now say change" in caught.value.problem
    assert "set review.age_question back to direction" in str(caught.value.fix)
    init = json.loads(ReviewStore(work).log.read_text().splitlines()[0])
    assert init["action"] == "init" and init["age_question"] == "direction"
    with pytest.raises(ConfigError, match="age_question is 'bipolar'"):
        ReviewStore(tmp_path / "other", create=True, age_question="bipolar")
    # The default, and a folder made before the setting existed: both ask for change.
    assert ReviewStore(tmp_path / "plain", create=True).age_question == "change"
    con = sqlite3.connect(work / review_store.DATABASE)
    con.execute("DELETE FROM meta WHERE key = 'age_question'")
    con.commit()
    con.close()
    old = ReviewStore(work)
    assert old.age_question == "change" and old.asked_axes == REVIEW_AXES
    assert ReviewStore(work, age_question="change").age_question == "change"
    with pytest.raises(ConfigError, match=r"review\.age_question = change, params now say "
                       r"direction"):
        ReviewStore(work, age_question="direction")


def test_a_database_from_before_age_direction_opens_and_exports(tmp_path: Path) -> None:
    store, _ = make_review_store(tmp_path, ("a",), items=3, k=1, paired_every=0)
    claim = store.next_item("a")
    assert claim is not None
    store.rate("a", claim.item.item_id, answers_for(claim.shown_order, 4), claim.shown_order)
    store.close()
    # Make the folder what an earlier ACRB left: the old ratings table, no age question.
    old_columns = ("rating_id, claim_id, rater, item_id, output, shown_first, edit_success, "
                   "skin_tone, race_change, gender_change, age_change, repeat, duration_ms, "
                   "created_at, audit_seq")
    con = sqlite3.connect(store.database)
    con.executescript(
        "ALTER TABLE ratings RENAME TO ratings_new;" + OLD_RATINGS_TABLE
        + f"INSERT INTO ratings SELECT {old_columns} FROM ratings_new; DROP TABLE ratings_new;"
        "DELETE FROM meta WHERE key = 'age_question';")
    assert "age_direction" not in {r[1] for r in con.execute("PRAGMA table_info(ratings)")}
    con.close()

    reopened = ReviewStore(store.workdir, age_question="change")
    con = sqlite3.connect(store.database)
    assert "age_direction" in {r[1] for r in con.execute("PRAGMA table_info(ratings)")}
    con.close()
    assert [(r.age_change, r.age_direction) for r in reopened.ratings()] == [(4, None)]
    following = reopened.next_item("a")
    assert following is not None
    reopened.rate("a", following.item.item_id, answers_for(following.shown_order, 2),
                  following.shown_order)
    assert [r.age_change for r in reopened.ratings()] == [4, 2]
    assert ReviewStore(store.workdir).ratings() == reopened.ratings()  # opens again as is
    assert reopened.verify().ok
    result = finalize(reopened, tmp_path / "inputs" / "review")
    table = read_table(result.folder / "ratings.parquet", RatingRecord)
    assert table["age_direction"].isna().all() and table["age_change"].tolist() == [4, 2]


def test_review_init_takes_the_age_question_from_params(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    make_review_set(tmp_path, 2, paired_every=0)
    params = deep_update(repo_params(), {"review": {"age_question": "direction"}})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    init = runner.invoke(app, ["review", "init"])
    assert init.exit_code == 0, init.output
    assert "age question direction" in init.output
    assert ReviewStore(tmp_path / "review-work").age_question == "direction"
    params["review"]["age_question"] = "change"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    changed = runner.invoke(app, ["review", "init"])
    assert changed.exit_code == 2 and "age_question" in changed.output
