"""`dvc exp run -S generate.runner=ray -S judge.runner=ray` on a copy of the project: the Ray
runner (a local cluster the stage starts itself) reproduces the local runner's pipeline, every
output hash in ``dvc.lock`` and every metric the same."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_dvc_experiments import TINIEST
from tests.test_dvc_pipeline import BIN, _run, dvc_project  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow  # two runs of the tiny pipeline, one on Ray
pytest.importorskip("ray", reason="the Ray runner needs ray (the dev extra)")

MODEL = "synthetic-biased"


def _outputs(root: Path) -> dict[str, Any]:
    """Stage -> its outputs' hashes in ``dvc.lock`` (params and code left out)."""
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return {name: sorted((o["path"], o.get("md5"), o.get("nfiles")) for o in stage["outs"])
            for name, stage in lock["stages"].items() if stage.get("outs")}


def _metrics(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted((root / "metrics").rglob("*.json"))}


def test_dvc_exp_run_on_ray_reproduces_the_local_run(
        dvc_project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:  # noqa: F811
    root, env = dvc_project
    params = yaml.safe_load((root / "params.yaml").read_text())
    tiny = {**params, **TINIEST, "prompts": {**params["prompts"], **TINIEST["prompts"]},
            "plan": {**params["plan"], **TINIEST["plan"]},
            "analyze": {**params["analyze"], **TINIEST["analyze"]},
            "judge": {**params["judge"], **TINIEST["judge"]},
            "models": {MODEL: params["models"][MODEL]},
            # Two actors of half a CPU each on the local cluster the stage starts.
            "ray": {**params["ray"], "cpus_per_actor": 0.5, "actors": 2}}
    (root / "params.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "tiny"], root, env)
    on_ray = tmp_path / "on-ray"
    shutil.copytree(root, on_ray)

    _run([str(BIN / "dvc"), "repro"], root, env)
    output = _run([str(BIN / "dvc"), "exp", "run", "-S", "generate.runner=ray",
                   "-S", "judge.runner=ray"], on_ray, env)
    assert f"Running stage 'generate@{MODEL}'" in output and f"judge@{MODEL}" in output

    # Every output, the tables and the report included: the params hash they name leaves out
    # the runner (acrb.config.EXECUTION_ONLY).
    assert _outputs(on_ray) == _outputs(root)
    assert _metrics(on_ray) == _metrics(root)
    lock = yaml.safe_load((on_ray / "dvc.lock").read_text())
    assert lock["stages"][f"generate@{MODEL}"]["params"]["params.yaml"]["generate"][
        "runner"] == "ray"
    timings = (on_ray / "logs" / "timings" / "generate" / f"{MODEL}.jsonl").read_text()
    assert '"runner":"ray"' in timings
