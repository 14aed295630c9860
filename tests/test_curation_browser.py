"""End to end in a real browser: headless Chromium (Debian's `chromium`, driven by Playwright)
against a live curation server. A curator logs in, opens a cell, picks a candidate and ticks
the checklist with the keyboard, writes a rationale, selects; rejects another candidate with
the mouse; the grid shows the progress; finalize writes the manifest with those decisions.

Screenshots of the grid and of a cell are saved under ``build/test-artifacts/curation/``.
Skips, saying why, where no Chromium executable or no Playwright is installed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from acrb.cli import app
from acrb.curation.store import CurationStore
from acrb.curation.web import create_app
from tests.conftest import REPO
from tests.curation_fixtures import make_store
from tests.live_server import CHROMIUM, LiveServer

SCREENSHOTS = REPO / "build" / "test-artifacts" / "curation"

pytestmark = [pytest.mark.browser]
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def curation(tmp_path_factory: pytest.TempPathFactory) -> tuple[CurationStore, str]:
    store, tokens = make_store(tmp_path_factory.mktemp("browser"), curators=("alice",), k=3)
    return store, tokens["alice"]


@pytest.fixture(scope="module")
def page(curation: tuple[CurationStore, str]) -> Iterator[tuple[object, str]]:
    store, _ = curation
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium refuses root otherwise
    with LiveServer(create_app(store)) as server, sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        yield context.new_page(), server.url
        context.close()
        browser.close()


def test_a_curator_selects_rejects_and_finalizes(curation: tuple[CurationStore, str],
                                                 page: tuple[object, str],
                                                 tmp_path: Path) -> None:
    store, token = curation
    browser_page, url = page
    p: sync_api.Page = browser_page  # type: ignore[assignment]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    expect = sync_api.expect

    def arrive(address: str) -> None:
        """Wait for the page and its script: a key pressed before app.js runs is lost."""
        expect(p).to_have_url(address)
        p.wait_for_load_state("load")

    p.goto(f"{url}/")
    arrive(f"{url}/login")
    p.fill("input[name=token]", token)
    p.click("button[type=submit]")
    arrive(f"{url}/")
    progress = p.locator("#progress")
    expect(progress).to_have_attribute("data-selected", "0")
    expect(progress).to_have_attribute("data-total", "84")
    p.screenshot(path=str(SCREENSHOTS / "grid-start.png"), full_page=True)

    # Keyboard: `n` opens the first cell without a selection.
    p.keyboard.press("n")
    arrive(f"{url}/cell/Black_Female_20s")
    expect(p.locator("article.card")).to_have_count(3)
    p.keyboard.press("2")
    expect(p.locator("input[name=candidate_id][value=Black_Female_20s_c2]")).to_be_checked()
    p.keyboard.press("a")
    for name in ("frontal_face", "clear_focus", "proper_lighting", "identifiable_features",
                 "neutral_expression", "upright_posture"):
        expect(p.locator(f"input[name={name}]")).to_be_checked()
    p.keyboard.press("/")
    p.keyboard.type("Frontal, sharp, evenly lit; candidate 1 looks away.")
    p.screenshot(path=str(SCREENSHOTS / "cell-before-select.png"), full_page=True)
    p.locator("h1").click()  # out of the text box, so keys act as shortcuts again
    p.keyboard.press("s")
    arrive(f"{url}/cell/Black_Female_30s")  # on to the next open cell

    # Mouse: reject candidate 1 of this cell with a reason; the page stays on the cell.
    p.check("input[name=candidate_id][value=Black_Female_30s_c1]")
    p.uncheck("input[name=frontal_face]")
    p.fill("textarea[name=rationale]", "Head turned to the side.")
    p.click("button[name=action][value=reject]")
    arrive(f"{url}/cell/Black_Female_30s")
    rejected = p.locator("article.card[data-candidate=Black_Female_30s_c1]")
    expect(rejected).to_have_class(re.compile(r"\brejected\b"))
    expect(rejected).to_contain_text("Head turned to the side.")
    p.screenshot(path=str(SCREENSHOTS / "cell-after-reject.png"), full_page=True)

    # A selection with a criterion unticked and no rationale is refused, and says why.
    p.check("input[name=candidate_id][value=Black_Female_30s_c3]")
    p.click("button[name=action][value=select]")
    expect(p.locator(".error")).to_contain_text("rationale")
    assert "Black_Female_30s" not in store.selections()

    p.locator("h1").click()  # out of the form fields, so keys act as shortcuts again
    p.keyboard.press("g")
    arrive(f"{url}/")
    expect(progress).to_have_attribute("data-selected", "1")
    expect(p.locator("td.gcell.done[data-cell=Black_Female_20s] img.thumb")).to_be_visible()
    p.screenshot(path=str(SCREENSHOTS / "grid-progress.png"), full_page=True)

    chosen = store.selections()["Black_Female_20s"]
    assert chosen["candidate_id"] == "Black_Female_20s_c2" and chosen["curator"] == "alice"
    assert all(chosen["criteria"].values()) and chosen["source"] == "web"
    assert store.rejections()["Black_Female_30s_c1"]["rationale"] == "Head turned to the side."
    assert store.verify().ok

    out = tmp_path / "fairface-curated"
    refused = CliRunner().invoke(app, ["curate", "finalize", "--workdir", str(store.workdir),
                                       "--out", str(out)])
    assert refused.exit_code == 2 and "Black_Female_30s" in refused.output
    done = CliRunner().invoke(app, ["curate", "finalize", "--workdir", str(store.workdir),
                                    "--out", str(out), "--size", "256", "--allow-incomplete"])
    assert done.exit_code == 0, done.output
    manifest = pd.read_csv(out / "manifest.csv", keep_default_na=False)
    assert manifest["source_id"].tolist() == ["Black_Female_20s"]
    row = manifest.iloc[0]
    assert row["curator"] == "alice" and row["criteria_met"] == 6
    assert row["rationale"] == "Frontal, sharp, evenly lit; candidate 1 looks away."
    assert len(json.loads((out / "manifest.json").read_text())["missing"]) == 83
    for name in ("grid-start.png", "cell-before-select.png", "grid-progress.png"):
        assert (SCREENSHOTS / name).stat().st_size > 10_000
