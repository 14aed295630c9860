"""Stage `report`: one self-contained HTML report from the analysis outputs.

Reads data/analysis/<model>/ and the figures under plots/figures/; writes reports/report.html
(figures inline, no external resources, labelled SIMULATION when any model is simulated) and
logs it to MLflow.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from acrb import layout
from acrb.analysis.report import render_report
from acrb.stages.analyze import load_section
from acrb.stages.context import StageContext
from acrb.tracking import git_state, stage_run


def run(ctx: StageContext) -> Path:
    sections = [load_section(ctx, model) for model in ctx.params.models]
    simulated = ctx.params.profile.simulation or any(s.simulated for s in sections)
    run_info = {
        "profile": ctx.profile,
        "git_commit": git_state(ctx.root)["git_commit"],
        "params_hash": ctx.params_hash,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    with stage_run("report", profile=ctx.profile, params_hash=ctx.params_hash,
                   simulated=simulated) as tracker:
        path = render_report(
            sections, run_info, ctx.path(layout.REPORT_FILE), simulated,
            simultaneous_intervals=ctx.params.analyze.simultaneous_intervals,
        )
        tracker.log_artifact(path)
    return path
