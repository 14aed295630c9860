"""End to end in a real browser: headless Chromium (Debian's `chromium`, driven by Playwright)
against a live review server. A rater logs in, rates three items with the keyboard (digits,
0 for cannot tell, Enter) and one with the mouse, reloads half-way through the next one and
finds it again, and finishes it; the store holds exactly those answers.

Screenshots are saved under ``build/test-artifacts/review/``. Skips, saying why, where no
Chromium executable or no Playwright is installed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from acrb.records import REVIEW_AXES
from acrb.review.store import ReviewStore
from acrb.review.web import create_app
from tests.conftest import REPO
from tests.live_server import CHROMIUM, LiveServer
from tests.review_fixtures import make_review_store

SCREENSHOTS = REPO / "build" / "test-artifacts" / "review"

pytestmark = [pytest.mark.browser]
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def review(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReviewStore, str]:
    store, tokens = make_review_store(tmp_path_factory.mktemp("browser"), ("r01",), items=6,
                                      k=1, paired_every=2)
    return store, tokens["r01"]


@pytest.fixture(scope="module")
def page(review: tuple[ReviewStore, str]) -> Iterator[tuple[object, str]]:
    store, _ = review
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium refuses root otherwise
    with LiveServer(create_app(store)) as server, sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        context = browser.new_context(viewport={"width": 1400, "height": 1100})
        yield context.new_page(), server.url
        context.close()
        browser.close()


def keys_for(groups: int, item: int) -> list[str]:
    """The key pressed for each question of an item: a varied, known pattern with one
    cannot-tell (0)."""
    return ["0" if n == 1 else str((n + item) % 5 + 1) for n in range(groups)]


def expected(keys: list[str]) -> list[int | None]:
    return [None if key == "0" else int(key) for key in keys]


def test_a_rater_rates_with_keys_and_mouse_and_resumes(review: tuple[ReviewStore, str],
                                                       page: tuple[object, str]) -> None:
    store, token = review
    browser_page, url = page
    p: sync_api.Page = browser_page  # type: ignore[assignment]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    expect = sync_api.expect
    answered: dict[int, tuple[str, tuple[str, ...], list[int | None]]] = {}

    def arrive() -> None:
        """Wait for the page and its script: a key pressed before app.js runs is lost."""
        expect(p).to_have_url(f"{url}/")
        p.wait_for_load_state("load")

    def current_claim() -> int:
        claim = store.open_claim("r01")
        assert claim is not None
        assert p.locator("input[name=claim]").get_attribute("value") == str(claim.claim_id)
        return claim.claim_id

    p.goto(f"{url}/")
    expect(p).to_have_url(f"{url}/login")
    p.fill("input[name=token]", token)
    p.click("button[type=submit]")
    arrive()

    # Three items with the keyboard alone: a digit answers the highlighted question and
    # moves on; Enter saves.
    for item in range(3):
        claim_id = current_claim()
        groups = p.locator("fieldset.axis")
        count = groups.count()
        assert count in (5, 10)
        expect(groups.nth(0)).to_have_class("axis current")
        keys = keys_for(count, item)
        for n, key in enumerate(keys):
            p.keyboard.press(key)
            if n + 1 < count:
                expect(groups.nth(n + 1)).to_have_class("axis current")
        if item == 0:
            p.screenshot(path=str(SCREENSHOTS / "keyboard-answered.png"), full_page=True)
        claim = store.open_claim("r01")
        assert claim is not None
        p.keyboard.press("Enter")
        arrive()
        expect(p.locator("#progress")).to_have_attribute("data-rated", str(item + 1))
        answered[claim_id] = (claim.item.item_id, claim.shown_order, expected(keys))

    # One with the mouse: click each answer's label, then the button.
    claim_id = current_claim()
    claim = store.open_claim("r01")
    assert claim is not None
    groups = p.locator("fieldset.axis")
    count = groups.count()
    clicks = keys_for(count, 7)
    for n, key in enumerate(clicks):
        value = "cannot_tell" if key == "0" else key
        groups.nth(n).locator(f"label:has(input[value=\"{value}\"])").click()
    p.screenshot(path=str(SCREENSHOTS / "mouse-answered.png"), full_page=True)
    p.click("button.primary")
    arrive()
    answered[claim_id] = (claim.item.item_id, claim.shown_order, expected(clicks))

    # Half-way through the next item, a reload: the same item comes back.
    claim_id = current_claim()
    p.keyboard.press("4")
    p.reload()
    p.wait_for_load_state("load")
    assert current_claim() == claim_id
    expect(p.locator("#progress")).to_have_attribute("data-rated", "4")
    p.screenshot(path=str(SCREENSHOTS / "resumed.png"), full_page=True)
    claim = store.open_claim("r01")
    assert claim is not None
    keys = keys_for(p.locator("fieldset.axis").count(), 4)
    for key in keys:
        p.keyboard.press(key)
    p.keyboard.press("Enter")
    arrive()
    answered[claim_id] = (claim.item.item_id, claim.shown_order, expected(keys))

    # The store holds exactly what was pressed and clicked, output by output.
    by_output = {(r.item_id, r.output): r for r in store.ratings()}
    assert len({item for item, _ in by_output}) == 5
    for claim_id, (item_id, order, values) in answered.items():
        for slot, output in enumerate(order):
            rating = by_output[(item_id, output)]
            got = [getattr(rating, axis) for axis in REVIEW_AXES]
            assert got == values[slot * 5:(slot + 1) * 5], (claim_id, output)
            assert rating.duration_ms is not None and rating.duration_ms >= 0
            assert rating.shown_first is (None if len(order) == 1 else slot == 0)
    assert store.verify().ok
    for name in ("keyboard-answered.png", "mouse-answered.png", "resumed.png"):
        assert (SCREENSHOTS / name).stat().st_size > 5_000

