"""The package's layers, read from its imports: the statistics never import what renders them,
the audited models and the instruments that measure them never import each other, and no
module imports itself round a loop.

Imports are read from the source (``ast``): those at module level, including the ones under
``if TYPE_CHECKING:``, which tie modules together for the type checker as much as at run time.
An import inside a function is a deliberate deferral (a heavy library, or a module that is only
needed when a rarely used path runs) and is not counted as a loop.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

SRC = REPO / "src"
#: The analysis subpackages that compute; ``acrb.analysis.outputs`` only assembles and renders.
STATISTICS = ("acrb.analysis.estimation", "acrb.analysis.tests", "acrb.analysis.agreement",
              "acrb.analysis.experiments")
OUTPUTS = "acrb.analysis.outputs"
#: The audited models, and the instruments that measure them: a simulated model plants its
#: effects from its own knowledge, and a detector or judge reads pixels and text, never a
#: model's code (or a planted value through it).
MODELS = "acrb.models"
INSTRUMENTS = ("acrb.detect", "acrb.judges")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted((SRC / "acrb").rglob("*.py"))}


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        if isinstance(node, ast.If | ast.Try):
            handlers = [s for h in getattr(node, "handlers", []) for s in h.body]
            yield from _module_level([*node.body, *node.orelse, *handlers,
                                      *getattr(node, "finalbody", [])])
        else:
            yield node


def _resolve(name: str) -> str | None:
    """The acrb module ``name`` names, or the module that defines it (``a.b.f`` -> ``a.b``)."""
    known = modules()
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def imports(module: str, *, deferred: bool = False) -> frozenset[str]:
    """The acrb modules ``module`` imports: at module level, or (``deferred``) anywhere."""
    tree = ast.parse(modules()[module].read_text())
    nodes = ast.walk(tree) if deferred else _module_level(tree.body)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(t for n in names if n.startswith("acrb")
                     if (t := _resolve(n)) is not None and t != module)
    return frozenset(found)


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def crossings(sources: tuple[str, ...], targets: tuple[str, ...]) -> list[str]:
    """``importer -> imported`` for every import, at any depth in a module, from a module of
    ``sources`` to one of ``targets``."""
    return sorted(f"{module} -> {target}" for module in modules()
                  if any(_inside(module, s) for s in sources)
                  for target in imports(module, deferred=True)
                  if any(_inside(target, t) for t in targets))


def loops() -> list[list[str]]:
    """The strongly connected components (Tarjan) of more than one module in the graph of
    module-level imports: each is a loop of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in imports(node):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in modules():
        if node not in index:
            visit(node)
    return found


def test_the_statistics_never_import_what_renders_them() -> None:
    base = tuple(m for m in modules() if m.startswith("acrb.analysis.")
                 and m.count(".") == 2 and not _inside(m, OUTPUTS)
                 and not any(_inside(m, s) for s in STATISTICS))
    assert base, "no module found at the root of acrb.analysis"
    found = crossings((*STATISTICS, *base), (OUTPUTS,))
    assert not found, f"statistics importing outputs: {found}"


def test_models_and_the_instruments_that_measure_them_never_import_each_other() -> None:
    found = crossings((MODELS,), INSTRUMENTS) + crossings(INSTRUMENTS, (MODELS,))
    assert not found, f"models and instruments importing each other: {found}"


def test_no_module_imports_itself_round_a_loop() -> None:
    found = loops()
    assert not found, f"import loops: {found}"


@pytest.mark.parametrize("planted", ["rendering", "instrument", "loop"])
def test_each_rule_sees_a_planted_import(planted: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above read real imports: one planted import of each kind is found."""
    real = imports.__wrapped__

    def with_planted(module: str, *, deferred: bool = False) -> frozenset[str]:
        found = set(real(module, deferred=deferred))
        if planted == "rendering" and module == "acrb.analysis.estimation.rates":
            found.add("acrb.analysis.outputs.figures")
        if planted == "instrument" and module == "acrb.judges.simulated" and deferred:
            found.add("acrb.models.synthetic_edits")
        if planted == "loop" and module == "acrb.storage":
            found.add("acrb.config")  # config imports storage
        return frozenset(found)

    monkeypatch.setattr(__import__(__name__, fromlist=["imports"]), "imports", with_planted)
    if planted == "rendering":
        with pytest.raises(AssertionError, match=r"rates -> acrb\.analysis\.outputs\.figures"):
            test_the_statistics_never_import_what_renders_them()
    elif planted == "instrument":
        with pytest.raises(AssertionError, match=r"simulated -> acrb\.models\.synthetic_edits"):
            test_models_and_the_instruments_that_measure_them_never_import_each_other()
    else:
        with pytest.raises(AssertionError, match=r"acrb\.storage"):
            test_no_module_imports_itself_round_a_loop()
