"""What each DVC stage really uses, set against what `dvc.yaml` declares.

A dependency missing from `dvc.yaml` is a silent stale result: change the file and `dvc repro`
keeps the old output. Two sources of truth are compared with the declarations:

- **code**: the modules a stage imports, transitively inside `acrb`, read statically from the
  source (imports inside functions count, since they run when the stage does; imports under
  ``if TYPE_CHECKING:`` do not);
- **data**: the files a stage opens (Python's ``open`` audit events, directory listings and
  Parquet reads, which pyarrow does natively), traced while the stage runs in process.

A used path is covered when a declared dependency is that path or a folder above it. The CLI
module (``acrb/cli.py``) is left out on purpose: it parses arguments and prints, and counting
it would re-run the whole pipeline for a help-text change.
"""

from __future__ import annotations

import ast
import functools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from acrb.timings import TIMINGS_DIR

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PACKAGE = "acrb"
#: Modules every stage reaches that are not stage code (see the module docstring).
NOT_STAGE_CODE = frozenset({"acrb.cli", "acrb.__main__"})


@dataclass(frozen=True)
class Stage:
    """One stage of dvc.yaml, a ``foreach`` stage expanded for one item."""

    name: str
    command: str
    deps: tuple[str, ...]
    outs: tuple[str, ...]

    @property
    def module(self) -> str:
        """The stage module the `acrb <command>` runs."""
        return f"{PACKAGE}.stages.{self.command}"


def _out_paths(items: Iterable[Any]) -> list[str]:
    paths = []
    for item in items or []:
        paths.extend(item if isinstance(item, dict) else [item])
    return [str(p) for p in paths]


def stages(dvc: Mapping[str, Any], models: Iterable[str]) -> dict[str, Stage]:
    """The stages of a parsed dvc.yaml, ``foreach: ${models}`` expanded over ``models``."""
    found: dict[str, Stage] = {}
    for name, spec in dvc["stages"].items():
        items: list[str | None] = [None]
        body = spec
        if "foreach" in spec:
            items, body = list(models), spec["do"]

        for item in items:
            def expand(text: str, item: str | None = item) -> str:
                return text if item is None else text.replace("${key}", item)

            command = expand(body["cmd"]).split()
            assert command[0] == "acrb", f"stage {name}: expected an `acrb` command"
            outs = [*_out_paths(body.get("outs")), *_out_paths(body.get("metrics")),
                    *_out_paths(body.get("plots"))]
            stage_name = name if item is None else f"{name}@{item}"
            found[stage_name] = Stage(
                name=stage_name, command=SUBCOMMAND_STAGES.get(tuple(command[1:3]),
                                                               command[1]),
                deps=tuple(expand(str(d)) for d in body.get("deps", [])),
                outs=tuple(expand(o) for o in outs),
            )
    return found


#: Stages run by a subcommand (`acrb review sample`): (command, subcommand) -> stage module.
SUBCOMMAND_STAGES: dict[tuple[str, ...], str] = {
    ("review", "sample"): "review_set",
    ("review", "analyze"): "review",
}


def load_stages(path: Path = REPO / "dvc.yaml",
                params: Path = REPO / "params.yaml") -> dict[str, Stage]:
    dvc = yaml.safe_load(path.read_text())
    return stages(dvc, yaml.safe_load(params.read_text())["models"])


# --- code: the static import closure -------------------------------------------------------

def module_path(module: str) -> Path | None:
    """The source file of an `acrb` module or package, if it exists."""
    base = SRC.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """All nodes, skipping the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


@functools.cache
def imported_modules(module: str) -> frozenset[str]:
    """The `acrb` modules that ``module`` imports at run time (one level); parsed once per
    session (every parametrised case of tests/test_dvc_deps.py walks the same sources)."""
    path = module_path(module)
    assert path is not None, f"no source for {module}"
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            found.add(base)
            # `from acrb.stages import generate` imports the submodule too.
            found.update(f"{base}.{alias.name}" for alias in node.names
                         if module_path(f"{base}.{alias.name}") is not None)
    return frozenset(m for m in found
                     if m.split(".")[0] == PACKAGE and module_path(m) is not None)


@functools.cache
def import_closure(module: str) -> frozenset[str]:
    """``module`` and every `acrb` module it reaches, with the packages that hold them."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        current = todo.pop()
        if current in seen or current in NOT_STAGE_CODE:
            continue
        seen.add(current)
        parts = current.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(imported_modules(current))
    return frozenset(seen)


def code_used(stage: Stage, loaded: Iterable[str] = ()) -> set[str]:
    """Repo-relative paths of the source files a stage runs: its import closure, and that of
    each module it ``loaded`` by name through the registry."""
    modules = set(import_closure(stage.module))
    for module in loaded:
        modules |= import_closure(module)
    paths = set()
    for module in modules:
        path = module_path(module)
        assert path is not None
        paths.add(path.relative_to(REPO).as_posix())
    return paths


# --- data: files opened while a stage runs ------------------------------------------------

@dataclass
class Trace:
    """Files a stage read and wrote (absolute, resolved)."""

    read: set[Path] = field(default_factory=set)
    written: set[Path] = field(default_factory=set)
    #: Modules loaded by name through the registry (invisible to the static import walk).
    loaded: set[str] = field(default_factory=set)


