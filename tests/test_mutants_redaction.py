"""Kill tests for acrb.redaction: a raw key fed to every masking layer directly, in this process.

tests/test_secrets.py checks the end-to-end property (no key reaches a file or the output of a
real run, the traceback hook in a child process); here each layer is called on its own with the
key unmasked: the thresholds at their boundaries (8 characters a key, 12 a masked piece, 24 for
a key's ends), the value walker, the file rewriter, the log record factory and the traceback
hook (called directly, with stderr captured and the previous hooks restored).
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acrb import redaction

ENV = "ACRB_TEST_KEY"
KEY = "sk-test-4Fh8Kq2Lp9Wz3Xc7Vb1Nm6"  # 30 characters: pieces and both ends are masked
HIDDEN = f"[redacted:{ENV}]"


@pytest.fixture
def key() -> str:
    assert redaction.register_secret(ENV, KEY)
    return KEY


def test_mask_names_the_variable() -> None:
    assert redaction.mask("OPENAI_API_KEY") == "[redacted:OPENAI_API_KEY]"


def test_nothing_registered_masks_nothing(tmp_path: Path) -> None:
    redaction.forget_all()
    assert not redaction.active() and redaction.registered_names() == []
    assert redaction.redact(f"a {KEY}") == f"a {KEY}"
    value = {"k": [KEY]}
    assert redaction.redact_value(value) is value
    assert not redaction.contains_secret(KEY)
    path = tmp_path / "a.json"
    path.write_text(KEY)
    assert not redaction.redact_file(path) and path.read_text() == KEY


def test_the_shortest_key_is_eight_characters() -> None:
    assert not redaction.register_secret("SEVEN", "Zq81-kL")
    assert not redaction.register_secret("NONE", None)
    assert not redaction.register_secret("BLANK", "   \n")
    assert not redaction.active()
    # Surrounding white space is not part of the key (as an .env line or a pasted key).
    assert redaction.register_secret("EIGHT", "  Zq81-kLm\n")
    assert redaction.active() and redaction.registered_names() == ["EIGHT"]
    assert redaction.redact("k=Zq81-kLm;") == "k=[redacted:EIGHT];"
    assert redaction.redact("k=Zq81-kL;") == "k=Zq81-kL;"


def test_a_key_registered_twice_keeps_its_first_name(key: str) -> None:
    assert redaction.register_secret("OTHER_NAME", key)
    assert redaction.registered_names() == [ENV]
    assert redaction.redact(key) == HIDDEN


def test_every_key_registered_stays_masked() -> None:
    second = "gm-idle-Xc83Jd02LqPz71NvBw5Ka"
    assert redaction.register_secret("ZZ_FIRST", KEY)
    assert redaction.register_secret("SECOND", second)
    assert redaction.registered_names() == ["SECOND", "ZZ_FIRST"]  # sorted, not as registered
    assert redaction.redact(f"{KEY} {second}") == "[redacted:ZZ_FIRST] [redacted:SECOND]"
    # A piece of the first key still grows to its whole run after the second came.
    assert redaction.redact(f"<{KEY[3:19]}>") == "<[redacted:ZZ_FIRST]>"


def test_a_key_under_twelve_characters_is_masked_whole_only() -> None:
    eleven = "Ab3dE5gH7jK"
    assert redaction.register_secret("SHORT", eleven)
    assert redaction.redact(f"{eleven}!") == "[redacted:SHORT]!"
    assert redaction.redact(eleven[:10]) == eleven[:10]


def test_a_twelve_character_key_is_masked_by_its_pieces() -> None:
    twelve = "Ab3dE5gH7jK9"
    assert redaction.register_secret("TWELVE", twelve)
    assert redaction.redact(f"x{twelve}y") == "x[redacted:TWELVE]y"
    # A 13-character key: both 12-character pieces are masked, though neither is the key.
    thirteen = "Qw2eR4tY6uI8o"
    assert redaction.register_secret("THIRTEEN", thirteen)
    for piece in (thirteen[:12], thirteen[1:]):
        assert redaction.redact(f"<{piece}>") == "<[redacted:THIRTEEN]>"
    assert redaction.redact(f"<{thirteen[1:12]}>") == f"<{thirteen[1:12]}>"


def test_the_ends_are_masked_from_twenty_four_characters() -> None:
    long_key = "Lk2Mn4Bv6Cx8Za1Sd3Fg5Hj7"  # 24
    short_key = "Pq9Wo8Ei7Ru6Ty5Yu4Ui3Oi"  # 23
    assert redaction.register_secret("LONG", long_key)
    assert redaction.register_secret("SHORTER", short_key)
    assert redaction.redact(f"{long_key[:8]}...{long_key[-8:]}") == \
        "[redacted:LONG]...[redacted:LONG]"
    assert redaction.redact(f"{short_key[:8]}...{short_key[-8:]}") == \
        f"{short_key[:8]}...{short_key[-8:]}"


def test_pieces_at_every_offset_grow_to_their_run(key: str) -> None:
    # Every run of 12 or more characters of the key, anywhere, is one mask; every run of 11
    # that is not a key end is left.
    for start in range(len(key) - 11):
        for end in range(start + 12, len(key) + 1):
            assert redaction.redact(f"({key[start:end]})") == f"({HIDDEN})", (start, end)
    for start in range(8, len(key) - 8 - 11 + 1):
        piece = key[start:start + 11]
        assert redaction.redact(f"({piece})") == f"({piece})", start
    # A run followed by more key-like text of another key stops where the key does.
    assert redaction.redact(key + key[:5] + "!") == HIDDEN + key[:5] + "!"
    # Two runs that touch are two masks; overlapping ones merge into one.
    assert redaction.redact(key[:14] + key[3:20]) == HIDDEN * 2
    assert redaction.redact(key[:14] + key[14:]) == HIDDEN
    # Text on both sides is kept byte for byte; the key in the middle of a long text too.
    text = "é" * 40 + key[2:17] + "ü" * 40 + key
    assert redaction.redact(text) == "é" * 40 + HIDDEN + "ü" * 40 + HIDDEN


def test_redact_of_empty_and_clean_text(key: str) -> None:
    assert redaction.redact("") == ""
    clean = "nothing to see " * 5
    assert redaction.redact(clean) is clean


def test_redact_value_walks_dicts_lists_and_tuples(key: str) -> None:
    value = {"a": [key, (1, key, None)], key: {"deep": (key,)}, "n": 3.5, "b": b"raw"}
    assert redaction.redact_value(value) == {
        "a": [HIDDEN, (1, HIDDEN, None)], HIDDEN: {"deep": (HIDDEN,)}, "n": 3.5, "b": b"raw"}
    walked = redaction.redact_value([(key,)])
    assert type(walked) is list and type(walked[0]) is tuple
    assert redaction.redact_value(key) == HIDDEN
    assert redaction.redact_value(7) == 7


def test_contains_secret_reads_bytes_and_text(key: str) -> None:
    assert redaction.contains_secret(b"\xff\xfe " + key.encode())  # not UTF-8 around it
    assert redaction.contains_secret(f"x{key[5:18]}y")
    assert not redaction.contains_secret(b"nothing here")
    assert not redaction.contains_secret("")


def test_redact_file_rewrites_text_files_only(key: str, tmp_path: Path) -> None:
    text = tmp_path / "reply.JSON"  # the suffix is compared in lower case
    text.write_text(f'{{"reply": "{key}", "note": "é"}}', encoding="utf-8")
    assert redaction.redact_file(text)
    assert text.read_text(encoding="utf-8") == f'{{"reply": "{HIDDEN}", "note": "é"}}'
    assert not redaction.redact_file(text)  # clean now: left as it is
    for name in ("image.png", "table.parquet"):
        binary = tmp_path / name
        binary.write_bytes(key.encode())
        assert not redaction.redact_file(binary) and binary.read_bytes() == key.encode()
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"\xe9 " + key.encode())  # not UTF-8: left alone
    assert not redaction.redact_file(latin) and latin.read_bytes() == b"\xe9 " + key.encode()
    assert not redaction.redact_file(tmp_path / "missing.md")
    clean = tmp_path / "clean.md"
    clean.write_text("nothing")
    before = clean.stat().st_mtime_ns
    assert not redaction.redact_file(clean) and clean.stat().st_mtime_ns == before


def make_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
    return logging.LogRecord(*args, **kwargs)


def test_the_record_factory_masks_the_message_when_made(key: str) -> None:
    factory = redaction._RedactingRecordFactory(make_record)
    assert factory.inner is make_record
    record = factory("acrb", logging.WARNING, __file__, 1, "server said %s", (key,), None)
    assert isinstance(record, logging.LogRecord)
    assert record.msg == f"server said {HIDDEN}" and record.args == ()
    assert record.getMessage() == f"server said {HIDDEN}"
    # A clean message keeps its arguments for the handler to format.
    clean = factory("acrb", logging.INFO, __file__, 1, "%s of %d", ("3", 4), None)
    assert (clean.msg, clean.args) == ("%s of %d", ("3", 4))
    # A malformed call is left for the handler to report, as it would have been.
    broken = factory("acrb", logging.INFO, __file__, 1, "%d", (key,), None)
    assert (broken.msg, broken.args) == ("%d", (key,))


def test_the_record_factory_is_a_no_op_with_nothing_registered() -> None:
    factory = redaction._RedactingRecordFactory(make_record)
    record = factory("acrb", logging.INFO, __file__, 1, "said %s", (KEY,), None)
    assert (record.msg, record.args) == ("said %s", (KEY,))


@pytest.fixture
def fresh_hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, ...]]]:
    """No hooks installed yet; an excepthook that records its calls; both hooks restored."""
    calls: list[tuple[Any, ...]] = []
    factory = logging.getLogRecordFactory()
    monkeypatch.setattr(redaction, "_installed", False)
    monkeypatch.setattr(sys, "excepthook", lambda *args: calls.append(args))
    try:
        yield calls
    finally:
        logging.setLogRecordFactory(factory)


def raised() -> tuple[type[BaseException], BaseException, Any]:
    try:
        raise RuntimeError(f"the server said {KEY}")
    except RuntimeError as error:
        return type(error), error, error.__traceback__


def test_registering_installs_each_hook_once(fresh_hooks: list[tuple[Any, ...]]) -> None:
    before_factory, before_hook = logging.getLogRecordFactory(), sys.excepthook
    assert redaction.register_secret(ENV, KEY)
    factory = logging.getLogRecordFactory()
    assert isinstance(factory, redaction._RedactingRecordFactory)
    assert factory.inner is before_factory
    hook = sys.excepthook
    assert hook is not before_hook
    assert redaction.register_secret("SECOND", "gm-idle-Xc83Jd02LqPz71NvBw5Ka")
    assert logging.getLogRecordFactory() is factory and sys.excepthook is hook
    assert redaction._installed
    # The installed hook passes to the one it replaced once nothing is registered.
    redaction.forget_all()
    error = raised()
    hook(*error)
    assert fresh_hooks == [error]


def test_the_excepthook_writes_the_masked_traceback(
        fresh_hooks: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]) -> None:
    hook = redaction._redacting_excepthook(sys.excepthook)
    kind, error, tb = raised()
    expected = "".join(traceback.format_exception(kind, error, tb)).replace(KEY, HIDDEN)
    assert redaction.register_secret(ENV, KEY)
    hook(kind, error, tb)
    captured = capsys.readouterr()
    assert captured.err == expected and KEY not in captured.err
    assert "RuntimeError: the server said " + HIDDEN in captured.err
    assert fresh_hooks == []  # the masked text replaces the inner hook's output


def test_the_excepthook_without_keys_is_the_inner_hook(
        fresh_hooks: list[tuple[Any, ...]], capsys: pytest.CaptureFixture[str]) -> None:
    hook = redaction._redacting_excepthook(sys.excepthook)
    error = raised()
    hook(*error)
    assert fresh_hooks == [error] and capsys.readouterr().err == ""


def test_forget_all_unregisters_every_key(key: str) -> None:
    redaction.forget_all()
    assert not redaction.active() and redaction.redact(key) == key


def test_params_secrets_are_found_at_any_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, KEY)
    monkeypatch.setenv("ACRB_TEST_SECOND", "gm-idle-Xc83Jd02LqPz71NvBw5Ka")
    monkeypatch.setenv("ACRB_TEST_PLACEHOLDER", "EMPTY")
    monkeypatch.delenv("ACRB_TEST_UNSET", raising=False)
    raw = {
        "models": {"a": {"config": {"api_key_env": ENV}},
                   "b": {"config": {"api_key_env": ENV}}},  # named twice: registered once
        "judges": [{"backend": {"api_key_env": "ACRB_TEST_UNSET"}},
                   ({"backend": {"api_key_env": "ACRB_TEST_SECOND"}},)],
        "local": {"api_key_env": "ACRB_TEST_PLACEHOLDER"},  # too short to be a key
        "blank": {"api_key_env": ""},
        "nested": {"api_key_env": {"api_key_env": "ACRB_TEST_SECOND"}},
    }
    assert redaction.register_params_secrets(raw) == [ENV, "ACRB_TEST_SECOND"]
    assert redaction.registered_names() == [ENV, "ACRB_TEST_SECOND"]
    assert redaction.redact(KEY) == HIDDEN


def test_params_secrets_of_a_non_string_entry_walk_into_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, KEY)
    assert redaction.register_params_secrets({"x": {"api_key_env": {"api_key_env": ENV}}}) == \
        [ENV]
    assert redaction.register_params_secrets({"x": {"api_key_env": 3}}) == []


def test_a_run_grows_to_the_first_character_of_the_text_and_no_further() -> None:
    """A run that starts the text is masked from its first character (a piece found from a
    block one character in still grows back to index 0), and growing back never wraps round to
    the text's last character nor past the key's first."""
    key = "Qw3-Er5tY7uI9oP1aS"  # 18 characters: blocks at key offsets 0, 6 and 12
    assert redaction.register_secret(ENV, key)
    # Starts at key offset 5: its first block (offset 6) is at text index 1.
    assert redaction.redact(key[5:]) == HIDDEN
    # Starts at key offset 6 and the text ends with the key's character before it.
    assert redaction.redact(key[6:] + " " + key[5]) == HIDDEN + " " + key[5]
    # The key whole, after the key's own last character.
    assert redaction.redact(key[-1] + key) == key[-1] + HIDDEN


def test_keys_found_one_character_apart_are_both_masked() -> None:
    # Two short keys (masked only whole) that overlap by all but one character.
    assert redaction.register_secret("FIRST", "abcdefgh")
    assert redaction.register_secret("SECOND", "bcdefghi")
    assert redaction.redact("<abcdefghi>") == "<[redacted:FIRST]>"


def test_a_block_two_keys_share_is_grown_for_each() -> None:
    """The block ``b`` stands in both keys: the first key's run, grown from an earlier block,
    already covers it, and the second key's run through it (its only block in the text) is
    still grown and masked."""
    block = "Bq7Bq7"
    first = "AAAAxy" + block           # b at offset 6
    second = "ZZZZxy" + block + "CCCC"  # b at offset 6, and its only whole block in the text
    assert redaction.register_secret("FIRST", first)
    assert redaction.register_secret("SECOND", second)
    assert redaction.redact("AAAAxy" + block + "CCCC!") == "[redacted:FIRST]!"


def test_a_merged_mask_is_named_by_the_longest_match_at_its_start() -> None:
    """Where a short key and a longer run of another key start at the same character, the mask
    names the key the text holds more of."""
    assert redaction.register_secret("SHORT", "Kp4Wz8Lm")
    assert redaction.register_secret("LONG", "Kp4Wz8Lm2Xc6Vb0N")
    assert redaction.redact("=Kp4Wz8Lm2Xc6Vb0N=") == "=[redacted:LONG]="


def test_the_record_factory_passes_keyword_arguments_through(key: str) -> None:
    factory = logging.getLogRecordFactory()
    record = factory("acrb.test", logging.INFO, __file__, 1, f"key {key}", (), None,
                     func="the_caller", sinfo="the stack")
    assert record.funcName == "the_caller" and record.stack_info == "the stack"
    assert record.getMessage() == f"key {HIDDEN}"


def _reference_spans(text: str, keys: dict[str, str]) -> list[tuple[int, int]]:
    """What the module docstring promises, by brute force: every common run of text and a key
    of at least 12 characters (the longest there), a key under 12 characters whole, and a key
    of 24 or more characters' first and last 8; overlapping spans merged, touching ones not."""
    spans: list[tuple[int, int]] = []

    def occurrences(part: str) -> None:
        spans.extend((i, i + len(part)) for i in range(len(text) - len(part) + 1)
                     if text.startswith(part, i))

    for key in keys:
        if len(key) < redaction.PIECE_CHARS:
            occurrences(key)
        else:
            for i in range(len(text)):
                for j in range(len(key)):
                    if i and j and text[i - 1] == key[j - 1]:
                        continue  # not where a run starts
                    length = 0
                    while (i + length < len(text) and j + length < len(key)
                           and text[i + length] == key[j + length]):
                        length += 1
                    if length >= redaction.PIECE_CHARS:
                        spans.append((i, i + length))
        if len(key) >= redaction.FRAGMENT_FROM_CHARS:
            occurrences(key[:redaction.FRAGMENT_CHARS])
            occurrences(key[-redaction.FRAGMENT_CHARS:])
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def test_the_masks_are_those_of_a_brute_force_search_on_random_texts() -> None:
    """Keys and texts over a three-letter alphabet (so runs of keys repeat, overlap and cross
    one another) with pieces of the keys pasted in: the masked spans are exactly the brute
    force's, whatever the keys' lengths (8 to 40), periods and shared blocks."""
    import random

    rng = random.Random(20261202)
    for trial in range(300):
        redaction.forget_all()
        keys: dict[str, str] = {}
        for number in range(rng.randint(1, 3)):
            if rng.random() < 0.3:  # a periodic key: its blocks repeat inside it
                unit = "".join(rng.choice("abc") for _ in range(rng.randint(2, 7)))
                key = (unit * 40)[:rng.randint(8, 40)]
            else:
                key = "".join(rng.choice("abc") for _ in range(rng.randint(8, 40)))
            if redaction.register_secret(f"K{number}", key) and key not in keys:
                keys[key] = f"K{number}"
        parts = []
        for _ in range(rng.randint(1, 6)):
            if rng.random() < 0.6:
                key = rng.choice(list(keys))
                start = rng.randint(0, len(key) - 1)
                parts.append(key[start:rng.randint(start + 1, len(key))])
            else:
                parts.append("".join(rng.choice("abc") for _ in range(rng.randint(0, 10))))
        text = "".join(parts)
        found = [(start, end) for start, end, _ in redaction._spans(text)]
        assert found == _reference_spans(text, keys), (trial, keys, text)


def test_a_whole_key_of_any_length_is_one_span_of_the_text_and_no_more() -> None:
    """Every length a key may have (8 to 40 characters, so every remainder of a key's length by
    its 6-character blocks): the key alone is one span, ending where the text does; a text that
    ends with a few characters of the key is left alone."""
    import random
    import string

    for length in range(redaction.MIN_SECRET_CHARS, 41):
        redaction.forget_all()
        rng = random.Random(length)
        key = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(length))
        assert redaction.register_secret("K", key)
        assert redaction._spans(key) == [(0, length, "K")], length
        assert redaction._spans("=" + key[-5:]) == [], length
