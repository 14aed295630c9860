"""`dvc repro` on a copy of the project with tiny params: the real dvc.yaml, run as a user would.

Checks that the pipeline runs, that a repeat does nothing, that changing an `analyze` param
re-runs only analyze and report and shows in `dvc metrics diff`, and that MLflow runs are found
from another directory.

Slow (five `dvc repro`s, about three minutes on two cores): one of the DVC and MLflow round
trips that CI runs after `make test` (`make test-ecosystem`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, write_params

BIN = Path(sys.executable).parent
PROJECT_FILES = ["dvc.yaml", "params.yaml", "pyproject.toml", ".dvcignore", ".gitignore"]


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def _stages_run(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


@pytest.fixture
def dvc_project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    return build_dvc_project(tmp_path / "acrb")


def build_dvc_project(root: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the project's code, inputs and DVC files at ``root`` with the tiny params,
    committed to a fresh git repository; returns it and the environment to run dvc in."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "inputs", root / "inputs")  # a dependency of `sources`
    for name in PROJECT_FILES:
        shutil.copy2(REPO / name, root / name)
    (root / ".dvc").mkdir()
    shutil.copy2(REPO / ".dvc" / "config", root / ".dvc" / "config")
    # This checks DVC's wiring (what reruns, what is cached, what is shared), not statistics:
    # a tenth of the resamples (the statistics at full size are checked in
    # tests/test_default_profile.py). Five repros of analyze at 2,000 made this file the
    # suite's longest, alone at the end of `make test` for 14 minutes. Likewise the
    # text-to-image prompts of two of the nine safety domains (550 instead of 2,500).
    write_params(root, {"prompts": {"catalog": "src/acrb/prompts/data/i2i_catalog.yaml",
                                    "synthesis": {"domains": ["copyright",
                                                              "religious-cultural"]}},
                        "analyze": {"bootstrap": 200, "permutations": 200}})
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ACRB_"))},
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
        "DVC_NO_ANALYTICS": "1",
        "ACRB_ANALYZE_WORKERS": "2",  # the models' analyses in two processes, as on 2 CPUs
    }
    _run(["git", "init", "-q"], root, env)
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "init"], root, env)
    return root, env


@pytest.mark.slow
def test_dvc_repro_end_to_end(dvc_project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, env = dvc_project
    # The first run without MLflow (each stage process saves about 3 s of MLflow's start-up);
    # the later repros log, and the end of the test finds their runs.
    first = _run([str(BIN / "dvc"), "repro"], root, {**env, "ACRB_MLFLOW": "0"})
    assert {"sources", "prompts", "plan", "generate@synthetic-fair",
            "generate@synthetic-biased", "evaluate@synthetic-fair", "evaluate@synthetic-biased",
            "judge@synthetic-fair", "judge@synthetic-biased", "analyze", "tables", "report"
            } <= _stages_run(first)
    assert (root / "data" / "tables" / "index.json").exists()
    assert (root / "reports" / "report.html").exists()
    assert (root / "metrics" / "audit" / "synthetic-biased" / "refusal.json").exists()
    assert (root / "dvc.lock").exists()

    again = _run([str(BIN / "dvc"), "repro"], root, env)
    assert _stages_run(again) == set(), again

    # `dvc repro` analysed the models in two processes (ACRB_ANALYZE_WORKERS above); one
    # process writes the same bytes, so DVC sees nothing changed afterwards.
    _run([str(BIN / "acrb"), "analyze"], root,
         {**env, "ACRB_ANALYZE_WORKERS": "1", "ACRB_MLFLOW": "0"})
    status = _run([str(BIN / "dvc"), "status"], root, env)
    assert "up to date" in status, status

    # A change to code a stage uses makes that stage stale: analyze and report declare the
    # analysis package, so editing its renderer re-runs both, and nothing upstream.
    renderer = root / "src" / "acrb" / "analysis" / "outputs" / "report.py"
    original = renderer.read_bytes()
    renderer.write_bytes(original + b"\n# a change\n")
    status = _run([str(BIN / "dvc"), "status"], root, env)
    stale = set(re.findall(r"^(\S+):\s*$", status, flags=re.MULTILINE))
    assert {"analyze", "report"} <= stale, status
    assert not stale & {"sources", "prompts", "plan"}, status
    renderer.write_bytes(original)
    assert _stages_run(_run([str(BIN / "dvc"), "repro"], root, env)) == set()

    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "first run"], root, env)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["analyze"]["confidence"] = 0.9
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    changed = _run([str(BIN / "dvc"), "repro"], root, env)
    # The review's corrected intervals and the paper's tables use the same confidence.
    assert _stages_run(changed) == {"analyze", "review", "tables", "report"}, changed
    diff = _run([str(BIN / "dvc"), "metrics", "diff"], root, env)
    assert "race_ub" in diff and "metrics/audit/synthetic-biased/refusal.json" in diff

    # A judge threshold re-runs judging (every answer reused) and the analyses (the review's
    # human outcomes use the same threshold; its set is redrawn, identical, because the
    # verdicts it reads changed), never generation or the detectors. The plan re-records its
    # stopping rule, null for this fixed design: the same bytes, so generation stays.
    params["judge"]["outcomes"]["soft_erasure"]["at_most"] = 4
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    rejudged = _run([str(BIN / "dvc"), "repro"], root, env)
    assert _stages_run(rejudged) == {"plan", "judge@synthetic-fair", "judge@synthetic-biased",
                                     "judge@synthetic-t2i", "analyze", "review_set", "review",
                                     "tables", "report"}, rejudged
    assert "0 asked" in rejudged

    # The stages queued their runs; `acrb mlflow-sync` waits until they are logged.
    synced = _run([str(BIN / "acrb"), "mlflow-sync"], root, env)
    assert "every queued run is logged" in synced, synced
    assert not [p for p in (root / ".acrb-cache" / "mlflow-queue").iterdir()
                if p.name[:1].isdigit() or p.name == "failed"]
    # MLflow runs are found from another directory through the project's absolute store.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = (
        "import mlflow\n"
        f"mlflow.set_tracking_uri('sqlite:///{root / 'mlflow.db'}')\n"
        "runs = mlflow.search_runs(experiment_names=['acrb/embedded-default'],"
        " filter_string=\"tags.`acrb.stage` = 'analyze'\")\n"
        "print(sorted(set(runs['tags.acrb.model'])), len(runs))\n"
        "print('delta_refusal' in ' '.join(runs.columns))\n"
    )
    found = _run([sys.executable, "-c", script], elsewhere, env)
    # One analyze run per model for each of the two logged repros that ran analyze.
    assert "['synthetic-biased', 'synthetic-fair', 'synthetic-t2i'] 6" in found, found
    assert "True" in found
