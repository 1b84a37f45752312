"""The attention viewer at /, in headless Chromium (Debian's package) driven by Playwright."""

from __future__ import annotations

import base64
import json
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, FloatRect, Locator, Page, sync_playwright

from app.api.viewer import STATIC_DIR
from tests.helpers import running_server

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TEXT = "The animal didn't cross the street because it was too tired."

# Reads whether a canvas has anything drawn on it: any pixel not fully transparent and not white.
CANVAS_INK = """(canvas) => {
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let ink = 0;
  for (let k = 0; k < data.length; k += 4) {
    if (data[k + 3] > 0 && (data[k] < 250 || data[k + 1] < 250 || data[k + 2] < 250)) ink++;
  }
  return ink;
}"""


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_server() as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Watched:
    """A page with its console errors, every URL it requested and the status and type of each answer."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.responses: dict[str, tuple[int, str]] = {}
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("requestfailed", lambda r: self.errors.append(f"{r.url}: {r.failure}"))
        page.on("response", lambda r: self.responses.update({r.url: (r.status, r.headers.get("content-type", ""))}))


@pytest.fixture
def viewer(browser: Browser, server: str) -> Iterator[Watched]:
    with opened(browser, server) as watched:
        yield watched


@contextmanager
def opened(browser: Browser, url: str) -> Iterator[Watched]:
    """The viewer of the service at ``url`` in a fresh browser context, once it has drawn its example text."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    watched = Watched(context.new_page())
    watched.page.goto(url + "/")
    watched.page.wait_for_selector("#head-left .token")  # the page draws its example text on load
    try:
        yield watched
    finally:
        context.close()


def n_tokens(server: str, text: str, pair: str | None = None) -> int:
    body = httpx.post(f"{server}/tokenize", json={"texts": text, "text_pair": pair}).json()
    return len(body["data"][0]["tokens"])


def submit(page: Page, text: str, pair: str = "") -> None:
    page.fill("#text", text)
    page.fill("#text-pair", pair)
    page.click("#submit")
    idle(page)


def idle(page: Page) -> None:
    """Wait until the page has no request to the API in flight."""
    page.wait_for_function("() => !document.body.hasAttribute('aria-busy')")


def open_tab(page: Page, tab: str) -> None:
    page.click(f"#tab-{tab}")
    idle(page)


def ink(page: Page, selector: str) -> int:
    return page.eval_on_selector(selector, CANVAS_INK)


def layout(page: Page, expression: str, arg: Any = None) -> Any:
    """`expression` evaluated in the page, with `m` the viewer's own layout module and `arg` the argument.

    The sizes the views draw with live in /static/layout.js only; the tests read them from there.
    """
    return page.evaluate(f"(arg) => import('/static/layout.js').then((m) => {expression})", arg)


def page_tokens(page: Page) -> list[str]:
    """The tokens of the text on show, as the head view lists them."""
    return page.eval_on_selector_all("#head-left .token", "cells => cells.map((c) => c.textContent)")


def bounds(locator: Locator) -> FloatRect:
    """Where an element is drawn, in CSS pixels (it must be visible)."""
    box = locator.bounding_box()
    assert box is not None, "the element is not visible"
    return box


def css_size(page: Page, selector: str) -> tuple[float, float]:
    box = bounds(page.locator(selector))
    return box["width"], box["height"]


def hover_cell(page: Page, selector: str, grid: dict, row: int, col: int) -> None:
    """Move the pointer to the middle of a cell of a drawn matrix, where its layout puts the cell, the page first
    scrolled to bring that point to the middle of the window (a tall drawing's cell may lie outside it)."""
    x = grid["left"] + (col + 0.5) * grid["cellW"]
    y = grid["top"] + (row + 0.5) * grid["cellH"]
    page.eval_on_selector(
        selector,
        "(el, [x, y]) => { const r = el.getBoundingClientRect();"
        " scrollBy(r.left + x - innerWidth / 2, r.top + y - innerHeight / 2); }",
        [x, y],
    )
    box = bounds(page.locator(selector))
    page.mouse.move(box["x"] + x, box["y"] + y)


def covered_texts(tokens: list[str], details: list[dict], texts: list[str]) -> list[str]:
    """A byte-level BPE model's tokens as the page labels them: the text each covers (its offsets into its own
    segment's text), a newline as ↵; special tokens, and other tokenizers' tokens, as the API spells them."""
    if not any("Ġ" in token or "Ċ" in token for token in tokens):
        return tokens
    return [
        token if detail["special"] else texts[detail["segment"]][detail["start"] : detail["end"]].replace("\n", "↵")
        for token, detail in zip(tokens, details, strict=True)
    ]


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])  # IHDR: width, height


def test_page_loads_without_console_errors_or_outside_requests(viewer: Watched, server: str) -> None:
    assert viewer.page.title() == "Encoder inspector"
    assert "all-MiniLM-L6-v2" in viewer.page.inner_text("#model-info")
    submit(viewer.page, TEXT)
    for tab in ("model", "heatmap", "neuron", "stats", "pe", "similarity", "head"):
        open_tab(viewer.page, tab)
    assert viewer.errors == []
    outside = [url for url in viewer.requests if not url.startswith(server) and not url.startswith(("data:", "blob:"))]
    assert outside == [], outside
    assert any(url.endswith("/attention") for url in viewer.requests)  # it uses the public API


def test_every_module_loads_as_javascript(browser: Browser, server: str) -> None:
    # A module that is missing, or served with a type other than JavaScript, stops the whole page
    # without a word on it: so every one the page asks for must come back 200, as JavaScript.
    context = browser.new_context()
    try:
        watched = Watched(context.new_page())
        watched.page.goto(server + "/", wait_until="networkidle")
        assert watched.page.get_attribute("script[src='/static/viewer.js']", "type") == "module"
        requested = {url for url in watched.requests if url.endswith(".js")}
        assert requested == {f"{server}/static/{path.name}" for path in STATIC_DIR.glob("*.js")}  # all, no more
        for url in sorted(requested):
            status, kind = watched.responses[url]
            assert status == 200, url
            assert kind.split(";")[0].strip() in ("text/javascript", "application/javascript"), (url, kind)
        watched.page.wait_for_selector("#head-left .token")  # and they ran: the page drew its example
        assert watched.errors == []
    finally:
        context.close()


def test_head_view_draws_one_label_per_token_and_lines(viewer: Watched, server: str) -> None:
    pair = "It was very tired."
    submit(viewer.page, TEXT, pair)
    expected = n_tokens(server, TEXT, pair)
    assert viewer.page.locator("#head-left .token").count() == expected
    assert viewer.page.locator("#head-right .token").count() == expected
    assert viewer.page.locator("#head-left .token").first.inner_text() == "[CLS]"
    assert ink(viewer.page, "#head-canvas") > 100
    assert viewer.page.locator("#head-toggles button").count() == 12


def test_head_view_rows_and_lines_follow_the_layout_module(viewer: Watched) -> None:
    page = viewer.page
    row, lines_width = layout(page, "[m.ROW, m.HEAD.linesWidth]")
    n = page.locator("#head-left .token").count()
    assert css_size(page, "#head-left .token >> nth=0")[1] == row  # the page's labels line up with the lines
    assert css_size(page, "#head-right .token >> nth=0")[1] == row
    assert css_size(page, "#head-canvas") == (lines_width, n * row)
    second = bounds(page.locator("#head-left .token >> nth=1"))
    assert second["y"] - bounds(page.locator("#head-canvas"))["y"] == row


def test_changing_layer_or_head_changes_the_head_view(viewer: Watched) -> None:
    page = viewer.page
    canvas = lambda: page.eval_on_selector("#head-canvas", "c => c.toDataURL()")  # noqa: E731
    before = canvas()
    page.select_option("#head-layer", "0")
    idle(page)
    after_layer = canvas()
    assert after_layer != before
    page.click("#head-toggles button[data-head='3']")  # hide one head
    assert page.get_attribute("#head-toggles button[data-head='3']", "aria-pressed") == "false"
    assert canvas() != after_layer
    page.click("#heads-none")
    assert ink(page, "#head-canvas") == 0  # no head selected, no lines


def test_hovering_a_token_focuses_its_lines(viewer: Watched) -> None:
    page = viewer.page
    everything = ink(page, "#head-canvas")
    page.hover("#head-left .token >> nth=3")
    assert page.locator("#head-left .token.active").count() == 1
    focused = ink(page, "#head-canvas")
    assert 0 < focused < everything


