"""The generic registry: lazy targets, entry points, dependency checks, and `acrb models`."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from abc import ABC, abstractmethod
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import acrb.registry
from acrb.cli import app
from acrb.errors import ConfigError
from acrb.models.base import Editor
from acrb.registry import CHAT_BACKENDS, EDITORS, Registry, RegistryEntry


class Scorer(ABC):
    """The base class of a kind that exists only in this test."""

    @abstractmethod
    def score(self, text: str) -> float: ...


class LengthScorer(Scorer):
    def score(self, text: str) -> float:
        return float(len(text))


class NotAScorer:
    pass


HERE = "tests.test_registry"


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for adapter modules written by a test; they are unloaded after."""
    folder = tmp_path / "adapters"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.startswith("acrb_test_"):
            del sys.modules[name]


def write_module(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    importlib.invalidate_caches()


EDITOR_MODULE = """
    from acrb.models.base import Editor

    class TestEditor(Editor):
        def edit(self, requests):
            return []
"""


@pytest.fixture
def scorers() -> Registry[Scorer]:
    return Registry("scorer", f"{HERE}:Scorer", "acrb.test_scorers",
                    [RegistryEntry("length", f"{HERE}:LengthScorer", description="text length")])


def no_entry_points(monkeypatch: pytest.MonkeyPatch, *points: EntryPoint) -> None:
    def fake(*, group: str) -> list[EntryPoint]:
        return [p for p in points if p.group == group]

    monkeypatch.setattr(acrb.registry, "entry_points", fake)


# ---- a kind defined here: the type is generic -----------------------------------------------


def test_registry_of_a_kind_defined_in_the_test(scorers: Registry[Scorer]) -> None:
    scorer_class = scorers.load("length")
    assert scorer_class is LengthScorer
    assert scorer_class().score("four") == 4.0
    assert scorers.base_class() is Scorer
    assert scorers.keys() == ["length"]
    assert scorers.entry("length").description == "text length"
    with pytest.raises(ConfigError) as err:
        scorers.check("bleu")
    assert err.value.problem == "unknown scorer key 'bleu'"
    assert "length" in (err.value.fix or "") and "acrb.test_scorers" in (err.value.fix or "")


def test_the_instances_list_their_builtins() -> None:
    assert {"synthetic:fair", "synthetic:biased"} <= set(EDITORS.keys())
    assert {"openai", "gemini", "transformers"} <= set(CHAT_BACKENDS.keys())
    local = CHAT_BACKENDS.entry("transformers")
    assert (local.extra, local.requires) == ("llm-local", ("torch", "transformers"))
    assert EDITORS.load("synthetic:biased").__name__ == "SyntheticEditor"
    assert issubclass(EDITORS.load("synthetic:biased"), Editor)
    assert EDITORS.group == "acrb.editors" and CHAT_BACKENDS.group == "acrb.chat_backends"


# ---- lazy imports ------------------------------------------------------------------------------


def test_targets_are_imported_only_on_load(modules: Path, scorers: Registry[Scorer]) -> None:
    write_module(modules, "acrb_test_lazy", """
        from tests.test_registry import Scorer

        class VowelScorer(Scorer):
            def score(self, text):
                return float(sum(c in "aeiou" for c in text))
    """)
    scorers.register("vowels", "acrb_test_lazy:VowelScorer", description="vowel count")
    assert "vowels" in scorers and "bleu" not in scorers
    scorers.check("vowels")
    assert scorers.is_available("vowels")
    assert [e.key for e in scorers.entries()] == ["length", "vowels"]
    assert "acrb_test_lazy" not in sys.modules
    scorer_class = scorers.load("vowels")
    assert "acrb_test_lazy" in sys.modules
    assert scorer_class().score("audit") == 3.0


def test_unknown_key_lists_the_valid_keys() -> None:
    with pytest.raises(ConfigError) as err:
        EDITORS.load("flux-not-registered")
    assert err.value.problem == "unknown model key 'flux-not-registered'"
    assert "synthetic:biased, synthetic:fair" in (err.value.fix or "")
    with pytest.raises(ConfigError, match="unknown chat backend kind 'claude-web'") as err:
        CHAT_BACKENDS.check("claude-web")
    assert "gemini, openai, transformers" in (err.value.fix or "")


def test_register_checks_the_target_shape(scorers: Registry[Scorer]) -> None:
    for bad in ("no_colon", "module:", ":Class", "a b:C"):
        with pytest.raises(ValueError, match="module:Class"):
            scorers.register("x", bad)
    with pytest.raises(ValueError):
        scorers.register("", f"{HERE}:LengthScorer")


# ---- entry points ------------------------------------------------------------------------------


def test_entry_points_are_discovered(monkeypatch: pytest.MonkeyPatch, modules: Path) -> None:
    write_module(modules, "acrb_test_plugin", EDITOR_MODULE)
    no_entry_points(
        monkeypatch,
        EntryPoint("plugin:editor", "acrb_test_plugin:TestEditor [diffusers]", "acrb.editors"),
        # An entry point cannot shadow a built-in.
        EntryPoint("synthetic:fair", "acrb_test_plugin:TestEditor", "acrb.editors"),
        EntryPoint("other:group", "acrb_test_plugin:TestEditor", "acrb.judges"),
    )
    entries = {e.key: e for e in EDITORS.entries()}
    builtins = {key for key, e in entries.items() if e.origin == "built-in"}
    assert {"synthetic:fair", "synthetic:biased"} <= builtins
    assert set(entries) == builtins | {"plugin:editor"}
    plugin = entries["plugin:editor"]
    assert (plugin.target, plugin.extra, plugin.origin) == (
        "acrb_test_plugin:TestEditor", "diffusers", "entry point")
    assert entries["synthetic:fair"].origin == "built-in"
    assert EDITORS.load("synthetic:fair").__name__ == "SyntheticEditor"
    assert "acrb_test_plugin" not in sys.modules
    assert EDITORS.load("plugin:editor").__name__ == "TestEditor"


def test_registered_entries_override_and_can_be_removed(scorers: Registry[Scorer]) -> None:
    scorers.register("length", f"{HERE}:LengthScorer", description="replaced")
    assert scorers.entry("length").origin == "registered"
    scorers.unregister("length")
    assert scorers.entry("length").origin == "built-in"


# ---- dependency checks -------------------------------------------------------------------------


def test_missing_required_module_names_the_extra(scorers: Registry[Scorer]) -> None:
    scorers.register("heavy", f"{HERE}:LengthScorer", extra="llm-local",
                     requires=("acrb_test_not_installed_xyz",))
    assert scorers.missing_modules("heavy") == ["acrb_test_not_installed_xyz"]
    assert not scorers.is_available("heavy")
    with pytest.raises(ConfigError) as err:
        scorers.load("heavy")
    assert "acrb_test_not_installed_xyz" in err.value.problem
    assert "not installed" in err.value.problem
    assert err.value.fix == 'pip install -e ".[llm-local]"'


def test_transformers_backend_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def without_torch(name: str, *args: Any) -> Any:
        return None if name == "torch" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_torch)
    assert not CHAT_BACKENDS.is_available("transformers")
    assert CHAT_BACKENDS.is_available("openai")
    with pytest.raises(ConfigError) as err:
        CHAT_BACKENDS.load("transformers")
    assert err.value.problem.startswith("chat backend 'transformers'")
    assert "needs torch, which is not installed" in err.value.problem
    assert err.value.fix == 'pip install -e ".[llm-local]"'


