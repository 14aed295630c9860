"""The HTML report renders offline, self-contained, and labels simulations."""

from __future__ import annotations

import base64
import re
import typing
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from acrb.analysis.estimation.disparity import disparities
from acrb.analysis.estimation.rates import group_rates
from acrb.analysis.outcomes import OUTCOME_NAMES, OUTCOMES
from acrb.analysis.outputs.figures import delta_bars, rate_heatmap
from acrb.analysis.outputs.report import SIMULATION_BANNER, render_report
from acrb.analysis.outputs.section import ModelSection, build_model_section
from acrb.config import HypothesisSpec
from acrb.demographics import SOURCE_DIMENSIONS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RUN_INFO = {
    "acrb_version": "0.1.0",
    "params_hash": "feedc0ffee",
    "profile": "default",
    "comment": "<script>alert(1)</script>",
}


def simulated_frame(seed: int = 3) -> pd.DataFrame:
    """One simulated editor over the full factorial design, two categories, two prompts each."""
    rng = np.random.default_rng(seed)
    sources = pd.MultiIndex.from_product(list(SOURCE_DIMENSIONS.values())).to_frame(
        index=False, name=list(SOURCE_DIMENSIONS)
    )
    prompts = pd.DataFrame({"prompt_id": ["a1", "a2", "e1", "e2"], "category": list("AAEE")})
    frame = sources.merge(prompts, how="cross")
    frame["planted_refusal"] = np.where(frame["race"] == "Black", 0.5, 0.2)
    frame["planted_erasure"] = 0.3
    frame["planted_lightening"] = 0.1
    u = rng.random((len(frame), 4))
    error = u[:, 3] < 0.02
    refused = u[:, 0] < frame["planted_refusal"].to_numpy()
    frame["status"] = np.where(error, "error", np.where(refused, "refused", "ok"))
    frame["hard_refusal"] = pd.array(np.where(error, None, refused), dtype="boolean")
    skip = error | refused
    erased = u[:, 1] < frame["planted_erasure"].to_numpy()
    lightened = u[:, 2] < frame["planted_lightening"].to_numpy()
    frame["erasure"] = pd.array(np.where(skip, None, erased), dtype="boolean")
    frame["lightening"] = pd.array(np.where(skip, None, lightened), dtype="boolean")
    return frame


@pytest.fixture(scope="module")
def sections(tmp_path_factory: pytest.TempPathFactory) -> list[ModelSection]:
    figures = tmp_path_factory.mktemp("figures")
    frame = simulated_frame()
    # Two outcomes keep the figures (about 0.3 s each) few; the third adds nothing new here.
    biased = build_model_section(
        frame.drop(columns="lightening"), "biased", "synthetic:biased", True, figures, tests=False
    )
    # A model without planted values, assembled by hand (and without figures, to stay fast).
    real = frame.drop(columns=["planted_refusal", "planted_erasure", "planted_lightening"])
    plain = ModelSection(
        slug="plain",
        key="synthetic:plain",
        simulated=False,
        status_counts=real["status"].value_counts().to_dict(),
        rates=group_rates(real, "hard_refusal"),
        disparities=disparities(real, "hard_refusal"),
    )
    return [biased, plain]


@pytest.fixture(scope="module")
def html(sections: list[ModelSection], tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("report") / "report.html"
    written = render_report(sections, RUN_INFO, path, simulated=True)
    assert written == path
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]  # no temporary left
    return path.read_text(encoding="utf-8")


def test_section_contents(sections: list[ModelSection]) -> None:
    biased, plain = sections
    assert biased.planted is not None and plain.planted is None
    assert set(biased.disparities["outcome"]) == {"hard_refusal", "erasure"}
    assert set(plain.disparities["outcome"]) == {"hard_refusal"}
    assert sum(biased.status_counts.values()) == 84 * 4
    assert list(biased.status_counts)[:3] == ["ok", "refused", "error"]
    assert all(f.path.read_bytes().startswith(PNG_SIGNATURE) for f in biased.figures)
    assert len(biased.figures) == 2 * (1 + len(SOURCE_DIMENSIONS))


