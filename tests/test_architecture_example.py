"""docs/ARCHITECTURE.md's examples of adding a task and an API dialect, run as written: each block in the namespace of
the file its first line names (as if it were written there; a new one's, made for it), served in process, the
answers against transformers and sentence-transformers."""

from __future__ import annotations

import importlib
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi import APIRouter

from app.engine.messages import KINDS
from app.services.embeddings import Embeddings
from app.settings import Settings
from model import TextEncoder, default_model_path, tasks
from tests.helpers import serving

DOC = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hi", "Attention is all you need, and a little more."]


def example_blocks(
    start: str = "**A task**, in four places.", end: str = "**An API dialect**"
) -> list[tuple[str, str]]:
    """The python blocks of a section (by default, on adding a task), each with the module its first line names."""
    text = DOC.read_text()
    section = text[text.index(start) : text.index(end)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    named = []
    for block in blocks:
        path = re.search(r"\b((?:app|model)/[\w/]+)\.py\b", block.splitlines()[0])
        assert path is not None, f"a block's first line names its file: {block.splitlines()[0]!r}"
        named.append((path.group(1).replace("/", "."), block))
    return named


def test_the_example_names_four_places_and_a_file_for_each_block() -> None:
    blocks = example_blocks()
    assert [module for module, _ in blocks] == [
        "model.runtime.tasks",
        "app.engine.messages",
        "app.services.embeddings",
        "app.schemas",
        "app.api.embeddings",
    ]


async def test_adding_a_task_as_the_architecture_shows_serves_it(
    bundled_model: TextEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModel, AutoTokenizer

    router = APIRouter()  # the route's, rather than app/api/embeddings.py's own (shared by every app of the run)
    monkeypatch.setitem(KINDS, "token_norms", None)  # type: ignore[misc]  # the declaration's entry, taken out again after the test
    earlier: dict[str, object] = {}  # what the blocks before define, as the later files would import it
    defined = []
    for module_name, block in example_blocks():
        namespace = {**vars(importlib.import_module(module_name)), **earlier, "router": router}
        before = dict(namespace)
        exec(compile(block, f"<{DOC.name}: {module_name}>", "exec"), namespace)  # noqa: S102
        new = {name: value for name, value in namespace.items() if before.get(name, namespace) is not value}
        defined.append(new)
        earlier.update(new)
    monkeypatch.setattr(tasks, "token_norms", defined[0]["token_norms"], raising=False)
    monkeypatch.setattr(Embeddings, "token_norms", defined[2]["token_norms"], raising=False)

    async with serving(Settings(), bundled_model) as service:
        service.app.include_router(router)
        response = await service.client.post("/encode/token-norms", json={"texts": TEXTS})
        refused = await service.client.post("/encode/token-norms", json={"texts": []})
    assert response.status_code == 200, response.text
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "texts"

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    reference = AutoModel.from_pretrained(str(default_model_path())).eval()
    norms = response.json()["norms"]
    assert len(norms) == len(TEXTS)
    for text, ours in zip(TEXTS, norms, strict=True):
        with torch.no_grad():
            hidden = reference(**tokenizer([text], return_tensors="pt")).last_hidden_state[0]  # (T, D)
        np.testing.assert_allclose(ours, hidden.norm(dim=-1).numpy(), rtol=1e-5, atol=1e-4)


def dialect_blocks() -> list[tuple[str, str]]:
    return example_blocks("**An API dialect**, in one folder", "## Tests")


def test_the_dialect_example_is_one_folder_of_three_files() -> None:
    assert [module for module, _ in dialect_blocks()] == [
        "app.api.acme.types",
        "app.api.acme.translate",
        "app.api.acme.routes",
    ]


async def test_adding_a_dialect_as_the_architecture_shows_serves_it(
    bundled_model: TextEncoder, sentence_transformer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its files made as new modules from the blocks alone (each imports what it needs), its router included as
    add_routes includes one: the answer in its shape, equal to sentence-transformers; its errors in its shape."""
    monkeypatch.setitem(sys.modules, "app.api.acme", types.ModuleType("app.api.acme"))
    modules = {}
    for module_name, block in dialect_blocks():
        module = types.ModuleType(module_name)
        monkeypatch.setitem(sys.modules, module_name, module)  # the later blocks import it as a file of the folder
        exec(compile(block, f"<{DOC.name}: {module_name}>", "exec"), vars(module))  # noqa: S102
        modules[module_name] = module
    router = modules["app.api.acme.routes"].router

    async with serving(Settings(), bundled_model) as service:
        service.app.include_router(router)
        response = await service.client.post("/acme/embed", json={"sentences": TEXTS, "ignored": 1})
        empty = await service.client.post("/acme/embed", json={"sentences": []})
        unknown = await service.client.post("/acme/embed", json={"sentences": TEXTS, "model": "no-such-model"})
        openapi = (await service.client.get("/openapi.json")).json()
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"vectors", "dims"} and body["dims"] == 384
    wanted = sentence_transformer.encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(np.array(body["vectors"]), wanted, atol=1e-5)
    assert empty.status_code == 422 and set(empty.json()) == {"fault"} and "sentences" in empty.json()["fault"]
    assert (
        unknown.status_code == 404 and set(unknown.json()) == {"fault"} and "no-such-model" in unknown.json()["fault"]
    )
    assert "/acme/embed" in openapi["paths"] and "AcmeEmbedResponse" in openapi["components"]["schemas"]
