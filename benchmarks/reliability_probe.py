"""The reliability probe of issue 30, rerun against the real CLI as a user (and an attacker) would.

Four categories of cases, each recorded with what was done, what was expected, what was
observed and pass or fail; the script exits 1 if any case fails.

kills
    A small DVC project (``tests.test_dvc_pipeline.build_dvc_project``: the real dvc.yaml, tiny
    params) is reproduced once with ``ACRB_MLFLOW=0``; its dvc.lock is the reference. For each
    stage that writes a table, an uninterrupted ``dvc repro -f -s STAGE`` measures the stage's
    clean duration (and must reproduce the reference); then, ``--kills-per-stage`` times,
    ``dvc repro -f -s STAGE`` is started in its own process group and the group is sent
    SIGKILL at a moment drawn uniformly within that duration (``--seed``), and a plain
    ``dvc repro`` must then finish with exit 0, every stage's outs md5 in dvc.lock equal to the
    reference and no ``.tmp-*`` file under data/, metrics/, plots/ or reports/. One more kill
    per stage lands mid-table-write on purpose: a ``sitecustomize`` hook (:data:`HOOK`, on
    PYTHONPATH) counts the stage's table temporaries in the clean run (each created, each
    renamed into place); in the killed run the process making event k (drawn uniformly)
    sends SIGKILL to its own process group, DVC included. The deterministic case: an empty
    ``.tmp-x.parquet`` planted in every table folder of the stage, the stage's command run
    directly with MLflow on (``MLFLOW_TRACKING_URI=sqlite:///<tmp>/mlflow.db``, then
    ``acrb mlflow-sync``, which waits for the logging process), then ``dvc repro``: no
    traceback anywhere (the logging process's log included), the temporaries gone, the lock
    equal to the reference.
bad-inputs
    Each bad input through the CLI in a fresh copy of the reference project (its params.yaml
    edited, or a bad file written): a non-zero exit, an ``error:`` line naming the bad input,
    no ``Traceback`` in stdout or stderr, nothing written outside the project (HOME points into
    the case's folder, which is checked too), no file of the project changed, no temporary
    left. An input that is accepted is a FAIL. ``review.raters_per_item`` above the raters
    registered is documented as a warning, not a refusal (docs/review.md): that case expects
    exit 0 and the warning.
tamperings
    A review folder with a few ratings made through the Python API the tests use
    (``tests.review_fixtures``): a rating edited, deleted or inserted in ``review.sqlite`` must
    fail ``acrb review verify``, naming the rating; a finalized export with ratings.parquet or
    ratings.csv edited or items.parquet deleted must fail ``acrb review verify EXPORT``, naming
    the file (untouched, both must verify). Against ``acrb review serve`` itself, over HTTP:
    ``GET /image/%C2%B2/source`` must be a 4xx, a rating posted with ``duration_ms=²`` must not
    be a 5xx (and the folder must still verify), and failed logins sent with a new
    ``X-Forwarded-For`` each time must meet 429 after the documented limit (10).
secrets
    A judge endpoint (a local fake OpenAI server) whose every answer echoes a 16-character
    middle piece of the API key; the real stages run through the CLI with MLflow on; no
    12-character piece of the key may be left in any file of the project (Parquet rows
    included) or in what was printed, and the echo must be found masked.

Usage::

    python benchmarks/reliability_probe.py [--kills-per-stage 2] [--seed S]
        [--only kills bad-inputs tamperings secrets] [--stages STAGE ...]
        [--out benchmarks/results/reliability_probe.json] [--keep DIR]

About 12 minutes on two shared cores with the defaults (the reference ``dvc repro`` alone about
one minute). Writes the JSON and, beside it, a Markdown summary (same name, ``.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the project builder and review fixtures live with the tests

BIN = Path(sys.executable).parent
ACRB = str(BIN / "acrb")
DVC = str(BIN / "dvc")
TMP_PREFIX = ".tmp-"  # acrb.storage.TMP_PREFIX
CATEGORIES = ("kills", "bad-inputs", "tamperings", "secrets")
MODEL = "synthetic-biased"
#: The stages that write a table, as dvc.yaml names them (the brief's list).
TABLE_STAGES = (f"generate@{MODEL}", f"evaluate@{MODEL}", f"judge@{MODEL}", "features",
                "review_set", "analyze", "review", "tables")
#: Stages that write tables too, left out by default to keep the probe near 15 minutes.
OTHER_TABLE_STAGES = ("sources", "prompts", "plan", "report")
OUTPUT_ROOTS = ("data", "metrics", "plots", "reports")
COMMAND_TIMEOUT = 600
CLI_TIMEOUT = 120


# ---- results -----------------------------------------------------------------------------------

@dataclass
class Result:
    name: str
    category: str
    action: str
    expected: str
    observed: str
    status: str  # pass | fail | skip
    seconds: float = 0.0


def _tail(text: str, limit: int = 1200) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def report(result: Result) -> Result:
    """Print one line of progress for ``result`` (and what was observed when it failed)."""
    print(f"[{result.category}] {result.name}: {result.status.upper()} "
          f"({result.seconds:.1f} s)", flush=True)
    if result.status == "fail":
        print("    observed: " + result.observed.replace("\n", "\n              "), flush=True)
    return result


@dataclass
class Ran:
    """One finished command: exit status (None: it ran past its timeout) and its output."""
    args: list[str]
    rc: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run(args: Sequence[str], cwd: Path, env: dict[str, str], timeout: float = COMMAND_TIMEOUT,
        stdin: str | None = None) -> Ran:
    start = time.monotonic()
    try:
        done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout, input=stdin, start_new_session=True)
        return Ran(list(args), done.returncode, done.stdout, done.stderr,
                   time.monotonic() - start)
    except subprocess.TimeoutExpired as exc:
        def text(data: Any) -> str:
            return data.decode("utf-8", "replace") if isinstance(data, bytes) else data or ""
        return Ran(list(args), None, text(exc.stdout), text(exc.stderr) + "\n(timed out)",
                   time.monotonic() - start)


# ---- files -------------------------------------------------------------------------------------

def digests(root: Path, skip: Iterable[str] = ()) -> dict[str, str]:
    """sha256 of every file under ``root`` by relative path, leaving out the top-level names in
    ``skip`` (links are recorded by their target)."""
    skipped = set(skip)
    found: dict[str, str] = {}
    if not root.exists():
        return found
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if relative.parts[0] in skipped:
            continue
        if path.is_symlink():
            found[str(relative)] = "link:" + os.readlink(path)
        elif path.is_file():
            found[str(relative)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def temporaries(root: Path, folders: Iterable[str] = OUTPUT_ROOTS) -> list[str]:
    """Every ``.tmp-*`` file or folder under ``folders`` of ``root``."""
    return sorted(str(path.relative_to(root)) for folder in folders
                  for path in (root / folder).rglob(f"{TMP_PREFIX}*"))


def lock_outs(lock: Path) -> dict[str, dict[str, str]]:
    """Each stage's outs in a dvc.lock: {stage: {path: md5}}."""
    stages = yaml.safe_load(lock.read_text()).get("stages", {})
    return {name: {out["path"]: out.get("md5", "") for out in entry.get("outs", [])}
            for name, entry in stages.items()}


def lock_difference(lock: Path, reference: dict[str, dict[str, str]]) -> str:
    """'' when the outs of ``lock`` equal ``reference``, else what differs."""
    if not lock.exists():
        return "dvc.lock is missing"
    outs = lock_outs(lock)
    problems = []
    for stage in sorted(set(outs) | set(reference)):
        if stage not in outs or stage not in reference:
            where = "the reference" if stage in reference else "dvc.lock"
            problems.append(f"stage {stage} only in {where}")
            continue
        for path in sorted(set(outs[stage]) | set(reference[stage])):
            if outs[stage].get(path) != reference[stage].get(path):
                problems.append(f"{stage}: {path} md5 {outs[stage].get(path)} "
                                f"(reference {reference[stage].get(path)})")
    return "; ".join(problems)


