"""Every command of the README and of docs/*.md is checked by the program it runs, so a renamed
option, a removed make target, a params key that no longer exists or an extra that was dropped
fails here instead of failing a reader (``tests/doc_commands.py`` reads the commands).

How each kind is checked (docs/testing.md, "Commands in the docs"):

- ``acrb``: the command and its options parsed by ACRB's own CLI (click, as typed); the ones
  that only read (``acrb models``, ``acrb --help``) are run.
- ``dvc``: parsed by DVC's own argument parser; ``dvc exp run -S`` overrides applied to the
  params file (or the profile a ``cp`` before it chose) as DVC applies them, and the result
  loaded and every model config checked; ``dvc repro <stage>`` names a stage of dvc.yaml,
  ``dvc metrics show <path>`` an output.
- ``make``: the target exists (``make -n``). ``pip install``: parsed by pip, every extra named
  exists in pyproject.toml. ``python``: a script's options are in its ``--help``, ``-c`` and
  heredoc code compiles, and the ``acrb`` names it imports exist; ``-m venv`` is importable.
- ``mlflow``, ``ray``, ``mutmut``: parsed by their own CLIs. ``export``: the variable is one
  ACRB or the library that reads it reads. ``cp``: its source exists. ``source``: the
  environment the Makefile makes.
- What cannot be run here is named with the reason: vLLM (its own environment, a GPU server),
  git, and the shell utilities of docs/step1x.md's record of how its fork was inspected.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import tomllib
import yaml

from tests.conftest import REPO
from tests.doc_commands import DOC_FILES, Command, doc_commands, unlabelled_fences

COMMANDS = doc_commands()
#: Programs the suite cannot run here, each with the reason.
NOT_RUN_HERE = {
    "vllm": "vLLM serves a model from its own environment on a GPU server (docs/judges.md)",
    "git": "git's own commands, on the reader's repository",
    "grep": "a shell utility: docs/step1x.md's record of how the fork was inspected",
    "ls": "a shell utility: docs/step1x.md's record of how the fork was inspected",
    "unzip": "a shell utility: docs/step1x.md's record of how the fork was inspected",
    "ldd": "a shell utility: docs/step1x.md's record of how the fork was inspected",
    "wc": "a shell utility: docs/step1x.md's record of how the fork was inspected",
    "echo": "a shell utility",
}
#: Environment variables read by a library ACRB drives, with a file of it that reads them.
LIBRARY_VARIABLES = {
    "AWS_ACCESS_KEY_ID": "botocore/credentials.py",
    "AWS_SECRET_ACCESS_KEY": "botocore/credentials.py",
    "MLFLOW_S3_ENDPOINT_URL": "mlflow/environment_variables.py",
    "MLFLOW_TRACKING_URI": "mlflow/environment_variables.py",
    "RAY_ADDRESS": "ray/_private/ray_constants.py",
}
SITE = Path(yaml.__file__).resolve().parents[1]


def _click_errors() -> tuple[tuple[type[Exception], ...], tuple[type[BaseException], ...]]:
    """(usage errors, exits of --help) of click and of the copy of it Typer ships."""
    import click

    usage: list[type[Exception]] = [click.UsageError]
    exits: list[type[BaseException]] = [click.exceptions.Exit]
    try:
        from typer._click import exceptions as typer_click
    except ImportError:
        pass
    else:
        usage.append(typer_click.UsageError)
        exits.extend(getattr(typer_click, n) for n in ("Exit",) if hasattr(typer_click, n))
    return tuple(usage), tuple(exits)


def _click_parse(group: object, words: list[str], where: str) -> str:
    """Descend ``group``'s subcommands along ``words`` and parse the rest with the leaf."""
    usage, exits = _click_errors()
    command = group
    path: list[str] = []
    while hasattr(command, "get_command") and words and not words[0].startswith("-"):
        context = type(command).context_class(command)  # type: ignore[attr-defined]
        sub = command.get_command(context, words[0])  # type: ignore[attr-defined]
        assert sub is not None, f"{where}: no command {' '.join([*path, words[0]])!r}"
        path.append(words[0])
        command, words = sub, words[1:]
    try:
        command.make_context(" ".join(path) or "cli", list(words))  # type: ignore[attr-defined]
    except exits:
        pass  # --help
    except usage as exc:
        raise AssertionError(f"{where}: {exc.format_message()}") from None
    return " ".join(path)


def check_acrb(command: Command) -> str:
    import typer

    from acrb.cli import app

    args = list(command.words[1:])
    leaf = _click_parse(typer.main.get_command(app), args, command.where)
    if args in (["models"], ["--help"]):
        run = subprocess.run([str(REPO / ".venv/bin/acrb"), *args], capture_output=True,
                             text=True, timeout=120, cwd=REPO)
        assert run.returncode == 0, f"{command.where}: {run.stderr}"
        return f"run: acrb {leaf}"
    return f"parsed: acrb {leaf}"