def test_model_view_draws_every_layer_and_head_and_enlarges_one(viewer: Watched) -> None:
    page = viewer.page
    open_tab(page, "model")
    cells = page.locator("#model-grid button")
    assert cells.count() == 6 * 12
    assert ink(page, "#model-canvas") > 0
    grid = layout(page, "m.modelLayout(6, 12)")
    assert css_size(page, "#model-canvas") == (grid["width"], grid["height"])
    canvas = bounds(page.locator("#model-canvas"))
    for li, hi in ((0, 0), (2, 5), (5, 11)):  # each button lies over its cell of the drawing
        cell = layout(page, f"m.modelCell(m.modelLayout(6, 12), {li}, {hi})")
        box = bounds(cells.nth(12 * li + hi))
        assert (box["x"] - canvas["x"], box["y"] - canvas["y"]) == (cell["x"], cell["y"])
        assert (box["width"], box["height"]) == (grid["cell"], grid["cell"])
    assert cells.nth(12 * 2 + 5).get_attribute("aria-label") == "layer 2, head 5: enlarge"  # as the API counts
    cells.nth(12 * 2 + 5).click()  # layer 2, head 5
    idle(page)
    assert page.get_attribute("#tab-heatmap", "aria-selected") == "true"
    assert page.input_value("#heat-layer") == "2" and page.input_value("#heat-head") == "5"
    assert ink(page, "#heat-canvas") > 0


def test_heatmap_shows_values_on_hover_and_draws_mean_and_rollout(viewer: Watched) -> None:
    page = viewer.page
    open_tab(page, "heatmap")
    head = page.eval_on_selector("#heat-canvas", "c => c.toDataURL()")
    assert ink(page, "#heat-canvas") > 0
    tokens = page_tokens(page)
    grid = layout(page, "m.heatmapLayout(arg)", tokens)
    assert grid["labels"] and grid["rows"] == len(tokens)
    assert css_size(page, "#heat-canvas") == (grid["width"], grid["height"])
    hover_cell(page, "#heat-canvas", grid, 0, 0)
    assert page.inner_text("#heat-readout").startswith("“[CLS]” → “[CLS]”: 0.")
    hover_cell(page, "#heat-canvas", grid, 1, len(tokens) - 2)
    assert page.inner_text("#heat-readout").startswith(f"“{tokens[1]}” → “{tokens[-2]}”: ")
    assert page.is_visible("#tooltip")
    drawings = {head}
    for choice in ("mean", "rollout"):
        page.select_option("#heat-head", choice)
        idle(page)
        drawings.add(page.eval_on_selector("#heat-canvas", "c => c.toDataURL()"))
    assert len(drawings) == 3
    assert any(url.endswith("/attention") for url in viewer.requests)


def test_positional_encoding_draws_and_follows_length_and_kind(viewer: Watched) -> None:
    page = viewer.page
    open_tab(page, "pe")
    assert ink(page, "#pe-canvas") > 0
    height = page.eval_on_selector("#pe-canvas", "c => c.height")
    page.fill("#pe-length", "16")
    page.click("#pe-form button[type=submit]")
    page.wait_for_function(f"() => document.querySelector('#pe-canvas').height < {height}")
    grid = layout(page, "m.peLayout(16, 128)")
    assert css_size(page, "#pe-canvas") == (grid["width"], grid["height"])
    hover_cell(page, "#pe-canvas", grid, 3, 100)
    assert page.inner_text("#pe-readout").startswith("position 3, dimension 100: ")
    page.select_option("#pe-kind", "learned")
    page.click("#pe-form button[type=submit]")
    idle(page)
    assert ink(page, "#pe-canvas") > 0
    assert any("kind=learned" in url for url in viewer.requests)


def test_similarity_matrix_has_one_row_per_text(viewer: Watched) -> None:
    page = viewer.page
    open_tab(page, "similarity")
    texts = ["A cat sits on the mat.", "A kitten rests on a rug.", "Interest rates rose again."]
    page.fill("#sim-texts", "\n".join(texts) + "\n\n")
    page.click("#sim-form button[type=submit]")
    page.wait_for_function("() => document.querySelectorAll('#sim-table tbody tr').length === 3")
    assert ink(page, "#sim-canvas") > 0
    grid = layout(page, "m.similarityLayout(arg)", texts)
    assert css_size(page, "#sim-canvas") == (grid["width"], grid["height"])
    hover_cell(page, "#sim-canvas", grid, 0, 1)
    assert page.inner_text("#sim-readout").startswith(f"{texts[0]} ↔ {texts[1]}: ")
    # The table is the drawing's text equivalent, for screen readers.
    rows = page.locator("#sim-table tbody tr")
    assert rows.count() == 3
    assert [rows.nth(i).locator("td").nth(i).inner_text() for i in range(3)] == ["1.00"] * 3
    cat_kitten = float(rows.nth(0).locator("td").nth(1).inner_text())
    cat_rates = float(rows.nth(0).locator("td").nth(2).inner_text())
    assert cat_kitten > cat_rates


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "must not be empty"),  # an empty text
        ("word " * 300, None),  # too long is cut (truncate), so no error: the page still draws
    ],
)
def test_api_errors_are_shown_in_words(viewer: Watched, text: str, words: str | None) -> None:
    submit(viewer.page, text)
    if words is None:
        assert viewer.page.is_hidden("#error")
        assert viewer.page.locator("#head-left .token").count() == 256  # 128+ tokens: still drawn
        return
    assert viewer.page.is_visible("#error")
    assert words in viewer.page.inner_text("#error")
    assert "did not accept" in viewer.page.inner_text("#error")
    # The example text's drawing is not left under the error as if it were this input's; the next good
    # request brings the view back.
    assert viewer.page.is_hidden("#head-canvas") and viewer.page.is_hidden("#head-left .token >> nth=0")
    submit(viewer.page, TEXT)
    assert viewer.page.is_hidden("#error") and viewer.page.is_visible("#head-canvas")
    assert ink(viewer.page, "#head-canvas") > 0


def test_an_empty_similarity_request_is_explained(viewer: Watched) -> None:
    open_tab(viewer.page, "similarity")
    viewer.page.fill("#sim-texts", "   \n")
    viewer.page.click("#sim-form button[type=submit]")
    viewer.page.wait_for_selector("#error:not([hidden])")
    assert "texts" in viewer.page.inner_text("#error")


@pytest.mark.parametrize("tab", ["head", "model", "heatmap", "neuron", "stats", "pe", "similarity"])
def test_each_view_downloads_as_png_and_json(viewer: Watched, tab: str) -> None:
    page = viewer.page
    open_tab(page, tab)
    with page.expect_download() as png:
        page.click("#download-png")
    assert png.value.suggested_filename == f"{tab}.png"
    image = png.value.path().read_bytes()
    if tab == "head":  # the lines on screen, with a title and both token columns round them
        expected = layout(page, "m.headLayout(arg, {labels: true})", page_tokens(page))
        assert png_size(image) == (expected["width"], expected["height"])
        assert expected["width"] > layout(page, "m.HEAD.linesWidth")
    else:  # drawn by the same function as the screen's canvas, pixel for pixel
        screen = page.eval_on_selector(f"#view-{tab} canvas", "c => c.toDataURL('image/png')")
        assert image == base64.b64decode(screen.split(",", 1)[1])
    with page.expect_download() as data:
        page.click("#download-json")
    assert data.value.suggested_filename == f"{tab}.json"
    assert json.loads(open(data.value.path(), encoding="utf-8").read())


# ---- the similarity explanation, head statistics, norm weighting and word level ----

SIM_TEXTS = ["A man is playing a guitar.", "Someone plays an instrument.", "Interest rates rose again."]
PIECES = "unbelievably tokenization"  # two words of several word pieces each


def posted(page: Page, path: str, **fields: Any) -> Any:
    """Waits for the page's next POST to `path` whose JSON body has `fields` (as a context manager)."""

    def matches(request: Any) -> bool:
        if request.method != "POST" or not request.url.endswith(path):
            return False
        body = request.post_data_json
        return all(body.get(key) == value for key, value in fields.items())

    return page.expect_request(matches)


