"""Whether two runs of the pipeline wrote the same outputs, byte for byte: compares the output
hashes that two ``dvc.lock`` files record (DVC's md5 of each output file, and of each output
folder's listing of its files' md5s).

A change that only moves code (a refactor, a renamed module) must leave every output as it was.
Run ``dvc repro`` on the change (``make repro`` in a fresh clone writes the lock), then:

    python benchmarks/same_outputs.py --base <commit before the change>

It compares the working ``dvc.lock`` with the lock committed at ``--base`` (or ``--before
FILE``) and prints each output whose hash differs, appeared or went away; exit 0 when every
output of every stage is the same, 1 otherwise. The stages' dependency hashes (the code that
changed) are not compared: only what the stages wrote.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


def output_hashes(lock: Mapping[str, Any]) -> dict[tuple[str, str], str | None]:
    """(stage, output path) -> the md5 the lock records (None for an output without one)."""
    found: dict[tuple[str, str], str | None] = {}
    for stage, entry in (lock.get("stages") or {}).items():
        for out in entry.get("outs") or []:
            found[(stage, out["path"])] = out.get("md5")
    return found


def differences(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """One line per output that differs between the two locks, sorted; empty when none does."""
    old, new = output_hashes(before), output_hashes(after)
    lines = []
    for key in sorted(old.keys() | new.keys()):
        stage, path = key
        if key not in new:
            lines.append(f"{stage}: {path}: only before ({old[key]})")
        elif key not in old:
            lines.append(f"{stage}: {path}: only after ({new[key]})")
        elif old[key] != new[key]:
            lines.append(f"{stage}: {path}: {old[key]} -> {new[key]}")
    return lines


def lock_at(revision: str, repo: Path) -> dict[str, Any]:
    shown = subprocess.run(["git", "show", f"{revision}:dvc.lock"], cwd=repo, check=True,
                           capture_output=True, text=True)
    return yaml.safe_load(shown.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--base", help="the git revision whose committed dvc.lock is 'before'")
    which.add_argument("--before", type=Path, help="a dvc.lock file to compare with instead")
    parser.add_argument("--after", type=Path, default=Path("dvc.lock"),
                        help="the lock of the run to check (default: ./dvc.lock)")
    args = parser.parse_args(argv)
    before = (lock_at(args.base, args.after.resolve().parent) if args.base
              else yaml.safe_load(args.before.read_text()))
    after = yaml.safe_load(args.after.read_text())
    lines = differences(before, after)
    outputs = len(output_hashes(after))
    for line in lines:
        print(line)
    print(f"{outputs} outputs compared: " + (f"{len(lines)} differ" if lines else "all the same"))
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