def _dvc_args(command: Command) -> object:
    from dvc.cli import parse_args

    try:
        return parse_args(list(command.words[1:]))
    except (SystemExit, Exception) as exc:
        raise AssertionError(f"{command.where}: dvc refuses {command.text!r} ({exc})") from None


def check_dvc(command: Command, tmp_path: Path) -> str:
    parsed = _dvc_args(command)
    words = list(command.words[1:])
    if words[:2] == ["exp", "run"] and "-S" in words:
        return _check_overrides(command, tmp_path)
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    if words[:1] == ["repro"]:
        for target in getattr(parsed, "targets", []) or []:
            assert target in stages, f"{command.where}: no stage {target!r} in dvc.yaml"
    if words[:2] == ["metrics", "show"]:
        outs = [str(o if isinstance(o, str) else next(iter(o)))
                for stage in stages.values() for kind in ("outs", "metrics", "plots")
                for o in stage.get(kind, []) or (stage.get("do") or {}).get(kind, [])]
        for target in getattr(parsed, "targets", []) or []:
            assert any(target.startswith(out) or out.startswith(target) for out in outs), \
                f"{command.where}: {target} is no stage's output"
    return f"parsed: dvc {' '.join(w for w in words[:2] if not w.startswith('-'))}"


def _check_overrides(command: Command, tmp_path: Path) -> str:
    from dvc.utils.hydra import apply_overrides

    from acrb.config import load_params

    words = list(command.words[1:])
    overrides = [words[i + 1] for i, word in enumerate(words) if word == "-S"]
    # Shell variables (pinned revisions the reader looks up) stand for 40-hex revisions.
    overrides = [re.sub(r"\$\{?\w+\}?", "0" * 40, o) for o in overrides]
    params = tmp_path / "params.yaml"
    params.write_text((REPO / command.params).read_text())
    apply_overrides(params, overrides)
    loaded, _ = load_params(params)
    loaded.check_model_configs()
    return f"applied to {command.params} and loaded: {len(overrides)} override(s)"


def check_make(command: Command) -> str:
    targets = [w for w in command.words[1:] if "=" not in w]
    run = subprocess.run(["make", "-n", "-C", str(REPO), *targets], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, f"{command.where}: {run.stderr.strip()}"
    return f"make -n {' '.join(targets)}"


def check_pip(command: Command) -> str:
    from pip._internal.commands import create_command

    name, *args = command.words[1:]
    try:
        options, _ = create_command(name).parse_args(list(args))
    except SystemExit:
        raise AssertionError(f"{command.where}: pip refuses {command.text!r}") from None
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
                 ["optional-dependencies"])
    for editable in getattr(options, "editables", []) or []:
        named = re.search(r"\[(.*)\]", editable)
        for extra in (named.group(1).split(",") if named else []):
            assert extra in extras, f"{command.where}: no extra {extra!r} in pyproject.toml"
    return f"parsed: pip {name}"


def _imports_resolve(code: str, where: str) -> None:
    for module, names in re.findall(r"^\s*from (acrb[\w.]*) import (.+)$", code, re.M):
        loaded = importlib.import_module(module)
        for name in (n.strip() for n in names.split(",")):
            assert hasattr(loaded, name), f"{where}: {module} has no {name}"


def check_python(command: Command) -> str:
    args = list(command.words[1:])
    if args[:2] == ["-m", "venv"]:
        importlib.import_module("venv")
        return "python -m venv"
    if args[:1] == ["-c"]:
        compile(args[1], command.where, "exec")
        _imports_resolve(args[1], command.where)
        return "compiled"
    if args[:1] == ["-"]:
        assert command.heredoc, f"{command.where}: python - without a heredoc"
        compile(command.heredoc, command.where, "exec")
        _imports_resolve(command.heredoc, command.where)
        return "heredoc compiled, its acrb imports resolve"
    script = REPO / args[0]
    assert script.is_file(), f"{command.where}: no script {args[0]}"
    helped = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    assert helped.returncode == 0, f"{command.where}: {helped.stderr}"
    for option in (a.split("=")[0] for a in args[1:] if a.startswith("--")):
        assert option in helped.stdout, f"{command.where}: {args[0]} has no {option}"
    return f"{args[0]} --help lists its options"


