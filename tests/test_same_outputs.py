"""The check that a change moved code and left every output as it was
(benchmarks/same_outputs.py): it finds an output whose hash changed, one that appeared and one
that went away, and ignores what a stage depends on."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import same_outputs


def committed_lock() -> dict:
    return yaml.safe_load((REPO / "dvc.lock").read_text())


def test_the_committed_lock_is_the_same_as_itself_whatever_its_code_hashes() -> None:
    before = committed_lock()
    after = copy.deepcopy(before)
    for entry in after["stages"].values():
        for dep in entry.get("deps") or []:
            dep["md5"] = "0" * 32  # the code changed
    assert same_outputs.differences(before, after) == []
    assert len(same_outputs.output_hashes(after)) > 20


def test_a_changed_an_added_and_a_removed_output_are_each_named() -> None:
    before = committed_lock()
    after = copy.deepcopy(before)
    stage, entry = next((s, e) for s, e in after["stages"].items() if e.get("outs"))
    changed = entry["outs"][0]
    changed["md5"] = "f" * 32
    removed = after["stages"]["report"]["outs"].pop(0)
    after["stages"]["report"]["outs"].append({"path": "reports/new.html", "md5": "1" * 32})
    lines = same_outputs.differences(before, after)
    assert any(line.startswith(f"{stage}: {changed['path']}: ") and line.endswith("f" * 32)
               for line in lines), lines
    assert f"report: {removed['path']}: only before ({removed['md5']})" in lines
    assert "report: reports/new.html: only after (" + "1" * 32 + ")" in lines
    assert len(lines) == 3


def test_the_command_exits_1_naming_the_difference(tmp_path: Path) -> None:
    after = committed_lock()
    after["stages"]["report"]["outs"][0]["md5"] = "e" * 32
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(after))
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "same_outputs.py"),
                          "--before", str(REPO / "dvc.lock"), "--after",
                          str(tmp_path / "dvc.lock")], capture_output=True, text=True)
    assert run.returncode == 1
    assert "report: " in run.stdout and "1 differ" in run.stdout
    same = subprocess.run([sys.executable, str(REPO / "benchmarks" / "same_outputs.py"),
                           "--before", str(REPO / "dvc.lock")], cwd=REPO,
                          capture_output=True, text=True)
    assert same.returncode == 0 and "all the same" in same.stdout
