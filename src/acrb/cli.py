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

from acrb.errors import AcrbError, file_system_error

app = typer.Typer(
    name="acrb",
    help="ACRB audits image editing and generation models for demographic bias in refusals, "
    "erasure of the requested attribute and identity drift. `dvc repro` runs the stages below "
    "in order; each reads params.yaml and writes under data/, metrics/, plots/ or reports/.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # docstrings are wrapped prose: join their lines
)

ParamsOption = Annotated[
    Path, typer.Option("--params", "-p", help="params file (default: params.yaml in the project)")
]
ModelOption = Annotated[
    str, typer.Option("--model", "-m", help="model entry name under `models:` in params.yaml")
]
F = TypeVar("F", bound=Callable[..., Any])
#: Where `acrb prompts import-study` writes the study's catalog (in the user's project).
DEFAULT_STUDY_CATALOG = Path("inputs/study/i2i_catalog.yaml")


def _reports_errors(func: F) -> F:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AcrbError as exc:
            from acrb.redaction import redact  # an echoed API key never reaches the terminal

            typer.secho(f"error: {redact(exc.problem)}", fg=typer.colors.RED, err=True)
            if exc.fix:
                typer.secho(f"  fix: {redact(exc.fix)}", fg=typer.colors.YELLOW, err=True)
            raise typer.Exit(code=2) from None
        except OSError as exc:  # a read-only folder, a full disk: one line, not a traceback
            error = file_system_error(exc)
            if error is None:
                raise
            typer.secho(f"error: {error.problem}", fg=typer.colors.RED, err=True)
            typer.secho(f"  fix: {error.fix}", fg=typer.colors.YELLOW, err=True)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


def _logs_to_mlflow(func: F) -> F:
    """A stage command: the MLflow logging process of the project's run queue
    (acrb.tracking_queue.start_logging) starts first, if none is running, so that MLflow is
    imported while the stage loads its code and params."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from acrb.tracking_queue import start_logging

        start_logging()
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _context(params: Path):
    from acrb.stages.context import StageContext

    return StageContext.load(params)


@app.command()
@_reports_errors
@_logs_to_mlflow
def sources(params: ParamsOption = Path("params.yaml")) -> None:
    """Make the source portraits. Reads params `sources`; writes data/sources/ (images and
    sources.parquet). The embedded default draws labelled synthetic placeholder portraits.
    With `kind: fairface` it draws k FairFace candidates per cell and pre-screens them into
    data/sources/candidates/, then builds from the curated set (`acrb curate --help`) once
    it is finalized; until then it stops and says what to do next."""
    from acrb.stages import sources as stage

    summary = stage.run(_context(params))
    typer.echo(f"sources: {summary.count} images -> {summary.table}")


prompts_group = typer.Typer(name="prompts", rich_markup_mode="markdown")
app.add_typer(prompts_group)


@prompts_group.callback(invoke_without_command=True)
@_reports_errors
@_logs_to_mlflow
def prompts(ctx: typer.Context, params: ParamsOption = Path("params.yaml")) -> None:
    """Build the prompt set: the I2I catalog, plus ACRB synthesis (base prompts x attributes)
    when `prompts.synthesis` is set. The writer is `prompts.synthesis.backend`: `template`
    (deterministic, offline) or a named LLM backend (OpenAI-compatible, Gemini or a local
    transformers model; API keys from the environment variable the backend names). LLM replies
    are cached, so a rerun only sends requests that failed. Writes data/prompts/ (prompts.parquet,
    synthesis_calls.parquet, summary.json, sample.md, sample.html). `acrb prompts import-study`
    imports the study's published prompt set as a catalog."""
    if ctx.invoked_subcommand is not None:
        return
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