def words(tokens: list[Any]) -> list[str]:
    """Token texts, whether the service lists them as strings or as /tokenize's objects."""
    return [t if isinstance(t, str) else t["text"] for t in tokens]


def compare(page: Page, texts: list[str] = SIM_TEXTS) -> None:
    open_tab(page, "similarity")
    page.fill("#sim-texts", "\n".join(texts))
    page.click("#sim-form button[type=submit]")
    idle(page)


def texts_of(page: Page, selector: str) -> list[str]:
    return page.eval_on_selector_all(selector, "cells => cells.map((c) => c.textContent)")


def table_numbers(page: Page, selector: str) -> list[float]:
    return [float(x) for x in texts_of(page, selector)]


def check_explanation(page: Page, server: str, body: dict, row: int, col: int) -> dict:
    """The explanation on show is the service's answer to `body`, drawn, and its totals add up."""
    assert body == {"source": SIM_TEXTS[row], "texts": [SIM_TEXTS[col]], "explain": True, "model": "all-MiniLM-L6-v2"}
    item = httpx.post(f"{server}/similarity", json=body).json()["data"][0]
    explanation = item["explanation"]
    source, tokens = words(explanation["source_tokens"]), words(explanation["tokens"])
    assert page.is_visible("#sim-explain-canvas")
    assert ink(page, "#sim-explain-canvas") > 1000
    assert page.get_attribute(f"#sim-grid button[data-row='{row}'][data-col='{col}']", "aria-pressed") == "true"
    # The table equivalent: one row per source token, one column per text token, and the totals.
    assert texts_of(page, "#sim-explain-table thead th")[1:] == [*tokens, "total"]
    assert texts_of(page, "#sim-explain-table tbody th") == source
    cells = table_numbers(page, "#sim-explain-table tbody td:not(.source-total)")
    flat = [v for line in explanation["contributions"] for v in line]
    assert cells == pytest.approx(flat, abs=1e-5)
    source_totals = table_numbers(page, "#sim-explain-table td.source-total")
    token_totals = table_numbers(page, "#sim-explain-table td.token-total")
    assert (len(source_totals), len(token_totals)) == (len(source), len(tokens))
    assert sum(source_totals) == pytest.approx(item["score"], abs=1e-3)
    assert sum(token_totals) == pytest.approx(item["score"], abs=1e-3)
    assert table_numbers(page, "#sim-explain-table td.score") == pytest.approx([item["score"]], abs=1e-5)
    assert f"similarity {item['score']:.4f}" in page.inner_text("#sim-explain-readout")
    # The score explained is the one the matrix shows for the pair.
    shown = float(page.locator("#sim-table tbody tr").nth(row).locator("td").nth(col).inner_text())
    assert shown == pytest.approx(item["score"], abs=0.006)
    return {"source": source, "tokens": tokens, "item": item}


def test_similarity_cell_click_explains_its_score_token_by_token(viewer: Watched, server: str) -> None:
    page = viewer.page
    compare(page)
    assert page.locator("#sim-grid button").count() == len(SIM_TEXTS) ** 2
    assert page.is_hidden("#sim-explain-canvas")
    with posted(page, "/similarity") as request:
        page.click("#sim-grid button[data-row='0'][data-col='1']")
    idle(page)
    shown = check_explanation(page, server, request.value.post_data_json, 0, 1)
    # Hovering the drawing reads a contribution, and a token's total from the strip beside the matrix.
    source, tokens = shown["source"], shown["tokens"]
    item = shown["item"]
    method = item["explanation"].get("method") or item.get("method")
    title = page.evaluate(
        "(arg) => import('/static/view-similarity.js').then((v) => v.explanationTitle(arg))",
        {"model": "all-MiniLM-L6-v2", "score": item["score"], "method": method},
    )
    grid = layout(page, "m.explanationLayout(arg[0], arg[1], arg[2])", [source, tokens, title])
    assert css_size(page, "#sim-explain-canvas") == (grid["width"], grid["height"])
    page.locator("#sim-explain-canvas").scroll_into_view_if_needed()
    hover_cell(page, "#sim-explain-canvas", grid, 1, 2)
    assert page.inner_text("#sim-explain-readout").startswith(f"“{source[1]}” · “{tokens[2]}”: ")
    box = bounds(page.locator("#sim-explain-canvas"))
    strip = layout(page, "m.EXPLAIN.strip")
    page.mouse.move(box["x"] + grid["stripX"] + strip / 2, box["y"] + grid["top"] + 0.5 * grid["cellH"])
    total = sum(shown["item"]["explanation"]["contributions"][0])
    assert page.inner_text("#sim-explain-readout") == f"“{source[0]}” (source), total: {total:.4f}"
    # Its data comes with the similarity view's JSON.
    with page.expect_download() as data:
        page.click("#download-json")
    saved = json.loads(open(data.value.path(), encoding="utf-8").read())
    assert saved["explanation"]["score"] == pytest.approx(shown["item"]["score"])
    assert viewer.errors == []


def test_similarity_explanation_opens_from_the_keyboard(viewer: Watched, server: str) -> None:
    page = viewer.page
    compare(page)
    cell = page.locator("#sim-grid button[data-row='2'][data-col='0']")
    cell.focus()
    assert page.inner_text("#sim-readout").startswith(f"{SIM_TEXTS[2]} ↔ {SIM_TEXTS[0]}: ")  # read on focus
    with posted(page, "/similarity") as request:
        page.keyboard.press("Enter")
    idle(page)
    check_explanation(page, server, request.value.post_data_json, 2, 0)
    page.keyboard.press("Tab")  # the next cell, (2, 1), in reading order
    with posted(page, "/similarity") as request:
        page.keyboard.press(" ")
    idle(page)
    check_explanation(page, server, request.value.post_data_json, 2, 1)
    assert page.get_attribute("#sim-grid button[data-row='2'][data-col='0']", "aria-pressed") == "false"
    assert viewer.errors == []


def test_head_statistics_grid_has_a_cell_per_layer_and_head_and_opens_its_heatmap(viewer: Watched, server: str) -> None:
    page = viewer.page
    with posted(page, "/attention/heads") as request:
        page.click("#tab-stats")
    idle(page)
    body = request.value.post_data_json
    assert body == {"texts": [TEXT], "model": "all-MiniLM-L6-v2"}
    expected = httpx.post(f"{server}/attention/heads", json=body).json()
    statistics = expected["statistics"]
    assert {"entropy", "distance", "to_cls", "to_sep", "to_punctuation", "to_self", "to_previous", "to_next"} <= set(
        statistics
    )
    options = page.eval_on_selector_all("#stats-statistic option", "os => os.map((o) => o.value)")
    assert options == list(statistics)
    assert page.locator("#stats-grid button").count() == 6 * 12
    assert ink(page, "#stats-canvas") > 1000
    grid = layout(page, "m.statsLayout(6, 12)")
    assert css_size(page, "#stats-canvas") == (grid["width"], grid["height"])
    drawings = set()
    for statistic in ("entropy", "to_cls"):
        page.select_option("#stats-statistic", statistic)
        rows = page.locator("#stats-table tbody tr")
        assert rows.count() == 6
        shown = texts_of(page, "#stats-table tbody td")
        wanted = [v for line in statistics[statistic] for v in line]
        assert len(shown) == len(wanted) == 6 * 12
        for got, want in zip(shown, wanted, strict=True):  # null: no query position to average over
            assert got == "none" if want is None else float(got) == pytest.approx(want, abs=1e-4)
        drawings.add(page.eval_on_selector("#stats-canvas", "c => c.toDataURL()"))
    assert len(drawings) == 2
    # Hover and focus read a head's value; selecting it (keyboard here) opens its heatmap.
    hover_cell(page, "#stats-canvas", grid, 4, 7)
    assert page.inner_text("#stats-readout").startswith("layer 4, head 7: ")  # from 0, as the API counts
    cell = page.locator("#stats-grid button[data-row='2'][data-col='5']")
    cell.focus()
    value = statistics["to_cls"][2][5]
    assert page.inner_text("#stats-readout").endswith(f"{value:.4f}")
    page.keyboard.press("Enter")
    idle(page)
    assert page.get_attribute("#tab-heatmap", "aria-selected") == "true"
    assert page.input_value("#heat-layer") == "2" and page.input_value("#heat-head") == "5"
    assert ink(page, "#heat-canvas") > 0
    attention = httpx.post(f"{server}/attention", json={"text": TEXT, "layers": [2], "heads": [5]}).json()
    tokens = attention["tokens"]
    heat = layout(page, "m.heatmapLayout(arg)", tokens)
    hover_cell(page, "#heat-canvas", heat, 3, 0)
    assert page.inner_text("#heat-readout").startswith(
        f"“{tokens[3]}” → “{tokens[0]}”: {attention['attention'][0][0][3][0]:.4f} (layer 2, head 5)"
    )
    assert viewer.errors == []


