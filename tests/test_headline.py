"""The headline metrics (valid JSON, Δ by dimension with interval, verdicts), the detailed metrics
kept beside them, the report's findings sentences, and the DVC plots offline."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from acrb.analysis.outputs.dvc_plots import write_dvc_plots
from acrb.analysis.outputs.findings import disparity_sentence, hypothesis_sentence
from acrb.analysis.outputs.headline import (
    headline_files,
    read_detailed_metrics,
    write_detailed_metrics,
    write_headline,
)
from tests.conftest import REPO

BIN = Path(sys.executable).parent


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} in a metrics file")


def _gaps() -> pd.DataFrame:
    rows = []
    for outcome, race in (("hard_refusal", 0.31), ("erasure", math.nan)):
        for category in ("all", "A"):
            rows.append({"outcome": outcome, "category": category, "dimension": "race",
                         "delta": race, "ci_low": 0.12, "ci_high": 0.5,
                         "flagged": outcome == "hard_refusal"})
            rows.append({"outcome": outcome, "category": category, "dimension": "gender",
                         "delta": 0.02, "ci_low": -0.0, "ci_high": 0.08, "flagged": False})
    return pd.DataFrame(rows)


def test_headline_is_valid_json_with_delta_by_dimension_and_verdicts(tmp_path: Path) -> None:
    frame = pd.DataFrame({"status": ["ok", "ok", "error", "missing"]})
    hypotheses = pd.DataFrame({"hypothesis": ["H1", "H2", "H3", "H4", "H5"],
                               "model": ["m", "other", "other, m", "m", "other, m"],
                               "supported": [True, True, None, False, True]})
    files = headline_files({"m": (frame, _gaps(), "i2i")}, hypotheses)
    assert set(files) == {Path("m/refusal.json"), Path("m/erasure.json"), Path("m/summary.json")}
    write_headline(tmp_path, files)
    read = {p.relative_to(tmp_path): json.loads(p.read_text(), parse_constant=_no_constant)
            for p in tmp_path.rglob("*.json")}
    # Pooled over categories, per dimension; flagged counts every category.
    assert read[Path("m/refusal.json")] == {
        "flagged": 2, "race": 0.31, "race_lb": 0.12, "race_ub": 0.5,
        "gender": 0.02, "gender_lb": 0.0, "gender_ub": 0.08}
    assert read[Path("m/erasure.json")]["race"] is None  # NaN is written as null
    # The hypotheses about m that are supported (H2 is another model's; H3 undecided, H4 not).
    assert read[Path("m/summary.json")] == {"requests": 4, "errors": 1, "missing": 1,
                                            "supported": "H1 H5"}
    none = headline_files({"m": (frame, _gaps(), "i2i")}, hypotheses.iloc[1:4])
    assert none[Path("m/summary.json")]["supported"] == "none"
    # A model no longer analysed leaves nothing behind.
    write_headline(tmp_path, {Path("n/summary.json"): {"requests": 1}})
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*.json")] == [
        Path("n/summary.json")]


def test_detailed_metrics_round_trip(tmp_path: Path) -> None:
    metrics = {"delta_refusal": 0.123456, "requests.total": 4200.0, "scs.B": math.nan}
    write_detailed_metrics(metrics, tmp_path / "metrics.csv")
    back = read_detailed_metrics(tmp_path / "metrics.csv")
    assert back["delta_refusal"] == 0.123456 and back["requests.total"] == 4200.0
    assert math.isnan(back["scs.B"]) and list(back) == sorted(metrics)


def test_findings_sentences_give_flagged_gaps_with_their_numbers() -> None:
    text = disparity_sentence("biased", _gaps(), simulated=True)
    assert text.startswith("biased (a simulated instrument with planted values")
    assert "2 disparities are flagged" in text
    assert "Δ hard refusal by race pooled over prompt categories 31.0 pp [12.0, 50.0]" in text
    assert "in prompt category A" in text
    fair = _gaps().assign(flagged=False)
    assert "no disparity is flagged" in disparity_sentence("fair", fair, simulated=False)
    hypotheses = pd.DataFrame({"hypothesis": ["H1", "H2"], "model": ["m", "m"],
                               "supported": [True, False]})
    assert hypothesis_sentence("m", hypotheses) == (
        "Hypotheses supported for m: H1; not supported: H2.")
    assert hypothesis_sentence("x", hypotheses) == ""


def _plots_tables(shift: float = 0.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    deltas = pd.DataFrame([
        {"model": m, "outcome": o, "cell": f"{c}/race", "delta": d + shift, "ci_low": 0.0,
         "ci_high": d + 0.1, "flagged": d > 0.2}
        for m, d in (("fair", 0.03), ("biased", 0.3)) for o in ("hard_refusal", "erasure")
        for c in ("all", "A")])
    rates = pd.DataFrame([
        {"model": m, "outcome": o, "category": "all", "group": f"race:{g}", "rate": r,
         "ci_low": max(r - 0.05, 0), "ci_high": r + 0.05}
        for m, r0 in (("fair", 0.1), ("biased", 0.2)) for o in ("hard_refusal", "erasure")
        for g, r in (("Black", r0 + shift), ("White", r0))])
    return deltas, rates


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _script_sources(html: str) -> list[str]:
    return re.findall(r"<script[^>]*\bsrc=[\"']([^\"']+)", html)


@pytest.fixture
def plots_project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A git + DVC project with the repository's top-level ``plots:`` and the PNGs analyze
    draws, committed once and then redrawn from other numbers (so ``plots diff`` has two)."""
    root = tmp_path / "project"
    root.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
           "DVC_NO_ANALYTICS": "1", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    project_plots = yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"]
    (root / "dvc.yaml").write_text(yaml.safe_dump({"plots": project_plots}))
    _run(["git", "init", "-q"], root, env)
    _run([str(BIN / "dvc"), "init", "-q"], root, env)
    write_dvc_plots(*_plots_tables(), root / "plots")
    _run(["git", "add", "dvc.yaml", "plots", ".dvc"], root, env)
    _run(["git", "commit", "-qm", "first"], root, env)
    write_dvc_plots(*_plots_tables(shift=0.1), root / "plots")
    return root, env


