"""The shell commands of the README and of docs/*.md, as a reader would type them.

Every fenced block tagged ``bash`` is read: continuation lines joined, comments dropped,
``&&``, ``;`` and ``|`` chains split into single commands, ``$(...)`` substitutions taken out
as commands of their own, heredoc bodies kept with the command that reads them, leading
``NAME=value`` assignments set aside. A block that runs ``cp <file> params.yaml`` makes the
later ``dvc exp run`` commands of the block apply to that file. ``tests/test_doc_commands.py``
checks each command with its own program.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from tests.conftest import REPO

#: The files whose commands are checked.
DOC_FILES = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))
_FENCE = re.compile(r"^\s*```(\S*)\s*$")
_SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")
_HEREDOC = re.compile(r"<<-?\s*'?(\w+)'?")
_FUNCTION = re.compile(r"^(\w+)\(\)\s*\{\s*(.*?);?\s*\}$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_OPERATORS = {"&&", "||", ";", "|"}


@dataclass(frozen=True)
class Command:
    """One command of a doc: where it is, its words, what it was given."""

    file: str
    line: int
    text: str
    words: tuple[str, ...]
    #: Leading ``NAME=value`` words (the environment the command runs in).
    env: tuple[str, ...] = ()
    #: A heredoc's body, when the command reads one.
    heredoc: str | None = None
    #: The params file a ``dvc exp run`` of this block applies to.
    params: str = "params.yaml"
    #: Shell functions the block defined before this command.
    functions: frozenset[str] = field(default_factory=frozenset)
    #: A ``$(...)`` substitution's command (checked on its own too).
    substituted: bool = False

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def program(self) -> str:
        return self.words[0].rsplit("/", 1)[-1] if self.words else ""


def fenced_bash_blocks(text: str) -> list[tuple[int, list[str]]]:
    """(line number of the first line, lines) of each ```bash block of ``text``."""
    blocks: list[tuple[int, list[str]]] = []
    current: list[str] | None = None
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(line)
        if fence and current is None:
            current = [] if fence.group(1) in ("bash", "sh", "shell", "console") else None
            start = number + 1
            if current is None:
                current = ["<not bash>"]
            continue
        if fence and current is not None:
            if current[:1] != ["<not bash>"]:
                blocks.append((start, current))
            current = None
            continue
        if current is not None:
            current.append(line)
    return blocks


def unlabelled_fences(text: str) -> list[int]:
    """Line numbers of opening fences with no language: a block of commands must say so."""
    found, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(line)
        if fence:
            if not inside and not fence.group(1):
                found.append(number)
            inside = not inside
    return found


def _words(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def block_commands(file: str, start: int, lines: list[str]) -> list[Command]:
    commands: list[Command] = []
    params = "params.yaml"
    functions: set[str] = set()
    index = 0
    while index < len(lines):
        number = start + index
        text = lines[index]
        while text.rstrip().endswith("\\") and index + 1 < len(lines):
            index += 1
            text = text.rstrip()[:-1] + " " + lines[index].strip()
        index += 1
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        heredoc = None
        marker = _HEREDOC.search(stripped)
        if marker:
            body = []
            while index < len(lines) and lines[index].strip() != marker.group(1):
                body.append(lines[index])
                index += 1
            index += 1
            heredoc = "\n".join(body)
            stripped = stripped[:marker.start()] + stripped[marker.end():]
        function = _FUNCTION.match(stripped)
        if function:
            functions.add(function.group(1))
            stripped = function.group(2)
        pieces = [stripped]
        for inner in _SUBSTITUTION.findall(stripped):
            pieces.append(inner)
        stripped = _SUBSTITUTION.sub("SUBSTITUTED", stripped)
        pieces[0] = stripped
        for position, piece in enumerate(pieces):
            words = _words(piece)
            chain: list[list[str]] = [[]]
            for word in words:
                if word in _OPERATORS:
                    chain.append([])
                else:
                    chain[-1].append(word)
            for part in chain:
                env = tuple(w for w in _leading_assignments(part))
                rest = tuple(part[len(env):])
                if not rest and not env:
                    continue
                command = Command(file=file, line=number, text=piece.strip(), words=rest,
                                  env=env, heredoc=heredoc if position == 0 else None,
                                  params=params, functions=frozenset(functions),
                                  substituted=position > 0)
                commands.append(command)
                if rest[:1] == ("cp",) and len(rest) == 3 and rest[2] == "params.yaml":
                    params = rest[1]
    return commands


def _leading_assignments(words: list[str]) -> list[str]:
    found = []
    for word in words:
        if not _ASSIGNMENT.match(word):
            break
        found.append(word)
    return found


def doc_commands() -> list[Command]:
    """Every command of :data:`DOC_FILES`, in order."""
    found: list[Command] = []
    for name in DOC_FILES:
        for start, lines in fenced_bash_blocks((REPO / name).read_text()):
            found.extend(block_commands(name, start, lines))
    return found