def test_norm_toggle_asks_for_norm_weighting_and_redraws(viewer: Watched, server: str) -> None:
    page = viewer.page
    before = page.eval_on_selector("#head-canvas", "c => c.toDataURL()")
    with posted(page, "/attention", weighting="norm") as request:
        page.check("#head-norm")
    idle(page)
    assert "level" not in request.value.post_data_json
    assert page.is_checked("#heat-norm")  # one setting, shown in both views
    assert ink(page, "#head-canvas") > 100
    assert page.eval_on_selector("#head-canvas", "c => c.toDataURL()") != before
    # The heatmap of another layer is asked for with the same weighting, and shows the norms.
    open_tab(page, "heatmap")
    with posted(page, "/attention", weighting="norm", layers=[0]):
        page.select_option("#heat-layer", "0")
    idle(page)
    page.select_option("#heat-head", "4")
    idle(page)
    norms = httpx.post(
        f"{server}/attention", json={"text": TEXT, "layers": [0], "heads": [4], "weighting": "norm", "decimals": 5}
    ).json()
    tokens = norms["tokens"]
    assert max(sum(row) for row in norms["attention"][0][0]) > 1.01  # rows do not sum to 1: norms are shown
    heat = layout(page, "m.heatmapLayout(arg)", tokens)
    hover_cell(page, "#heat-canvas", heat, 2, 1)
    value = norms["attention"][0][0][2][1]
    assert page.inner_text("#heat-readout").startswith(f"“{tokens[2]}” → “{tokens[1]}”: {value:.4f}")
    assert "norm-weighted" in page.inner_text("#heat-readout")
    with posted(page, "/attention") as request:
        page.uncheck("#heat-norm")
    idle(page)
    assert "weighting" not in request.value.post_data_json
    assert not page.is_checked("#head-norm")
    assert viewer.errors == []


def test_word_toggle_shows_words_instead_of_word_pieces(viewer: Watched, server: str) -> None:
    page = viewer.page
    submit(page, PIECES)
    pieces = page_tokens(page)
    assert len(pieces) == n_tokens(server, PIECES) > 4
    with posted(page, "/attention", level="word") as request:
        page.check("#head-word")
    idle(page)
    assert "weighting" not in request.value.post_data_json
    expected = httpx.post(f"{server}/attention", json={"text": PIECES, "layers": [0], "level": "word"}).json()["tokens"]
    assert page_tokens(page) == expected
    assert len(expected) < len(pieces)
    assert ink(page, "#head-canvas") > 100
    # The heatmap has one row and column per word.
    open_tab(page, "heatmap")
    assert page.is_checked("#heat-word")
    height = css_size(page, "#heat-canvas")[1]
    assert height == layout(page, "m.heatmapLayout(arg)", expected)["height"]
    with posted(page, "/attention") as request:
        page.uncheck("#heat-word")
    idle(page)
    assert "level" not in request.value.post_data_json
    assert css_size(page, "#heat-canvas")[1] == layout(page, "m.heatmapLayout(arg)", pieces)["height"] > height
    # Both at once: words, weighted by norm; the head view follows.
    with posted(page, "/attention", level="word", weighting="norm"):
        page.check("#heat-word")
        page.check("#heat-norm")
    idle(page)
    assert css_size(page, "#heat-canvas")[1] == height
    open_tab(page, "head")
    assert page.is_checked("#head-word") and page.is_checked("#head-norm")
    assert page_tokens(page) == expected
    assert viewer.errors == []


# ---- the neuron view: one head, one query token, step by step ----


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def neuron_table(page: Page) -> dict[str, list]:
    """The neuron view's table, column by column: key tokens, omega, scaled scores, attention weights."""
    return {
        "tokens": texts_of(page, "#neuron-table tbody th"),
        "omega": table_numbers(page, "#neuron-table td.omega"),
        "scaled": table_numbers(page, "#neuron-table td.scaled"),
        "attention": table_numbers(page, "#neuron-table td.attention"),
    }


def shown_shapes(page: Page) -> dict[str, str]:
    return page.eval_on_selector_all(
        "#neuron-steps li",
        "items => Object.fromEntries(items.map((li) => [li.dataset.step, li.lastChild.textContent]))",
    )


def active(page: Page) -> dict[str, Any]:
    """The element with the keyboard focus: its id, token index, whether it is checked and shows its focus."""
    return page.evaluate(
        "() => { const e = document.activeElement; return {id: e.id, index: e.dataset.index,"
        " checked: e.getAttribute('aria-checked'), visible: e.matches(':focus-visible')}; }"
    )


def test_neuron_view_walks_a_query_token_through_one_head_from_the_keyboard(viewer: Watched, server: str) -> None:
    page = viewer.page
    page.focus("#tab-head")
    for _ in range(3):  # Head view → Model view → Heatmap → Neuron view
        page.keyboard.press("ArrowRight")
    idle(page)
    assert page.get_attribute("#tab-neuron", "aria-selected") == "true" and page.is_visible("#view-neuron")
    while active(page)["id"] != "neuron-layer":  # on through the download buttons to the view's controls
        page.keyboard.press("Tab")
    assert page.input_value("#neuron-layer") == "5" and page.input_value("#neuron-head") == "0"
    with posted(page, "/attention/neuron", layer=3):
        page.keyboard.press("ArrowUp")
        page.keyboard.press("ArrowUp")
    idle(page)
    page.keyboard.press("Tab")
    assert active(page)["id"] == "neuron-head"
    with posted(page, "/attention/neuron", layer=3, head=2) as request:
        page.keyboard.press("ArrowDown")
        page.keyboard.press("ArrowDown")
    idle(page)
    body = request.value.post_data_json
    assert body == {"text": TEXT, "text_pair": None, "layer": 3, "head": 2, "model": "all-MiniLM-L6-v2"}
    response = request.value.response()
    assert response is not None and response.status == 200
    answer = response.json()
    tokens = answer["tokens"]
    T, Dh = len(tokens), len(answer["queries"][0])
    assert n_tokens(server, TEXT) == T and (T, Dh) == (16, 32)

    # The query token: Tab into the row of tokens (on the chosen one), then arrow keys to "it".
    page.keyboard.press("Tab")
    assert active(page) == {"id": "", "index": "1", "checked": "true", "visible": True}
    i = tokens.index("it")
    for _ in range(i - 1):
        page.keyboard.press("ArrowRight")
    assert active(page)["index"] == str(i) and active(page)["checked"] == "true"
    assert page.locator("#neuron-tokens [aria-checked='true']").count() == 1
    assert page.inner_text("#neuron-readout").startswith(f"Query “it” (token {i + 1} of {T})")

    # Drawn, at the layout's size, and its rows read what the table says.
    assert ink(page, "#neuron-canvas") > 5000
    grid = page.evaluate(
        "(arg) => Promise.all([import('/static/view-neuron.js'), import('/static/layout.js')]).then(([v, m]) => {"
        " const d = v.neuronData(arg.answer, arg.i);"
        " return m.neuronLayout(d.tokens, d.dh, d.headings, {title: d.title, bias: d.hasBias}); })",
        {"answer": answer, "i": i},
    )
    assert css_size(page, "#neuron-canvas") == (grid["width"], grid["height"])
    assert grid["rows"] == T and grid["dh"] == Dh
    query, keys = answer["queries"][i], answer["keys"]
    hover_cell(page, "#neuron-canvas", grid, 2, 0)
    assert page.inner_text("#neuron-readout").startswith(f"“it” → “{tokens[2]}”: omega {dot(query, keys[2]):.4f}, ")

    # The table: omega from the response's vectors, the service's scaled scores and its attention row.
    table = neuron_table(page)
    assert table["tokens"] == tokens
    assert table["omega"] == pytest.approx([dot(query, k) for k in keys], abs=1e-4)
    assert table["scaled"] == pytest.approx(answer["scores"][i], abs=1e-4)
    assert table["scaled"] == pytest.approx([answer["scale"] * dot(query, k) for k in keys], abs=1e-3)
    assert table["attention"] == pytest.approx(answer["attention"][i], abs=1e-4)
    assert sum(table["attention"]) == pytest.approx(1, abs=1e-4)
    assert page.is_hidden("#neuron-note")  # BERT has no position bias
    shapes = shown_shapes(page)
    assert shapes == {
        "query": f"({Dh},)",
        "keys": f"({T}, {Dh})",
        "products": f"({T}, {Dh})",
        "omega": f"({T},)",
        "scaled": f"({T},)",
        "attention": f"({T},)",
        "values": f"({T}, {Dh})",
        "context": f"({Dh},)",
    }
    assert "1/√Dh = 0.177" in page.inner_text("#neuron-steps")
    assert len(answer["context"][i]) == Dh and len(answer["values"]) == T
    # Home and End reach the ends; a click picks a token too; neither asks the service again.
    asked = sum(url.endswith("/attention/neuron") for url in viewer.requests)
    page.keyboard.press("End")
    assert active(page)["index"] == str(T - 1)
    assert neuron_table(page)["attention"] == pytest.approx(answer["attention"][T - 1], abs=1e-4)
    page.click("#neuron-tokens [data-index='2']")
    assert page.get_attribute("#neuron-tokens [data-index='2']", "aria-checked") == "true"
    assert neuron_table(page)["omega"] == pytest.approx([dot(answer["queries"][2], k) for k in keys], abs=1e-4)
    assert sum(url.endswith("/attention/neuron") for url in viewer.requests) == asked
    assert viewer.errors == []