def copy_project(source: Path, target: Path, *, cache: bool = True) -> Path:
    if target.exists():
        shutil.rmtree(target)
    ignore = shutil.ignore_patterns("__pycache__")
    if not cache:
        def ignore(folder: str, names: list[str]) -> set[str]:  # type: ignore[misc]
            skip = {"__pycache__"} & set(names)
            if Path(folder) == source / ".dvc":
                skip |= {"cache", "tmp"} & set(names)
            return skip
    shutil.copytree(source, target, symlinks=True, ignore=ignore)
    return target


# ---- kills -------------------------------------------------------------------------------------

def build_reference(folder: Path) -> tuple[Path, dict[str, str], Ran]:
    """The tests' DVC project at ``folder/acrb``, reproduced once without MLflow."""
    from tests.test_dvc_pipeline import build_dvc_project

    root, env = build_dvc_project(folder / "acrb")
    env = {**env, "ACRB_MLFLOW": "0", "HOME": str(folder / "home")}
    (folder / "home").mkdir(exist_ok=True)
    ran = run([DVC, "repro"], root, env)
    return root, env, ran


def kill_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL the process group of ``process`` and wait until none of it is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


#: Loaded by every Python process of a run through PYTHONPATH (``sitecustomize``): records each
#: table temporary (``.tmp-*`` under data/, metrics/, plots/, reports/) a stage creates and
#: each it renames into place, one line per event in ``$RELIABILITY_PROBE_EVENTS``; with
#: ``$RELIABILITY_PROBE_KILL_AT`` = k, the process that makes the k-th event sends SIGKILL to
#: its whole process group (DVC and the stage), as a kill from outside at that instant would.
HOOK = """\
import os

_EVENTS = os.environ.get("RELIABILITY_PROBE_EVENTS")
if _EVENTS:
    import signal
    import tempfile

    _KILL_AT = int(os.environ.get("RELIABILITY_PROBE_KILL_AT") or 0)
    _ROOTS = tuple(os.path.join(os.environ["RELIABILITY_PROBE_ROOT"], name) + os.sep
                   for name in ("data", "metrics", "plots", "reports"))

    def _event(kind, path):
        path = os.path.abspath(os.fspath(path))
        if not os.path.basename(path).startswith(".tmp-") or not path.startswith(_ROOTS):
            return
        fd = os.open(_EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{kind} {path}\\n".encode())
        os.close(fd)
        if _KILL_AT:
            with open(_EVENTS, "rb") as handle:
                if handle.read().count(b"\\n") == _KILL_AT:
                    os.killpg(os.getpgrp(), signal.SIGKILL)

    _mkstemp = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, name = _mkstemp(*args, **kwargs)
        _event("created", name)
        return fd, name

    tempfile.mkstemp = mkstemp
    _replace = os.replace

    def replace(src, dst, *args, **kwargs):
        _event("renaming", src)
        return _replace(src, dst, *args, **kwargs)

    os.replace = replace
"""


def hook_env(env: dict[str, str], hook: Path, root: Path, events: Path, kill_at: int = 0
             ) -> dict[str, str]:
    """``env`` with :data:`HOOK` loaded (from the folder ``hook``), recording to ``events``."""
    hook.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK)
    events.unlink(missing_ok=True)
    path = os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH", "")]))
    return {**env, "PYTHONPATH": path, "RELIABILITY_PROBE_EVENTS": str(events),
            "RELIABILITY_PROBE_ROOT": str(root), "RELIABILITY_PROBE_KILL_AT": str(kill_at)}


def read_events(events: Path, root: Path) -> list[str]:
    if not events.exists():
        return []
    return [line.replace(str(root) + os.sep, "", 1)
            for line in events.read_text().splitlines()]


def forced_run_killed(root: Path, env: dict[str, str], stage: str, *, at: float | None = None,
                      limit: float = COMMAND_TIMEOUT) -> tuple[str, int | None]:
    """Start ``dvc repro -f -s stage`` in its own process group; SIGKILL the group ``at``
    seconds in (with :data:`HOOK` in ``env``, the run may kill itself first). Returns what
    happened and the exit status (None: killed from here)."""
    start = time.monotonic()
    process = subprocess.Popen([DVC, "repro", "-f", "-s", stage], cwd=root, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                               start_new_session=True)
    deadline = min(at if at is not None else limit, limit)
    while process.poll() is None and time.monotonic() - start < deadline:
        time.sleep(0.01)
    elapsed = time.monotonic() - start
    finished = process.poll()
    kill_group(process)  # whatever is left of the group (or all of it)
    if finished is None:
        return f"killed at {elapsed:.2f} s", None
    if finished == -signal.SIGKILL:
        return f"killed itself at {elapsed:.2f} s", finished
    return f"finished (exit {finished}) at {elapsed:.2f} s, before any kill", finished


def check_after(root: Path, env: dict[str, str], reference: dict[str, dict[str, str]]
                ) -> tuple[bool, str]:
    """``dvc repro`` to completion, then the lock against the reference and no temporaries.
    (A killed stage whose outputs are not persistent is not rerun: its dvc.lock entry is
    unchanged and its outputs are in DVC's cache, so DVC checks them out, "is cached -
    skipping run"; persistent outputs are rerun over.)"""
    command = [DVC, "repro"]
    ran = run(command, root, env)
    problems = []
    if ran.rc != 0:
        problems.append(f"dvc repro exit {ran.rc}: {_tail(ran.output, 800)}")
    if "Traceback" in ran.output:
        problems.append(f"traceback in dvc repro's output: {_tail(ran.output, 800)}")
    difference = lock_difference(root / "dvc.lock", reference)
    if difference:
        problems.append(f"dvc.lock differs: {difference}")
    left = temporaries(root)
    if left:
        problems.append(f"temporaries left: {left}")
    rerun = sorted(set(re.findall(r"Running stage '([^']+)'", ran.output)))
    restored = sorted(set(re.findall(r"Stage '([^']+)' is cached - skipping run", ran.output)))
    done = (f"dvc repro exit {ran.rc} in {ran.seconds:.1f} s (ran "
            f"{', '.join(rerun) or 'no stage'}"
            + (f"; restored {', '.join(restored)} from DVC's cache" if restored else "") + ")")
    return not problems, "; ".join([done, *problems]) if problems else \
        f"{done}; lock equal to the reference; no temporaries"


def stage_folders(root: Path, outs: Iterable[str]) -> list[Path]:
    """Where a stage writes its tables: each output folder and every folder under it holding a
    table, and the folder of each output file."""
    folders: list[Path] = []
    for out in outs:
        path = root / out
        if path.is_dir():
            folders.append(path)
            folders += sorted({table.parent for suffix in ("*.parquet", "*.csv", "*.json")
                               for table in path.rglob(suffix)} - {path})
        else:
            folders.append(path.parent)
    return list(dict.fromkeys(folders))


KILL_EXPECTED = ("the next `dvc repro` exits 0; every stage's outs md5 in dvc.lock equal to "
                 "the reference; no .tmp-* under data/, metrics/, plots/, reports/")


