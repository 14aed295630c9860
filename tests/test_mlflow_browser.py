"""The MLflow UI in a real browser, opened as a person opens it after `make repro`.

A small store is logged through the functions the stages call (`tracking.stage_run`, the
`analyze` stage's model runs with what they log on the pipeline's parent run and the shared
runs view), served by `mlflow server` on a free port, and opened in headless Chromium (Debian's
`chromium`, driven by Playwright) at the address `acrb mlflow-url` prints. In a desktop window,
with no click, the parent run's row shows both simulated editors' Δ refusal, each column's name
whole, and one click unfolds the stage runs, whose names are whole too; in a laptop window the
one click closes the UI's Assistant panel. Screenshots go to the test's tmp dir.

Skips, saying why, where no Chromium executable or no Playwright is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acrb import tracking
from tests.live_server import CHROMIUM
from tests.servers import MLFLOW_SERVER_ENV, free_port, stop, wait_for

pytestmark = [pytest.mark.browser]
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (pip install -e '.[dev]')")

PROFILE = "embedded-default"
#: Δ refusal of the two simulated editors on the default run (the issue's numbers).
DELTA_REFUSAL = {"synthetic-fair": 0.03, "synthetic-biased": 0.092}
MLFLOW = Path(sys.executable).parent / "mlflow"


def model_metrics(delta: float) -> dict[str, float]:
    """The analyze stage's flat metrics of one model, in its shape (a few of each kind)."""
    return {"delta_refusal": delta, "delta_refusal.race": delta,
            "delta_refusal.race.ci_low": round(delta / 2, 6),
            "delta_refusal.race.ci_high": round(delta * 2, 6), "delta_refusal.gender": 0.01,
            "delta_erasure": round(delta + 0.01, 6), "delta_lightening": round(delta / 3, 6),
            "flagged.refusal": 1.0, "flagged.erasure": 0.0, "flagged.lightening": 0.0,
            "refusal_rate.race.Black": 0.1, "requests.total": 840.0, "requests.error": 0.0,
            "requests.missing": 0.0}


