"""benchmarks/gpu_check.sh, the one script that makes every GPU figure: each command it would
run is accepted by its benchmark's own argument parser, writes under the output folder, and
each part (`first`, `adapters`) fits one 10-minute command. Its benchmarks' CPU paths are
tested in their own files; this keeps the script's command lines from drifting from them."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
PART_LINE = re.compile(r"^== (?P<name>\S+) \(at most (?P<seconds>\d+)s\): (?P<command>.*)$")


def dry_run(part: str, out: Path) -> list[tuple[str, int, list[str]]]:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    result = subprocess.run(["bash", str(SCRIPT), str(out), part], capture_output=True,
                            text=True, check=True, timeout=60, cwd=REPO,
                            env={**os.environ, "GPU_CHECK_DRY_RUN": "1"})
    parts = []
    for line in result.stdout.splitlines():
        match = PART_LINE.match(line)
        assert match, f"unexpected line: {line!r}"
        parts.append((match["name"], int(match["seconds"]), shlex.split(match["command"])))
    return parts


def load(path: Path) -> ModuleType:
    name = f"gpu_check_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_every_command_is_one_its_benchmark_accepts(tmp_path: Path) -> None:
    parts = dry_run("all", tmp_path / "out")
    scripts = [command for _, _, command in parts if command[0] != "environment"]
    assert [Path(c[1]).name for c in scripts] == [
        "harness_overhead.py", "judge_throughput.py", "clip_throughput.py", "gpu_adapters.py"]
    for command in scripts:
        assert command[0] == "python3"
        module = load(REPO / command[1])
        args = module.parse_args(command[2:])  # an unknown or ill-typed option exits here
        assert args.device == "cuda", command
        assert Path(args.out).parent == tmp_path / "out", command
        assert not getattr(args, "tiny", False), command


@pytest.mark.parametrize("part", ["first", "adapters"])
def test_each_part_fits_one_ten_minute_command(tmp_path: Path, part: str) -> None:
    parts = dry_run(part, tmp_path / "out")
    assert parts, part
    # The parts' own bounds, with time left for the packages' install and the transfers.
    assert sum(seconds for _, seconds, _ in parts) <= 570, parts
