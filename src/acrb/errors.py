"""Errors a user can act on: each says what is wrong, where, and how to fix it."""

from __future__ import annotations


class AcrbError(Exception):
    """An error caused by the user's inputs or environment, reported without a traceback.

    ``problem`` names the bad input (a file, a params key, a model key); ``fix`` says what to do.
    """

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\n  fix: {fix}")


class ConfigError(AcrbError):
    """params.yaml (or a config file it names) is invalid."""


class InputDataError(AcrbError):
    """An input file (image, catalog, table) is missing, corrupt or empty."""