def run_kills(sandbox: Path, stages: Sequence[str], kills_per_stage: int, rng: random.Random,
              *, at_write: bool = True, planted: bool = True) -> tuple[list[Result], Path | None]:
    """The kills category; returns its results and the reference project (for the bad
    inputs), a pristine copy kept at ``sandbox/reference``."""
    results: list[Result] = []
    start = time.monotonic()
    root, env, ran = build_reference(sandbox / "kills")
    ok = ran.rc == 0
    results.append(report(Result(
        "reference-repro", "kills", "dvc repro of the tests' tiny DVC project, ACRB_MLFLOW=0",
        "exit 0", f"exit {ran.rc} in {ran.seconds:.1f} s"
        + ("" if ok else ": " + _tail(ran.output)),
        "pass" if ok else "fail", time.monotonic() - start)))
    if not ok:
        return results, None
    reference_dir = copy_project(root, sandbox / "reference")
    reference = lock_outs(reference_dir / "dvc.lock")
    commands = {name: entry["cmd"] for name, entry in
                yaml.safe_load((reference_dir / "dvc.lock").read_text())["stages"].items()}
    mlflow_db = sandbox / "kills" / "mlflow.db"

    def restore() -> None:
        copy_project(reference_dir, root)

    for stage in stages:
        if stage not in reference:
            results.append(report(Result(f"{stage}:unknown", "kills", "look the stage up",
                                         "a stage of dvc.lock", "no such stage", "fail")))
            continue
        outs = list(reference[stage])
        # The clean duration, and the table writes: one uninterrupted forced run.
        began = time.monotonic()
        events = sandbox / "kills" / "events.txt"
        clean = run([DVC, "repro", "-f", "-s", stage], root,
                    hook_env(env, sandbox / "kills" / "hook", root, events))
        duration = clean.seconds
        writes = read_events(events, root)
        difference = lock_difference(root / "dvc.lock", reference)
        ok = clean.rc == 0 and not difference and not temporaries(root)
        results.append(report(Result(
            f"{stage}:clean", "kills", f"dvc repro -f -s {stage}, uninterrupted (its duration "
            "bounds the kill times; its table writes are counted)",
            "exit 0, lock equal to the reference",
            f"exit {clean.rc} in {duration:.2f} s; {len(writes)} temporary events "
            f"(created + renamed into place)" + (f"; {difference}" if difference else "")
            + ("" if clean.rc == 0 else ": " + _tail(clean.output)),
            "pass" if ok else "fail", time.monotonic() - began)))
        if not ok:
            restore()
        for index in range(kills_per_stage):
            began = time.monotonic()
            moment = rng.uniform(0, duration)
            what, _ = forced_run_killed(root, env, stage, at=moment)
            ok, observed = check_after(root, env, reference)
            results.append(report(Result(
                f"{stage}:kill-{index + 1}", "kills",
                f"dvc repro -f -s {stage} in its own process group, SIGKILL to the group at "
                f"{moment:.2f} s of {duration:.2f} s ({what}), then dvc repro",
                KILL_EXPECTED, observed, "pass" if ok else "fail", time.monotonic() - began)))
            if not ok:
                restore()
        if at_write and writes:
            began = time.monotonic()
            k = rng.randint(1, len(writes))
            what, _ = forced_run_killed(root, hook_env(env, sandbox / "kills" / "hook", root,
                                                       events, kill_at=k), stage,
                                        limit=max(4 * duration, 120))
            seen = read_events(events, root)
            at_event = seen[k - 1] if len(seen) >= k else "none (the run took another path)"
            ok, observed = check_after(root, env, reference)
            results.append(report(Result(
                f"{stage}:kill-mid-write", "kills",
                f"dvc repro -f -s {stage} in its own process group, SIGKILL to the group at "
                f"table-temporary event {k} of {len(writes)}: {at_event} ({what}), then "
                "dvc repro", KILL_EXPECTED, observed,
                ("pass" if "killed" in what else "skip") if ok else "fail",
                time.monotonic() - began)))
            if not ok:
                restore()
        elif at_write:
            results.append(report(Result(
                f"{stage}:kill-mid-write", "kills", f"dvc repro -f -s {stage}",
                KILL_EXPECTED, "the stage created no .tmp-* under data/, metrics/, plots/, "
                "reports/ in its clean run: nothing to kill mid-write", "skip")))
        if planted:
            results.append(planted_temporaries(root, env, stage, commands[stage], outs,
                                               reference, mlflow_db))
            if results[-1].status == "fail":
                restore()
    total = time.monotonic() - start
    print(f"[kills] {len(results)} cases in {total:.0f} s", flush=True)
    return results, reference_dir


def planted_temporaries(root: Path, env: dict[str, str], stage: str, command: str,
                        outs: Sequence[str], reference: dict[str, dict[str, str]],
                        mlflow_db: Path) -> Result:
    """An empty .tmp-x.parquet in every table folder of the stage, the stage's command run
    directly with MLflow on, the logging process waited for, then dvc repro."""
    began = time.monotonic()
    planted = []
    for folder in stage_folders(root, outs):
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{TMP_PREFIX}x.parquet"
        path.write_bytes(b"")
        planted.append(path)
    tracked = {k: v for k, v in env.items() if k != "ACRB_MLFLOW"}
    tracked["MLFLOW_TRACKING_URI"] = f"sqlite:///{mlflow_db}"
    direct = run(shlex.split(command), root, tracked)
    synced = run([ACRB, "mlflow-sync"], root, tracked)
    logs = "".join(p.read_text(errors="replace")
                   for p in (root / ".acrb-cache").rglob("*.log") if p.is_file()) \
        if (root / ".acrb-cache").exists() else ""
    failed_entries = sorted(str(p.relative_to(root)) for p in (root / ".acrb-cache").rglob(
        "error.json")) if (root / ".acrb-cache").exists() else []
    problems = []
    if direct.rc != 0:
        problems.append(f"`{command}` exit {direct.rc}: {_tail(direct.output, 800)}")
    if synced.rc != 0:
        problems.append(f"acrb mlflow-sync exit {synced.rc}: {_tail(synced.output, 800)}")
    for what, text in ((command, direct.output), ("acrb mlflow-sync", synced.output),
                       ("the logging process's log", logs)):
        if "Traceback" in text:
            problems.append(f"traceback in {what}: {_tail(text, 800)}")
    if failed_entries:
        problems.append(f"runs that could not be logged: {failed_entries}")
    left = [str(p.relative_to(root)) for p in planted if p.exists()]
    if left:
        problems.append(f"planted temporaries still there after `{command}`: {left}")
    ok, observed = check_after(root, env, reference)
    if not ok:
        problems.append(observed)
    return report(Result(
        f"{stage}:planted-temporaries", "kills",
        f"an empty {TMP_PREFIX}x.parquet in each of {len(planted)} table folder(s) "
        f"({', '.join(sorted({str(p.parent.relative_to(root)) for p in planted})[:6])}"
        f"{', ...' if len(planted) > 6 else ''}); `{command}` run directly with MLflow on "
        "(MLFLOW_TRACKING_URI=sqlite:///<tmp>/mlflow.db), acrb mlflow-sync, then dvc repro "
        "(ACRB_MLFLOW=0)",
        "exit 0 and no traceback (stage, mlflow-sync, logging process); the planted files "
        "gone; dvc repro exit 0, lock equal to the reference, no temporaries",
        "; ".join(problems) or f"`{command}` exit 0 in {direct.seconds:.1f} s, mlflow-sync "
        f"exit 0, no traceback, planted files gone; {observed}",
        "fail" if problems else "pass", time.monotonic() - began))


# ---- bad inputs --------------------------------------------------------------------------------

Setup = Callable[[Path], None]