@prompts_group.command("import-study")
@_reports_errors
def prompts_import_study(
    file: Annotated[Path, typer.Argument(help="your copy of the study's prompt JSON")],
    out: Annotated[Path, typer.Option("--out", help="where to write the catalog (in your "
                                      "project, not the package)")] = DEFAULT_STUDY_CATALOG,
    links: Annotated[Path | None, typer.Option(
        "--links", help="congruence links, YAML or JSON: {prompt_id: {congruent: [race:<group>, "
        "...], incongruent: [...]}}")] = None,
) -> None:
    """Import the study's published prompt set (`version`, `categories`, `prompts` of {id,
    category, prompt, hypothesis}) as a prompt catalog with the study's ids, keeping the file's
    version and sha256 and every other key it carries; declared counts (`total_prompts`, a
    category's `count`) must match its prompts. Congruence links for SCS come from the entries'
    `congruent` / `incongruent` keys and from `--links` (which wins for the prompts it
    names)."""
    from acrb.prompts.study import MAIN_EXPERIMENT_IDS, import_study

    done = import_study(file, out, links)
    counts = ", ".join(f"{c} {n}" for c, n in done.per_category.items())
    typer.echo(f"prompts import-study: {sum(done.per_category.values())} prompts ({counts}) "
               f"of {file.name} version {done.version}, sha256 {done.sha256[:12]}…")
    typer.echo(f"  congruence links on {done.linked} prompts"
               + (f" (links from {done.links_file})" if done.links_file else ""))
    kept = "; ".join(f"{level} {', '.join(keys)}" for level, keys in done.kept.items() if keys)
    if kept:
        typer.echo(f"  also kept in the catalog: {kept}")
    typer.echo(f"  catalog -> {done.catalog}")
    main = [i for i in MAIN_EXPERIMENT_IDS if i in done.ids]
    categories = ",".join(done.per_category)
    sets = [f"-S prompts.catalog={done.catalog}", f"-S 'prompts.categories=[{categories}]'"]
    if len(main) == len(MAIN_EXPERIMENT_IDS):
        sets.append(f"-S 'prompts.ids=[{','.join(main)}]'")
    typer.echo("  next: set prompts.catalog (and prompts.ids for a subset) in params.yaml, or\n"
               "    dvc exp run " + " ".join(sets)
               + ("\n  (prompts.ids: the paper's main experiment, B01-B10 and D01-D10)"
                  if len(main) == len(MAIN_EXPERIMENT_IDS) else ""))


@app.command()
@_reports_errors
@_logs_to_mlflow
def features(params: ParamsOption = Path("params.yaml")) -> None:
    """Write a feature prompt p_feat per source portrait, for the feature-prompt arm. Reads
    data/sources and params `features`: `describer` simulated (read from the pixels, offline),
    vlm (a vision-language model through `features.vlm`; an answer naming a race, ethnicity
    or nationality is refused and asked again; replies cached) or mapping (a published
    {source_id: prompt} JSON). Writes data/features/ (features.parquet, summary.json)."""
    from acrb.stages import features as stage

    summary = stage.run(_context(params))
    if not summary.describer:
        typer.echo(f"features: no `features` section in params; empty table -> {summary.table}")
        return
    typer.echo(f"features: {summary.count} feature prompts by {summary.describer} "
               f"({summary.requests_sent} requests sent, {summary.retried} sources asked "
               f"again) -> {summary.table}")
    if summary.warnings:
        typer.echo(f"  warning: {len(summary.warnings)} imported prompt(s) name a demographic "
                   "group; see data/features/summary.json")
    if summary.extra_ids:
        typer.echo(f"  {summary.extra_ids} mapping id(s) without a source here were ignored")


@app.command()
@_reports_errors
@_logs_to_mlflow
def plan(params: ParamsOption = Path("params.yaml")) -> None:
    """Plan requests = sources x prompts x models x seeds x arms. Reads data/sources,
    data/prompts and params `plan`, `models`; writes data/plan/requests.parquet."""
    from acrb.stages import plan as stage

    summary = stage.run(_context(params))
    typer.echo(f"plan: {summary.count} requests -> {summary.table}")
    for estimate in summary.estimates:
        typer.echo(f"  {estimate.describe()}")
    if summary.gpu_hours is not None and summary.gpu_hours > 0:
        typer.echo(f"  estimated total: {summary.gpu_hours:.1f} GPU-hours")
    for model, reason in summary.winobias_skipped.items():
        typer.echo(f"plan: WinoBias skips {model}: {reason}")


@app.command()
@_reports_errors
@_logs_to_mlflow
def generate(
    model: ModelOption,
    params: ParamsOption = Path("params.yaml"),
    shard: Annotated[
        str | None, typer.Option(help="run only shard i of N, written i/N (e.g. 0/4)")
    ] = None,
) -> None:
    """Run one model over its planned requests. Reads data/plan and the source images;
    writes `data/generations/MODEL/` (images, one record per request, generations.parquet).
    Resumable: finished requests are skipped, so rerun after a crash or kill."""
    from acrb.stages import generate as stage

    ctx = _context(params)
    parsed = stage.Shard.parse(shard) if shard is not None else None
    status = stage.delegate(ctx, model, params, parsed)
    if status is not None:  # ran in the model's own environment (models.<name>.python)
        raise typer.Exit(status)
    summary = stage.run(ctx, model, parsed)
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
@_logs_to_mlflow
def evaluate(model: ModelOption, params: ParamsOption = Path("params.yaml")) -> None:
    """Read one model's outputs with the detectors: layered hard refusal (status, blank frame,
    unchanged output, CLIP refusal templates when `evaluate.clip` is set), edit size and skin
    tone inside the located face. Reads `data/generations/MODEL` and data/sources; writes
    `data/judgements/MODEL/`. The pixel detectors use every CPU this process may
    (`ACRB_EVALUATE_WORKERS` sets the number of processes)."""
    from acrb.stages import evaluate as stage
    from acrb.stages.context import stage_workers

    summary = stage.run(_context(params), model,
                        workers=stage_workers("ACRB_EVALUATE_WORKERS"))
    typer.echo(
        f"evaluate {model}: {summary.judged} judged, {summary.reused} reused; "
        f"{summary.hard_refusals} hard refusals, {summary.erasures} erasures, "
        f"{summary.lightenings} lightenings -> {summary.table}"
    )


