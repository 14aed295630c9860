"""`dvc exp run --queue`/`--run-all`/`--temp` on a copy of the project: experiments in isolation.

DVC runs a queued or temporary experiment in a copy under ``.dvc/tmp/exps/`` (``tmp<random>/``
for the queue, ``standalone/tmp<random>/`` for ``--temp``). Each experiment must read its own
params and write its own outputs there, leave the workspace byte-identical, show its own
metrics in ``dvc exp show``, and log its own params in the project's MLflow store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_dvc_pipeline import BIN, _run, dvc_project  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow  # one repro and three experiments of the tiny pipeline

#: The tiniest params that run every stage: one editor, two catalog categories, one seed.
TINIEST: dict[str, Any] = {
    "prompts": {"categories": ["A", "B"], "synthesis": None},
    "plan": {"seeds": [0]},
    "analyze": {"bootstrap": 100, "permutations": 100},
    "judge": {"use": ["sim-judge-a"]},
}


def _workspace(root: Path) -> dict[str, bytes]:
    """Every file of the workspace that a stage reads or writes, by path."""
    files = [root / "params.yaml", root / "dvc.lock"]
    for folder in ("data", "metrics", "plots", "reports"):
        files += [p for p in (root / folder).rglob("*") if p.is_file()]
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def _exp_metrics(root: Path, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``dvc exp show --json``: name of each experiment (the workspace as "workspace") ->
    model -> its refusal headline (metrics/audit/<model>/refusal.json)."""
    shown = json.loads(_run([str(BIN / "dvc"), "exp", "show", "--json"], root, env))
    out: dict[str, dict[str, Any]] = {}

    def take(entry: dict[str, Any]) -> None:
        data = entry.get("data") or {}
        name = entry.get("name") or data.get("rev") or ""
        files = data.get("metrics") or {}
        metrics = {path.split("/")[-2]: (content.get("data") or {})
                   for path, content in files.items()
                   if path.startswith("metrics/audit/") and path.endswith("/refusal.json")}
        if metrics:
            out[name] = metrics
        for child in entry.get("experiments") or []:
            for revision in child.get("revs") or []:
                take(revision)

    for entry in shown:
        take(entry)
    return out


def _confidences(root: Path) -> dict[str, set[str]]:
    """MLflow: DVC experiment name -> the analyze.confidence of its analyze runs (once the
    runs the experiments' stages queued are logged)."""
    import mlflow

    from acrb.tracking_queue import wait_for_queue

    wait_for_queue(root)

    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("acrb/embedded-default")
    out: dict[str, set[str]] = {}
    for run in client.search_runs([experiment.experiment_id],
                                  filter_string="tags.`acrb.stage` = 'analyze'"):
        name = run.data.tags.get("acrb.dvc_exp_name", "")
        out.setdefault(name, set()).add(run.data.params["analyze.confidence"])
    return out


def test_queued_and_temp_experiments_are_isolated(
        dvc_project: tuple[Path, dict[str, str]]) -> None:  # noqa: F811
    from tests.conftest import write_params

    root, env = dvc_project
    params = yaml.safe_load((root / "params.yaml").read_text())
    write_params(root, {**TINIEST, "prompts": {**TINIEST["prompts"],
                                              "catalog": params["prompts"]["catalog"]},
                        "models": {"synthetic-biased": params["models"]["synthetic-biased"]}})
    # Only the editor: a models section replaced whole (write_params merges mappings).
    tiny = yaml.safe_load((root / "params.yaml").read_text())
    tiny["models"] = {"synthetic-biased": params["models"]["synthetic-biased"]}
    (root / "params.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    _run([str(BIN / "dvc"), "repro"], root, env)
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "baseline"], root, env)
    before = _workspace(root)
    workspace_metrics = {model: json.loads(path.read_text()) for path in
                         (root / "metrics" / "audit").glob("*/refusal.json")
                         for model in [path.parent.name]}

    _run([str(BIN / "dvc"), "exp", "run", "--queue", "-n", "queued-90",
          "-S", "analyze.confidence=0.9"], root, env)
    _run([str(BIN / "dvc"), "exp", "run", "--run-all", "-j", "1"], root, env)
    assert _workspace(root) == before
    _run([str(BIN / "dvc"), "exp", "run", "--temp", "-n", "temp-80",
          "-S", "analyze.confidence=0.8"], root, env)
    assert _workspace(root) == before

    shown = _exp_metrics(root, env)
    assert {"queued-90", "temp-80"} <= set(shown), sorted(shown)
    model = "synthetic-biased"
    def bounds(metrics: dict[str, Any]) -> dict[str, float]:
        return {k: v for k, v in metrics[model].items() if k.endswith(("_lb", "_ub"))}

    for name in ("queued-90", "temp-80"):
        # The confidence level changes the interval bounds, not the estimates.
        assert shown[name][model]["race"] == workspace_metrics[model]["race"]
        assert bounds(shown[name]) != bounds(workspace_metrics), name
    assert bounds(shown["queued-90"]) != bounds(shown["temp-80"])

    logged = _confidences(root)
    assert logged["queued-90"] == {"0.9"} and logged["temp-80"] == {"0.8"}, logged
    assert logged[""] == {"0.95"}
    # The experiments' temporary copies are gone; their runs are in the project's store.
    assert not list((root / ".dvc" / "tmp" / "exps").glob("**/dvc.yaml"))


def test_dvc_runs_experiments_where_the_roots_expect(
        dvc_project: tuple[Path, dict[str, str]]) -> None:  # noqa: F811
    """A one-stage pipeline that records, from inside DVC's copies (DVC 3.67), the folder it
    runs in and the two roots: the stage root is the copy, the tracking root the project."""
    root, env = dvc_project
    log = root.parent / "where.jsonl"
    script = ("import json, os; from acrb.tracking import stage_root, tracking_root; "
              f"open({str(log)!r}, 'a').write(json.dumps([os.getcwd(), str(stage_root()), "
              "str(tracking_root())]) + chr(10))")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"where": {
        "cmd": f"python -c \"{script}\"", "params": ["analyze.confidence"]}}}))
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "where"], root, env)
    _run([str(BIN / "dvc"), "exp", "run", "--temp", "-S", "analyze.confidence=0.8"], root, env)
    _run([str(BIN / "dvc"), "exp", "run", "--queue", "-S", "analyze.confidence=0.9"], root, env)
    _run([str(BIN / "dvc"), "exp", "run", "--run-all", "-j", "1"], root, env)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 2, rows
    exps = root.resolve() / ".dvc" / "tmp" / "exps"
    temp, queued = (Path(row[0]) for row in rows)
    assert temp.parent == exps / "standalone" and temp.name.startswith("tmp")
    assert queued.parent == exps and queued.name.startswith("tmp")
    for cwd, stage, tracking in rows:
        assert stage == cwd and tracking == str(root.resolve())