@dataclass
class BadInput:
    """One bad input: ``setup`` breaks a fresh copy of the project, then ``args`` runs in it
    (``acrb`` first means the project's CLI). A refusal is expected: a non-zero exit and an
    ``error:`` line holding every phrase of ``expect``; with ``refusal`` False, exit 0 and a
    ``warning:`` line holding them (what the docs promise for that input)."""
    name: str
    action: str
    args: list[str]
    expect: tuple[str, ...]
    setup: Setup | None = None
    env: dict[str, str | None] = field(default_factory=dict)
    refusal: bool = True


# The setups the bad-input tests use (tests/test_bad_inputs.py): each edits a project copy.
from tests.test_bad_inputs import (  # noqa: E402
    both,
    params_edit,
    params_set,
    rename_judge,
    write_file,
)


def rename_first_judge(new: str) -> Setup:
    return params_edit(rename_judge(new))


#: A study prompt file of made-up entries, in the published file's shape.
STUDY = {"version": "0.9-probe", "categories": {"A": "neutral", "B": "occupational"},
         "prompts": [{"id": "A01", "category": "A", "prompt": "Add a striped scarf.",
                      "hypothesis": ""},
                     {"id": "B01", "category": "B", "prompt": "Show them as a baker.",
                      "hypothesis": "H2"}]}
#: One record of a survey export, in the study's shape (made-up values).
SURVEY_RECORD = {
    "userId": "probe@example.org", "itemId": "it-1", "originalItemId": "src-it-1",
    "model": "flux", "promptId": "A-03", "category": "A", "race": "Black", "gender": "Female",
    "age": "20-29", "editedShownFirst": True, "duration_ms": 5400,
    "createdAt": "2025-03-04T10:11:12.000Z",
    **{f"edited_{axis}": 3 for axis in ("edit_success", "skin_tone", "race_drift",
                                        "gender_drift", "age_drift")}}
HUGE = "9" * 5000
DEEP = "[" * 50_000 + "]" * 50_000
STUDY_FILE = "inputs/probe/study.json"
SURVEY_FILE = "inputs/probe/survey.json"
IMPORT_STUDY = ["acrb", "prompts", "import-study", STUDY_FILE, "--out", "inputs/probe/catalog.yaml"]
IMPORT_SURVEY = ["acrb", "review", "import-survey", SURVEY_FILE, "--out", "inputs/probe/review"]
REVIEW_WORK = "probe-review-work"
#: Where MLflow 3 keeps its telemetry installation id, relative to a case folder (HOME = home).
MLFLOW_TELEMETRY = "home/.config/mlflow/telemetry.json"


def study_with(extra: str) -> str:
    return json.dumps(STUDY).replace('"version": "0.9-probe"', f'"n": {extra}, "version": '
                                     '"0.9-probe"')


def review_folder(raters: Sequence[str], k: int) -> Setup:
    """A review set (the tests' fixture: small PNGs under data/images) and a review folder
    with ``raters``, k = ``k``, made by `acrb review init` from params."""
    def setup(root: Path) -> None:
        from tests.review_fixtures import make_review_set

        make_review_set(root, items=4)
        params_set("review.raters_per_item", k)(root)
        env = probe_env(root.parent / "home")
        for args in ([ACRB, "review", "init", "--workdir", REVIEW_WORK],
                     *([ACRB, "review", "add-rater", name, "--workdir", REVIEW_WORK]
                       for name in raters)):
            ran = run(args, root, env, timeout=CLI_TIMEOUT)
            if ran.rc != 0:
                raise RuntimeError(f"setup {args[1:]} failed: {_tail(ran.output)}")
    return setup


def wait_for_logger(root: Path, timeout: float = 60) -> bool:
    """Wait until no MLflow logging process holds the queue of ``root`` (it stays
    ``IDLE_SECONDS`` after its last entry); whether it ended in time."""
    import fcntl

    lock = root / ".acrb-cache" / "mlflow-queue" / "drainer.lock"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not lock.exists():
            return True
        with lock.open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                time.sleep(0.5)
                continue
            fcntl.flock(handle, fcntl.LOCK_UN)
            return True
    return False


def stage_with_mlflow(args: list[str]) -> Setup:
    """Run ``acrb ARGS`` with MLflow on (it must succeed) and wait for its logging process:
    part of a case's setup."""
    def setup(root: Path) -> None:
        ran = run([ACRB, *args], root, probe_env(root.parent / "home", {"ACRB_MLFLOW": None}),
                  timeout=CLI_TIMEOUT)
        if ran.rc != 0:
            raise RuntimeError(f"setup acrb {' '.join(args)} failed: {_tail(ran.output)}")
        if not wait_for_logger(root):
            raise RuntimeError("the MLflow logging process of the setup did not end in 60 s")
    return setup


def bad_input_cases(sandbox_hint: str = "<case folder>") -> list[BadInput]:
    """Every bad-input case. The absolute judge name points into the case's own folder, at
    ``abs-escape`` (the folder is checked for anything written outside the project)."""
    judge = "judge"
    return [
        BadInput("study-huge-number", "acrb prompts import-study FILE, FILE holding a "
                 "5,000-digit integer", IMPORT_STUDY, ("study.json", "5,000 digits"),
                 write_file(STUDY_FILE, study_with(HUGE))),
        BadInput("study-deep-nesting", "acrb prompts import-study FILE, FILE holding 50,000 "
                 "nested [", IMPORT_STUDY, ("study.json", "nested too deeply"),
                 write_file(STUDY_FILE, study_with(DEEP))),
        BadInput("study-nul-in-prompt", "acrb prompts import-study FILE, prompt A01 holding a "
                 "NUL byte", IMPORT_STUDY, ("A01", "U+0000"),
                 write_file(STUDY_FILE, json.dumps(STUDY).replace(
                     "Add a striped scarf.", "Add a\\u0000 striped scarf."))),
        BadInput("survey-huge-number", "acrb review import-survey FILE, FILE holding a "
                 "5,000-digit integer", IMPORT_SURVEY, ("survey.json", "5,000 digits"),
                 write_file(SURVEY_FILE, '[{"duration_ms": ' + HUGE + "}]")),
        BadInput("survey-deep-nesting", "acrb review import-survey FILE, FILE holding 50,000 "
                 "nested [", IMPORT_SURVEY, ("survey.json", "nested too deeply"),
                 write_file(SURVEY_FILE, json.dumps([SURVEY_RECORD]).replace(
                     '"duration_ms": 5400', '"duration_ms": 5400, "n": ' + DEEP))),
        BadInput("params-analyze-seed-negative", "params analyze.seed: -1; acrb analyze",
                 ["acrb", "analyze"], ("analyze.seed",), params_set("analyze.seed", -1)),
        BadInput("params-winobias-seed-negative", "params winobias: {sentences: the embedded "
                 "file, seed: -1}; acrb plan", ["acrb", "plan"], ("winobias.seed",),
                 params_set("winobias", {"sentences": "src/acrb/prompts/data/winobias_acrb.yaml",
                                         "rubric": "src/acrb/judges/rubrics/winobias-v1.yaml",
                                         "seed": -1})),
        BadInput("params-plan-seed-1e30", "params plan.seeds: [1e30]; acrb plan",
                 ["acrb", "plan"], ("plan.seeds",), params_set("plan.seeds", [1e30])),
        BadInput("params-review-bootstrap-1e9", "params review.bootstrap: 1000000000; "
                 "acrb review analyze", ["acrb", "review", "analyze"], ("review.bootstrap",),
                 params_set("review.bootstrap", 1_000_000_000)),
        BadInput("params-judge-name-escapes", "the first judge renamed ../../escape (judges: "
                 f"and judge.use); acrb {judge} --model {MODEL}",
                 ["acrb", judge, "--model", MODEL], ("../../escape",),
                 rename_first_judge("../../escape")),
        BadInput("params-judge-name-absolute", "the first judge renamed to an absolute path "
                 f"({sandbox_hint}/abs-escape); acrb {judge} --model {MODEL}",
                 ["acrb", judge, "--model", MODEL], ("abs-escape",),
                 lambda root: rename_first_judge(str(root.parent / "abs-escape"))(root)),
        BadInput("params-judge-used-twice", "params judge.use: [sim-judge-a, sim-judge-a]; "
                 f"acrb {judge} --model {MODEL}", ["acrb", judge, "--model", MODEL],
                 ("judge.use", "sim-judge-a"),
                 params_set("judge.use", ["sim-judge-a", "sim-judge-a"])),
        BadInput("params-planted-rates-mistyped-category", f"params models.{MODEL}.config."
                 "refusal.race: {c: {Black: 0.2}} (category c, not C); acrb generate --model "
                 f"{MODEL}", ["acrb", "generate", "--model", MODEL],
                 (f"models.{MODEL}.config.refusal", "'c'"),
                 params_set(f"models.{MODEL}.config.refusal.race", {"c": {"Black": 0.2}})),
        BadInput("review-add-rater-newline", "acrb review add-rater $'rA\\n' in a review "
                 "folder made by acrb review init", ["acrb", "review", "add-rater", "rA\n",
                                                     "--workdir", REVIEW_WORK],
                 ("rA",), review_folder((), k=3)),
        BadInput("review-k3-two-raters", "review.raters_per_item: 3, acrb review init, two "
                 "raters added; acrb review status (docs/review.md: a warning, serving goes on)",
                 ["acrb", "review", "status", "--workdir", REVIEW_WORK],
                 ("review.raters_per_item is 3", "only 2 rater(s)"),
                 review_folder(("ra", "rb"), k=3), refusal=False),
        BadInput("mlflow-db-not-a-database", "mlflow.db of text bytes in the project; "
                 "acrb review sample with MLflow on (its default store)",
                 ["acrb", "review", "sample"], ("mlflow.db", "not an SQLite database"),
                 write_file("mlflow.db", b"this is not a database\n" * 40),
                 env={"ACRB_MLFLOW": None}),
        # A valid header over garbage passes the stage's check of the header; by design the
        # stage finishes and its queued run is refused by the logging process, and the next
        # stage or `acrb mlflow-sync` stops with the error (acrb/tracking_queue.py).
        BadInput("mlflow-db-header-then-garbage", "mlflow.db: SQLite's 16-byte header then "
                 "8 KiB of random bytes; acrb review sample with MLflow on (finishes: the run is "
                 "queued), then the checked command: acrb mlflow-sync",
                 ["acrb", "mlflow-sync"], ("mlflow.db", "cannot be opened"),
                 both(write_file("mlflow.db", b"SQLite format 3\x00"
                                 + random.Random(7).randbytes(8192)),
                      stage_with_mlflow(["review", "sample"])),
                 env={"ACRB_MLFLOW": None}),
    ]


