"""Bad params, catalogs, prompt files and file-system states, through the real CLI.

Each case copies one good project (sources, prompts, plan, generate, evaluate and a study
import already run), breaks one thing, runs one `acrb` command and asserts: exit code 2, one
`error:` line holding a distinctive phrase followed by a `fix:` line, no traceback, every file
present before the command byte-identical after it, and no temporary file left behind.

Read-only folders are tested twice: with a real `chmod` (skipped as root, who ignores
permissions) and with the `PermissionError` a read-only folder raises, simulated where the
temporary file is created, so the path is tested on every machine.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from acrb import layout
from acrb.cli import app
from acrb.journal import JOURNAL_DIR
from acrb.storage import TMP_PREFIX
from tests.conftest import update_params, write_params

MODEL = "synthetic-biased"
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0

#: A catalog of made-up instructions, in the shape of the I2I catalog.
CATALOG = """\
name: test-catalog
version: 1
categories:
  A: {name: neutral}
  B: {name: occupational}
prompts:
  - {id: A01, category: A, text: "Put a blue felt hat on this person.", attribute: neutral}
  - {id: A02, category: A, text: "Change the background to a pebble beach.", attribute: neutral}
  - {id: B01, category: B, text: "Show this person as a ship's pilot in uniform.",
     attribute: "occupation:pilot", congruent_with: ["gender:Male"],
     incongruent_with: ["gender:Female"]}
  - {id: B02, category: B, text: "Show this person as a librarian at a desk.",
     attribute: "occupation:librarian"}