def test_neuron_view_shows_the_services_scores_and_says_when_they_hold_a_position_bias(viewer: Watched) -> None:
    # MiniLM has no position bias: add one to the service's answer, as T5-style models would.
    page = viewer.page

    def biased(route: Any) -> None:
        answer = route.fetch().json()
        answer["scores"] = [[s + 0.25 * (j - k) for k, s in enumerate(row)] for j, row in enumerate(answer["scores"])]
        route.fulfill(json=answer)

    page.route("**/attention/neuron", biased)
    with page.expect_response(lambda r: r.url.endswith("/attention/neuron")) as response:
        open_tab(page, "neuron")
    answer = response.value.json()
    assert page.is_visible("#neuron-note")
    assert "position bias" in page.inner_text("#neuron-note")
    table = neuron_table(page)
    query = answer["queries"][1]
    assert table["scaled"] == pytest.approx(answer["scores"][1], abs=1e-4)  # the service's, bias and all
    assert table["omega"] == pytest.approx([dot(query, k) for k in answer["keys"]], abs=1e-4)
    assert "plus the position bias" in page.inner_text("#neuron-steps")
    assert viewer.errors == []


def test_neuron_view_explains_an_error_and_clears_what_it_showed(viewer: Watched) -> None:
    page = viewer.page
    open_tab(page, "neuron")
    assert page.locator("#neuron-table tbody tr").count() > 0
    # The service refuses an empty text; the page's own text is fine, so send an empty one on its way.
    page.route(
        "**/attention/neuron",
        lambda route: route.continue_(post_data=json.dumps({**route.request.post_data_json, "text": ""})),
    )
    page.select_option("#neuron-head", "4")
    idle(page)
    assert page.is_visible("#error")
    assert "did not accept" in page.inner_text("#error") and "must not be empty" in page.inner_text("#error")
    assert page.locator("#neuron-table tr").count() == 0
    assert page.eval_on_selector("#neuron-canvas", "c => [c.width, c.height]") == [0, 0]
    page.click("#download-png")  # nothing to download now
    assert page.inner_text("#error") == "Nothing is drawn in this view yet."


def test_keyboard_moves_between_tabs(viewer: Watched) -> None:
    page = viewer.page
    page.focus("#tab-head")
    page.keyboard.press("ArrowRight")
    assert page.get_attribute("#tab-model", "aria-selected") == "true"
    assert page.evaluate("document.activeElement.id") == "tab-model"


def test_phone_width_has_no_page_level_horizontal_scroll(browser: Browser, server: str) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    page.goto(server + "/")
    page.wait_for_selector("#head-left .token")
    assert page.evaluate("document.documentElement.scrollWidth") <= 391
    assert page.is_visible("#submit")
    assert css_size(page, "#head-canvas")[0] == layout(page, "m.HEAD.linesWidthNarrow")
    context.close()


# ---- several models: the picker, and the rerank view with a cross-encoder ----

QUERY = "the cat sat on the mat"
DOCUMENTS = ["hello world", "the cat sat on the mat", "the quick brown fox", "a lazy dog"]