def log_audit(root: Path) -> None:
    """One pipeline run's MLflow runs in ``root``'s store, as the stages log them: the stage
    runs, then each model's ``analyze`` run, which logs its headline on itself and on the
    parent, and (the first) the shared runs view (see ``acrb.stages.analyze.run``)."""
    metrics = {model: model_metrics(delta) for model, delta in DELTA_REFUSAL.items()}
    common: dict[str, Any] = {"profile": PROFILE, "params_hash": "browser", "simulated": True}
    for stage in ("sources", "prompts", "plan"):
        with tracking.stage_run(stage, **common):
            pass
    for model in metrics:
        for stage in ("generate", "evaluate", "judge"):
            with tracking.stage_run(stage, model=model, **common):
                pass
    on_parent = {model: tracking.parent_headline(model, m) for model, m in metrics.items()}
    view = tracking.runs_view_columns(name for head in on_parent.values() for name in head)
    for i, (model, m) in enumerate(metrics.items()):
        with tracking.stage_run("analyze", model=model, **common) as tracker:
            tracker.log_model_analysis(m, root / "data" / "analysis" / model, [], model)
            tracker.log_on_parent(on_parent[model])
            if i == 0:
                tracker.share_runs_view(view, on_parent)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(the address `acrb mlflow-url` gives for a UI served on a free port, the project)."""
    if not MLFLOW.exists():
        pytest.skip(f"no mlflow command beside {sys.executable}")
    root = tmp_path_factory.mktemp("mlflow-ui") / "project"
    root.mkdir()
    (root / "dvc.yaml").write_text("stages: {}\n")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("MLFLOW_TRACKING_URI", "ACRB_PIPELINE_RUN", "DVC_EXP_NAME",
                     "DVC_EXP_BASELINE_REV"):
            patch.delenv(name, raising=False)
        patch.setenv("ACRB_MLFLOW", "1")
        patch.chdir(root)
        log_audit(root)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(MLFLOW_SERVER_ENV)
    with (root / "mlflow-server.log").open("wb") as log:
        server = subprocess.Popen(
            [str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port),
             "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(f"{base}/health", server)
        address, why = tracking.runs_address(PROFILE, base, root)
        assert why is None, why
        yield address, root
    finally:
        stop(server)


# Whether the text of ``el`` shows whole: no element from it up to its table cell cuts it
# (overflow, ellipsis), the text lies inside the cell, and the cell inside the table's visible
# part (the grid scrolls sideways; the Assistant panel beside it narrows it).
WHOLE = """el => {
  const cell = el.closest('.ag-cell, .ag-header-cell');
  if (!cell) return 'not in a table cell';
  for (let node = el; node && node !== cell; node = node.parentElement) {
    if (node.scrollWidth > node.clientWidth + 1) return 'cut: ' + node.className;
  }
  const range = document.createRange();
  range.selectNodeContents(el);
  const text = range.getBoundingClientRect(), box = cell.getBoundingClientRect();
  const grid = el.closest('.ag-root').querySelector('.ag-body-viewport').getBoundingClientRect();
  if (text.left < box.left - 1 || text.right > box.right + 1) return 'text outside its cell';
  if (box.left < grid.left - 1 || box.right > grid.right + 1) return 'cell outside the table';
  if (box.right > window.innerWidth) return 'cell outside the window';
  return 'whole';
}"""


def whole(within: Any, text: str) -> str:
    """``WHOLE`` of the one element under the locator ``within`` whose text is ``text``."""
    found = within.get_by_text(text, exact=True)
    sync_api.expect(found).to_have_count(1)
    return str(found.evaluate(WHOLE))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium refuses root otherwise
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield chromium
        chromium.close()


def open_runs(browser: Any, address: str, viewport: dict[str, int]) -> tuple[Any, Any, Any]:
    """A fresh browser's page at ``address``, once the parent row shows; (page, the rows, the
    run name cells)."""
    page = browser.new_context(viewport=viewport).new_page()
    page.goto(address)
    rows = page.locator(".ag-row")  # each row: its left (pinned) and middle parts
    sync_api.expect(rows.locator('[col-id="metrics.`synthetic-biased.delta_refusal`"]')
                    ).to_have_text("0.092", timeout=60_000)
    return page, rows, page.locator('.ag-row [col-id="attributes.`Run Name`"]')


def delta_refusal_shown(page: Any, rows: Any) -> None:
    """Both models' Δ refusal, value and column name, show whole on the pipeline's row."""
    for model, delta in DELTA_REFUSAL.items():
        column = f"metrics.`{model}.delta_refusal`"
        header = page.locator(f'.ag-header-cell[col-id="{column}"]')
        assert whole(header, f"{model}.delta_refusal") == "whole", model
        assert whole(rows.locator(f'[col-id="{column}"]'), f"{delta:g}") == "whole", model


def test_the_address_shows_each_models_delta_refusal_on_the_pipeline_row(
        served: tuple[str, Path], browser: Any, tmp_path: Path) -> None:
    """A common desktop window (1920 x 1080): no click; then one unfolds the stage runs."""
    address, _ = served
    assert address.endswith(f"/runs?viewStateShareKey={tracking.RUNS_VIEW_KEY}")
    page, rows, names = open_runs(browser, address, {"width": 1920, "height": 1080})
    page.screenshot(path=str(tmp_path / "mlflow-runs.png"))
    sync_api.expect(names).to_have_count(1)  # the one pipeline run, its stage runs folded
    parent = names.locator("a").inner_text()
    assert parent.startswith("pipeline ")
    assert whole(names, parent) == "whole"
    delta_refusal_shown(page, rows)

    names.locator("button").click()  # the one click: unfold the stage runs
    sync_api.expect(names).to_have_count(1 + 3 + 4 * len(DELTA_REFUSAL))  # 4 stages a model
    page.screenshot(path=str(tmp_path / "mlflow-runs-unfolded.png"))
    for name in ("analyze/synthetic-biased", "generate/synthetic-biased",
                 "evaluate/synthetic-fair", "judge/synthetic-fair", parent):
        assert whole(names, name) == "whole", name
    assert (tmp_path / "mlflow-runs.png").stat().st_size > 5_000


def test_on_a_laptop_one_click_closes_the_assistant_and_both_show(
        served: tuple[str, Path], browser: Any, tmp_path: Path) -> None:
    """A common laptop window (1366 x 768): the UI opens its Assistant panel beside the table
    on a first visit, which hides the second column; closing it is the one click."""
    address, _ = served
    page, rows, _ = open_runs(browser, address, {"width": 1366, "height": 768})
    close = page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]')
    clicks = 0
    if close.count():
        close.click()
        clicks += 1
        sync_api.expect(close).to_have_count(0)
    page.screenshot(path=str(tmp_path / "mlflow-runs-laptop.png"))
    delta_refusal_shown(page, rows)
    assert clicks <= 2


def test_the_parent_run_holds_each_models_headline(served: tuple[str, Path]) -> None:
    """What the row shows is what the model runs logged, under ``<model>.<name>``."""
    import mlflow

    _, root = served
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(tracking.experiment_name(PROFILE))
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.data.tags["acrb.stage"] == tracking.PARENT_STAGE)
    for run in runs:
        if run.data.tags["acrb.stage"] != "analyze":
            continue
        model = run.data.tags["acrb.model"]
        for name in tracking.PARENT_HEADLINE:
            assert parent.data.metrics[f"{model}.{name}"] == run.data.metrics[name]
    assert parent.data.metrics["synthetic-biased.delta_refusal"] == 0.092
