"""Every command block of the README, run as a newcomer runs it from a fresh clone: its ``make serve`` lines (each
starts and serves the models it names, those named by Hub id fetched from a stand-in Hub), ``make download``, its
``curl`` commands against the bundled model, and its Python block (OpenAI's client) in an environment of its own
made by the ``pip install`` line the README shows before it. tests/pages.py says how a page is read and what each
answer is held to.

Two commands are not run, and only these: ``make test`` (it is the run this test is part of: CI runs it) and
``ENCODER_MODEL=/models/my-model make serve`` (a directory of the reader's own). Of ``make serve`` and ``make
download`` the install step is the set-up this test runs in (the environment it runs in stands for ``.venv``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.pages import (
    Download,
    Other,
    Request,
    Script,
    Serve,
    Services,
    check_download,
    check_request,
    check_script,
    check_serve,
    services,
    steps,
)

pytestmark = pytest.mark.slow  # services in their own processes

STEPS = steps(ROOT / "README.md")
SERVES = [step for step in STEPS if isinstance(step, Serve)]
DOWNLOADS = [step for step in STEPS if isinstance(step, Download)]
REQUESTS = [step for step in STEPS if isinstance(step, Request)]
SCRIPTS = [step for step in STEPS if isinstance(step, Script)]
NOT_RUN = {"make test", "ENCODER_MODEL=/models/my-model make serve"}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    with services(tmp_path_factory.mktemp("readme")) as running:
        yield running


def test_every_command_is_run_but_the_two_named() -> None:
    assert {step.line for step in STEPS if isinstance(step, Other)} == NOT_RUN
    assert len(SERVES) >= 4 and DOWNLOADS and len(REQUESTS) >= 3 and SCRIPTS, STEPS
    assert all(step.answer is not None for step in REQUESTS), REQUESTS
    assert all(step.installs for step in SCRIPTS), "the README says how to install the client each block uses"


@pytest.mark.parametrize("step", SERVES, ids=[step.where for step in SERVES])
def test_each_make_serve_line_serves_the_models_it_names(pool: Services, step: Serve) -> None:
    check_serve(step, pool)


@pytest.mark.parametrize("step", DOWNLOADS, ids=[step.where for step in DOWNLOADS])
def test_make_download_fills_the_cache(pool: Services, step: Download, tmp_path: Path) -> None:
    check_download(step, pool, tmp_path / "hf")


@pytest.mark.parametrize("step", REQUESTS, ids=[step.where for step in REQUESTS])
def test_each_curl_answers_as_the_readme_shows(pool: Services, step: Request, tmp_path: Path) -> None:
    check_request(step, pool, tmp_path)


@pytest.mark.timeout(600)  # the first run installs the clients from PyPI (the TEI clients: about 100 s)
@pytest.mark.parametrize("step", SCRIPTS, ids=[step.where for step in SCRIPTS])
def test_each_python_block_prints_what_the_readme_says(pool: Services, step: Script, tmp_path: Path) -> None:
    check_script(step, pool, tmp_path)
