from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from acrb.cli import app
from acrb.config import hashed_params, load_params
from acrb.errors import ConfigError
from tests.conftest import REPO, write_params


def test_committed_params_load() -> None:
    params, params_hash = load_params(REPO / "params.yaml")
    assert params.profile.simulation is True
    assert set(params.models) == {"synthetic-fair", "synthetic-biased", "synthetic-t2i"}
    assert len(params_hash) == 20


def test_params_hash_changes_with_any_value(project: Path) -> None:
    _, first = load_params(project / "params.yaml")
    write_params(project, {"analyze": {"confidence": 0.9}})
    _, second = load_params(project / "params.yaml")
    assert first != second


@pytest.mark.parametrize("change", [
    {"generate": {"runner": "ray"}},
    {"judge": {"runner": "ray"}},
    {"ray": {"address": "head:6379", "actors": 8, "gpus_per_actor": 0.5, "max_restarts": 9}},
    {"generate": {"runner": "ray"}, "judge": {"runner": "ray"}, "ray": {"cpus_per_actor": 4}},
])
def test_params_hash_leaves_out_where_the_model_calls_run(project: Path,
                                                         change: dict[str, Any]) -> None:
    """The runner and the Ray cluster change no record, so not the hash the tables, report
    and MLflow runs name; everything beside them in the same sections still does."""
    _, first = load_params(project / "params.yaml")
    raw = yaml.safe_load((project / "params.yaml").read_text())
    write_params(project, change)
    _, second = load_params(project / "params.yaml")
    assert first == second
    assert yaml.safe_load((project / "params.yaml").read_text()) != raw
    for other in ({"generate": {"batch_size": 3}}, {"judge": {"batch_size": 3}},
                  {"generate": {"retry_errors": False}}):
        write_params(project, {**change, **other})
        assert load_params(project / "params.yaml")[1] != first, other


def test_hashed_params_leaves_the_params_it_is_given_as_they_were() -> None:
    raw = {"generate": {"runner": "ray", "batch_size": 2}, "ray": {"actors": 2},
           "judge": "not a mapping", "models": {"m": {}}}
    before = json.loads(json.dumps(raw))
    assert hashed_params(raw) == {"generate": {"batch_size": 2}, "judge": "not a mapping",
                                  "models": {"m": {}}}
    assert raw == before


def test_unknown_model_key_lists_valid_keys(project: Path) -> None:
    write_params(project, {"models": {"synthetic-fair": {"key": "flux-not-registered"}}})
    with pytest.raises(ConfigError) as err:
        load_params(project / "params.yaml")
    message = str(err.value)
    assert "flux-not-registered" in message
    assert "synthetic:fair" in message and "synthetic:biased" in message


def test_wrong_param_type_names_the_key(project: Path) -> None:
    write_params(project, {"plan": {"seeds": ["zero"]}})
    with pytest.raises(ConfigError) as err:
        load_params(project / "params.yaml")
    assert "plan.seeds.0" in str(err.value)
    assert "'zero'" in str(err.value)


def test_bad_hypothesis_names_the_key(project: Path) -> None:
    write_params(project, {"analyze": {"hypotheses": {
        "H7": {"claim": "x", "test": "vibes", "category": "B"}}}})
    with pytest.raises(ConfigError) as err:
        load_params(project / "params.yaml")
    assert "analyze.hypotheses.H7.test" in str(err.value)
    assert "equivalence" in str(err.value)  # the valid tests are listed


def test_unknown_key_is_rejected(project: Path) -> None:
    write_params(project, {"analyze": {"confidnce": 0.9}})
    with pytest.raises(ConfigError, match=r"analyze\.confidnce"):
        load_params(project / "params.yaml")


def test_bad_planted_group_in_model_config(project: Path) -> None:
    write_params(project, {"models": {"synthetic-biased": {"config": {
        "refusal": {"race": {"C": {"Martian": 0.2}}}}}}})
    # Loading params checks model keys only; the adapter's typed config is checked where
    # models are used, starting with `plan`.
    params, _ = load_params(project / "params.yaml")
    with pytest.raises(ConfigError) as err:
        params.check_model_configs()
    assert "models.synthetic-biased.config.refusal" in str(err.value)
    assert "Martian" in str(err.value)
    assert str(project / "params.yaml") in str(err.value)


def test_invalid_yaml(project: Path) -> None:
    (project / "params.yaml").write_text("plan: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(project / "params.yaml")


def test_cli_reports_config_error_without_traceback(project: Path) -> None:
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["models"]["synthetic-fair"]["key"] = "nope:model"
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["plan"])
    assert result.exit_code == 2
    assert "unknown model key 'nope:model'" in result.output
    assert "fix:" in result.output
    assert "Traceback" not in result.output