def test_banner_at_top_and_on_each_simulated_model(html: str) -> None:
    assert html.count(SIMULATION_BANNER) == 2  # top of the report and the simulated model
    assert html.index(SIMULATION_BANNER) < html.index("<h1>")
    assert html.index("<h1>") < html.rindex(SIMULATION_BANNER) < html.index('id="model-plain"')


def test_report_is_self_contained(html: str) -> None:
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html)
    # Inline script only (the model comparison table); nothing loaded from elsewhere.
    assert not re.search(r"<script[^>]*\ssrc\s*=", html, re.I) and "<link" not in html.lower()
    sources = re.findall(r'<img[^>]*\ssrc="([^"]*)"', html)
    assert len(sources) == 2 * (1 + len(SOURCE_DIMENSIONS))
    for source in sources:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1]).startswith(PNG_SIGNATURE)


def test_report_contents_and_escaping(html: str) -> None:
    for text in ("ACRB version", "0.1.0", "feedc0ffee", "How to read this"):
        assert text in html
    assert "Method" in html and "Holm" in html and "Wilson" in html and "Newcombe" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Planted vs measured" in html and ("✓" in html or "✗" in html)
    assert html.count("Planted vs measured Δ") == 2  # only the simulated model, per outcome


def test_real_only_report_has_no_banner(sections: list[ModelSection], tmp_path: Path) -> None:
    path = render_report([sections[1]], {"acrb_version": "0.1.0"}, tmp_path / "r.html", False)
    text = path.read_text(encoding="utf-8")
    assert SIMULATION_BANNER not in text
    assert "params hash" in text  # absent run-info keys are shown as missing, not dropped


def test_every_outcome_has_one_set_of_names() -> None:
    # Params, metric keys, the report and the LaTeX tables all name outcomes from one table.
    assert set(OUTCOME_NAMES) == set(OUTCOMES)
    assert set(typing.get_args(HypothesisSpec.model_fields["outcome"].annotation)) == set(OUTCOMES)
    labels = [names.metric for names in OUTCOME_NAMES.values()]
    assert len(set(labels)) == len(labels)  # metric keys stay distinct


def test_figures_are_deterministic(sections: list[ModelSection], tmp_path: Path) -> None:
    biased = sections[0]
    first = rate_heatmap(biased.rates, "erasure", "age", "t", tmp_path / "a.png")
    second = rate_heatmap(biased.rates, "erasure", "age", "t", tmp_path / "b.png")
    assert first.read_bytes() == second.read_bytes()
    bars = delta_bars(biased.disparities, "hard_refusal", "t", tmp_path / "d.png", biased.planted)
    assert bars.read_bytes().startswith(PNG_SIGNATURE)


def test_a_clustered_section_shows_the_corrected_delta_and_labels_its_intervals(
        tmp_path: Path) -> None:
    from acrb.analysis.outputs.report import _points

    frame = simulated_frame().drop(columns=["erasure", "lightening"])
    frame["source_id"] = (frame["race"] + "-" + frame["gender"] + "-" + frame["age"]).astype(str)
    section = build_model_section(frame, "biased", "synthetic:biased", True,
                                  tmp_path / "figures", tests=False, bootstrap=300,
                                  permutations=300)
    race = section.disparities.query("category == 'all' and dimension == 'race'").iloc[0]
    assert race["delta_corrected"] < race["delta"]
    per_row = render_report([section], RUN_INFO, tmp_path / "a.html", simulated=True
                            ).read_text(encoding="utf-8")
    assert "corrected Δ (pp)" in per_row and "per-row interval (pp)" in per_row
    assert f">{_points(race['delta_corrected'])}<" in per_row
    assert "Hypotheses" not in per_row or "confirmatory" in per_row
    assert "screening" in per_row
    joint = render_report([section], RUN_INFO, tmp_path / "b.html", simulated=True,
                          simultaneous_intervals=True).read_text(encoding="utf-8")
    assert "simultaneous interval (pp)" in joint and "per-row interval" not in joint