def test_third_party_import_error_in_the_target(modules: Path,
                                                scorers: Registry[Scorer]) -> None:
    write_module(modules, "acrb_test_needs_dep", """
        import acrb_test_missing_dependency  # an optional dependency that is not installed
    """)
    scorers.register("needs-dep", "acrb_test_needs_dep:Anything", extra="diffusers")
    # Not required up front, so only the import finds out; it is reported the same way.
    assert scorers.is_available("needs-dep")
    with pytest.raises(ConfigError) as err:
        scorers.load("needs-dep")
    assert "'acrb_test_missing_dependency' is not installed" in err.value.problem
    assert err.value.fix == 'pip install -e ".[diffusers]"'
    # Without an extra, the fix names the module to install.
    scorers.register("needs-dep", "acrb_test_needs_dep:Anything")
    with pytest.raises(ConfigError) as err:
        scorers.load("needs-dep")
    assert "acrb_test_missing_dependency" in (err.value.fix or "")


def test_broken_targets_are_config_errors(modules: Path, scorers: Registry[Scorer]) -> None:
    scorers.register("no-module", "acrb_test_no_such_module:Scorer")
    assert not scorers.is_available("no-module")
    with pytest.raises(ConfigError, match="acrb_test_no_such_module"):
        scorers.load("no-module")
    scorers.register("no-class", f"{HERE}:NoSuchScorer")
    with pytest.raises(ConfigError, match="has no attribute 'NoSuchScorer'"):
        scorers.load("no-class")


def test_a_target_that_is_not_a_subclass_is_refused(scorers: Registry[Scorer]) -> None:
    for target in (f"{HERE}:NotAScorer", f"{HERE}:HERE"):
        scorers.register("impostor", target)
        with pytest.raises(ConfigError) as err:
            scorers.load("impostor")
        assert target in err.value.problem
        assert f"not a subclass of {HERE}:Scorer" in err.value.problem
    # The same class under the editor registry is refused too: the base is the editors'.
    EDITORS.register("acrb-test:scorer", f"{HERE}:LengthScorer")
    try:
        with pytest.raises(ConfigError, match=r"acrb\.models\.base:Editor"):
            EDITORS.load("acrb-test:scorer")
    finally:
        EDITORS.unregister("acrb-test:scorer")


# ---- acrb models -------------------------------------------------------------------------------


def test_cli_lists_every_kind_with_extra_and_availability(modules: Path) -> None:
    write_module(modules, "acrb_test_cli_editor", EDITOR_MODULE)
    EDITORS.register("acrb-test:needs-extra", "acrb_test_cli_editor:TestEditor",
                     extra="diffusers", requires=("acrb_test_not_installed_xyz",))
    try:
        result = CliRunner().invoke(app, ["models"])
    finally:
        EDITORS.unregister("acrb-test:needs-extra")
    assert result.exit_code == 0, result.output
    rows = {tuple(line.split()[:4]): line for line in result.output.splitlines()[1:] if line}
    assert ("editor", "synthetic:biased", "acrb.models.synthetic:SyntheticEditor", "-") in rows
    assert ("chat", "backend", "openai", "acrb.clients.openai:OpenAIChatClient") in rows
    needs = next(line for line in rows.values() if "acrb-test:needs-extra" in line)
    assert "diffusers" in needs and "no (needs acrb_test_not_installed_xyz)" in needs
    synthetic = next(line for line in rows.values() if "synthetic:fair" in line)
    assert synthetic.rstrip().endswith("yes")
    assert "acrb.editors" in result.output and "acrb.chat_backends" in result.output
    # Listing imports no target.
    assert "acrb_test_cli_editor" not in sys.modules