def probe_env(home: Path, extra: dict[str, str | None] | None = None) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ACRB_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", ACRB_MLFLOW="0",
               DVC_NO_ANALYTICS="1", HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_CONFIG_HOME=str(home / ".config"), MPLCONFIGDIR=str(home / ".mpl"))
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def judge_refusal(case: BadInput, ran: Ran, *, outside: list[str], changed: list[str],
                  left: list[str]) -> tuple[bool, str]:
    """Whether ``ran`` is the refusal ``case`` expects, and what was observed."""
    output = ran.output
    kind = "error: " if case.refusal else "warning: "
    lines = [line for line in output.splitlines() if line.startswith(kind)]
    named = [line for line in lines if all(phrase in line for phrase in case.expect)]
    problems = []
    if ran.rc is None:
        problems.append("ran past its timeout (accepted, still working)")
    elif case.refusal and ran.rc == 0:
        problems.append("exit 0: the input was accepted")
    elif not case.refusal and ran.rc != 0:
        problems.append(f"exit {ran.rc}")
    if not named:
        problems.append(f"no line starting {kind.strip()!r} holding {list(case.expect)}")
    if "Traceback" in output:
        problems.append("a Traceback was printed")
    if outside:
        problems.append(f"written outside the project: {outside[:8]}")
    if changed:
        problems.append(f"project files changed or removed: {changed[:8]}")
    if left:
        problems.append(f"temporaries left: {left[:8]}")
    shown = named[0] if named else _tail(output, 600)
    return not problems, (f"exit {ran.rc}; " + ("; ".join(problems) + "; output: " + shown
                                                if problems else shown))


def run_bad_input(case: BadInput, base: Path, folder: Path) -> Result:
    """``case`` in a fresh copy of ``base`` at ``folder/project``."""
    began = time.monotonic()
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    root = copy_project(base, folder / "project", cache=False)
    home = folder / "home"
    env = probe_env(home, case.env)
    expected = ("exit 0, a 'warning:' line holding " if not case.refusal else
                "non-zero exit, an 'error:' line holding ") + \
        f"{list(case.expect)}; no Traceback; nothing written outside the project; no project " \
        "file changed; no temporary left"
    try:
        if case.setup is not None:
            case.setup(root)
    except Exception as exc:  # a setup that fails is a failure of the probe, reported
        return report(Result(case.name, "bad-inputs", case.action, expected,
                             f"setup failed: {type(exc).__name__}: {exc}", "fail",
                             time.monotonic() - began))
    inside = digests(root)
    outside = digests(folder, skip={"project"})
    args = [ACRB if arg == "acrb" and index == 0 else arg for index, arg in enumerate(case.args)]
    ran = run(args, root, env, timeout=CLI_TIMEOUT)
    after_inside = digests(root)
    after_outside = digests(folder, skip={"project"})
    written = sorted(p for p, d in after_outside.items() if outside.get(p) != d)
    # git's bookkeeping (`git status` refreshes the index's stat cache) and the MLflow queue's
    # (its log, entries moved to failed/) are no change to the project.
    changed = sorted(p for p, d in inside.items() if after_inside.get(p) != d
                     and not p.startswith((".git/", ".acrb-cache/mlflow-queue/")))
    left = sorted(p for p in after_inside if Path(p).name.startswith(TMP_PREFIX))
    escaped = sorted(str(p.relative_to(folder)) for p in folder.rglob("*escape*"))
    if escaped:
        written = sorted(set(written) | set(escaped))
    # MLflow's own telemetry id, written wherever MLflow is imported: a separate case
    # (secrets: mlflow-telemetry-off), so that it does not hide what this case is about.
    telemetry = [p for p in written if p == MLFLOW_TELEMETRY]
    written = [p for p in written if p != MLFLOW_TELEMETRY]
    ok, observed = judge_refusal(case, ran, outside=written, changed=changed, left=left)
    if telemetry:
        observed += f" (MLflow wrote {MLFLOW_TELEMETRY}: see secrets/mlflow-telemetry-off)"
    return report(Result(case.name, "bad-inputs", case.action, expected, observed,
                         "pass" if ok else "fail", time.monotonic() - began))


def run_bad_inputs(base: Path, sandbox: Path, names: Sequence[str] | None = None,
                   cases: Sequence[BadInput] | None = None) -> list[Result]:
    chosen = list(cases) if cases is not None else bad_input_cases()
    if names is not None:
        unknown = set(names) - {case.name for case in chosen}
        if unknown:
            raise ValueError(f"no bad-input case named {sorted(unknown)}")
        chosen = [case for case in chosen if case.name in names]
    return [run_bad_input(case, base, sandbox / case.name) for case in chosen]


def code_only_project(folder: Path) -> Path:
    """The tests' DVC project without any run (code, params, inputs): enough for the cases
    that need no stage's output (imports, params refused at load)."""
    from tests.test_dvc_pipeline import build_dvc_project

    root, _ = build_dvc_project(folder)
    return root