@app.command()
@_reports_errors
@_logs_to_mlflow
def judge(model: ModelOption, params: ParamsOption = Path("params.yaml")) -> None:
    """Score one model's outputs with the judges of `judge.use` (VLMs or simulated judges) on
    the rubric, combine them by `judge.ensemble` and read the judge outcomes. Reads
    `data/generations/MODEL`, `data/judgements/MODEL`, `data/sources`; writes `data/scores/MODEL/`.
    Answers are cached: a rerun asks only what is new or errored."""
    from acrb.stages import judge as stage

    summary = stage.run(_context(params), model)
    if not summary.judges:
        typer.echo(f"judge {model}: no judges in judge.use; nothing scored")
        return
    for name in summary.judges:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.statuses[name].items()))
        typer.echo(f"judge {model} / {name}: {summary.asked[name]} asked, "
                   f"{summary.reused[name]} reused; {counts}")
    typer.echo(f"judge {model}: {summary.needs_review} need review -> {summary.table}")


@app.command()
@_reports_errors
@_logs_to_mlflow
def analyze(params: ParamsOption = Path("params.yaml")) -> None:
    """Rates, disparities (Δ with intervals and corrected tests) and planted-vs-measured
    tables. Reads data/judgements and data/plan; writes data/analysis/, metrics/audit/,
    plots/; logs one MLflow run per model."""
    from acrb.stages import analyze as stage

    for result in stage.run(_context(params), workers=stage.analysis_workers()):
        # A text-to-image model has no erasure measure (no source image to compare with).
        erasure = result.metrics.get("delta_erasure")
        typer.echo(
            f"analyze {result.model}: Δ refusal {result.metrics['delta_refusal']:.3f}, "
            + (f"Δ erasure {erasure:.3f}, " if erasure is not None else "")
            + f"{int(result.metrics['flagged.refusal'])} refusal disparities flagged"
        )


@app.command()
@_reports_errors
@_logs_to_mlflow
def report(params: ParamsOption = Path("params.yaml")) -> None:
    """Write the self-contained HTML report. Reads data/analysis and plots/; writes
    reports/report.html and logs it to MLflow."""
    from acrb.stages import report as stage

    path = stage.run(_context(params))
    typer.echo(f"report: {path}")


@app.command()
@_reports_errors
@_logs_to_mlflow
def tables(params: ParamsOption = Path("params.yaml")) -> None:
    """The paper's tables as CSV and booktabs LaTeX, each naming its run and inputs. Reads
    data/plan, data/judgements, data/scores, data/analysis and data/review/analysis; writes
    data/tables/ (index.json lists the tables) and logs one MLflow run."""
    from acrb.stages import tables as stage

    for result in stage.run(_context(params)):
        state = "written" if result.written else f"skipped: {result.note}"
        typer.echo(f"tables {result.id}: {state}")


