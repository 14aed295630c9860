"""`python -m acrb` is the same as the `acrb` command."""

from acrb.cli import app

app(prog_name="acrb")
