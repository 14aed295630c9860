"""What a pipeline run leaves in MLflow, read back with MlflowClient as a person comparing models.

The tiny pipeline (two simulated editors, sources to analyze) runs once with tracking on into a
SQLite store; the tests read: one parent run per pipeline run holding every param under its
dotted name and the datasets with digests; every stage run nested under it with its own
sections; the two model runs with the same headline metric names and the same artifact names;
MLflow's own git source tags; a classic ML experiment. The helpers (params flattening, headline
metrics, dirtiness, the two roots) are tested on their own below.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acrb import tracking
from tests.conftest import update_params, write_params

MODELS = ("synthetic-fair", "synthetic-biased")
#: The tiniest params that still give every i2i outcome: two categories, one seed.
SMALL = {"prompts": {"categories": ["A", "B"], "synthesis": None},
         "plan": {"seeds": [0]},
         "analyze": {"bootstrap": 100, "permutations": 100},
         "judge": {"use": ["sim-judge-a"]}}
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


def tracked_project(root: Path, models: tuple[str, ...] = MODELS) -> Path:
    """A tiny committed project with the simulated editors ``models`` (runs nothing)."""
    root.mkdir(parents=True)
    (root / "dvc.yaml").write_text("stages: {}\n")
    write_params(root, SMALL)
    update_params(root, lambda p: p.update(models={m: p["models"][m] for m in models}))
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "init")
    return root


def run_tracked_stages(root: Path, models: tuple[str, ...] = MODELS) -> None:
    """sources, prompts, plan, then generate, evaluate and judge per model, then analyze: the
    functions each `acrb` stage command calls, with tracking on, in ``root``."""
    from acrb.stages import analyze, evaluate, generate, judge, plan, prompts, sources
    from acrb.stages.context import StageContext

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "1")
        patch.chdir(root)
        ctx = StageContext.load(root / "params.yaml", root)
        for stage in (sources, prompts, plan):
            stage.run(ctx)
        for model in models:
            generate.run(ctx, model)
            evaluate.run(ctx, model)
            judge.run(ctx, model)
        analyze.run(ctx)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, Path]]:
    """(client, experiment id, project root) after one tracked run of the tiny pipeline."""
    import mlflow

    root = tracked_project(tmp_path_factory.mktemp("tracked") / "project")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the project's own store
        patch.delenv("ACRB_PIPELINE_RUN", raising=False)
        for name in ("DVC_EXP_NAME", "DVC_EXP_BASELINE_REV"):
            patch.delenv(name, raising=False)
        run_tracked_stages(root)
        mlflow.set_tracking_uri(uri)
        client = mlflow.MlflowClient(uri)
        experiment = client.get_experiment_by_name("acrb/embedded-default")
        yield client, experiment.experiment_id, root


def _runs(client: Any, experiment_id: str) -> list[Any]:
    return list(client.search_runs([experiment_id], max_results=1000))


def _by_name(runs: list[Any]) -> dict[str, Any]:
    return {r.info.run_name: r for r in runs}


@pytest.mark.slow  # one tracked tiny pipeline: ~60 s of CPU
def test_one_parent_holds_every_param_and_the_stage_runs_nest_under_it(store) -> None:
    client, experiment_id, root = store
    runs = _runs(client, experiment_id)
    parents = [r for r in runs if r.data.tags.get("acrb.stage") == tracking.PARENT_STAGE]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert tracking.PIPELINE_TAG in parent.data.tags
    children = [r for r in runs if r is not parent]
    names = {r.info.run_name for r in children}
    assert {"sources", "prompts", "plan", "analyze-compare",
            *(f"{s}/{m}" for s in ("generate", "evaluate", "judge", "analyze") for m in MODELS)
            } <= names
    assert all(r.data.tags.get("mlflow.parentRunId") == parent.info.run_id for r in children)

    # Every param of params.yaml, under its dotted name, as the validated params give it.
    from acrb.config import load_params

    params, _ = load_params(root / "params.yaml")
    logged = parent.data.params
    assert logged == {tracking.mlflow_name(k): v for k, v in tracking.params_of(params).items()}
    assert logged["analyze.confidence"] == "0.95"
    assert logged["sources.seed"] == str(params.sources.seed)
    assert logged["plan.seeds"] == "[0]"
    assert logged["prompts.categories"] == '["A", "B"]'
    planted = [k for k in logged if k.startswith("models.synthetic-biased.config.")]
    assert planted, sorted(logged)[:20]
    assert logged["prompts.synthesis"] == "null"

    # A stage run holds its own sections under the same names, and not the others'.
    by_name = _by_name(children)
    analyze = by_name["analyze/synthetic-fair"].data.params
    assert analyze["analyze.confidence"] == "0.95"
    assert not any(k.startswith("sources.") for k in analyze)
    assert any(k.startswith("models.synthetic-fair.") for k in analyze)
    assert not any(k.startswith("models.synthetic-biased.") for k in analyze)
    assert by_name["sources"].data.params["sources.seed"] == logged["sources.seed"]


@pytest.mark.slow  # one tracked tiny pipeline: ~60 s of CPU
def test_the_datasets_are_inputs_with_digests(store) -> None:
    client, experiment_id, root = store
    runs = _by_name(_runs(client, experiment_id))
    parent = next(r for n, r in runs.items() if n.startswith("pipeline"))

    def inputs(run: Any) -> dict[str, tuple[str, str]]:
        found = {}
        for item in run.inputs.dataset_inputs:
            context = {t.key: t.value for t in item.tags}["mlflow.data.context"]
            found[context] = (item.dataset.name, item.dataset.digest)
        return found

    on_parent = inputs(parent)
    assert set(on_parent) == {"sources", "prompts", "plan"}
    assert all(name == context and digest for context, (name, digest) in on_parent.items())
    assert inputs(runs["plan"]) == {"plan": on_parent["plan"]}
    assert inputs(runs["analyze/synthetic-biased"]) == {"plan": on_parent["plan"]}
    assert inputs(runs["sources"]) == {"sources": on_parent["sources"]}
    # The digest is of the rows: the same table gives the same digest.
    from acrb import layout

    again = tracking.table_dataset(root / layout.PLAN_TABLE, "plan")
    assert again.digest == on_parent["plan"][1]


@pytest.mark.slow  # one tracked tiny pipeline: ~60 s of CPU
def test_two_models_have_the_same_headline_metrics_and_artifact_names(store) -> None:
    client, experiment_id, _ = store
    runs = _by_name(_runs(client, experiment_id))
    fair, biased = runs["analyze/synthetic-fair"], runs["analyze/synthetic-biased"]
    expected = {f"delta_{o}{s}" for o in ("refusal", "erasure", "lightening")
                for s in ("", ".ci_low", ".ci_high")}
    expected |= {f"flagged.{o}" for o in ("refusal", "erasure", "lightening")}
    expected |= {"requests.total", "requests.error", "requests.missing"}
    assert set(fair.data.metrics) == set(biased.data.metrics) == expected
    for run in (fair, biased):
        m = run.data.metrics
        assert m["delta_refusal.ci_low"] <= m["delta_refusal"] <= m["delta_refusal.ci_high"]
    # The planted biased editor refuses more unequally than the fair one.
    assert biased.data.metrics["delta_refusal"] > fair.data.metrics["delta_refusal"]

    def artifacts(run: Any, folder: str | None = None) -> set[str]:
        out: set[str] = set()
        for item in client.list_artifacts(run.info.run_id, folder):
            out |= artifacts(run, item.path) if item.is_dir else {item.path}
        return out

    names = artifacts(fair)
    assert names == artifacts(biased)
    assert {"metrics.csv", "tables/disparities.csv", "tables/rates.csv",
            "figures/hard_refusal-race.png"} <= names
    assert not any(n.endswith(".parquet") for n in names)
    assert not any("synthetic" in n for n in names)
    # Every metric the analysis computed is in metrics.csv (the per-cell ones too).
    import pandas as pd

    path = client.download_artifacts(biased.info.run_id, "metrics.csv")
    table = pd.read_csv(path)
    assert "delta_refusal.race" in set(table["metric"]) and len(table) > 100
    row = table[table["metric"] == "delta_refusal"]["value"].iloc[0]
    assert row == pytest.approx(biased.data.metrics["delta_refusal"])


@pytest.mark.slow  # one tracked tiny pipeline: ~60 s of CPU
def test_the_parent_run_compares_the_models_and_the_address_opens_it(store) -> None:
    """The parent holds each model's headline as ``<model>.<name>``, the values its analyze
    run logged; the experiment's shared view shows the Δ columns, models in params order,
    and the printed address opens it. metrics/headline.json holds the same Δ, rounded."""
    import json

    client, experiment_id, root = store
    runs = _by_name(_runs(client, experiment_id))
    parent = next(r for n, r in runs.items() if n.startswith("pipeline"))
    for model in MODELS:
        logged = runs[f"analyze/{model}"].data.metrics
        assert {k: v for k, v in parent.data.metrics.items() if k.startswith(f"{model}.")} == {
            f"{model}.{name}": logged[name] for name in tracking.PARENT_HEADLINE}
    # Nothing else on the parent: its chart view shows the models' headline only.
    assert len(parent.data.metrics) == len(MODELS) * len(tracking.PARENT_HEADLINE)

    tags = client.get_experiment(experiment_id).tags
    state = json.loads(tags[tracking.SHARED_VIEW_TAG + tracking.RUNS_VIEW_KEY])
    order = [m for m in ("synthetic-fair", "synthetic-biased") if m in MODELS]  # params order
    assert state["selectedColumns"] == [f"metrics.`{m}.delta_{o}`"
                                        for o in tracking.HEADLINE_OUTCOMES for m in order]
    address, why = tracking.runs_address("embedded-default", start=root)
    assert why is None
    assert address == (f"{tracking.UI_ADDRESS}/#/experiments/{experiment_id}/runs"
                       f"?viewStateShareKey={tracking.RUNS_VIEW_KEY}")

    headline = json.loads((root / "metrics" / "headline.json").read_text())
    for model in MODELS:
        logged = runs[f"analyze/{model}"].data.metrics
        assert headline[model] == {f"d_{o}": round(logged[f"delta_{o}"], 4)
                                   for o in tracking.HEADLINE_OUTCOMES}


@pytest.mark.slow  # one tracked tiny pipeline: ~60 s of CPU
def test_source_tags_and_a_classic_experiment(store) -> None:
    client, experiment_id, root = store
    commit = _git(root, "rev-parse", "HEAD")
    for run in _runs(client, experiment_id):
        tags = run.data.tags
        assert tags["mlflow.source.git.commit"] == commit
        assert tags["mlflow.source.name"] == f"acrb {tags['acrb.stage']}"
        # dvc.lock, metrics/ and params.yaml are not code: the run wrote none of them here,
        # and the checkout is clean.
        assert tags["acrb.git_dirty"] == "false"
    experiment = client.get_experiment(experiment_id)
    assert experiment.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"


# ---- the pieces ---------------------------------------------------------------------------------


def test_flatten_params_walks_mappings_and_keeps_plain_lists_whole() -> None:
    tree = {"a": {"b": 1, "c": [1, 2], "d": None, "e": True, "f": {}},
            "g": [{"h": "x"}, {"h": "y"}], "i": "text"}
    assert tracking.flatten_params(tree) == {
        "a.b": "1", "a.c": "[1, 2]", "a.d": "null", "a.e": "true", "a.f": "{}",
        "g.0.h": "x", "g.1.h": "y", "i": "text"}


def test_param_values_are_cut_only_at_mlflows_limit() -> None:
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    assert tracking.MAX_PARAM_VALUE == MAX_PARAM_VAL_LENGTH
    long = "x" * (MAX_PARAM_VAL_LENGTH + 10)
    clean = tracking._clean_params({"k": long, "race.*.Black": 1})
    assert clean["k"] == long[:MAX_PARAM_VAL_LENGTH]
    assert clean["race._.Black"] == "1"


def test_headline_metrics_take_the_interval_of_the_largest_gap() -> None:
    metrics = {"delta_refusal": 0.3, "delta_refusal.race": 0.3,
               "delta_refusal.race.ci_low": 0.1, "delta_refusal.race.ci_high": 0.5,
               "delta_refusal.gender": 0.2, "delta_refusal.gender.ci_low": 0.0,
               "delta_refusal.gender.ci_high": 0.4, "delta_refusal.A.race": 0.3,
               "delta_refusal.A.race.ci_low": -1.0, "flagged.refusal": 2.0,
               "refusal_rate.race.Black": 0.4, "requests.total": 10.0}
    assert tracking.headline_metrics(metrics) == {
        "delta_refusal": 0.3, "delta_refusal.ci_low": 0.1, "delta_refusal.ci_high": 0.5,
        "flagged.refusal": 2.0, "requests.total": 10.0}
    # A model with its own pooled interval (text-to-image) keeps it.
    t2i = {"delta_refusal": 0.2, "delta_refusal.ci_low": 0.05, "delta_refusal.ci_high": 0.3}
    assert tracking.headline_metrics(t2i) == t2i


def test_the_parent_gets_each_models_headline_under_its_name() -> None:
    metrics = {"delta_refusal": 0.3, "delta_refusal.race": 0.3, "delta_refusal.race.ci_low": 0.1,
               "delta_refusal.race.ci_high": 0.5, "flagged.refusal": 2.0, "delta_erasure": 0.1,
               "requests.total": 10.0, "refusal_rate.race.Black": 0.4}
    assert tracking.parent_headline("synthetic-biased", metrics) == {
        "synthetic-biased.delta_refusal": 0.3, "synthetic-biased.delta_erasure": 0.1,
        "synthetic-biased.flagged.refusal": 2.0}
    # The view's columns: Δ refusal of every model first, then erasure, then lightening.
    names = ["b.delta_refusal", "b.flagged.refusal", "b.delta_erasure", "a.delta_refusal",
             "a.delta_lightening", "t2i.delta_refusal"]
    assert tracking.runs_view_columns(names) == [
        "b.delta_refusal", "a.delta_refusal", "t2i.delta_refusal", "b.delta_erasure",
        "a.delta_lightening"]


def test_the_shared_view_widens_the_columns_it_shows() -> None:
    state = tracking.runs_view_state(["synthetic-fair.delta_refusal", "x.delta_refusal"],
                                     ["synthetic-fair", "qwen-image-edit-2511"])
    ids = ["metrics.`synthetic-fair.delta_refusal`", "metrics.`x.delta_refusal`"]
    assert state["selectedColumns"] == ids
    assert state["columnOrder"] == ["attributes.`Run Name`", *ids]
    widths = state["columnWidths"]
    # Wider than the UI's 100 px for a metric, as wide as its name needs; the run name column
    # grows with the longest stage run name, `generate/qwen-image-edit-2511`.
    assert widths[ids[0]] > 200 > widths[ids[1]] > 100
    assert widths["attributes.`Run Name`"] > tracking.runs_view_state(
        [], ["synthetic-fair"])["columnWidths"]["attributes.`Run Name`"] >= 200


def test_the_address_before_any_run_is_the_experiments_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    listing = f"{tracking.UI_ADDRESS}/#/experiments?workflowType=machine_learning"
    address, why = tracking.runs_address("embedded-default", start=tmp_path)
    assert (address, "no MLflow store" in str(why)) == (listing, True)
    assert not (tmp_path / "mlflow.db").exists()  # looking never creates the store
    # A store without the profile's experiment; then one whose runs predate the shared view.
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    address, why = tracking.runs_address("embedded-default", "http://host:5001/", tmp_path)
    assert address == "http://host:5001/#/experiments?workflowType=machine_learning"
    assert "no experiment acrb/embedded-default" in str(why)
    experiment_id = client.create_experiment("acrb/embedded-default")
    address, why = tracking.runs_address("embedded-default", start=tmp_path)
    assert (address, why) == (f"{tracking.UI_ADDRESS}/#/experiments/{experiment_id}/runs", None)
    # A server's address is the UI's address too.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
    address, why = tracking.runs_address("embedded-default", start=tmp_path)
    assert address == "http://127.0.0.1:9/#/experiments?workflowType=machine_learning"
    assert "could not read the MLflow store" in str(why)


def test_dirty_ignores_what_the_pipeline_rewrites_but_not_code(tmp_path: Path) -> None:
    root = tmp_path / "p"
    (root / "src").mkdir(parents=True)
    (root / "metrics").mkdir()
    for name in ("dvc.yaml", "dvc.lock", "params.yaml", "src/code.py", "metrics/audit.json",
                 ".gitignore"):
        (root / name).write_text("one\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "init")
    state = tracking.git_state(root)
    assert state == {"git_commit": _git(root, "rev-parse", "HEAD"), "git_dirty": "false"}
    key = tracking.pipeline_key("h", root)
    for name in ("dvc.lock", "params.yaml", "metrics/audit.json", ".gitignore"):
        (root / name).write_text("two\n")
    assert tracking.git_state(root)["git_dirty"] == "false"
    assert tracking.pipeline_key("h", root) == key
    assert tracking.pipeline_key("other params", root) != key
    (root / "src/code.py").write_text("two\n")
    assert tracking.git_state(root)["git_dirty"] == "true"
    assert tracking.pipeline_key("h", root) != key


def test_pipeline_key_separates_dvc_experiments(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACRB_PIPELINE_RUN", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    plain = tracking.pipeline_key("h", tmp_path)
    monkeypatch.setenv("DVC_EXP_NAME", "ohmic-bawl")
    named = tracking.pipeline_key("h", tmp_path)
    assert named != plain
    monkeypatch.setenv("ACRB_PIPELINE_RUN", "ci-1234")
    assert tracking.pipeline_key("h", tmp_path) == "ci-1234"


def test_a_queued_experiment_reads_its_copy_and_logs_to_the_project(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "project"
    for copy in (root / ".dvc/tmp/exps/tmpabc123", root / ".dvc/tmp/exps/standalone/tmpxyz"):
        (copy / "data").mkdir(parents=True)
        (copy / "dvc.yaml").write_text("stages: {}\n")
        assert tracking.stage_root(copy / "data") == copy
        assert tracking.tracking_root(copy / "data") == root
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        assert tracking.tracking_uri(copy) == f"sqlite:///{root / 'mlflow.db'}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
        assert tracking.tracking_uri(copy) == "http://127.0.0.1:5000"
    (root / "dvc.yaml").write_text("stages: {}\n")
    assert tracking.stage_root(root) == tracking.tracking_root(root) == root


def test_stage_runs_in_one_process_log_to_their_own_stores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow exports the tracking URI it is given to the process environment, which
    tracking_uri() reads first; a stage run must put it back, or the next stage run in the
    process (another project, a test after it) would log to the first project's store."""
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("ACRB_MLFLOW", "1")
    roots = [tmp_path / "first", tmp_path / "second"]
    for root in roots:
        root.mkdir()
        (root / "dvc.yaml").write_text("stages: {}\n")
        monkeypatch.chdir(root)
        with tracking.stage_run("prompts", profile="default", params_hash=root.name):
            pass
        assert "MLFLOW_TRACKING_URI" not in os.environ
    for root in roots:
        client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
        runs = [run for experiment in client.search_experiments()
                for run in client.search_runs([experiment.experiment_id])]
        hashes = {run.data.tags.get("acrb.params_hash") for run in runs}
        assert hashes == {root.name}, (root, hashes)


def test_a_logged_tables_schema_is_inferred_from_its_first_rows(tmp_path: Path) -> None:
    """The schema from the first SCHEMA_ROWS rows is MLflow's own inference on those rows;
    the profile and the digest still cover every row."""
    import pandas as pd
    from mlflow.data.pandas_dataset import PandasDataset

    rows = tracking.SCHEMA_ROWS + 300
    frame = pd.DataFrame({"request_id": [f"r{i}" for i in range(rows)],
                          "seed": range(rows), "rate": [i / 7 for i in range(rows)]})
    path = tmp_path / "table.parquet"
    frame.to_parquet(path)
    dataset = tracking.table_dataset(path, "plan")
    expected = PandasDataset(frame.head(tracking.SCHEMA_ROWS), source=dataset.source).schema
    assert dataset.schema == expected
    assert dataset.profile == {"num_rows": rows, "num_elements": rows * 3}
    frame.loc[rows - 1, "request_id"] = "changed"
    frame.to_parquet(path)
    assert tracking.table_dataset(path, "plan").digest != dataset.digest
