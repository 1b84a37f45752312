"""Screenshots of each view of the attention viewer, for the README: `make screenshots`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from tests.app.test_viewer import CHROMIUM_ARGS  # noqa: E402
from tests.helpers import running_server  # noqa: E402

VIEWS = {
    "head": "head-view",
    "model": "model-view",
    "heatmap": "heatmap",
    "pe": "positional-encoding",
    "similarity": "similarity",
}


def main() -> None:
    with running_server() as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"), args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1200, "height": 800}, device_scale_factor=1)
        page.goto(url + "/")
        page.wait_for_selector("#head-left .token")
        for tab, name in VIEWS.items():
            page.click(f"#tab-{tab}")
            page.wait_for_function("() => !document.body.hasAttribute('aria-busy')")
            if tab == "heatmap":
                page.select_option("#heat-head", "rollout")
                page.wait_for_function("() => !document.body.hasAttribute('aria-busy')")
            if tab == "similarity":
                page.click("#sim-form button[type=submit]")
                page.wait_for_function("() => !document.body.hasAttribute('aria-busy')")
            path = ROOT / "docs" / f"viewer-{name}.png"
            page.screenshot(path=str(path), full_page=True)
            print(f"wrote {path.relative_to(ROOT)}")
        browser.close()


if __name__ == "__main__":
    main()
