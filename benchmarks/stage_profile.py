"""Seconds per DVC stage of one `dvc repro`, from the moments DVC announces each stage.

Run it in a project (a fresh clone for a from-scratch profile):

    python benchmarks/stage_profile.py --label after --out benchmarks/results/stage_profile.json

It runs `dvc repro` (its output goes to the terminal as usual), notes when each "Running stage"
line arrives, and adds {label: {stage: seconds, ..., "total": seconds}} to ``--out`` with the
machine's CPU count, then runs `dvc repro` once more and records how long the no-op took.
A stage's time includes its process start and MLflow logging: what a user waits for.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

STAGE_LINE = re.compile(r"Running stage '([^']+)'")


def profile(command: list[str]) -> dict[str, float]:
    """Seconds from each stage's announcement to the next one's (the last: to the end)."""
    started = time.perf_counter()
    marks: list[tuple[str, float]] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            found = STAGE_LINE.search(line)
            if found:
                marks.append((found.group(1), time.perf_counter()))
        if process.wait() != 0:
            raise SystemExit(f"{' '.join(command)} failed with exit code {process.returncode}")
    ended = time.perf_counter()
    times = {name: round(end - start, 1) for (name, start), (_, end)
             in zip(marks, [*marks[1:], ("", ended)], strict=True)}
    times["total"] = round(ended - started, 1)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", required=True, help="e.g. the commit, or before/after")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/stage_profile.json"))
    parser.add_argument("--dvc", default="dvc")
    args = parser.parse_args()
    stages = profile([args.dvc, "repro"])
    tick = time.perf_counter()
    subprocess.run([args.dvc, "repro"], check=True, capture_output=True)
    noop = round(time.perf_counter() - tick, 1)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results[args.label] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "stages_seconds": stages, "noop_repro_seconds": noop}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\n{args.label}: dvc repro {stages['total']} s, no-op {noop} s -> {args.out}")


if __name__ == "__main__":
    main()
