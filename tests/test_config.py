from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from acrb.cli import app
from acrb.config import load_params
from acrb.errors import ConfigError
from tests.conftest import REPO, write_params


def test_committed_params_load() -> None:
    params, params_hash = load_params(REPO / "params.yaml")
    assert params.profile.simulation is True
    assert set(params.models) == {"synthetic-fair", "synthetic-biased"}
    assert len(params_hash) == 20


def test_params_hash_changes_with_any_value(project: Path) -> None:
    _, first = load_params(project / "params.yaml")
    write_params(project, {"analyze": {"confidence": 0.9}})
    _, second = load_params(project / "params.yaml")
    assert first != second


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
