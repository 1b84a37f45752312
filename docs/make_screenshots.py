"""Screenshots of each view of the attention viewer, for docs/viewer.md: `make screenshots`."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import Page, sync_playwright  # noqa: E402

from model import DEFAULT_MODEL_NAME, default_model_path  # noqa: E402
from tests.app.test_viewer import CHROMIUM_ARGS  # noqa: E402
from tests.helpers import running_server, write_tiny_model  # noqa: E402

# (tab, file name): each view as it opens, some after a step of their own (below); in this order,
# the rerank and explain views last, since they need the cross-encoder.
VIEWS = [
    ("head", "head-view"),
    ("model", "model-view"),
    ("heatmap", "heatmap"),
    ("neuron", "neuron-view"),
    ("stats", "head-statistics"),
    ("pe", "positional-encoding"),
    ("similarity", "similarity"),
    ("similarity", "similarity-explanation"),
    ("head", "head-view-norm"),
    ("rerank", "rerank"),
    ("explain", "explain"),
]
# The rerank and explain views need a cross-encoder: a tiny random one, whose vocabulary has only a few dozen words
# (its attributions are those of random weights: the picture shows the view, not a finding).
CROSS_ENCODER = "tiny-cross-encoder"
QUERY = "the cat sat on the mat"
# The neuron view's query: "it" in "The animal didn't cross the street because it was too tired."
NEURON_QUERY = 10
DOCUMENTS = ["a lazy dog", "the cat sat on the mat", "the quick brown fox jumps over the lazy dog", "hello world"]


def idle(page: Page) -> None:
    page.wait_for_function("() => !document.body.hasAttribute('aria-busy')")


def main() -> None:
    scratch = tempfile.TemporaryDirectory()
    tiny = write_tiny_model(Path(scratch.name) / CROSS_ENCODER, head="sequence-classification", num_labels=1)
    env = {"ENCODER_MODELS": f"{DEFAULT_MODEL_NAME}={default_model_path()},{CROSS_ENCODER}={tiny}"}
    with scratch, running_server(env) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"), args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1200, "height": 800}, device_scale_factor=1)
        page.goto(url + "/")
        page.wait_for_selector("#head-left .token")
        for tab, name in VIEWS:
            if tab == "rerank":
                page.select_option("#model-select", CROSS_ENCODER)
                idle(page)
            page.click(f"#tab-{tab}")
            idle(page)
            if tab == "heatmap":
                page.select_option("#heat-head", "rollout")
                idle(page)
            if tab == "neuron":  # layer 4, head 2: "it" looks at "animal", the page's example sentence
                page.select_option("#neuron-layer", "3")
                idle(page)
                page.select_option("#neuron-head", "1")
                idle(page)
                page.click(f"#neuron-tokens [data-index='{NEURON_QUERY}']")
            if name == "head-statistics":
                page.select_option("#stats-statistic", "to_previous")
            if name == "similarity":
                page.click("#sim-form button[type=submit]")
                idle(page)
            if name == "similarity-explanation":  # texts 1 and 2: a guitar and an instrument
                page.click("#sim-grid button[data-row='0'][data-col='1']")
                idle(page)
            if name == "head-view-norm":  # the same layer as head-view, for comparison
                page.check("#head-norm")
                idle(page)
            if tab == "rerank":
                page.fill("#rerank-query", QUERY)
                page.fill("#rerank-docs", "\n".join(DOCUMENTS))
                page.click("#rerank-form button[type=submit]")
                idle(page)
                page.click("#rerank-list button >> nth=0")
                idle(page)
            if tab == "explain":  # the query and the best-ranked document, integrated gradients in 50 steps
                page.fill("#text", QUERY)
                page.fill("#text-pair", DOCUMENTS[2])
                page.click("#submit")
                idle(page)
                page.click("#tab-explain")
                page.wait_for_selector("#explain-tokens .explain-token")
                idle(page)
            page.mouse.move(0, 0)  # no tooltip left over from a click
            path = ROOT / "docs" / f"viewer-{name}.png"
            page.screenshot(path=str(path), full_page=True)
            print(f"wrote {path.relative_to(ROOT)}")
        browser.close()


if __name__ == "__main__":
    main()
