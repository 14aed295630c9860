"""The PNG plots of plots/delta.csv and plots/rates.csv: :func:`write_dvc_plots` draws them in
order and removes those of outcomes gone; :func:`dvc_plot_jobs` hands out the same drawing as
separate calls (for a pool of processes) and :func:`remove_stale_plots` removes the rest."""

from __future__ import annotations

import pickle
from pathlib import Path

import pandas as pd

from acrb.analysis.outputs.dvc_plots import dvc_plot_jobs, remove_stale_plots, write_dvc_plots


def _tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    deltas = pd.DataFrame([
        {"model": m, "outcome": o, "cell": f"{c}/race", "category": c, "dimension": "race",
         "delta": 0.05 + 0.01 * i, "ci_low": 0.01, "ci_high": 0.1 + 0.01 * i,
         "max_group": "Black", "min_group": "White", "p_adjusted": 0.02, "flagged": i % 2 == 0}
        for i, (m, o, c) in enumerate((m, o, c) for m in ("a", "b")
                                      for o in ("hard_refusal", "erasure") for c in ("all", "A"))])
    rates = pd.DataFrame([
        {"model": m, "outcome": o, "category": "all", "group": f"race:{g}", "n": 40, "k": k,
         "rate": k / 40, "ci_low": max(k / 40 - 0.1, 0), "ci_high": k / 40 + 0.1}
        for m in ("a", "b") for o in ("hard_refusal", "erasure")
        for k, g in ((4, "Black"), (9, "White"))])
    return deltas, rates


def test_the_jobs_draw_what_write_dvc_plots_draws(tmp_path: Path) -> None:
    deltas, rates = _tables()
    written = write_dvc_plots(deltas, rates, tmp_path / "at-once")
    assert [p.relative_to(tmp_path / "at-once").as_posix() for p in written] == [
        "delta/hard_refusal.png", "delta/erasure.png", "rates/hard_refusal.png",
        "rates/erasure.png"]
    jobs = dvc_plot_jobs(deltas, rates, tmp_path / "jobs")
    drawn = [pickle.loads(pickle.dumps(job))() for job in jobs]  # as a pool process gets it
    assert [p.relative_to(tmp_path / "jobs") for p in drawn] == [
        p.relative_to(tmp_path / "at-once") for p in written]
    for one, other in zip(written, drawn, strict=True):
        assert one.read_bytes() == other.read_bytes()


def test_plots_of_outcomes_gone_are_removed(tmp_path: Path) -> None:
    deltas, rates = _tables()
    write_dvc_plots(deltas, rates, tmp_path)
    fewer = [draw() for draw in dvc_plot_jobs(deltas[deltas["outcome"] == "erasure"],
                                              rates[rates["outcome"] == "erasure"], tmp_path)]
    remove_stale_plots(tmp_path, fewer)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.png")) == [
        "delta/erasure.png", "rates/erasure.png"]