"""

#: A study prompt file of made-up entries, in the published file's shape.
STUDY = {"version": "0.9-test", "categories": {"A": "neutral", "B": "occupational"},
         "prompts": [{"id": "A01", "category": "A", "prompt": "Add a striped scarf.",
                      "hypothesis": ""},
                     {"id": "B01", "category": "B", "prompt": "Show them as a baker.",
                      "hypothesis": "H2"}]}


def _params_update(params: dict[str, Any]) -> None:
    params["models"] = {MODEL: params["models"][MODEL]}
    params["sources"].update(races=["Black", "White"], genders=["Female"], ages=["20s"])
    params["prompts"].update(catalog="inputs/catalog.yaml", categories=None, ids=None,
                             synthesis=None)
    params["analyze"].update(bootstrap=100, permutations=100,
                             hypotheses={"H2": params["analyze"]["hypotheses"]["H2"]})


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small project after a good run of sources, prompts, plan, generate and evaluate for
    one model, and a good study import (about a second)."""
    from acrb.prompts.study import import_study
    from acrb.stages import evaluate, generate, plan, prompts, sources

    root = tmp_path_factory.mktemp("bad-inputs") / "good"
    root.mkdir()
    (root / "dvc.yaml").write_text("stages: {}\n")
    (root / "inputs" / "study").mkdir(parents=True)
    (root / "inputs" / "catalog.yaml").write_text(CATALOG)
    (root / "inputs" / "study" / "prompts.json").write_text(json.dumps(STUDY))
    write_params(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        patch.chdir(root)
        ctx = update_params(root, _params_update)
        for stage in (sources, prompts, plan):
            stage.run(ctx)
        generate.run(ctx, MODEL)
        evaluate.run(ctx, MODEL)
        import_study(Path("inputs/study/prompts.json"), Path("inputs/study/catalog.yaml"))
    return root


# ---- what a case does to the project ------------------------------------------------------

def _write_text(path: Path, text: str) -> None:
    """Write ``text`` as UTF-8, except that a lone surrogate such as "\udce9" is written as
    the single byte it stands for (0xe9): how an editor saving Latin-1 leaves the file."""
    path.write_bytes(text.encode("utf-8", errors="surrogateescape"))


def params_text(edit: Callable[[str], str]) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        path = root / "params.yaml"
        _write_text(path, edit(path.read_text()))
    return setup


def params_bytes(data: bytes) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        (root / "params.yaml").write_bytes(data)
    return setup


def params_set(dotted: str, value: Any) -> Callable[[Path], None]:
    """Set one params key (``a.b.c``) to ``value`` and write the file back."""
    def setup(root: Path) -> None:
        path = root / "params.yaml"
        params = yaml.safe_load(path.read_text())
        *parents, last = dotted.split(".")
        node = params
        for key in parents:
            node = node[key]
        node[last] = value
        path.write_text(yaml.safe_dump(params, sort_keys=False))
    return setup


def params_edit(edit: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    """Apply ``edit`` to the params (a dict, changed in place) and write the file back."""
    def setup(root: Path) -> None:
        path = root / "params.yaml"
        params = yaml.safe_load(path.read_text())
        edit(params)
        path.write_text(yaml.safe_dump(params, sort_keys=False))
    return setup


def rename_judge(new: str) -> Callable[[dict[str, Any]], Any]:
    """The first judge entry under ``new`` (and ``judge.use`` naming it so)."""
    def edit(params: dict[str, Any]) -> None:
        old = params["judge"]["use"][0]
        params["judges"][new] = params["judges"].pop(old)
        params["judge"]["use"][0] = new
    return edit


def swapped_output(root: Path) -> None:
    """One output image replaced by another after generation, and the detectors' records
    gone, so that evaluate reads the images again."""
    images = sorted((root / layout.generations_dir(MODEL) / "images").glob("*.png"))
    images[0].write_bytes(images[1].read_bytes())
    shutil.rmtree(root / layout.JUDGEMENTS_DIR / MODEL)


def append_after(anchor: str, text: str) -> Callable[[str], str]:
    """Insert ``text`` after the first line that is exactly ``anchor``."""
    def edit(source: str) -> str:
        lines = source.splitlines(keepends=True)
        index = next(i for i, line in enumerate(lines) if line.rstrip("\n") == anchor)
        return "".join([*lines[: index + 1], text, *lines[index + 1 :]])
    return edit


def write_file(relative: str, content: str | bytes) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return setup


def catalog(edit: Callable[[str], str]) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        path = root / "inputs" / "catalog.yaml"
        _write_text(path, edit(path.read_text()))
    return setup


def catalog_bytes(data: bytes) -> Callable[[Path], None]:
    return write_file("inputs/catalog.yaml", data)


def replace(old: str, new: str) -> Callable[[str], str]:
    def edit(source: str) -> str:
        assert old in source, old
        return source.replace(old, new, 1)
    return edit


def study(edit: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        data = json.loads(json.dumps(STUDY))
        edit(data)
        (root / "inputs" / "study" / "prompts.json").write_text(json.dumps(data))
    return setup


#: One record of a survey export, in the study's shape (made-up values).
SURVEY_RECORD = {
    "userId": "ana@example.org", "itemId": "it-1", "originalItemId": "src-it-1",
    "model": "flux", "promptId": "A-03", "category": "A", "race": "Black", "gender": "Female",
    "age": "20-29", "editedShownFirst": True, "duration_ms": 5400,
    "createdAt": "2025-03-04T10:11:12.000Z",
    **{f"edited_{axis}": 3 for axis in ("edit_success", "skin_tone", "race_drift",
                                        "gender_drift", "age_drift")}}


def survey_after_an_import(records: list[dict[str, Any]]) -> Callable[[Path], None]:
    """A survey already imported into inputs/review, and ``records`` as the next export."""
    def setup(root: Path) -> None:
        from acrb.review.survey import write_survey

        first = root / "inputs" / "survey-first.json"
        first.write_text(json.dumps([SURVEY_RECORD]))
        write_survey(first, root / "inputs" / "review")
        (root / "inputs" / "survey.json").write_text(json.dumps(records))
    return setup


def synthesis_with(attributes: Callable[[str], str]) -> Callable[[Path], None]:
    """Turn on template synthesis with a copy of the shipped attribute file, edited."""
    def setup(root: Path) -> None:
        data = Path(__file__).resolve().parents[1] / "src" / "acrb" / "prompts" / "data"
        (root / "inputs" / "attributes.yaml").write_text(
            attributes((data / "attributes.yaml").read_text()))
        params_set("prompts.synthesis", {"base_prompts": str(data / "base_prompts.yaml"),
                                         "attributes": "inputs/attributes.yaml",
                                         "modes": ["i2i"]})(root)
    return setup


def both(*setups: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        for step in setups:
            step(root)
    return setup


def read_only(relative: str) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        folder = root / relative
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    return setup


def without(relative: str) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        shutil.rmtree(root / relative)
    return setup


def file_instead_of_folder(relative: str) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        path = root / relative
        if path.is_dir():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not a folder\n")
    return setup


# ---- simulated failures of the file system (patched where storage creates its files) ------

def refuse_writes_in(relative: str) -> Callable[[Path, pytest.MonkeyPatch], None]:
    """``tempfile.mkstemp`` in ``relative`` raises what a read-only folder raises."""
    def patch(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        folder = (root / relative).resolve()
        real = tempfile.mkstemp

        def mkstemp(suffix: str | None = None, prefix: str | None = None,
                    dir: str | os.PathLike[str] | None = None, text: bool = False
                    ) -> tuple[int, str]:
            if dir is not None and Path(dir).resolve().is_relative_to(folder):
                name = os.path.join(os.fspath(dir), f"{prefix}x1y2z3{suffix or ''}")
                raise PermissionError(errno.EACCES, "Permission denied", name)
            return real(suffix=suffix, prefix=prefix, dir=dir, text=text)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    return patch


def refuse_appends_in(relative: str) -> Callable[[Path, pytest.MonkeyPatch], None]:
    """Opening a file in ``relative`` to append to it (a stage's journal,
    :mod:`acrb.journal`) raises what a read-only folder raises."""
    def patch(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        folder = (root / relative).resolve()
        real = builtins.open

        def refusing_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, (str, os.PathLike)) and "a" in mode \
                    and Path(file).resolve().is_relative_to(folder):
                raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
            return real(file, mode, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", refusing_open)
    return patch


def disk_full_in(relative: str) -> Callable[[Path, pytest.MonkeyPatch], None]:
    """Moving a finished temporary file into ``relative`` fails as a full disk does (an
    ``OSError`` naming no file), after the temporary file was written."""
    def patch(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        folder = (root / relative).resolve()
        real = os.replace

        def replace_file(src: Any, dst: Any, **kwargs: Any) -> None:
            if Path(dst).resolve().is_relative_to(folder):
                raise OSError(errno.ENOSPC, "No space left on device")
            real(src, dst, **kwargs)

        monkeypatch.setattr(os, "replace", replace_file)
    return patch


# ---- the cases ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    id: str
    args: list[str]
    expect: str  # a distinctive phrase of the one-line error ({root}: the project's folder)
    setup: Callable[[Path], None] | None = None
    patch: Callable[[Path, pytest.MonkeyPatch], None] | None = None
    marks: list[Any] = field(default_factory=list)


PLAN = ["plan"]
PROMPTS = ["prompts"]
GENERATE = ["generate", "--model", MODEL]
IMPORT = ["prompts", "import-study", "inputs/study/prompts.json", "--out",
          "inputs/study/catalog.yaml"]
SURVEY = ["review", "import-survey", "inputs/survey.json", "--out", "inputs/review"]
CHMOD = [pytest.mark.skipif(AS_ROOT, reason="root ignores folder permissions; the simulated "
                            "case of the same folder runs instead")]

PARAMS_CASES = [
    Case("params-latin1-in-comment", PLAN, "line 1, column 3: byte 0xe9 is not UTF-8",
         params_text(lambda s: "# \udce9\n" + s)),
    Case("params-latin1-in-value", PLAN, "byte 0xe9 is not UTF-8",
         params_text(replace("name: embedded-default", "name: caf\udce9"))),
    Case("params-duplicate-generate-section", PLAN, "key 'generate' appears twice",
         params_text(lambda s: s + "generate:\n  batch_size: 3\n")),
    Case("params-duplicate-nested-key", PLAN, "key 'seed' appears twice",
         params_text(append_after("sources:", "  seed: 7\n"))),
    Case("params-duplicate-model-entry", PLAN, f"key '{MODEL}' appears twice",
         params_text(append_after("models:", f"  {MODEL}:\n    key: synthetic:fair\n"))),
    Case("params-duplicate-deep-key", PLAN, "key 'resolution' appears twice",
         params_text(append_after("sources:", "  resolution: 32\n"))),
    Case("params-syntax-unclosed-bracket", PLAN, "is not valid YAML at line",
         params_text(lambda s: s + "plan:\n  arms: [none\n")),
    Case("params-syntax-bad-indent", PLAN, "is not valid YAML at line",
         params_text(append_after("sources:", "      oops: 1\n  bad\n"))),
    Case("params-tab-indent", PLAN, "is not valid YAML at line",
         params_text(append_after("sources:", "\tseed: 1\n"))),
    Case("params-empty-file", PLAN, "is empty", params_bytes(b"")),
    Case("params-only-comments", PLAN, "is empty", params_bytes(b"# nothing here\n")),
    Case("params-top-level-list", PLAN, "must be a mapping of sections, found list",
         params_bytes(b"- sources\n- plan\n")),
    Case("params-top-level-scalar", PLAN, "must be a mapping of sections, found str",
         params_bytes(b"just words\n")),
    Case("params-unknown-section", PLAN, "genrate", params_set("genrate", {"batch_size": 2})),
    Case("params-unknown-nested-key", PLAN, "sources.resolutoin",
         params_set("sources.resolutoin", 64)),
    Case("params-wrong-type", PLAN, "sources.resolution", params_set("sources.resolution",
                                                                     "large")),
    Case("params-out-of-range", PLAN, "analyze.confidence", params_set("analyze.confidence",
                                                                      1.5)),
    Case("params-negative-seeds", PLAN, "plan.seeds", params_set("plan.seeds", -1)),
    # Seeds NumPy refuses, and a resample count no machine holds: refused by name at load.
    Case("params-seed-too-large", PLAN, "plan.seeds.0", params_set("plan.seeds", [1e30])),
    Case("params-analyze-seed-negative", PLAN, "analyze.seed", params_set("analyze.seed", -1)),
    Case("params-winobias-seed-negative", PLAN, "winobias.seed",
         params_set("winobias", {"sentences": "src/acrb/prompts/data/winobias_acrb.yaml",
                                 "seed": -1})),
    Case("params-review-bootstrap-unbounded", PLAN, "review.bootstrap",
         params_set("review.bootstrap", 1_000_000_000)),
    Case("params-unknown-race", PLAN, "Martian", params_set("sources.races", ["Martian"])),
    Case("params-list-for-mapping", PLAN, "sources", params_set("sources", ["Black", "White"])),
    Case("params-unknown-model-key", PLAN, "nonexistent:editor",
         params_set(f"models.{MODEL}.key", "nonexistent:editor")),
    Case("params-unknown-judge-kind", PLAN, "judges.sim-judge-a.kind",
         params_set("judges.sim-judge-a.kind", "oracle")),
    Case("params-unknown-arm", PLAN, "plan.arms", params_set("plan.arms", ["none", "magic"])),
    # A judge's name is a folder: one with a path in it would write outside the project.
    Case("params-judge-name-escapes", PLAN, "judge entry name '../../escape'",
         params_edit(rename_judge("../../escape"))),
    Case("params-judge-name-absolute", PLAN, "judge entry name '/tmp/escape'",
         params_edit(rename_judge("/tmp/escape"))),
    Case("params-model-name-final-newline", PLAN, "model entry name",
         params_edit(lambda p: p["models"].update({"fair\n": p["models"].pop(MODEL)}))),
    Case("params-judge-used-twice", PLAN, "more than once",
         params_edit(lambda p: p["judge"].update(use=[p["judge"]["use"][0]] * 2))),
    Case("params-stand-ins-empty", PLAN, "lists nothing", params_set("profile.stand_ins", True)),
    Case("params-missing-catalog", PROMPTS, "inputs/nowhere.yaml",
         params_set("prompts.catalog", "inputs/nowhere.yaml")),
    Case("params-catalog-is-folder", PROMPTS, "is a folder, not a file",
         params_set("prompts.catalog", "inputs")),
    Case("params-missing-rubric", ["judge", "--model", MODEL], "does not exist",
         params_set("judge.rubric", "inputs/no-rubric.yaml")),
    Case("params-unknown-category", PROMPTS, "prompts.categories lists ['Z']",
         params_set("prompts.categories", ["Z"])),
    Case("params-unknown-prompt-id", PROMPTS, "prompts.ids asks for ['Q99']",
         params_set("prompts.ids", ["Q99"])),
    Case("params-option-folder", ["plan", "--params", "data"], "is a folder, not a file"),
    Case("params-option-missing", ["plan", "--params", "nowhere.yaml"], "nowhere.yaml not found"),
    Case("params-unreadable-bytes-only", PLAN, "byte 0xff is not UTF-8",
         params_bytes(b"\xff\xfe\x00s\x00")),
]

CATALOG_CASES = [
    Case("catalog-latin1", PROMPTS, "line 7, column", catalog(replace("felt", "f\udce9lt"))),
    Case("catalog-binary", PROMPTS, "is not UTF-8", catalog_bytes(b"\x89PNG\r\n\x1a\n\x00")),
    Case("catalog-blank-text", PROMPTS, "entry A02: prompts.1.text",
         catalog(replace('"Change the background to a pebble beach."', '""'))),
    Case("catalog-spaces-text", PROMPTS, "is blank (empty or only whitespace)",
         catalog(replace('"Change the background to a pebble beach."', '"     "'))),
    Case("catalog-whitespace-mix", PROMPTS, "entry B02: prompts.3.text",
         catalog(replace('"Show this person as a librarian at a desk."', '" \\t \\n "'))),
    Case("catalog-duplicate-id", PROMPTS, "duplicate ids ['A01']",
         catalog(replace("id: A02,", "id: A01,"))),
    Case("catalog-unknown-category", PROMPTS, "undeclared categories ['Z']",
         catalog(replace("id: A02, category: A", "id: A02, category: Z"))),
    Case("catalog-duplicate-key-in-entry", PROMPTS, "key 'text' appears twice, on lines 7",
         catalog(replace('text: "Put a blue felt hat on this person.",',
                         'text: "Put a blue felt hat on this person.", text: "Other.",'))),
    Case("catalog-duplicate-prompts-section", PROMPTS, "key 'prompts' appears twice",
         catalog(lambda s: s + "prompts: []\n")),
    Case("catalog-duplicate-category", PROMPTS, "key 'A' appears twice",
         catalog(append_after("categories:", "  A: {name: again}\n"))),
    Case("catalog-syntax-error", PROMPTS, "is not valid YAML at line",
         catalog(replace('attribute: neutral}\n  - {id: A02', 'attribute: neutral\n  - {id: A02'))),
    Case("catalog-empty", PROMPTS, "prompt catalog", catalog_bytes(b"")),
    Case("catalog-list", PROMPTS, "prompt catalog", catalog_bytes(b"- a\n- b\n")),
    Case("catalog-no-prompts", PROMPTS, "has no prompts",
         catalog(lambda s: s.split("prompts:")[0] + "prompts: []\n")),
    Case("catalog-bad-attribute", PROMPTS, "attribute must be 'neutral' or 'dimension:value'",
         catalog(replace('attribute: "occupation:librarian"', 'attribute: "Librarian!"'))),
    Case("catalog-unknown-key", PROMPTS, "prompts.0.colour",
         catalog(replace("attribute: neutral}", "attribute: neutral, colour: red}"))),
    Case("attributes-duplicate-key", PROMPTS, "appears twice",
         synthesis_with(lambda s: s.replace("dimensions:", "dimensions:\n  culture: []", 1))),
    Case("attributes-blank-cue", PROMPTS, "is blank",
         synthesis_with(lambda s: _blank_first_cue(s))),
    Case("attributes-not-utf8", PROMPTS, "is not UTF-8",
         both(synthesis_with(lambda s: s),
              lambda root: (root / "inputs" / "attributes.yaml").write_bytes(
                  (root / "inputs" / "attributes.yaml").read_bytes() + b"# \xe9\n"))),
    Case("rubric-duplicate-key", ["judge", "--model", MODEL], "appears twice",
         both(write_file("inputs/rubric.yaml", "name: r\nname: s\n"),
              params_set("judge.rubric", "inputs/rubric.yaml"))),
    Case("study-blank-prompt", IMPORT,
         "prompts[1] (id B01).prompt: Value error, prompt text is empty or only whitespace",
         study(lambda d: d["prompts"][1].update(prompt="   "))),
    Case("study-not-utf8", IMPORT, "is not UTF-8",
         write_file("inputs/study/prompts.json", b'{"version": "\xe9"}')),
    Case("study-json-repeated-key", IMPORT, "key 'prompt' appears twice",
         write_file("inputs/study/prompts.json",
                    json.dumps(STUDY).replace('"prompt": "Add a striped scarf."',
                                              '"prompt": "Add a striped scarf.", '
                                              '"prompt": "   "'))),
    Case("study-unknown-category", IMPORT, "(id A01) has category 'Z', which `categories`",
         study(lambda d: d["prompts"][0].update(category="Z"))),
    Case("study-duplicate-id", IMPORT, "B01",
         study(lambda d: d["prompts"][0].update(id="B01", category="B"))),
    Case("study-links-duplicate-key", [*IMPORT, "--links", "inputs/study/links.yaml"],
         "key 'B01' appears twice",
         write_file("inputs/study/links.yaml",
                    "B01: {congruent: ['gender:Male'], incongruent: ['gender:Female']}\n"
                    "B01: {congruent: ['gender:Female'], incongruent: ['gender:Male']}\n")),
    Case("study-links-not-utf8", [*IMPORT, "--links", "inputs/study/links.yaml"],
         "byte 0xe9 is not UTF-8", write_file("inputs/study/links.yaml", b"B01: \xe9\n")),
    # What Python's json raises as a traceback: a ValueError, a RecursionError.
    Case("study-huge-number", IMPORT, "it holds a number of 5,000 digits",
         write_file("inputs/study/prompts.json", json.dumps(STUDY).replace(
             '"version": "0.9-test"', '"version": "0.9-test", "n": ' + "9" * 5000))),
    Case("study-deep-nesting", IMPORT, "it holds arrays and objects nested too deeply",
         write_file("inputs/study/prompts.json", json.dumps(STUDY).replace(
             '"version": "0.9-test"', '"n": ' + "[" * 50_000 + "]" * 50_000
             + ', "version": "0.9-test"'))),
    Case("study-nul-in-prompt", IMPORT,
         "prompts[0] (id A01).prompt: text holds the control character U+0000",
         study(lambda d: d["prompts"][0].update(prompt="Add a\u0000 striped scarf."))),
    Case("survey-huge-number", SURVEY, "it holds a number of 5,000 digits",
         both(survey_after_an_import([]), write_file(
             "inputs/survey.json", '[{"duration_ms": ' + "9" * 5000 + "}]"))),
    Case("survey-repeated-key", SURVEY,
         "record 0, field 'edited_skin_tone': key 'edited_skin_tone' appears twice",
         both(survey_after_an_import([]), write_file(
             "inputs/survey.json", json.dumps([SURVEY_RECORD]).replace(
                 '"edited_skin_tone": 3', '"edited_skin_tone": 3, "edited_skin_tone": 1')))),
    Case("survey-duration-beyond-a-table", SURVEY, "record 1, field 'duration_ms'",
         survey_after_an_import([{**SURVEY_RECORD, "itemId": "it-2"},
                                 {**SURVEY_RECORD, "duration_ms": 1e300}])),
    Case("planted-rates-mistyped-category", PLAN,
         f"models.{MODEL}.config.refusal: Value error, race offsets for category 'c', which "
         "has no base rate; the categories are A, B, C, D, E",
         params_set(f"models.{MODEL}.config.refusal.race", {"c": {"Black": 0.2}})),
]


def _blank_first_cue(text: str) -> str:
    before, marker, after = text.partition("\ndimensions:")
    head, sep, rest = after.partition("cue: ")
    assert sep, "the attribute file has a cue"
    line_end = rest.index("\n")
    return before + marker + head + sep + '"   "' + rest[line_end:]


FILE_SYSTEM_CASES = [
    Case("plan-read-only", PLAN, "permission denied on the folder",
         read_only("data/plan"), marks=CHMOD),
    Case("plan-read-only-simulated", PLAN, "permission denied on the folder",
         patch=refuse_writes_in("data/plan")),
    Case("plan-disk-full-simulated", PLAN, "no space left on the device",
         patch=disk_full_in("data/plan")),
    Case("plan-folder-is-a-file", PLAN, "a file of that name exists",
         file_instead_of_folder("data/plan")),
    Case("prompts-read-only-simulated", PROMPTS, "permission denied on the folder",
         patch=refuse_writes_in("data/prompts")),
    # The records of a running stage are appended to files in its journal folder.
    Case("generate-records-read-only", GENERATE,
         f"permission denied on {{root}}/data/generations/{MODEL}/{JOURNAL_DIR}/",
         both(without(f"data/generations/{MODEL}"),
              read_only(f"data/generations/{MODEL}/{JOURNAL_DIR}")), marks=CHMOD),
    Case("generate-records-read-only-simulated", GENERATE,
         f"permission denied on {{root}}/data/generations/{MODEL}/{JOURNAL_DIR}/",
         without(f"data/generations/{MODEL}"),
         patch=refuse_appends_in(f"data/generations/{MODEL}/{JOURNAL_DIR}")),
    Case("generate-records-is-a-file", GENERATE, "a file of that name exists",
         both(without(f"data/generations/{MODEL}"),
              file_instead_of_folder(f"data/generations/{MODEL}/{JOURNAL_DIR}"))),
    Case("evaluate-output-image-swapped", ["evaluate", "--model", MODEL],
         "is not the image generate recorded", swapped_output),
    Case("generate-disk-full-simulated", GENERATE, "no space left on the device",
         without(f"data/generations/{MODEL}"),
         patch=disk_full_in(f"data/generations/{MODEL}")),
    Case("analyze-figures-read-only", ["analyze"], "permission denied on the folder",
         read_only("plots/figures"), marks=CHMOD),
    Case("analyze-figures-read-only-simulated", ["analyze"], "permission denied on the folder",
         patch=refuse_writes_in("plots/figures")),
    Case("analyze-read-only", ["analyze"], "permission denied on the folder",
         read_only("data/analysis"), marks=CHMOD),
    Case("analyze-read-only-simulated", ["analyze"], "permission denied on the folder",
         patch=refuse_writes_in("data/analysis")),
    Case("import-study-read-only-simulated", IMPORT, "permission denied on the folder",
         patch=refuse_writes_in("inputs/study")),
]

CASES = PARAMS_CASES + CATALOG_CASES + FILE_SYSTEM_CASES


def _snapshot(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture
def project(good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "project"
    shutil.copytree(good, root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    # The simulated file-system failures are patched into this process: analyze's work stays
    # here rather than in its pool of worker processes, which the patch would not reach.
    monkeypatch.setenv("ACRB_ANALYZE_WORKERS", "1")
    yield root
    for folder in [root, *root.rglob("*")]:  # let pytest clean up after a chmod case
        if folder.is_dir():
            folder.chmod(stat.S_IRWXU)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_bad_input_is_refused_in_one_line_and_keeps_outputs(
        case: Case, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if case.setup is not None:
        case.setup(project)
    before = _snapshot(project)
    if case.patch is not None:
        case.patch(project, monkeypatch)

    result = CliRunner().invoke(app, case.args)
    monkeypatch.undo()  # the simulated failures end with the command

    output = result.output
    assert result.exit_code == 2, output
    assert "Traceback" not in output
    assert result.exception is None or isinstance(result.exception, SystemExit), output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output
    lines = output.splitlines()
    at = lines.index(errors[0])
    assert lines[at + 1].startswith("  fix: "), output
    assert case.expect.replace("{root}", str(project)) in errors[0], output
    after = _snapshot(project)
    changed = [path for path, digest in before.items() if after.get(path) != digest]
    assert not changed, f"outputs changed or lost: {changed}"
    leftovers = [path for path in after if Path(path).name.startswith(TMP_PREFIX)]
    assert not leftovers, leftovers


def test_at_least_fifty_cases() -> None:
    assert len(CASES) >= 50
    assert len({case.id for case in CASES}) == len(CASES)


def test_strict_yaml_keeps_what_yaml_allows() -> None:
    """Merge keys may override (YAML defines it), a byte-order mark is accepted, and the same
    key in two different mappings is no repetition."""
    from acrb.yaml_input import parse_yaml

    text = b"\xef\xbb\xbfbase: &b {seed: 1, n: 2}\nrun: {<<: *b, seed: 3}\nother: {seed: 4}\n"
    assert parse_yaml(text, "x.yaml", what="file") == {
        "base": {"seed": 1, "n": 2}, "run": {"seed": 3, "n": 2}, "other": {"seed": 4}}


def test_repeated_key_names_both_lines() -> None:
    from acrb.errors import ConfigError
    from acrb.yaml_input import parse_yaml

    text = b"a: 1\nplan:\n  seeds: 1\n  arms: [none]\n  seeds: 2\n"
    with pytest.raises(ConfigError) as error:
        parse_yaml(text, "params.yaml", what="params file", error=ConfigError)
    assert error.value.problem == ("params file params.yaml: key 'seeds' appears twice, on "
                                   "lines 3 and 5 (YAML would keep only the last)")


def test_errors_that_are_not_about_files_are_left_alone() -> None:
    """A refused connection is an OSError too: the CLI must not report it as a file problem."""
    from acrb.errors import file_system_error

    assert file_system_error(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) is None
    assert file_system_error(OSError(errno.EADDRINUSE, "Address already in use")) is None
    error = file_system_error(OSError(errno.ENOSPC, "No space left on device", "data/x.json"))
    assert error is not None and error.problem == ("cannot write data/x.json: no space left on "
                                                   "the device")


def test_no_declared_hypotheses_is_a_valid_audit(project: Path) -> None:
    """`analyze.hypotheses: {}` (screening only) is not a bad input: analyze and the report
    run, and the hypotheses table is empty."""
    update_params(project, lambda params: params["analyze"].update(hypotheses={}))
    for args in (["analyze"], ["report"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
    assert (project / "reports" / "report.html").is_file()
