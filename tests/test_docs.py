"""Every command block of docs/guide.md and docs/models.md, run as a reader runs it: each ``make serve`` line with
settings starts the service it says (the models it names by Hub id fetched from a stand-in Hub that publishes tiny
random stand-ins under those ids, the bundled model's own files under sentence-transformers/all-MiniLM-L6-v2) and
serves the examples after it up to the next heading; every other example runs against plain ``make serve``, the
bundled all-MiniLM-L6-v2. ``curl`` commands answer as the page shows; each Python block runs in an environment of
its own made by the ``pip install`` lines the page shows before it (a block without them uses the project itself,
with the project's interpreter) and prints what its comments say. tests/pages.py says how a page is read and what
each answer is held to. No command of these pages is left out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.pages import (
    Other,
    Request,
    Script,
    Serve,
    Services,
    check_request,
    check_script,
    check_serve,
    services,
    steps,
)

pytestmark = pytest.mark.slow  # services in their own processes

PAGES = [ROOT / "docs" / "guide.md", ROOT / "docs" / "models.md"]
STEPS = [step for page in PAGES for step in steps(page)]
SERVES = [step for step in STEPS if isinstance(step, Serve)]
REQUESTS = [step for step in STEPS if isinstance(step, Request)]
SCRIPTS = [step for step in STEPS if isinstance(step, Script)]


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    with services(tmp_path_factory.mktemp("docs")) as running:
        yield running


def test_every_command_of_the_pages_is_run() -> None:
    assert [step for step in STEPS if isinstance(step, Other)] == []
    assert len(REQUESTS) >= 20 and len(SCRIPTS) >= 4, STEPS
    assert len([step for step in REQUESTS if step.answer is not None or step.rest]) >= 15, REQUESTS


@pytest.mark.parametrize("step", SERVES, ids=[step.where for step in SERVES])
def test_each_make_serve_line_serves_the_models_it_names(pool: Services, step: Serve) -> None:
    check_serve(step, pool)


@pytest.mark.parametrize("step", REQUESTS, ids=[step.where for step in REQUESTS])
def test_each_example_answers_as_its_page_shows(pool: Services, step: Request, tmp_path: Path) -> None:
    check_request(step, pool, tmp_path)


@pytest.mark.timeout(600)  # the first run installs the clients from PyPI (the TEI clients: about 100 s)
@pytest.mark.parametrize("step", SCRIPTS, ids=[step.where for step in SCRIPTS])
def test_each_python_block_prints_what_its_page_says(pool: Services, step: Script, tmp_path: Path) -> None:
    check_script(step, pool, tmp_path)