@pytest.fixture(scope="module")
def models_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bundled MiniLM (the default, listed first) and a tiny random cross-encoder named "ce"."""
    from model import default_model_path
    from tests.helpers import write_tiny_model

    ce = write_tiny_model(tmp_path_factory.mktemp("ce"), head="sequence-classification", num_labels=1)
    with running_server({"ENCODER_MODELS": f"minilm={default_model_path()},ce={ce}"}) as url:
        yield url


@pytest.fixture
def multi(browser: Browser, models_server: str) -> Iterator[Watched]:
    with opened(browser, models_server) as watched:
        idle(watched.page)
        yield watched


def pick_model(page: Page, name: str) -> None:
    page.select_option("#model-select", name)
    page.wait_for_function(
        "(name) => document.querySelector('#model-info').textContent.startsWith(name + ' ')", arg=name
    )
    idle(page)


def rank(page: Page, query: str = QUERY, documents: list[str] = DOCUMENTS) -> None:
    open_tab(page, "rerank")
    page.fill("#rerank-query", query)
    page.fill("#rerank-docs", "\n".join(documents))
    page.click("#rerank-form button[type=submit]")
    idle(page)


def test_the_tablist_holds_only_tabs_and_the_downloads_stay_on_one_row(viewer: Watched) -> None:
    """The download buttons are not tabs: they sit beside the tablist, and where the row is too narrow for the nine
    tabs and both of them (1200 px), they move below together rather than one at a time."""
    page = viewer.page
    roles = page.eval_on_selector_all("[role=tablist] > *", "els => els.map((e) => e.getAttribute('role'))")
    assert len(roles) == 9 and set(roles) == {"tab"}
    for width in (1200, 1280, 900):
        page.set_viewport_size({"width": width, "height": 900})
        png, json_ = bounds(page.locator("#download-png")), bounds(page.locator("#download-json"))
        assert png["y"] == json_["y"] and png["x"] < json_["x"], width
    assert viewer.errors == []


def test_single_model_has_no_picker(viewer: Watched) -> None:
    assert viewer.page.is_hidden("#model-picker")


def test_picker_lists_the_served_models_and_switches_info(multi: Watched, models_server: str) -> None:
    page = multi.page
    served = [m["id"] for m in httpx.get(f"{models_server}/v1/models").json()["data"]]
    assert served == ["minilm", "ce"]
    assert page.is_visible("#model-select")
    assert page.eval_on_selector_all("#model-select option", "os => os.map((o) => o.value)") == served
    assert page.input_value("#model-select") == "minilm"
    assert page.inner_text("#model-info").startswith("minilm · 6 layers × 12 heads")
    assert page.locator("label[for=model-select]").inner_text() == "Model"
    page.focus("#model-select")  # keyboard: the select is a native control
    pick_model(page, "ce")
    info = httpx.get(f"{models_server}/info", params={"model": "ce"}).json()["architecture"]
    assert page.inner_text("#model-info").startswith(f"ce · {info['layers']} layers × {info['heads']} heads")
    assert any(url.endswith("/info?model=ce") for url in multi.requests)
    assert page.locator("#head-toggles button").count() == info["heads"]  # the head view is the new model's
    open_tab(page, "pe")
    assert any("model=ce" in url and "/positional-encoding" in url for url in multi.requests)
    assert multi.errors == []


def test_rerank_ranks_draws_bars_and_attention_of_the_selected_document(multi: Watched, models_server: str) -> None:
    page = multi.page
    pick_model(page, "ce")
    rank(page)
    expected = httpx.post(
        f"{models_server}/rerank",
        json={"query": QUERY, "documents": DOCUMENTS, "model": "ce", "return_documents": True},
    ).json()["results"]
    buttons = page.locator("#rerank-list button")
    assert buttons.count() == len(DOCUMENTS)
    assert [buttons.nth(k).get_attribute("data-index") for k in range(len(DOCUMENTS))] == [
        str(r["index"]) for r in expected
    ]
    assert [buttons.nth(k).inner_text().split(" — ")[0] for k in range(len(DOCUMENTS))] == [
        r["document"] for r in expected
    ]
    assert ink(page, "#rerank-canvas") > 0
    grid = layout(page, "m.rerankLayout(arg)", expected)
    assert css_size(page, "#rerank-canvas") == (grid["width"], grid["height"])
    assert page.is_hidden("#rerank-attn-canvas")

    # Select the second-ranked document with the keyboard.
    buttons.nth(1).focus()
    page.keyboard.press("Enter")
    idle(page)
    assert buttons.nth(1).get_attribute("aria-pressed") == "true"
    document = expected[1]["document"]
    assert page.is_visible("#rerank-attn-canvas")
    assert ink(page, "#rerank-attn-canvas") > 0
    details = httpx.post(
        f"{models_server}/tokenize", json={"texts": QUERY, "text_pair": document, "model": "ce"}
    ).json()["data"][0]
    attention = httpx.post(
        f"{models_server}/attention",
        json={"text": QUERY, "text_pair": document, "model": "ce", "layers": [-1], "aggregate": "mean"},
    ).json()
    tokens = attention["tokens"]
    rows = [tokens[i] for i, d in enumerate(attention["token_details"]) if d["segment"] == 0 and not d["special"]]
    cols = [tokens[i] for i, d in enumerate(attention["token_details"]) if d["segment"] == 1 and not d["special"]]
    assert rows == QUERY.split() and cols == document.split()
    assert len(details["tokens"]) == len(tokens)
    title = "ce · last layer, mean over heads: query → document 2"
    block = layout(page, "m.crossLayout(arg[0], arg[1], arg[2])", [rows, cols, title])
    assert (block["rows"], block["cols"]) == (len(rows), len(cols))
    assert css_size(page, "#rerank-attn-canvas") == (block["width"], block["height"])
    page.locator("#rerank-attn-canvas").scroll_into_view_if_needed()
    hover_cell(page, "#rerank-attn-canvas", block, 0, len(cols) - 1)
    assert page.inner_text("#rerank-readout").startswith(f"“{rows[0]}” → “{cols[-1]}”: ")

    # Clicking a bar selects its document too.
    page.locator("#rerank-canvas").scroll_into_view_if_needed()
    canvas = bounds(page.locator("#rerank-canvas"))
    page.mouse.click(canvas["x"] + grid["left"] + 5, canvas["y"] + grid["top"] + 2.5 * grid["cellH"])
    idle(page)
    assert buttons.nth(2).get_attribute("aria-pressed") == "true"
    assert any("/attention" in url for url in multi.requests)

    with page.expect_download() as png:
        page.click("#download-png")
    screen = page.eval_on_selector("#rerank-canvas", "c => c.toDataURL('image/png')")
    assert png.value.path().read_bytes() == base64.b64decode(screen.split(",", 1)[1])
    assert multi.errors == []


def explained_tokens(page: Page) -> tuple[list[str], list[float]]:
    tokens = page.locator("#explain-tokens .explain-token")
    n = tokens.count()
    return [tokens.nth(k).inner_text() for k in range(n)], [
        float(tokens.nth(k).get_attribute("data-attribution") or "nan") for k in range(n)
    ]


def test_explain_shades_each_token_by_its_attribution_and_its_link_opens_it(
    multi: Watched, models_server: str, browser: Browser
) -> None:
    page = multi.page
    pick_model(page, "ce")
    page.fill("#text", QUERY)
    page.fill("#text-pair", DOCUMENTS[2])
    page.click("#submit")
    idle(page)
    open_tab(page, "explain")
    expected = httpx.post(
        f"{models_server}/explain", json={"model": "ce", "text": QUERY, "text_pair": DOCUMENTS[2]}
    ).json()
    tokens, values = explained_tokens(page)
    assert tokens == expected["tokens"]
    assert values == pytest.approx(expected["attributions"], abs=1e-6)
    readout = page.inner_text("#explain-readout")
    assert f"score {expected['score']:.4f}" in readout and f"baseline {expected['baseline_score']:.4f}" in readout
    # For in blue, against in red, the largest at full strength.
    largest = max(range(len(values)), key=lambda k: abs(values[k]))
    colour = page.locator("#explain-tokens .explain-token").nth(largest).evaluate("e => e.style.background")
    assert colour == ("rgb(33, 102, 172)" if values[largest] > 0 else "rgb(178, 24, 43)")
    # Gradient × input on the same text.
    page.select_option("#explain-method", "gradient_x_input")
    page.click("#explain-form button[type=submit]")
    idle(page)
    by_gradient = httpx.post(
        f"{models_server}/explain",
        json={"model": "ce", "text": QUERY, "text_pair": DOCUMENTS[2], "method": "gradient_x_input"},
    ).json()
    assert explained_tokens(page)[1] == pytest.approx(by_gradient["attributions"], abs=1e-6)
    assert "gradient × input" in page.inner_text("#explain-readout")
    # The page's address now links to this explanation: opened elsewhere, it shows the same.
    link = page.url
    assert "tab=explain" in link and "model=ce" in link
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        other = context.new_page()
        other.goto(link)  # integrated gradients, the form's default
        other.wait_for_selector("#explain-tokens .explain-token")
        idle(other)
        assert other.get_attribute("#tab-explain", "aria-selected") == "true"
        assert other.input_value("#text") == QUERY and other.input_value("#text-pair") == DOCUMENTS[2]
        assert explained_tokens(other)[1] == pytest.approx(expected["attributions"], abs=1e-6)
    finally:
        context.close()
    assert multi.errors == []
    # An embedding model has no score to explain: the service's reason, in words.
    pick_model(page, "minilm")
    assert "/similarity" in page.inner_text("#error")
    assert page.locator("#explain-tokens .explain-token").count() == 0


@pytest.fixture(scope="module")
def classifier_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A tiny random classifier of three labels, alone."""
    from tests.helpers import write_tiny_model

    classifier = write_tiny_model(tmp_path_factory.mktemp("clf"), head="sequence-classification", num_labels=3)
    with running_server({"ENCODER_MODELS": f"clf={classifier}"}) as url:
        yield url


def test_explain_on_a_classifier_shades_the_tokens_for_its_top_label(browser: Browser, classifier_server: str) -> None:
    with opened(browser, classifier_server) as watched:
        page = watched.page
        idle(page)
        page.fill("#text", QUERY)
        page.click("#submit")
        idle(page)
        open_tab(page, "explain")
        page.wait_for_selector("#explain-tokens .explain-token")
        expected = httpx.post(f"{classifier_server}/explain", json={"text": QUERY}).json()
        labels = httpx.post(f"{classifier_server}/classify", json={"texts": [QUERY]}).json()["data"][0]["labels"]
        assert expected["target"]["label"] == labels[0]["label"]  # the top label, as the tab says
        tokens, values = explained_tokens(page)
        assert tokens == expected["tokens"] and tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
        assert values == pytest.approx(expected["attributions"], abs=1e-6)
        readout = page.inner_text("#explain-readout")
        assert f"clf · label {labels[0]['label']} · integrated gradients, 50 steps" in readout
        assert f"score {expected['score']:.4f}" in readout and f"baseline {expected['baseline_score']:.4f}" in readout
        assert watched.errors == []


def test_rerank_with_a_plain_encoder_ranks_by_cosine(multi: Watched) -> None:
    page = multi.page
    assert page.input_value("#model-select") == "minilm"
    rank(page)
    assert page.is_hidden("#error")
    assert "Scored by the cosine of the query's and the document's embeddings" in page.inner_text("#rerank-readout")
    assert page.locator("#rerank-list button").count() == len(DOCUMENTS)
    assert "Needs a cross-encoder" not in page.inner_text("#view-rerank")  # it ranks without one, and says how
    # A document's cosine, explained as /similarity explains it (the pairs of tokens it comes from), not by
    # attention in a pass that never computed the score.
    with posted(page, "/similarity") as request:
        page.locator("#rerank-list button").nth(0).click()
    idle(page)
    assert request.value.post_data_json["explain"] is True
    assert page.is_visible("#rerank-attn-canvas") and ink(page, "#rerank-attn-canvas") > 0
    assert "the cells sum to its score" in page.inner_text("#rerank-readout")
    assert multi.errors == []