# ---- tamperings --------------------------------------------------------------------------------

def rated_review(root: Path) -> tuple[Path, dict[str, str]]:
    """Two raters, k = 2, six items (every other a pair), three rated by each: the tests'
    fixture (tests/test_review_integrity.py). Returns the review folder and the tokens."""
    from tests.review_fixtures import answers_for, make_review_store

    store, tokens = make_review_store(root, ("a", "b"), items=6, k=2)
    for rater, value in (("a", 3), ("b", 4)):
        for _ in range(3):
            claim = store.next_item(rater)
            assert claim is not None
            store.rate(rater, claim.item.item_id, answers_for(claim.shown_order, value),
                       claim.shown_order, 1000)
    return store.workdir, tokens


def _sql(database: Path, statement: str, *args: Any) -> None:
    con = sqlite3.connect(database)
    with con:
        con.execute(statement, args)
    con.close()


def _rating_ids(database: Path) -> list[str]:
    con = sqlite3.connect(database)
    ids = [row[0] for row in con.execute("SELECT rating_id FROM ratings ORDER BY audit_seq")]
    con.close()
    return ids


def verify_case(name: str, action: str, target: Path, cwd: Path, env: dict[str, str],
                expect: tuple[str, ...], *, ok_expected: bool = False) -> Result:
    began = time.monotonic()
    ran = run([ACRB, "review", "verify", str(target)], cwd, env, timeout=CLI_TIMEOUT)
    if ok_expected:
        ok = ran.rc == 0 and "Traceback" not in ran.output
        expected = "exit 0 (untouched)"
    else:
        ok = ran.rc == 1 and all(p in ran.output for p in expect) and "Traceback" not in ran.output
        expected = f"exit 1 naming {list(expect)}; no Traceback"
    return report(Result(name, "tamperings", action, expected,
                         f"exit {ran.rc}; {_tail(ran.output, 700)}", "pass" if ok else "fail",
                         time.monotonic() - began))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def raw_get(port: int, target: str, cookie: str) -> int:
    """GET ``target`` byte for byte (no client normalising it); the status code."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {cookie}\r\n"
                     "Connection: close\r\n\r\n".encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


def run_tamperings(sandbox: Path) -> list[Result]:
    results: list[Result] = []
    pristine = sandbox / "pristine"
    began = time.monotonic()
    workdir, tokens = rated_review(pristine)
    env = probe_env(sandbox / "home")
    print(f"[tamperings] review folder with 6 ratings built in {time.monotonic() - began:.1f} s",
          flush=True)

    def fresh(name: str) -> Path:
        return copy_project(pristine, sandbox / name)

    root = fresh("untouched")
    results.append(verify_case("review-untouched-verifies", "acrb review verify on the "
                               "untouched review folder", root / workdir.name, root, env, (),
                               ok_expected=True))
    root = fresh("edited")
    database = root / workdir.name / "review.sqlite"
    target = _rating_ids(database)[2]
    _sql(database, "UPDATE ratings SET skin_tone = 5 WHERE rating_id = ?", target)
    results.append(verify_case("review-rating-edited", f"UPDATE ratings SET skin_tone = 5 for "
                               f"rating {target} in review.sqlite; acrb review verify",
                               root / workdir.name, root, env,
                               ("review.sqlite", target, "skin_tone is 5 in the database")))
    root = fresh("deleted")
    database = root / workdir.name / "review.sqlite"
    gone = _rating_ids(database)[-1]
    _sql(database, "DELETE FROM ratings WHERE rating_id = ?", gone)
    results.append(verify_case("review-rating-deleted", f"DELETE rating {gone} from "
                               "review.sqlite; acrb review verify", root / workdir.name, root,
                               env, ("review.sqlite", gone, "deleted from the database")))
    root = fresh("inserted")
    database = root / workdir.name / "review.sqlite"
    _sql(database, "INSERT INTO ratings (rating_id, claim_id, rater, item_id, output, "
         "edit_success, skin_tone, race_change, gender_change, age_change, repeat, "
         "created_at, audit_seq) SELECT 'rt-forged', claim_id, rater, item_id, output, 1, 1, "
         "1, 1, 1, repeat, created_at, audit_seq FROM ratings LIMIT 1")
    results.append(verify_case("review-rating-inserted", "INSERT a copy of a rating as "
                               "'rt-forged' (all scores 1) into review.sqlite; acrb review "
                               "verify", root / workdir.name, root, env,
                               ("review.sqlite", "rt-forged", "inserted behind the log")))

    # An export, made by the CLI, then tampered with.
    root = fresh("export")
    done = run([ACRB, "review", "finalize", "--workdir", str(root / workdir.name), "--out",
                str(root / "export")], root, env, timeout=CLI_TIMEOUT)
    if done.rc != 0:
        results.append(report(Result("review-finalize", "tamperings", "acrb review finalize",
                                     "exit 0", f"exit {done.rc}: {_tail(done.output)}", "fail")))
    else:
        results.append(verify_case("export-untouched-verifies", "acrb review finalize, then "
                                   "acrb review verify EXPORT", root / "export", root, env, (),
                                   ok_expected=True))

        def edit_parquet(path: Path) -> None:
            path.write_bytes(path.read_bytes() + b"\0")

        def edit_csv(path: Path) -> None:
            text = path.read_text()
            path.write_text(text.replace(",3,", ",5,", 1) if ",3," in text else text + "x\n")

        for name, change, what, said in (
                ("ratings.parquet", edit_parquet, "a NUL byte appended to",
                 "the file was changed after the export"),
                ("ratings.csv", edit_csv, "one score 3 changed to 5 in",
                 "the file was changed after the export"),
                ("items.parquet", Path.unlink, "deleted", "is listed in manifest.json but "
                 "missing")):
            copy = copy_project(root / "export", sandbox / f"export-{name}")
            change(copy / name)
            results.append(verify_case(f"export-{name.replace('.', '-')}-tampered",
                                       f"finalized export: {name} {what}; acrb review verify "
                                       "EXPORT", copy, root, env, (name, said)))
    results += web_cases(fresh("web"), workdir.name, tokens["a"], env)
    return results


def web_cases(root: Path, workdir: str, token: str, env: dict[str, str]) -> list[Result]:
    """The rating app as `acrb review serve` runs it, over HTTP on a free local port; ``token``
    is a rater's with items left to rate."""
    port = free_port()
    log_path = root / "serve.log"
    with log_path.open("w") as log:
        server = subprocess.Popen([ACRB, "review", "serve", "--workdir", str(root / workdir),
                                   "--port", str(port)], cwd=root, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            results = _against_server(server, port, root / workdir, token, env, log_path)
        finally:
            kill_group(server)
    served = log_path.read_text(errors="replace")
    if "Traceback" in served:
        results.append(report(Result("web-server-log", "tamperings", "the server's output "
                                     "over the cases above", "no Traceback",
                                     _tail(served), "fail")))
    return results


def _against_server(server: subprocess.Popen[str], port: int, workdir: Path, token: str,
                    env: dict[str, str], log_path: Path) -> list[Result]:
    import httpx
    from tests.live_server import csrf_of
    from tests.test_review_web import form_for

    began = time.monotonic()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() - began > 60:
                return [report(Result("serve-starts", "tamperings", "acrb review serve",
                                      "listening", f"exit {server.poll()}: "
                                      f"{_tail(log_path.read_text(errors='replace'))}",
                                      "fail"))]
            time.sleep(0.2)
    results: list[Result] = []
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, follow_redirects=False, timeout=30) as client:
        page = client.get("/login")
        login = client.post("/login", data={"token": token, "csrf": csrf_of(page.text)})
        cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
        # A claim number that is no ASCII digit: `²` passes str.isdigit, not int().
        started = time.monotonic()
        status = raw_get(port, "/image/%C2%B2/source", cookie)
        results.append(report(Result(
            "web-image-superscript-claim", "tamperings",
            f"logged in (login {login.status_code}); GET /image/%C2%B2/source, sent byte for "
            "byte", "a 4xx, not a 5xx", f"HTTP {status}",
            "pass" if 400 <= status < 500 and login.status_code == 303 else "fail",
            time.monotonic() - started)))
        started = time.monotonic()
        form = form_for(client.get("/").text)
        form["duration_ms"] = "\u00b2"
        posted = client.post("/rate", data=form)
        check = run([ACRB, "review", "verify", str(workdir)], workdir.parent, env,
                    timeout=CLI_TIMEOUT)
        con = sqlite3.connect(workdir / "review.sqlite")
        stored = con.execute("SELECT duration_ms FROM ratings ORDER BY audit_seq DESC "
                             "LIMIT 1").fetchone()
        con.close()
        ok = posted.status_code < 500 and check.rc == 0
        results.append(report(Result(
            "web-rate-duration-superscript", "tamperings", "POST /rate with a complete answer "
            "and duration_ms=² (U+00B2), then acrb review verify",
            "not a 5xx (the server's own time is used, or a 4xx); the folder still verifies",
            f"HTTP {posted.status_code}; verify exit {check.rc}; the last rating's duration_ms "
            f"{stored[0] if stored else None!r}", "pass" if ok else "fail",
            time.monotonic() - started)))
    started = time.monotonic()
    codes = []
    with httpx.Client(base_url=base, follow_redirects=False, timeout=30) as client:
        for n in range(12):
            client.cookies.clear()
            client.headers["X-Forwarded-For"] = f"203.0.113.{n + 1}"
            page = client.get("/login")
            codes.append(client.post("/login", data={
                "token": "acrb_wrong" if n < 10 else token,
                "csrf": csrf_of(page.text)}).status_code)
    ok = codes == [401] * 10 + [429, 429]
    results.append(report(Result(
        "web-login-throttle-rotating-xff", "tamperings", "12 logins from one client, each with "
        "a new X-Forwarded-For (203.0.113.1-12): 10 wrong tokens, then the right one twice",
        "401 x 10, then 429 x 2 (10 failures a minute per connecting address; X-Forwarded-For "
        "not believed)", f"HTTP {codes}", "pass" if ok else "fail",
        time.monotonic() - started)))
    return results