def test_cli_unknown_model_entry(project: Path) -> None:
    result = CliRunner().invoke(app, ["generate", "--model", "nobody"])
    assert result.exit_code == 2
    assert "no model entry 'nobody'" in result.output
    assert "synthetic-biased" in result.output


def test_every_stage_has_help() -> None:
    runner = CliRunner()
    for stage in ("sources", "prompts", "plan", "generate", "evaluate", "analyze", "report"):
        result = runner.invoke(app, [stage, "--help"])
        assert result.exit_code == 0, result.output
        assert "writes" in result.output.lower()


def test_unknown_chat_backend_kind_names_the_key(project: Path) -> None:
    write_params(project, {"prompts": {"synthesis": {"backend": "mine", "backends": {
        "mine": {"kind": "claude-web", "model": "m"}}}}})
    with pytest.raises(ConfigError) as err:
        load_params(project / "params.yaml")
    message = str(err.value)
    assert "prompts.synthesis.backends.mine.kind" in message
    assert "unknown chat backend kind 'claude-web'" in message
    assert "gemini, openai, transformers" in message


def test_bad_model_config_fails_at_plan_with_the_key_named(project: Path) -> None:
    from acrb.stages import plan
    from acrb.stages.context import StageContext

    write_params(project, {"models": {"synthetic-fair": {"config": {"refusl": {}}}}})
    ctx = StageContext.load(project / "params.yaml", project)  # keys alone are fine
    # No sources or prompts exist yet: the check comes before the stage reads anything.
    with pytest.raises(ConfigError) as err:
        plan.run(ctx)
    assert "models.synthetic-fair.config.refusl" in str(err.value)
    assert "Extra inputs are not permitted" in str(err.value)
    result = CliRunner().invoke(app, ["plan"])
    assert result.exit_code == 2
    assert "models.synthetic-fair.config.refusl" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("stage", ["generate", "analyze"])
def test_bad_model_config_fails_in_other_model_stages_with_the_key_named(
        project: Path, stage: str) -> None:
    # Run by hand after params changed (without re-planning), generate and analyze build the
    # adapter from its typed config: the error names the key, as at plan time.
    write_params(project, {"models": {"synthetic-fair": {"config": {"refusl": {}}}}})
    args = [stage, "--model", "synthetic-fair"] if stage == "generate" else [stage]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "models.synthetic-fair.config.refusl" in result.output
    assert "Traceback" not in result.output


# A stage that uses no model must not import any adapter, nor torch: run in a fresh interpreter,
# with an editor whose module raises if it is ever imported.
_IMPORT_PROBE = """
import json, sys
from pathlib import Path

from typer.testing import CliRunner

from acrb.registry import EDITORS

EDITORS.register("loud:editor", "acrb_test_loud_adapter:LoudEditor")

from acrb.cli import app

runner = CliRunner()
results = {name: runner.invoke(app, [name]) for name in ("sources", "prompts", "report")}
print(json.dumps({
    "exit": {name: r.exit_code for name, r in results.items()},
    "output": {name: r.output for name, r in results.items()},
    "imported": sorted(m for m in sys.modules
                       if m.split(".")[0] in ("torch", "transformers", "diffusers",
                                              "acrb_test_loud_adapter")
                       or m.startswith("acrb.models.synthetic")
                       or m.startswith("acrb.clients")),
}))
"""


def test_stages_without_models_import_no_adapter(project: Path, tmp_path: Path) -> None:
    adapters = tmp_path / "adapters"
    adapters.mkdir()
    (adapters / "acrb_test_loud_adapter.py").write_text(
        'raise RuntimeError("the adapter module was imported")\n')
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["models"] = {"loud": {"key": "loud:editor", "config": {"no_such_option": 1}}}
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {**os.environ, "ACRB_MLFLOW": "0",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(adapters),
                                          os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", _IMPORT_PROBE], cwd=project, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["exit"]["sources"] == 0, probe["output"]["sources"]
    assert probe["exit"]["prompts"] == 0, probe["output"]["prompts"]
    assert (project / "data" / "sources" / "sources.parquet").exists()
    # The report needs the analysis, which does not exist: it stops and says so, having read
    # params and imported its code.
    assert probe["exit"]["report"] == 2
    assert "acrb analyze" in probe["output"]["report"]
    assert probe["imported"] == []
