"""The `acrb` command: one subcommand per pipeline stage, each a thin layer over a function.

`dvc repro` runs these in order (see dvc.yaml); each can also be run by hand. Errors in inputs
are reported as one message naming the problem and the fix, with exit code 2.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from acrb.errors import AcrbError

app = typer.Typer(
    name="acrb",
    help="ACRB audits image editing and generation models for demographic bias in refusals, "
    "erasure of the requested attribute and identity drift. `dvc repro` runs the stages below "
    "in order; each reads params.yaml and writes under data/, metrics/, plots/ or reports/.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ParamsOption = Annotated[
    Path, typer.Option("--params", "-p", help="params file (default: params.yaml in the project)")
]
ModelOption = Annotated[
    str, typer.Option("--model", "-m", help="model entry name under `models:` in params.yaml")
]
F = TypeVar("F", bound=Callable[..., Any])


def _reports_errors(func: F) -> F:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AcrbError as exc:
            typer.secho(f"error: {exc.problem}", fg=typer.colors.RED, err=True)
            if exc.fix:
                typer.secho(f"  fix: {exc.fix}", fg=typer.colors.YELLOW, err=True)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


def _context(params: Path):
    from acrb.stages.context import StageContext

    return StageContext.load(params)


@app.command()
@_reports_errors
def sources(params: ParamsOption = Path("params.yaml")) -> None:
    """Make the source portraits. Reads params `sources`; writes data/sources/ (images and
    sources.parquet). The embedded default draws labelled synthetic placeholder portraits."""
    from acrb.stages import sources as stage

    summary = stage.run(_context(params))
    typer.echo(f"sources: {summary.count} images -> {summary.table}")


@app.command()
@_reports_errors
def prompts(params: ParamsOption = Path("params.yaml")) -> None:
    """Build the prompt set: the I2I catalog, plus ACRB synthesis (base prompts x attributes)
    when `prompts.synthesis` is set. The writer is `prompts.synthesis.backend`: `template`
    (deterministic, offline) or a named LLM backend (OpenAI-compatible, Gemini or a local
    transformers model; API keys from the environment variable the backend names). LLM replies
    are cached, so a rerun only sends requests that failed. Writes data/prompts/ (prompts.parquet,
    synthesis_calls.parquet, summary.json, sample.md, sample.html)."""
    from acrb.stages import prompts as stage

    summary = stage.run(_context(params))
    typer.echo(f"prompts: catalog {summary.count} ({summary.per_category}) -> {summary.table}")
    if summary.synthesized:
        fallbacks = sum(summary.fallbacks.values())
        typer.echo(
            f"  ACRB synthesis by {summary.backend}: "
            + ", ".join(f"{mode} {n:,}" for mode, n in summary.synthesized.items())
            + f"; by method {summary.per_synthesis}; {summary.llm_requests} LLM requests sent; "
            + f"{fallbacks} fell back to the template {summary.fallbacks or ''}".rstrip()
        )
        typer.echo(f"  sample: {summary.sample}")


@app.command()
@_reports_errors
def plan(params: ParamsOption = Path("params.yaml")) -> None:
    """Plan requests = sources x prompts x models x seeds x arms. Reads data/sources,
    data/prompts and params `plan`, `models`; writes data/plan/requests.parquet."""
    from acrb.stages import plan as stage

    summary = stage.run(_context(params))
    typer.echo(f"plan: {summary.count} requests {summary.per_model} -> {summary.table}")


@app.command()
@_reports_errors
def generate(
    model: ModelOption,
    params: ParamsOption = Path("params.yaml"),
    shard: Annotated[
        str | None, typer.Option(help="run only shard i of N, written i/N (e.g. 0/4)")
    ] = None,
) -> None:
    """Run one model over its planned requests. Reads data/plan and the source images;
    writes data/generations/<model>/ (images, one record per request, generations.parquet).
    Resumable: finished requests are skipped, so rerun after a crash or kill."""
    from acrb.stages import generate as stage

    summary = stage.run(_context(params), model,
                        stage.Shard.parse(shard) if shard is not None else None)
    typer.echo(
        f"generate {model}: {summary.generated} generated, {summary.skipped} already done, "
        f"status {summary.status_counts}; model time {summary.seconds_model:.1f}s of "
        f"{summary.seconds_total:.1f}s -> {summary.table}"
    )
    if not summary.complete:
        typer.echo(f"generate {model}: not every planned request has a record yet "
                   "(other shards pending)", err=True)


@app.command()
@_reports_errors
def evaluate(model: ModelOption, params: ParamsOption = Path("params.yaml")) -> None:
    """Judge one model's outputs with the pixel detectors (blank, unchanged, edit size, skin
    tone). Reads data/generations/<model> and data/sources; writes data/judgements/<model>/."""
    from acrb.stages import evaluate as stage

    summary = stage.run(_context(params), model)
    typer.echo(
        f"evaluate {model}: {summary.judged} judged, {summary.reused} reused; "
        f"{summary.hard_refusals} hard refusals, {summary.erasures} erasures, "
        f"{summary.lightenings} lightenings -> {summary.table}"
    )


@app.command()
@_reports_errors
def analyze(params: ParamsOption = Path("params.yaml")) -> None:
    """Rates, disparities (Δ with intervals and corrected tests) and planted-vs-measured
    tables. Reads data/judgements and data/plan; writes data/analysis/, metrics/audit.json,
    plots/; logs one MLflow run per model."""
    from acrb.stages import analyze as stage

    for result in stage.run(_context(params)):
        typer.echo(
            f"analyze {result.model}: Δ refusal {result.metrics['delta_refusal']:.3f}, "
            f"Δ erasure {result.metrics['delta_erasure']:.3f}, "
            f"{int(result.metrics['flagged.refusal'])} refusal disparities flagged"
        )


@app.command()
@_reports_errors
def report(params: ParamsOption = Path("params.yaml")) -> None:
    """Write the self-contained HTML report. Reads data/analysis and plots/; writes
    reports/report.html and logs it to MLflow."""
    from acrb.stages import report as stage

    path = stage.run(_context(params))
    typer.echo(f"report: {path}")


@app.command("models")
def list_models() -> None:
    """List the registered model keys usable as `models.<name>.key` in params.yaml."""
    from acrb.models.registry import model_keys

    for key, target in model_keys().items():
        typer.echo(f"{key}\t{target}")


def main() -> None:  # pragma: no cover
    sys.exit(app())