# ---- secrets -----------------------------------------------------------------------------------

def run_secrets(sandbox: Path) -> list[Result]:
    """A judge endpoint echoing the middle piece of the key, through the CLI, MLflow on."""
    from tests.conftest import write_params
    from tests.llm_servers import FakeLLMServer, Scripted, openai_reply
    from tests.test_secrets import ENV, KEY, MIDDLE, leaking_files, leaks

    began = time.monotonic()

    def echoing(user: str) -> Scripted:
        if "exactly the keys" in user:  # a judge question: a valid answer, the piece in a note
            keys = re.findall(r'"(\w+)"', user.rsplit("exactly the keys", 1)[1])
            values = {"edit_success": 4, "skin_tone": 3, "race_change": 1, "gender_change": 1,
                      "age_change": 1, "aging_accuracy": 4, "cue_retention": 1.0}
            answer = {k: values.get(k, 1) for k in keys}
            answer["note"] = f"key id {MIDDLE}"
            return Scripted(body=openai_reply(json.dumps(answer) + f" ({MIDDLE})"),
                            headers={"x-echo": MIDDLE})
        return Scripted(body=openai_reply(f"fine, key id {MIDDLE}"))

    root = sandbox / "project"
    root.mkdir(parents=True)
    (root / "dvc.yaml").write_text("stages: {}\n")
    printed = []
    with FakeLLMServer("openai", responder=echoing) as server:
        backend = {"kind": "openai", "model": "judge-1", "base_url": server.base_url,
                   "api_key_env": ENV, "temperature": 0.0, "max_tokens": 400, "timeout_s": 10.0,
                   "max_attempts": 1, "backoff_s": 0.0, "backoff_max_s": 0.0,
                   "requests_per_minute": 600_000.0, "concurrency": 4}
        write_params(root, {
            "sources": {"races": ["Black"], "genders": ["Female"], "ages": ["20s"]},
            "prompts": {"categories": ["A"], "synthesis": None},
            "judges": {"echo-judge": {"kind": "vlm", "backend": backend}},
            "judge": {"use": ["echo-judge", "sim-judge-b"]}})
        params_edit(lambda p: p.update(models={MODEL: p["models"][MODEL]}))(root)
        env = probe_env(sandbox / "home", {"ACRB_MLFLOW": None, ENV: KEY})
        problems = []
        for args in (["sources"], ["prompts"], ["plan"], ["generate", "-m", MODEL],
                     ["evaluate", "-m", MODEL], ["judge", "-m", MODEL], ["mlflow-sync"]):
            ran = run([ACRB, *args], root, env)
            printed.append(ran.output)
            if ran.rc != 0:
                problems.append(f"acrb {' '.join(args)} exit {ran.rc}: {_tail(ran.output, 600)}")
                break
        asked = [r for r in server.requests if r.body.get("model") == "judge-1"]
        keyed = all(r.headers.get("authorization") == f"Bearer {KEY}" for r in asked)
    if not problems and not (root / "mlflow.db").is_file():
        problems.append("no mlflow.db in the project: MLflow did not log")
    if not asked:
        problems.append("the judge endpoint was never asked")
    elif not keyed:
        problems.append("the judge endpoint was not sent the key")
    leaked = {**leaking_files(root), **{f"HOME/{k}": v for k, v in
                                        leaking_files(sandbox / "home").items()}}
    if leaked:
        problems.append(f"key pieces in files: {dict(list(leaked.items())[:6])}")
    if leaks("\n".join(printed)):
        problems.append(f"key pieces printed: {leaks(chr(10).join(printed))}")
    masked = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
              and p.suffix in (".json", ".jsonl", ".csv", ".md")
              and f"key id [redacted:{ENV}]" in p.read_text(errors="replace")]
    if not problems and not masked:
        problems.append("the echoed piece was found nowhere, masked or not (nothing checked)")
    return [report(Result(
        "judge-echoes-key-middle", "secrets",
        f"a fake OpenAI judge endpoint whose every answer echoes the key's 16-character middle "
        f"piece; acrb sources, prompts, plan, generate, evaluate, judge and mlflow-sync with "
        f"MLflow on ({len(asked)} judge requests)",
        "every command exit 0; no 12-character piece of the key in any file of the project "
        "(Parquet rows, mlflow.db and artifacts included) or in what was printed; the echo "
        "stored masked", "; ".join(problems) or f"no piece anywhere; masked echo in "
        f"{masked[:4]}", "fail" if problems else "pass", time.monotonic() - began))]


# ---- the run -----------------------------------------------------------------------------------