# ---- the models people pick now: a causal model with grouped-query attention, a yes/no reranker, DeBERTa ----

DECODER_TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def decoders_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Tiny random Qwen3 embedder (4 query heads over 2 key/value heads, causal, last-token pooling), a
    Qwen3-Reranker-shaped causal LM and a DeBERTa-v3-shaped model (relative positions)."""
    from tests.families import write_family_model

    root = tmp_path_factory.mktemp("viewer-decoders")
    models = {
        "qwen3": write_family_model(root / "qwen3", "qwen3"),
        "reranker": write_family_model(root / "reranker", "qwen3-reranker", head="causal-lm"),
        "deberta": write_family_model(root / "deberta", "deberta-v2"),
    }
    with running_server({"ENCODER_MODELS": ",".join(f"{n}={d}" for n, d in models.items())}) as url:
        yield url


@pytest.fixture
def decoder_page(browser: Browser, decoders_server: str) -> Iterator[Watched]:
    with opened(browser, decoders_server) as watched:
        idle(watched.page)
        yield watched


def downloaded_json(page: Page) -> Any:
    with page.expect_download() as data:
        page.click("#download-json")
    return json.loads(open(data.value.path(), encoding="utf-8").read())


def test_a_causal_model_with_grouped_query_heads_works_in_every_view(
    decoder_page: Watched, decoders_server: str
) -> None:
    page = decoder_page.page
    assert page.input_value("#model-select") == "qwen3"  # the first listed, the default
    info = page.inner_text("#model-info")
    assert info.startswith("qwen3 · 2 layers × 4 heads (2 key/value) · 16 wide · causal: each token sees itself")
    # Which query heads share a key/value head: said under the toggles and on each toggle.
    assert page.is_visible("#head-groups")
    assert page.inner_text("#head-groups").startswith(
        "Grouped-query attention: heads 0–1 share key/value head 0; heads 2–3 share key/value head 1."
    )
    toggles = page.locator("#head-toggles button")
    assert [toggles.nth(h).get_attribute("title") for h in range(4)] == [
        "head 0 · key/value head 0",
        "head 1 · key/value head 0",
        "head 2 · key/value head 1",
        "head 3 · key/value head 1",
    ]
    submit(page, DECODER_TEXT)
    assert ink(page, "#head-canvas") > 0

    # The heatmap: the causal triangle, zero above the diagonal and read as such.
    open_tab(page, "heatmap")
    tokens = page_tokens(page)
    grid = layout(page, "m.heatmapLayout(arg)", tokens)
    hover_cell(page, "#heat-canvas", grid, 0, len(tokens) - 1)
    assert page.inner_text("#heat-readout").startswith(f"“{tokens[0]}” → “{tokens[-1]}”: 0.0000")
    hover_cell(page, "#heat-canvas", grid, 0, 0)
    assert page.inner_text("#heat-readout").startswith(f"“{tokens[0]}” → “{tokens[0]}”: 1.0000")
    matrix = downloaded_json(page)["matrix"]
    assert len(matrix) == len(tokens)
    assert all(matrix[i][j] == 0 for i in range(len(tokens)) for j in range(i + 1, len(tokens)))
    assert all(matrix[i][i] > 0 for i in range(len(tokens)))
    for tab, canvas in (("model", "#model-canvas"), ("neuron", "#neuron-canvas"), ("stats", "#stats-canvas")):
        open_tab(page, tab)
        assert ink(page, canvas) > 0, tab
    # The neuron view's head 1 uses key/value head 0: the same keys as head 0's, its own queries.
    open_tab(page, "neuron")
    first = downloaded_json(page)
    with posted(page, "/attention/neuron", head=1):
        page.select_option("#neuron-head", "1")
    idle(page)
    second = downloaded_json(page)
    assert first["keys"] == second["keys"] and first["queries"] != second["queries"]

    # Positional encoding: the model's own rotary angles at its base; no learned table to offer.
    open_tab(page, "pe")
    kinds = page.eval_on_selector_all("#pe-kind option", "os => os.map((o) => o.value)")
    assert kinds == ["sinusoidal", "rotary"]
    page.select_option("#pe-kind", "rotary")
    assert page.is_disabled("#pe-width")
    with page.expect_response(lambda r: "kind=rotary" in r.url):
        page.click("#pe-form button[type=submit]")
    idle(page)
    length = int(page.input_value("#pe-length"))
    answer = httpx.get(
        f"{decoders_server}/positional-encoding", params={"kind": "rotary", "length": length, "model": "qwen3"}
    ).json()
    pairs = len(answer["encoding"][0])
    assert pairs == 4  # half the head width, 8
    grid = layout(page, "m.peLayout(arg[0], arg[1])", [answer["length"], pairs])
    assert css_size(page, "#pe-canvas") == (grid["width"], grid["height"])
    hover_cell(page, "#pe-canvas", grid, 3, 1)
    theta = 3 / answer["base"] ** (2 / 8)  # position 3, pair 1 of a head 8 wide
    assert page.inner_text("#pe-readout").startswith(f"position 3, pair 1: θ = {theta:.4f} rad")

    # Similarity, explained at the last token (the model's pooling): the whole score in one cell.
    compare(page, [DECODER_TEXT, "A lazy dog.", "Hello world!"])
    page.click("#sim-grid button[data-row='0'][data-col='1']")
    idle(page)
    assert page.is_visible("#sim-explain-canvas") and ink(page, "#sim-explain-canvas") > 0
    assert "(method: last_token)" in page.inner_text("#sim-explain-readout")
    assert decoder_page.errors == []


def test_byte_level_tokens_are_labelled_with_the_text_they_cover(decoder_page: Watched, decoders_server: str) -> None:
    """A byte-level BPE tokenizer spells a space Ġ and a newline Ċ; the page labels each token with the text it
    covers (its offsets), a newline as ↵, where the API keeps the tokenizer's own spelling."""
    page = decoder_page.page
    text = "The quick brown fox\njumps over the lazy dog."
    submit(page, text)
    answer = httpx.post(f"{decoders_server}/attention", json={"text": text, "model": "qwen3", "layers": [0]}).json()
    assert any("Ġ" in token for token in answer["tokens"]) and any("Ċ" in token for token in answer["tokens"])
    covered = covered_texts(answer["tokens"], answer["token_details"], [text])
    shown = page_tokens(page)
    assert shown == covered
    assert " quick" in shown and not any("Ġ" in token or "Ċ" in token for token in shown)
    assert decoder_page.errors == []


def test_a_yes_no_reranker_ranks_and_shows_each_documents_attention_to_the_query(
    decoder_page: Watched, decoders_server: str
) -> None:
    page = decoder_page.page
    pick_model(page, "reranker")
    rank(page)
    expected = httpx.post(
        f"{decoders_server}/rerank",
        json={"query": QUERY, "documents": DOCUMENTS, "model": "reranker", "return_documents": True},
    ).json()
    assert expected["method"] == "yes-no"
    buttons = page.locator("#rerank-list button")
    assert [buttons.nth(k).get_attribute("data-index") for k in range(len(DOCUMENTS))] == [
        str(r["index"]) for r in expected["results"]
    ]
    readout = page.inner_text("#rerank-readout")
    assert readout.startswith("Scored by the chance the model answers “yes” rather than “no”")
    assert readout.endswith("Select a document to see its attention to the query.")
    buttons.nth(0).click()
    idle(page)
    # Causal: the query, read first, never sees the document; the document's tokens (rows) see the query's.
    document = expected["results"][0]["document"]
    attention = httpx.post(
        f"{decoders_server}/attention",
        json={"text": QUERY, "text_pair": document, "model": "reranker", "layers": [-1], "aggregate": "mean"},
    ).json()
    details = attention["token_details"]
    tokens = covered_texts(attention["tokens"], details, [QUERY, document])  # as the page labels them
    rows = [tokens[i] for i, d in enumerate(details) if d["segment"] == 1 and not d["special"]]
    cols = [tokens[i] for i, d in enumerate(details) if d["segment"] == 0 and not d["special"]]
    title = "reranker · last layer, mean over heads: document 1 → query"
    block = layout(page, "m.crossLayout(arg[0], arg[1], arg[2])", [rows, cols, title])
    assert css_size(page, "#rerank-attn-canvas") == (block["width"], block["height"])
    saved = downloaded_json(page)["attention"]
    assert saved["title"] == title and saved["rowTokens"] == rows and saved["colTokens"] == cols
    assert min(min(row) for row in saved["matrix"]) > 0  # every document token sees every query token
    assert decoder_page.errors == []


