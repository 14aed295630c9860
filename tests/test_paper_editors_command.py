"""The command of docs/models.md for the study's three editors is one a user can run: its `-S`
overrides, applied to params.yaml as `dvc exp run` applies them (Hydra's override grammar,
through DVC's own function), give valid params whose models are the three editors, each config
accepted by its adapter and Step1X sent to its own environment."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

from dvc.utils.hydra import apply_overrides

from acrb.config import load_params
from acrb.registry import model_registry
from tests.conftest import REPO

MARKER = "<!-- paper-editors:"


def paper_command() -> str:
    """The `dvc exp run` command of docs/models.md's fenced block after the paper-editors marker,
    continuation lines joined."""
    readme = (REPO / "docs" / "models.md").read_text()
    after = readme[readme.index(MARKER):]
    block = re.search(r"```bash\n(.*?)```", after, re.S)
    assert block, "no bash block after the paper-editors marker in docs/models.md"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    (command,) = [line.strip() for line in lines if line.strip().startswith("dvc exp run")]
    return command


def overrides(command: str, variables: dict[str, str]) -> list[str]:
    for name, value in variables.items():
        command = command.replace(f"${name}", value)
    words = shlex.split(command)
    return [words[i + 1] for i, word in enumerate(words) if word == "-S"]


def test_the_paper_command_gives_the_three_editors(tmp_path: Path) -> None:
    revisions = {"QWEN_REV": "1" * 40, "FLUX2_REV": "2" * 40, "STEP1X_REV": "3" * 40}
    readme = (REPO / "docs" / "models.md").read_text()
    for variable in revisions:
        assert f"{variable}=$(rev " in readme, variable
    params = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", params)

    apply_overrides(params, overrides(paper_command(), revisions))

    loaded, _ = load_params(params)
    assert set(loaded.models) == {"qwen-image-edit-2511", "flux2-dev", "step1x-edit-v1p2"}
    keys = {name: entry.key for name, entry in loaded.models.items()}
    assert keys == {"qwen-image-edit-2511": "qwen-image-edit", "flux2-dev": "flux2-dev:edit",
                    "step1x-edit-v1p2": "step1x-edit-v1p2"}
    assert all(model_registry(key).kind == "editor" for key in keys.values())
    assert [loaded.models[name].revision for name in sorted(loaded.models)] == \
        ["2" * 40, "1" * 40, "3" * 40]
    assert loaded.models["step1x-edit-v1p2"].python == ".venv-step1x/bin/python"
    assert loaded.models["flux2-dev"].typed_config().cpu_offload == "model"  # type: ignore[attr-defined]
    loaded.check_model_configs()  # every config is one its adapter accepts
    assert loaded.profile.name == "paper-editors" and loaded.profile.simulation is False