def summary(results: Sequence[Result]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for result in results:
        entry = counts.setdefault(result.category, {"pass": 0, "fail": 0, "skip": 0})
        entry[result.status] += 1
    return counts


NOTES = (
    "After a kill, `dvc repro` does not rerun a stage whose outputs are all cached and "
    "non-persistent: its dvc.lock entry is unchanged, so DVC checks the outputs out of its "
    "cache (\"is cached - skipping run\"). The stage's own clean-up of what a kill left is "
    "exercised where DVC reruns it (persistent outputs: generate, evaluate, judge; outputs "
    "with `cache: false`: analyze, review) and by each stage's planted-temporaries case, "
    "which runs the stage's command directly, as a user rerunning by hand does.",
    "kill-N cases kill at a uniform moment of the whole `dvc repro -f -s STAGE` (DVC's own "
    "start-up included); kill-mid-write cases kill at a table write, counted by a "
    "sitecustomize hook; a kill-N whose run ended before its moment is still checked.",
    "`review.raters_per_item` above the raters registered is documented as a warning, not a "
    "refusal (docs/review.md, Assignment), so that case expects exit 0 and the warning.",
    "`duration_ms=²` is documented to fall back to the server's own time (docs/review.md), so "
    "a 303 that stores a number is the expected answer there; a 5xx would fail.",
    "Bad inputs: HOME points into each case's folder, which is checked for writes; MLflow 3 "
    "writes its telemetry id to `$HOME/.config/mlflow/telemetry.json` whenever it is "
    "imported (MLflow's telemetry is on unless MLFLOW_DISABLE_TELEMETRY or DO_NOT_TRACK is "
    "set); that one file is not counted as the case's write and is named in its observed "
    "text.",
)


def write_markdown(path: Path, record: dict[str, Any]) -> None:
    lines = ["# Reliability probe (issue 30 rerun)", "",
             f"- command: `{record['command']}`",
             f"- date: {record['date']}",
             f"- commit: `{record['commit']}`" + (
                 f" with uncommitted changes to {len(record['dirty'])} file(s) of src/, tests/, "
                 "dvc.yaml, params.yaml (listed in the JSON, `dirty`)" if record["dirty"] else ""),
             f"- machine: {record['machine']['cpus']} CPU cores (shared), "
             f"{record['machine']['platform']}, Python {record['machine']['python']}; "
             f"load average at the start {record['machine']['load_start']}, at the end "
             f"{record['machine']['load_end']}",
             f"- seed: {record['seed']}, kills per stage: {record['kills_per_stage']}, "
             f"stages: {', '.join(record['stages'])}",
             f"- wall time: {record['seconds']:.0f} s", "",
             "| category | pass | fail | skip |", "| --- | --- | --- | --- |"]
    for category, counts in record["counts"].items():
        lines.append(f"| {category} | {counts['pass']} | {counts['fail']} | {counts['skip']} |")
    failures = [r for r in record["results"] if r["status"] == "fail"]
    lines += ["", "## Failing cases", ""]
    if not failures:
        lines.append("None.")
    for result in failures:
        lines += [f"### {result['category']}: {result['name']}", "",
                  f"- done: {result['action']}", f"- expected: {result['expected']}",
                  "- observed:", "", "```", result["observed"], "```", ""]
    lines += ["", "## Notes", "", *[f"- {note}" for note in NOTES]]
    lines += ["", "## Every case", "", "| category | case | status | s | observed |",
              "| --- | --- | --- | --- | --- |"]
    for result in record["results"]:
        observed = result["observed"].replace("\n", " ").replace("|", "\\|")
        observed = observed if len(observed) <= 180 else observed[:177] + "..."
        lines.append(f"| {result['category']} | {result['name']} | {result['status']} | "
                     f"{result['seconds']:.1f} | {observed} |")
    lines += ["", "What each case does and expects is in the JSON beside this file "
              "(`action`, `expected`, `observed`); the probe itself: "
              "`benchmarks/reliability_probe.py`.", ""]
    path.write_text("\n".join(lines))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Rerun the reliability probe of issue 30 against the real CLI: kills of "
        "`dvc repro` mid-stage (kills), bad inputs (bad-inputs), tamperings of the human "
        "review (tamperings) and a judge echoing the API key (secrets). Prints one line per "
        "case, writes every case (name, category, what was done, expected, observed, "
        "pass/fail) to --out and a Markdown summary beside it, and exits 1 if any case fails.")
    parser.add_argument("--kills-per-stage", type=int, default=2,
                        help="random-moment kills of each stage (default 2); each stage also "
                        "gets one kill mid-table-write and the planted-temporaries case")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the kill moments (default: drawn, and recorded)")
    parser.add_argument("--only", nargs="+", choices=CATEGORIES, default=None,
                        metavar="CATEGORY",
                        help=f"run only these categories ({', '.join(CATEGORIES)})")
    parser.add_argument("--stages", nargs="+", default=list(TABLE_STAGES), metavar="STAGE",
                        help="the stages to kill (default: "
                        f"{' '.join(TABLE_STAGES)}; {' '.join(OTHER_TABLE_STAGES)} write "
                        "tables too)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" /
                        "reliability_probe.json",
                        help="the JSON record (the Markdown summary goes beside it, .md)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="build the temporary projects in DIR and keep them (default: a "
                        "temporary folder, removed at the end)")
    return parser.parse_args(argv)


def command_line(argv: Sequence[str] | None) -> str:
    """How this run was started, as one would type it in the repository (niceness included)."""
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):
        python = python.relative_to(REPO)
    niceness = os.nice(0)
    return " ".join([*([f"nice -n {niceness}"] if niceness else []), str(python),
                     "benchmarks/reliability_probe.py",
                     *map(shlex.quote, argv if argv is not None else sys.argv[1:])])


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    categories = args.only or list(CATEGORIES)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    rng = random.Random(seed)
    began = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    # The code under test: the working tree at the start (the projects copy src/ from it).
    commit = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", "src", "dvc.yaml", "params.yaml",
                "tests").splitlines()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        sandbox = args.keep.resolve()
    else:
        sandbox = Path(tempfile.mkdtemp(prefix="acrb-probe-"))
    print(f"reliability probe: seed {seed}, categories {', '.join(categories)}, in {sandbox}",
          flush=True)
    results: list[Result] = []
    reference: Path | None = None
    try:
        if "kills" in categories:
            found, reference = run_kills(sandbox, args.stages, args.kills_per_stage, rng)
            results += found
        if "bad-inputs" in categories:
            if reference is None:
                root, _, ran = build_reference(sandbox / "bad-inputs-reference")
                if ran.rc == 0:
                    reference = root
                else:
                    results.append(report(Result("reference-repro", "bad-inputs", "dvc repro",
                                                 "exit 0", _tail(ran.output), "fail")))
            if reference is not None:
                results += run_bad_inputs(reference, sandbox / "bad-inputs")
        if "tamperings" in categories:
            results += run_tamperings(sandbox / "tamperings")
        if "secrets" in categories:
            results += run_secrets(sandbox / "secrets")
    finally:
        if args.keep is None:
            shutil.rmtree(sandbox, ignore_errors=True)
    counts = summary(results)
    record = {
        "command": command_line(argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "load_start": load_start,
                    "load_end": [round(x, 2) for x in os.getloadavg()]},
        "seed": seed, "kills_per_stage": args.kills_per_stage,
        "stages": list(args.stages) if "kills" in categories else [],
        "categories": categories, "seconds": round(time.monotonic() - began, 1),
        "counts": counts, "failures": [r.name for r in results if r.status == "fail"],
        "results": [asdict(r) for r in results]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    write_markdown(args.out.with_suffix(".md"), record)
    print(f"\n{sum(c['pass'] for c in counts.values())} passed, "
          f"{sum(c['fail'] for c in counts.values())} failed, "
          f"{sum(c['skip'] for c in counts.values())} skipped in {record['seconds']:.0f} s "
          f"(seed {seed}); " + ", ".join(f"{k}: {v['pass']}/{sum(v.values())} pass"
                                         for k, v in counts.items()), flush=True)
    for name in record["failures"]:
        print(f"FAILED: {name}", flush=True)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}", flush=True)
    return 1 if record["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