_active: list[Trace] = []
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _as_path(value: Any) -> Path | None:
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if isinstance(value, (str, os.PathLike)):
        return Path(os.path.abspath(os.fspath(value)))
    return None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _active:
        return
    trace = _active[-1]
    if event == "open":
        path = _as_path(args[0])
        if path is None:
            return
        mode, flags = args[1], args[2]
        writing = (any(c in mode for c in "wax+") if isinstance(mode, str)
                   else bool((flags or 0) & _WRITE_FLAGS))
        (trace.written if writing else trace.read).add(path)
    elif event in ("os.listdir", "os.scandir"):
        path = _as_path(args[0] if args and args[0] is not None else ".")
        if path is not None:
            trace.read.add(path)


sys.addaudithook(_audit)  # audit hooks cannot be removed; it does nothing unless tracing


def _wrap_reader(function: Callable[..., Any]) -> Callable[..., Any]:
    def traced(source: Any, *args: Any, **kwargs: Any) -> Any:
        path = _as_path(source)
        if _active and path is not None:
            _active[-1].read.add(path)
        return function(source, *args, **kwargs)

    return traced


def _wrap_writer(function: Callable[..., Any]) -> Callable[..., Any]:
    def traced(table: Any, where: Any, *args: Any, **kwargs: Any) -> Any:
        path = _as_path(where)
        if _active and path is not None:
            _active[-1].written.add(path)
        return function(table, where, *args, **kwargs)

    return traced


def _trace_registry_loads(monkeypatch: Any) -> None:
    """Record the module of every class the registry loads by its ``module:Class`` name."""
    from acrb.registry import Registry

    original = Registry.load
    if getattr(original, "traced", False):
        return

    def load(self: Any, key: str) -> Any:
        loaded = original(self, key)
        if _active:
            _active[-1].loaded.add(loaded.__module__)
        return loaded

    load.traced = True  # type: ignore[attr-defined]
    monkeypatch.setattr(Registry, "load", load)


@contextmanager
def tracing(monkeypatch: Any) -> Iterator[Trace]:
    """Record the files opened inside the block (pyarrow's native Parquet I/O included)."""
    import pyarrow.parquet as pq

    monkeypatch.setattr(pq, "read_table", _wrap_reader(pq.read_table))
    monkeypatch.setattr(pq, "read_schema", _wrap_reader(pq.read_schema))
    monkeypatch.setattr(pq, "write_table", _wrap_writer(pq.write_table))
    trace = Trace()
    _trace_registry_loads(monkeypatch)
    _active.append(trace)
    try:
        yield trace
    finally:
        _active.remove(trace)


# --- the comparison -------------------------------------------------------------------------

def covered(path: str, declared: Iterable[str]) -> bool:
    """Whether a repo- or project-relative path is a declared path or lies inside one."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in declared)


def data_used(trace: Trace, project: Path, stage: Stage) -> set[str]:
    """Project- and repo-relative paths a stage read, less its own outputs and bookkeeping.

    Paths under the project count as data; paths under ``src/`` of the repo count as code
    data (templates, data files shipped in the package). ``params.yaml`` is declared through
    ``params:``; ``dvc.yaml``, the MLflow store and caches are not inputs of a result.
    """
    used: set[str] = set()
    for path in trace.read:
        for root in (project, SRC):
            if path == root or not path.is_relative_to(root):
                continue
            relative = path.relative_to(root).as_posix()
            if root is SRC:
                # Source files are code, found by the import walk; a traced read of one is
                # the import system or a warning's source line, not data.
                if not relative.endswith((".py", ".pyc")):
                    used.add(f"src/{relative}")
            elif not (relative in ("params.yaml", "dvc.yaml", "mlflow.db")
                      or relative.startswith((".acrb-cache/", "mlflow.db"))
                      or covered(relative, stage.outs)):
                used.add(relative)
            break
    return {p for p in used if not p.endswith("/__pycache__") and "/__pycache__/" not in p
            and not p.endswith(".pyc")}


def missing(stage: Stage, used: Iterable[str]) -> list[str]:
    """Used paths that no declared dependency of ``stage`` covers."""
    return sorted(p for p in used if not covered(p, stage.deps))


def writes_outside_outs(stage: Stage, trace: Trace, project: Path) -> list[str]:
    """Files a stage wrote under the project that are not inside its declared outputs."""
    stray = []
    for path in trace.written:
        if not path.is_relative_to(project):
            continue
        relative = path.relative_to(project).as_posix()
        # The MLflow store, caches and the timing logs (acrb.timings) are bookkeeping beside
        # the pipeline, never a stage's output.
        if relative.startswith(("mlflow.db", ".acrb-cache/", f"{TIMINGS_DIR.as_posix()}/")) \
                or covered(relative, stage.outs):
            continue
        # An atomic write's temporary file sits beside the declared file it becomes.
        if path.name.startswith(".tmp-") and any(
                Path(out).parent.as_posix() == Path(relative).parent.as_posix()
                for out in stage.outs):
            continue
        stray.append(relative)
    return sorted(stray)