def check_export(command: Command) -> str:
    source = "\n".join(p.read_text() for p in (REPO / "src" / "acrb").rglob("*.py"))
    params = "\n".join(p.read_text() for p in [REPO / "params.yaml",
                                               *(REPO / "profiles").glob("*.yaml")])
    for assignment in command.words[1:]:
        name = assignment.split("=")[0]
        if name in LIBRARY_VARIABLES:
            assert name in (SITE / LIBRARY_VARIABLES[name]).read_text(), \
                f"{command.where}: {LIBRARY_VARIABLES[name]} no longer reads {name}"
        else:
            assert name in source or name in params, \
                f"{command.where}: nothing reads the environment variable {name}"
    return "variables read"


def _cli(module: str, attribute: str) -> Callable[[Command], str]:
    def check(command: Command) -> str:
        group = getattr(importlib.import_module(module), attribute)
        words = [w for w in command.words[1:]]
        leaf = _click_parse(group, words, command.where)
        return f"parsed: {command.program} {leaf}"
    return check


CHECKS: dict[str, Callable[[Command], str]] = {
    "acrb": check_acrb,
    "make": check_make,
    "pip": check_pip,
    "python": check_python,
    "export": check_export,
    "mlflow": _cli("mlflow.cli", "cli"),
    "ray": _cli("ray.scripts.scripts", "cli"),
    "mutmut": _cli("mutmut.__main__", "cli"),
}


def check(command: Command, tmp_path: Path) -> str:
    """Check ``command``; return how (AssertionError naming what is wrong)."""
    words = list(command.words)
    if command.program == "nice":  # nice -n 19 <command>
        words = words[3:]
        command = Command(command.file, command.line, command.text, tuple(words),
                          params=command.params)
    program = command.program
    if not words:  # an assignment of a shell variable (its $(...) is checked on its own)
        assert command.env, command.where
        return "shell variable"
    if program in command.functions:
        return "a shell function the block defines"
    if program == "dvc":
        return check_dvc(command, tmp_path)
    if program == "source":
        assert words[1] == ".venv/bin/activate", f"{command.where}: {words[1]}"
        assert re.search(r"^VENV := \.venv$", (REPO / "Makefile").read_text(), re.M)
        return "the Makefile's environment"
    if program == "cp":
        assert (REPO / words[1]).is_file(), f"{command.where}: no file {words[1]}"
        return "its source exists"
    if program in CHECKS:
        return CHECKS[program](command)
    assert program in NOT_RUN_HERE, (
        f"{command.where}: no check for {program!r} ({command.text!r}): add one to "
        "tests/test_doc_commands.py, or the reason it cannot run here to NOT_RUN_HERE")
    return f"not run here: {NOT_RUN_HERE[program]}"


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.where}:{c.program}" for c in COMMANDS])
def test_a_documented_command_is_one_its_program_accepts(command: Command,
                                                         tmp_path: Path) -> None:
    assert check(command, tmp_path)


def test_the_docs_have_commands_and_every_fence_says_what_it_holds() -> None:
    assert len(COMMANDS) > 100
    assert {c.file for c in COMMANDS} >= {"README.md", "docs/team.md", "docs/review.md"}
    for name in DOC_FILES:
        assert unlabelled_fences((REPO / name).read_text()) == [], name


@pytest.mark.parametrize(("text", "problem"), [
    ("acrb generate --no-such-option", "no-such-option"),
    ("acrb no-such-stage", "no command"),
    ("dvc exp run -S analyze.no_such_key=1", "Invalid `--set-param` value"),
    ("dvc exp run -S +analyze.no_such_key=1", "no_such_key"),
    ("dvc exp run -S analyze.confidence=2", "confidence"),
    ("dvc repro no-such-stage", "no stage"),
    ("dvc exp shwo", "dvc refuses"),
    ("make no-such-target", "No rule"),
    ('pip install -e ".[no-such-extra]"', "no extra"),
    ("export ACRB_NO_SUCH_VARIABLE=1", "nothing reads"),
    ("python benchmarks/stage_profile.py --no-such-option", "has no --no-such-option"),
    ("mlflow ui --no-such-option", "no-such-option"),
    ("cp profiles/no-such.yaml params.yaml", "no file"),
    ("frobnicate --all", "no check for 'frobnicate'"),
])
def test_a_wrong_command_fails_its_check(text: str, problem: str, tmp_path: Path) -> None:
    from tests.doc_commands import block_commands

    (command,) = block_commands("planted.md", 1, [text])
    with pytest.raises(Exception, match=re.escape(problem)):
        check(command, tmp_path)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_every_relative_link_of_the_docs_resolves() -> None:
    broken = []
    for name in DOC_FILES:
        page = REPO / name
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"^[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{name}: {target} (no file)")
            elif anchor and file.suffix == ".md":
                slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
                if anchor not in slugs:
                    broken.append(f"{name}: {target} (no heading)")
    assert not broken, broken