def test_dvc_plots_show_and_diff_need_no_network(plots_project: tuple[Path, dict[str, str]]
                                                 ) -> None:
    root, env = plots_project
    for command, out in ((["show"], "show"), (["diff", "HEAD"], "diff")):
        _run([str(BIN / "dvc"), "plots", *command, "-o", str(root / out)], root, env)
        html = (root / out / "index.html").read_text()
        assert not [s for s in _script_sources(html) if re.match(r"(https?:)?//", s)], html
        assert "vega" not in html.lower()
        images = re.findall(r"<img[^>]*\bsrc=[\"']([^\"']+)", html)
        assert any("delta" in s and "hard_refusal" in s for s in images), images
        assert any("rates" in s and "erasure" in s for s in images), images
        for src in images:
            assert src.startswith("data:") or (root / out / src).exists(), src
    diff = (root / "diff" / "index.html").read_text()
    assert "HEAD" in diff and "workspace" in diff


@pytest.mark.browser
def test_dvc_plots_page_screenshot(plots_project: tuple[Path, dict[str, str]]) -> None:
    from tests.conftest import _chromium

    root, env = plots_project
    _run([str(BIN / "dvc"), "plots", "show", "-o", str(root / "show")], root, env)
    chromium = _chromium()
    assert chromium is not None
    shot = REPO / "build" / "dvc-plots.png"
    shot.parent.mkdir(exist_ok=True)
    shot.unlink(missing_ok=True)
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                    f"--screenshot={shot}", "--window-size=1400,1000",
                    (root / "show" / "index.html").as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert shot.exists() and shot.stat().st_size > 10_000