def test_relative_positions_are_drawn_as_the_bucket_matrix(decoder_page: Watched, decoders_server: str) -> None:
    page = decoder_page.page
    pick_model(page, "deberta")
    open_tab(page, "pe")
    kinds = page.eval_on_selector_all("#pe-kind option", "os => os.map((o) => o.value)")
    assert kinds == ["sinusoidal", "relative"]
    page.select_option("#pe-kind", "relative")
    page.fill("#pe-length", "24")
    page.click("#pe-form button[type=submit]")
    idle(page)
    answer = httpx.get(
        f"{decoders_server}/positional-encoding", params={"kind": "relative", "length": 24, "model": "deberta"}
    ).json()
    grid = layout(page, "m.peLayout(24, 24)")
    assert css_size(page, "#pe-canvas") == (grid["width"], grid["height"])
    assert ink(page, "#pe-canvas") > 0
    hover_cell(page, "#pe-canvas", grid, 2, 20)
    assert page.inner_text("#pe-readout") == f"query 2, key 20: bucket {answer['encoding'][2][20]}"
    hover_cell(page, "#pe-canvas", grid, 20, 2)
    assert page.inner_text("#pe-readout") == f"query 20, key 2: bucket {answer['encoding'][20][2]}"
    assert answer["encoding"][2][20] != answer["encoding"][20][2]
    assert decoder_page.errors == []


# ---- retrieval models: a ColBERT model's MaxSim, a SPLADE model's shared terms ----


@pytest.fixture(scope="module")
def retrieval_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A tiny random ColBERT model (sentence-transformers' MultiVectorEncoder layout, listed first) and a tiny
    random SPLADE model."""
    from tests.families import write_family_model
    from tests.retrieval import write_colbert, write_splade

    root = tmp_path_factory.mktemp("viewer-retrieval")
    base = write_family_model(root / "base", "electra", seed=4)
    models = {
        "colbert": write_colbert(root / "colbert", base, {"strategy": "fixed", "attend": False, "length": 12}),
        "splade": write_splade(root / "splade", "bert", "max", seed=2),
    }
    with running_server({"ENCODER_MODELS": ",".join(f"{n}={d}" for n, d in models.items())}) as url:
        yield url


@pytest.fixture
def retrieval_page(browser: Browser, retrieval_server: str) -> Iterator[Watched]:
    with opened(browser, retrieval_server) as watched:
        idle(watched.page)
        yield watched


def test_a_colbert_models_similarity_is_maxsim_and_explained_by_best_matches(
    retrieval_page: Watched, retrieval_server: str
) -> None:
    page = retrieval_page.page
    assert page.input_value("#model-select") == "colbert"
    texts = ["the quick brown fox", "a lazy dog sleeps", "attention is all you need"]
    compare(page, texts)
    assert "MaxSim" in page.inner_text("#sim-table caption")
    rows = page.locator("#sim-table tbody tr")
    for i, source in enumerate(texts):  # each row: the text read as a query against all of them as documents
        scores = httpx.post(f"{retrieval_server}/similarity", json={"source": source, "texts": texts}).json()
        shown = [float(rows.nth(i).locator("td").nth(j).inner_text()) for j in range(len(texts))]
        assert shown == pytest.approx([item["score"] for item in scores["data"]], abs=0.006)
    with posted(page, "/similarity") as request:
        page.click("#sim-grid button[data-row='0'][data-col='1']")
    idle(page)
    assert request.value.post_data_json == {
        "source": texts[0],
        "texts": [texts[1]],
        "explain": True,
        "model": "colbert",
    }
    item = httpx.post(f"{retrieval_server}/similarity", json=request.value.post_data_json).json()["data"][0]
    explanation = item["explanation"]
    assert explanation["method"] == "maxsim"
    assert page.is_visible("#sim-explain-canvas") and ink(page, "#sim-explain-canvas") > 1000
    assert texts_of(page, "#sim-explain-table tbody th") == explanation["source_tokens"]
    assert texts_of(page, "#sim-explain-table thead th")[1:] == [*explanation["tokens"], "total"]
    cells = table_numbers(page, "#sim-explain-table tbody td:not(.source-total)")
    assert cells == pytest.approx([v for line in explanation["contributions"] for v in line], abs=1e-5)
    assert "method: maxsim" in page.inner_text("#sim-explain-readout")
    assert retrieval_page.errors == []


def test_rerank_explains_maxsim_by_best_matches_and_sparse_dot_by_shared_terms(
    retrieval_page: Watched, retrieval_server: str
) -> None:
    page = retrieval_page.page
    rank(page)
    assert "Scored by MaxSim" in page.inner_text("#rerank-readout")
    buttons = page.locator("#rerank-list button")
    with posted(page, "/similarity") as request:  # MaxSim's terms, as /similarity explains them
        buttons.nth(0).click()
    idle(page)
    assert request.value.post_data_json["explain"] is True
    assert page.is_visible("#rerank-attn-canvas") and ink(page, "#rerank-attn-canvas") > 0
    assert "the cells sum to its score" in page.inner_text("#rerank-readout")

    pick_model(page, "splade")
    rank(page)
    assert "Scored by the dot product of the query's and the document's sparse vectors" in page.inner_text(
        "#rerank-readout"
    )
    expected = httpx.post(
        f"{retrieval_server}/rerank",
        json={"query": QUERY, "documents": DOCUMENTS, "model": "splade", "return_documents": True},
    ).json()["results"]
    buttons.nth(0).click()
    idle(page)
    assert "the products sum to its score" in page.inner_text("#rerank-readout")
    document = expected[0]["document"]
    sparse = httpx.post(
        f"{retrieval_server}/encode/sparse",
        json={"texts": [QUERY, document], "model": "splade", "return_tokens": True},
    ).json()["data"]
    query_weights = dict(zip(sparse[0]["indices"], sparse[0]["values"], strict=True))
    shared = sorted(
        (
            (query_weights[index] * value, token)
            for index, value, token in zip(sparse[1]["indices"], sparse[1]["values"], sparse[1]["tokens"], strict=True)
            if index in query_weights
        ),
        reverse=True,
    )
    assert sum(product for product, _ in shared) == pytest.approx(expected[0]["relevance_score"], rel=1e-4)
    terms = [{"document": token, "relevance_score": product} for product, token in shared]
    grid = layout(page, "m.rerankLayout(arg)", terms)
    assert css_size(page, "#rerank-attn-canvas") == (grid["width"], grid["height"])
    page.locator("#rerank-attn-canvas").scroll_into_view_if_needed()
    hover_cell(page, "#rerank-attn-canvas", grid, 0, 0)
    assert page.inner_text("#rerank-readout").startswith(f"“{shared[0][1]}”: ")
    assert page.inner_text("#rerank-readout").endswith(f"= {shared[0][0]:.4f}")
    assert retrieval_page.errors == []


def test_the_api_docs_render_every_operation_with_the_network_off(browser: Browser, server: str) -> None:
    """/docs (Swagger UI 5, which renders FastAPI's OpenAPI 3.1) from the service's own files: every request to
    another host is refused, as on a machine without network, and every operation still renders."""
    schema = httpx.get(f"{server}/openapi.json").json()
    assert schema["openapi"].startswith("3.1")
    operations = sum(len(methods) for methods in schema["paths"].values())
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        context.route(lambda url: not url.startswith(server), lambda route: route.abort())
        watched = Watched(context.new_page())
        watched.page.goto(server + "/docs")
        watched.page.wait_for_selector(".opblock-summary-path", timeout=30_000)
        assert watched.page.locator(".opblock").count() == operations
        assert "/encode" in watched.page.locator(".opblock-summary-path").all_inner_texts()
        outside = [url for url in watched.requests if not url.startswith(server) and not url.startswith("data:")]
        assert outside == [], outside
        assert watched.errors == [], watched.errors
    finally:
        context.close()
    assert httpx.get(f"{server}/redoc").status_code == 404  # not offered: ReDoc's page asks a CDN for its logo