curate = typer.Typer(
    name="curate",
    help="Curate the FairFace candidates into the source set: add curators, serve the web tool, "
    "import the study's record, verify the audit log, finalize the set. The curation folder "
    "(--workdir, default `curation`) holds curation.sqlite and the hash-chained audit.jsonl.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
app.add_typer(curate)
WorkdirOption = Annotated[
    Path, typer.Option("--workdir", "-w", help="curation folder (database and audit log)")
]
CandidatesOption = Annotated[
    Path, typer.Option("--candidates", help="the candidates `acrb sources` drew "
                       "(sources.kind: fairface)")
]
DEFAULT_WORKDIR = Path("curation")
DEFAULT_CANDIDATES = Path("data/sources/candidates")


def _store(workdir: Path, candidates: Path | None, *, create: bool):
    from acrb.curation.store import CurationStore

    store = CurationStore(workdir, create=create)
    if candidates is not None and (candidates / "candidates.parquet").exists():
        added = store.load_candidates(candidates)
        if added:
            typer.echo(f"curate: took {added} candidates from {candidates}")
    return store


@curate.command("add-curator")
@_reports_errors
def curate_add_curator(
    name: Annotated[str, typer.Argument(help="the curator's name, as it appears in the log")],
    workdir: WorkdirOption = DEFAULT_WORKDIR,
    candidates: CandidatesOption = DEFAULT_CANDIDATES,
    replace_token: Annotated[bool, typer.Option(help="issue a new token for an existing "
                                                "curator (the old one stops working)")] = False,
) -> None:
    """Add a curator and print their login token. The token is shown once and stored only
    as a hash; give it to that person alone. Creates the curation folder if needed."""
    store = _store(workdir, candidates, create=True)
    token = store.replace_token(name) if replace_token else store.add_curator(name)
    typer.echo(f"curator {name}: token (shown once, keep it secret):\n{token}")


@curate.command("serve")
@_reports_errors
def curate_serve(
    workdir: WorkdirOption = DEFAULT_WORKDIR,
    candidates: CandidatesOption = DEFAULT_CANDIDATES,
    host: Annotated[str, typer.Option(help="address to listen on; keep 127.0.0.1 unless "
                                      "curators reach it through an authenticated tunnel")
                    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8765,
    trusted_proxy: Annotated[list[str] | None, typer.Option(
        "--trusted-proxy", help="address of a reverse proxy in front of the tool whose "
        "X-Forwarded-For / X-Forwarded-Proto headers are believed (repeat for several); by "
        "default none are, so logins are throttled per connecting address")] = None,
) -> None:
    """Run the curation web tool: a grid of the 84 cells, each cell's candidates with their
    pre-screen scores, the criteria checklist, select/reject with a rationale. Every action
    is appended to the audit log. Stop with Ctrl-C; the curation resumes where it was."""
    from acrb.web.serving import require_web_extra

    require_web_extra("acrb curate serve", "fairface")
    from acrb.curation.web import create_app
    from acrb.web.security import local_hosts
    from acrb.web.serving import exposure_warning, serve

    store = _store(workdir, candidates, create=False)
    check = store.verify()
    if not check.ok:
        raise AcrbError(f"the audit log does not verify: {check.message()}",
                        check.fix or "restore audit.jsonl from a backup before curating "
                        "further")
    if not store.curators():
        raise AcrbError(f"{workdir} has no curators", "add one: acrb curate add-curator NAME")
    if store.candidates_dir() is None:
        raise AcrbError(f"no candidates in {candidates}",
                        "draw them with `acrb sources` (sources.kind: fairface)")
    warning = exposure_warning(host)
    if warning:
        typer.secho(warning, fg=typer.colors.YELLOW, err=True)
    typer.echo(f"curate: serving {workdir} on http://{host}:{port}/ (Ctrl-C to stop)")
    serve(create_app(store, allowed_hosts=local_hosts(host)), host=host, port=port,
          trusted_proxies=trusted_proxy or ())


@curate.command("status")
@_reports_errors
def curate_status(workdir: WorkdirOption = DEFAULT_WORKDIR) -> None:
    """Progress of the curation: cells with a selection, cells left, decisions, curators."""
    from acrb.curation.finalize import missing_cells

    store = _store(workdir, None, create=False)
    missing = missing_cells(store)
    grid = store.grid()
    seq, head = store.head()
    decisions = store.decisions()
    names = sorted({d["curator"] for d in decisions})
    typer.echo(f"{len(grid) - len(missing)} / {len(grid)} cells have a selection; "
               f"{len(decisions)} decisions by {', '.join(names) or 'nobody'}"
               f"; audit log {seq} entries, head {head[:16]}")
    if missing:
        typer.echo("without a selection: " + ", ".join(missing))


@curate.command("verify")
@_reports_errors
def curate_verify(
    path: Annotated[Path, typer.Argument(help="a curation folder, or a finalized set "
                                         "(checked against its manifest's head hash)")
                    ] = DEFAULT_WORKDIR,
    resolve: ResolveOption = False,
    by: ResolveByOption = "",
) -> None:
    """Check the audit log's hash chain and that it ends at the head the database (or the
    manifest) recorded. Exit 0 if intact; exit 1 naming the first line that was edited,
    removed or inserted, any line past the recorded head, or lines set aside from past it
    that nobody has resolved yet."""
    from acrb.curation import finalize, store

    _verify_audit(path, store.DATABASE, store.AUDIT_LOG, "manifest.json",
                  lambda: _store(path, None, create=False), finalize.read_manifest,
                  "a curation folder nor a finalized set", resolve=resolve, by=by)


ResolveOption = Annotated[bool, typer.Option(
    "--resolve", help="accept the lines set aside from past the recorded head (a write that "
    "never committed) after reading them: each side file is logged with its sha256 and kept; "
    "its lines never enter the log")]
ResolveByOption = Annotated[str, typer.Option("--by", help="who resolves (recorded in the log)")]


def _verify_audit(path: Path, database: str, audit_log: str, manifest: str,
                  open_store: Callable[[], Any], read_manifest: Callable[[Path], Any],
                  neither: str, *, resolve: bool = False, by: str = "") -> None:
    """The verify command of a tool: check the folder's audit log through its store when
    ``path`` holds the ``database`` (``resolve``: first accept its set-aside lines, logged
    with ``by``), else against a finalized ``manifest``'s entry count and head hash; exit 1
    naming the first bad line. ``neither`` ends the error for a path that is neither."""
    from acrb.web.audit import verify

    if (path / database).exists():
        store = open_store()
        if resolve:
            for entry in store.resolve_set_aside(by):
                typer.echo(f"resolved: {entry['lines']} line(s) of {entry['file']} (sha256 "
                           f"{entry['sha256'][:16]}) accepted as set aside; logged as entry "
                           f"{entry['seq']}")
        check = store.verify()
    elif (path / manifest).exists():
        if resolve:
            raise AcrbError(f"{path} is a finalized export: there is nothing to resolve",
                            "run --resolve on the tool's working folder")
        anchor = read_manifest(path)["audit"]
        check = verify(path / audit_log, expected_head=anchor["head"],
                       expected_entries=anchor.get("entries"))
    else:
        raise AcrbError(f"{path} is neither {neither}",
                        f"pass the folder holding {database} or {manifest}")
    if check.ok:
        typer.echo(f"ok: {check.message()}")
        return
    typer.secho(f"FAILED: {check.message()}", fg=typer.colors.RED, err=True)
    if check.fix:
        typer.secho(f"  fix: {check.fix}", err=True)
    raise typer.Exit(code=1)


@curate.command("import-study")
@_reports_errors
def curate_import_study(
    folder: Annotated[Path, typer.Argument(help="the study's folder (candidates/ with "
                                           "selection_logs.json, and curated/)")],
    workdir: WorkdirOption = DEFAULT_WORKDIR,
    candidates: CandidatesOption = DEFAULT_CANDIDATES,
    curator: Annotated[str, typer.Option(help="name the imported decisions carry")] = "study",
) -> None:
    """Import the original FairFace study's selection log as decisions (each becomes an audit
    entry keeping the study's timestamp) and report where its records disagree."""
    from acrb.curation.study import import_study

    store = _store(workdir, candidates, create=True)
    for line in import_study(store, folder, curator).lines():
        typer.echo(f"import-study: {line}")


@curate.command("finalize")
@_reports_errors
def curate_finalize(
    workdir: WorkdirOption = DEFAULT_WORKDIR,
    out: Annotated[Path, typer.Option(help="where the curated set goes (sources.fairface."
                                      "curated)")] = Path("inputs/fairface-curated"),
    size: Annotated[int, typer.Option(help="side of the square output images, pixels")] = 1024,
    allow_incomplete: Annotated[bool, typer.Option(
        help="finalize even if some cells have no selection; they are listed as missing")
    ] = False,
    curator: Annotated[str, typer.Option(help="who finalizes (recorded in the log)")] = "",
) -> None:
    """Write the curated set: each cell's chosen image resized to SIZE² (Lanczos), a manifest
    (origin, sha256 of original and final, curator, time, criteria, rationale), the audit log
    and every decision. Refuses an incomplete grid unless --allow-incomplete."""
    from acrb.curation.finalize import finalize

    result = finalize(_store(workdir, None, create=False), out, size=size,
                      allow_incomplete=allow_incomplete, curator=curator)
    typer.echo(f"finalize: {result.images} images -> {result.folder} (manifest {result.manifest}"
               f", audit head {result.audit_head[:16]})")
    if result.missing:
        typer.secho(f"finalize: {len(result.missing)} cell(s) missing: "
                    + ", ".join(result.missing), fg=typer.colors.YELLOW, err=True)
    typer.echo(f"next: `dvc add {out}` so the pipeline tracks this exact set, then `dvc repro`")


review = typer.Typer(
    name="review",
    help="Human review of judged outputs: load the review set, add raters, serve the rating "
    "app, follow progress, verify the audit log, export the ratings to inputs/review/. The "
    "review folder (--workdir, default `review-work`) holds review.sqlite and the "
    "hash-chained audit.jsonl.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
app.add_typer(review)
ReviewWorkdirOption = Annotated[
    Path, typer.Option("--workdir", "-w", help="review folder (database and audit log)")
]
DEFAULT_REVIEW_WORKDIR = Path("review-work")


def _review_store(workdir: Path):
    from acrb.review.store import ReviewStore

    return ReviewStore(workdir)


@review.command("init")
@_reports_errors
def review_init(
    workdir: ReviewWorkdirOption = DEFAULT_REVIEW_WORKDIR,
    review_set: Annotated[Path, typer.Option("--set", help="the review set to rate "
                                             "(ReviewItemRecord rows; image paths relative "
                                             "to the project root)")] = Path(
                                                 "data/review/set/items.parquet"),
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Create the review folder and load the review set, recording its sha256. Reads k
    (`review.raters_per_item`), `review.repeat_fraction` and `review.age_question` (change or
    direction) from params; the folder keeps them, so later changes to params do not reshuffle
    or reword a review under way. The project root (where the set's image paths start) is
    the folder of the params file. Running it again with the same set changes nothing."""
    from acrb.config import load_params
    from acrb.review.store import ReviewStore

    loaded, _ = load_params(params)
    store = ReviewStore(workdir, create=True,
                        raters_per_item=loaded.review.raters_per_item,
                        repeat_fraction=loaded.review.repeat_fraction,
                        age_question=loaded.review.age_question)
    added = store.load_set(review_set, params.resolve().parent)
    info = store.set_info()
    typer.echo(f"review: {workdir} rates {review_set} (sha256 {info['sha256'][:16]}; "
               f"{added} items added) with k={store.raters_per_item}, repeat fraction "
               f"{store.repeat_fraction}, age question {store.age_question}")
    typer.echo("next: `acrb review add-rater NAME` for each rater, then `acrb review serve`")


@review.command("add-rater")
@_reports_errors
def review_add_rater(
    name: Annotated[str, typer.Argument(help="a pseudonym for the rater (e.g. r01), never a "
                                        "name or e-mail: it goes into the exported ratings")],
    workdir: ReviewWorkdirOption = DEFAULT_REVIEW_WORKDIR,
    replace_token: Annotated[bool, typer.Option(help="issue a new token for an existing "
                                                "rater (the old one stops working)")] = False,
) -> None:
    """Add a rater and print their login token. The token is shown once and stored only as
    a hash; give it to that person alone."""
    store = _review_store(workdir)
    token = store.replace_token(name) if replace_token else store.add_rater(name)
    typer.echo(f"rater {name}: token (shown once, keep it secret):\n{token}")


@review.command("serve")
@_reports_errors
def review_serve(
    workdir: ReviewWorkdirOption = DEFAULT_REVIEW_WORKDIR,
    host: Annotated[str, typer.Option(help="address to listen on; keep 127.0.0.1 unless "
                                      "raters reach it through an authenticated tunnel")
                    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8766,
    trusted_proxy: Annotated[list[str] | None, typer.Option(
        "--trusted-proxy", help="address of a reverse proxy in front of the tool whose "
        "X-Forwarded-For / X-Forwarded-Proto headers are believed (repeat for several); by "
        "default none are, so logins are throttled per connecting address")] = None,
) -> None:
    """Run the rating app: each rater logs in with their token and rates one item after
    another (source, output(s), instruction; never the judges' scores, the model or the
    group labels), with keys 1-5, 0 for cannot tell, Enter to save. Every rating is appended
    to the audit log. Stop with Ctrl-C; raters resume where they were. Warns when fewer
    raters are registered than `review.raters_per_item` (no item can be complete)."""
    from acrb.web.serving import require_web_extra

    require_web_extra("acrb review serve", "review")
    from acrb.review.web import serve
    from acrb.web.serving import exposure_warning

    store = _review_store(workdir)
    check = store.verify()
    if not check.ok:
        raise AcrbError(f"the audit log does not verify: {check.message()}",
                        check.fix or "restore audit.jsonl from a backup before rating further")
    if not store.set_info()["sha256"]:
        raise AcrbError(f"{workdir} has no review set", "load one: acrb review init --set PATH")
    if not store.raters():
        raise AcrbError(f"{workdir} has no raters", "add one: acrb review add-rater NAME")
    for warning in (exposure_warning(host), store.too_few_raters()):
        if warning:
            typer.secho(warning, fg=typer.colors.YELLOW, err=True)
    typer.echo(f"review: serving {workdir} on http://{host}:{port}/ (Ctrl-C to stop)")
    serve(store, host=host, port=port, trusted_proxies=trusted_proxy or ())


@review.command("status")
@_reports_errors
def review_status(workdir: ReviewWorkdirOption = DEFAULT_REVIEW_WORKDIR) -> None:
    """Progress of the review: ratings done of items x k, items rated by all k raters,
    repeats, and each rater's count; the audit log's length and head."""
    from acrb.review.store import describe

    store = _review_store(workdir)
    for line in describe(store.progress()):
        typer.echo(line)
    seq, head = store.head()
    typer.echo(f"audit log {seq} entries, head {head[:16]}")


@review.command("verify")
@_reports_errors
def review_verify(
    path: Annotated[Path, typer.Argument(help="a review folder, or a finalized export "
                                         "(checked against its manifest's head hash)")
                    ] = DEFAULT_REVIEW_WORKDIR,
    resolve: ResolveOption = False,
    by: ResolveByOption = "",
) -> None:
    """Check the audit log's hash chain and that it ends at the head the database (or the
    manifest) recorded. Exit 0 if intact; exit 1 naming the first line that was edited,
    removed or inserted, any line past the recorded head, or lines set aside from past it
    that nobody has resolved yet. In a review folder the ratings table must hold exactly
    the ratings the log records (a rating edited, deleted or added in the database is
    named); in an export every file must match the sha256 its manifest lists."""
    from acrb.review import finalize, store

    if (path / store.DATABASE).exists() or not (path / finalize.MANIFEST).exists():
        _verify_audit(path, store.DATABASE, store.AUDIT_LOG, finalize.MANIFEST,
                      lambda: _review_store(path), finalize.read_manifest,
                      "a review folder nor a finalized export", resolve=resolve, by=by)
        return
    if resolve:
        raise AcrbError(f"{path} is a finalized export: there is nothing to resolve",
                        "run --resolve on the tool's working folder")
    check = finalize.verify_export(path)
    if check.ok:
        typer.echo(f"ok: {check.message()}")
        for note in check.notes:
            typer.echo(f"ok: {note}")
        return
    typer.secho(f"FAILED: {check.message()}", fg=typer.colors.RED, err=True)
    if check.fix:
        typer.secho(f"  fix: {check.fix}", err=True)
    raise typer.Exit(code=1)


@review.command("finalize")
@_reports_errors
def review_finalize(
    workdir: ReviewWorkdirOption = DEFAULT_REVIEW_WORKDIR,
    out: Annotated[Path, typer.Option(help="where the export goes (read by the review stage "
                                      "with review.ratings: inputs)")] = Path("inputs/review"),
) -> None:
    """Export the ratings (RatingRecord rows, origin app) to ratings.parquet and ratings.csv,
    the items rated to items.parquet (ReviewItemRecord rows), with the audit log and a
    manifest holding its head hash and each file's sha256. Refuses a log that does not
    verify or a ratings table that disagrees with it. The files are swapped in only once all
    are written, so a failed export leaves the previous one intact."""
    from acrb.review.finalize import finalize

    store = _review_store(workdir)
    result = finalize(store, out)
    typer.echo(f"finalize: {result.ratings} ratings of {result.items} items by "
               f"{result.raters} raters -> {result.folder} (audit head "
               f"{result.audit_head[:16]})")
    warning = store.too_few_raters()
    if warning:
        typer.secho(warning, fg=typer.colors.YELLOW, err=True)
    typer.echo(f"next: `dvc add {out}` (or commit it as a DVC-tracked input), then "
               "`dvc repro` with review.ratings: inputs")


@review.command("sample")
@_reports_errors
@_logs_to_mlflow
def review_sample(params: ParamsOption = Path("params.yaml")) -> None:
    """The `review_set` stage: draw the review set. A stratified random sample of
    `review.sample_size` judged outputs (model, race, gender and age proportions kept, every
    prompt covered; seed `review.seed`) plus, with `review.include_needs_review`, every output
    the judges disagreed on. Reads data/plan, data/generations, data/scores; writes
    data/review/set/ (items.parquet, summary.json)."""
    from acrb.stages import review_set as stage

    summary = stage.run(_context(params))
    typer.echo(f"review sample: {summary.items} items ({summary.random_sample} drawn at random, "
               f"{summary.needs_review_only} more the judges disagreed on); "
               f"{summary.prompts_covered}/{summary.prompts} prompts covered -> {summary.path}")


@review.command("analyze")
@_reports_errors
@_logs_to_mlflow
def review_analyze(params: ParamsOption = Path("params.yaml")) -> None:
    """The `review` stage: agreement between raters, the judges against people, and the
    judge-corrected rates (prediction-powered inference). Ratings from inputs/review/
    (`review.ratings: inputs`) or simulated raters (`review.ratings: simulated`, planted
    noise). Writes data/review/analysis/ and metrics/review/; logs one MLflow run."""
    from acrb.stages import review as stage

    summary = stage.run(_context(params))
    typer.echo(f"review: {summary.ratings} ratings of {summary.items} items by "
               f"{summary.raters} raters ({summary.origin}) -> {summary.out_dir}")


@review.command("import-survey")
@_reports_errors
def review_import_survey(
    export: Annotated[Path, typer.Argument(help="the survey's JSON export: a list of rating "
                                           "records (userId, itemId, ..., edited_* and "
                                           "preserved_* scores)")],
    out: Annotated[Path, typer.Option(help="where the ratings go (read by the review stage "
                                      "with review.ratings: inputs)")] = Path("inputs/review"),
    scales: Annotated[Path | None, typer.Option(
        help="YAML declaring each survey axis's scale and the ACRB axis it is read as "
        "(default: the study's survey; see docs/review.md)")] = None,
) -> None:
    """Import an existing survey's export as ratings: items.parquet and ratings.parquet in
    OUT (rater ids pseudonymised; `preserved_` scores are the feature-prompt output; every
    axis read through its declared scale). A bad record is refused, naming its index and
    field; an axis without a declared scale, or one ACRB cannot map, is refused."""
    from acrb.review.survey import write_survey

    written = write_survey(export, out, scales)
    typer.echo(f"import-survey: {export} -> {written}")
    typer.echo(f"next: `dvc add {out}`, then `dvc repro` with review.ratings: inputs")


@app.command("models")
def list_models() -> None:
    """List what params can name, one row per registry entry: editors (`models.<name>.key`)
    and chat backends (`prompts.synthesis.backends.<name>.kind`), with each entry's import
    target, the extra it needs (`pip install -e ".[EXTRA]"`) and whether it is importable
    here (checked without importing any adapter). Other packages add entries through the
    entry-point groups shown."""
    from acrb.registry import REGISTRIES

    rows = [("KIND", "KEY", "TARGET", "EXTRA", "IMPORTABLE")]
    for registry in REGISTRIES:
        for entry in registry.entries():
            missing = registry.missing_modules(entry.key)
            if missing:
                importable = "no (needs " + ", ".join(missing) + ")"
            else:
                importable = "yes" if registry.is_available(entry.key) else "no"
            rows.append((registry.kind, entry.key, entry.target, entry.extra or "-", importable))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        padded = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        typer.echo("  ".join([*padded, row[-1]]))
    groups = ", ".join(f"{r.group} ({r.kind})" for r in REGISTRIES)
    typer.echo(f"\nentry-point groups: {groups}")


@app.command("mlflow-url")
@_reports_errors
def mlflow_url(
    params: ParamsOption = Path("params.yaml"),
    base: Annotated[str | None, typer.Option(
        help="where the MLflow UI is served (default: MLFLOW_TRACKING_URI when it is a "
             "server, else http://127.0.0.1:5000, where `mlflow ui` listens)")] = None,
) -> None:
    """Print the MLflow UI address of this project's runs: the experiment of params'
    profile, its pipeline runs with every model's Δ as columns (the view the `analyze` stage
    shares). Before any run is logged, the experiments list, with the reason on stderr."""
    from acrb.config import load_params
    from acrb.tracking import runs_address
    from acrb.tracking_queue import wait_for_queue

    loaded, _ = load_params(params)
    root = params.resolve().parent
    try:  # the runs the stages queued, in the store before its address is read
        wait_for_queue(root, timeout=120)
    except AcrbError as exc:  # printing an address must never stop `make repro`
        typer.echo(f"mlflow-url: {exc.problem}", err=True)
    address, why = runs_address(loaded.profile.name, base, root)
    if why:
        typer.echo(f"mlflow-url: {why}", err=True)
    typer.echo(address)


@app.command("mlflow-sync")
@_reports_errors
def mlflow_sync(
    timeout: Annotated[float, typer.Option(
        help="seconds to wait for the queued runs before giving up")] = 600.0,
) -> None:
    """Log every MLflow run the stages queued, and wait until they are in the store. The
    stages hand their runs to a logging process through a queue
    (.acrb-cache/mlflow-queue/), so a `dvc repro` may end a few seconds before its last runs
    are logged; `make repro` runs this after it. A run that could not be logged (a store
    that cannot be opened or written) is kept in the queue's failed/ folder and stops the next
    stage with the error and its fix: once fixed, this logs it. Exits non-zero with the error
    when a run still cannot be logged."""
    from acrb.tracking_queue import queue_folder, sync

    waited = sync(timeout=timeout)
    typer.echo(f"mlflow-sync: every queued run is logged ({waited} waited for here; queue: "
               f"{queue_folder()})")


def main() -> None:  # pragma: no cover
    sys.exit(app())
