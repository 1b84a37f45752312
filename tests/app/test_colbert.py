"""ColBERT checkpoints on POST /encode/multi-vector, /rerank (MaxSim) and /similarity's explanation, against
sentence-transformers' MultiVectorEncoder loading the same directories: its own saves (query expansion fixed or
min, attended to or not; the skiplist; document length; meanmaxsim) and PyLate's (≤ 3) layout, whose prefix tokens
([unused0]) must stay whole."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from sentence_transformers.util.quantization import quantize_embeddings

from app.main import create_app
from app.settings import Settings
from model import TextEncoder, load_model
from tests.families import write_family_model
from tests.helpers import Service, assert_error, wait_until_ready
from tests.retrieval import COLBERT_WIDTH as WIDTH
from tests.retrieval import write_colbert

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention, is all you need!",
    "hi",
    "a rather long document that goes on and on, well past the document length of the model, with commas, "
    "full stops. And more words after them; a query this long fills the expansion entirely.",
]


def encoder_reference(directory: Path) -> Any:
    from sentence_transformers import MultiVectorEncoder

    return MultiVectorEncoder(str(directory), device="cpu")


def save_pylate(directory: Path, base: Path) -> Path:
    """PyLate's (≤ 3) layout by hand over the bundled MiniLM: modules Transformer and PyLate's Dense, the prefixes
    [unused0] and [unused1], the lengths and the expansion flag at the top of config_sentence_transformers.json."""
    directory.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (directory / name).symlink_to(base / name)
    (directory / "special_tokens_map.json").symlink_to(base / "special_tokens_map.json")
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": False}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    st = {
        "model_type": "ColBERT",
        "query_prefix": "[unused0]",
        "document_prefix": "[unused1]",
        "query_length": 16,
        "document_length": 24,
        "attend_to_expansion_tokens": False,
        "similarity_fn_name": "MaxSim",
        "prompts": {"query": "", "document": ""},
        "default_prompt_name": None,
    }
    (directory / "config_sentence_transformers.json").write_text(json.dumps(st))
    (directory / "1_Dense").mkdir()
    dense: dict[str, object] = {"in_features": 384, "out_features": WIDTH, "bias": False}
    dense |= {"activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}
    (directory / "1_Dense" / "config.json").write_text(json.dumps(dense))
    weight = torch.randn(WIDTH, 384, generator=torch.Generator().manual_seed(7)) / 8
    save_file({"linear.weight": weight}, str(directory / "1_Dense" / "model.safetensors"))
    return directory


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory, bundled_path: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("colbert")
    base = write_family_model(root / "base", "electra", seed=4)
    fixed = {"strategy": "fixed", "attend": False, "length": 12}
    attended = {"strategy": "min", "attend": True, "length": 10}
    return {
        "fixed": write_colbert(root / "fixed", base, fixed),
        "min": write_colbert(
            root / "min",
            base,
            attended,
            similarity="meanmaxsim",
            skiplist_tasks=["query", "document"],
            normalize=False,
            bias=True,
            document_length=48,
        ),
        "plain": write_colbert(root / "plain", base, None),
        "pylate": save_pylate(root / "pylate", bundled_path),
    }


@pytest.fixture(scope="module")
async def service(directories: dict[str, Path], bundled_model: TextEncoder) -> AsyncIterator[Service]:
    models = {name: load_model(path, name=name, device="cpu", dtype="float32") for name, path in directories.items()}
    app = create_app(Settings(), {**models, "minilm": bundled_model})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            await wait_until_ready(client)
            yield Service(app, client)


def reference_vectors(directory: Path, texts: list[str], query: bool) -> list[np.ndarray]:
    reference = encoder_reference(directory)
    encode = reference.encode_query if query else reference.encode_document
    return [np.asarray(vectors, dtype=np.float32) for vectors in encode(texts, convert_to_numpy=True)]


@pytest.mark.parametrize("name", ["fixed", "min", "plain", "pylate"])
@pytest.mark.parametrize("query", [True, False], ids=["query", "document"])
async def test_vectors_equal_multi_vector_encoder(
    service: Service, directories: dict[str, Path], name: str, query: bool
) -> None:
    response = await service.client.post(
        "/encode/multi-vector", json={"texts": TEXTS, "model": name, "is_query": query}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["dim"] == WIDTH
    theirs = reference_vectors(directories[name], TEXTS, query)
    for item, expected in zip(body["data"], theirs, strict=True):
        assert len(item["tokens"]) == len(item["embeddings"])
        np.testing.assert_allclose(np.array(item["embeddings"]), expected, atol=3e-5)


async def test_tokens_show_prefixes_expansion_and_skipped_punctuation(service: Service) -> None:
    text = "Attention, is all you need!"
    query = await service.client.post("/encode/multi-vector", json={"texts": text, "model": "pylate", "is_query": True})
    tokens = query.json()["data"][0]["tokens"]
    # the prefix kept whole, the punctuation scored in a query, the query filled with [MASK] up to 16
    assert tokens[:3] == ["[CLS]", "[unused0]", "attention"] and "," in tokens and "!" in tokens
    assert len(tokens) == 16 and tokens[-1] == "[MASK]" and tokens.count("[MASK]") == 16 - tokens.index("[MASK]")
    document = await service.client.post("/encode/multi-vector", json={"texts": text, "model": "pylate"})
    tokens = document.json()["data"][0]["tokens"]
    assert tokens[:3] == ["[CLS]", "[unused1]", "attention"] and "," not in tokens and "!" not in tokens
    assert "[MASK]" not in tokens


@pytest.mark.parametrize("name", ["fixed", "min", "pylate"])
async def test_rerank_scores_equal_the_encoders_maxsim(
    service: Service, directories: dict[str, Path], name: str
) -> None:
    query, documents = "who jumps over the dog?", TEXTS
    response = await service.client.post("/rerank", json={"query": query, "documents": documents, "model": name})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["method"] == "maxsim"
    reference = encoder_reference(directories[name])
    expected = reference.similarity(reference.encode_query([query]), reference.encode_document(documents))[0]
    expected = expected.numpy()
    assert [r["index"] for r in body["results"]] == np.argsort(-expected, kind="stable").tolist()
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(float(expected[result["index"]]), rel=1e-5, abs=1e-5)


async def test_binary_formats_and_info(service: Service) -> None:
    floats = await service.client.post("/encode/multi-vector", json={"texts": TEXTS[0], "model": "fixed"})
    packed = await service.client.post(
        "/encode/multi-vector", json={"texts": TEXTS[0], "model": "fixed", "encoding_format": "binary"}
    )
    vectors = np.array(floats.json()["data"][0]["embeddings"], dtype=np.float32)
    expected = np.asarray(quantize_embeddings(vectors, precision="binary")).astype(np.int64)
    np.testing.assert_array_equal(np.array(packed.json()["data"][0]["embeddings"]), expected)
    info = (await service.client.get("/info", params={"model": "pylate"})).json()
    assert (info["multi_vector"], info["rerank"], info["sparse"]) == ("colbert", "maxsim", None)
    cosine = {"query": "q", "documents": ["d"], "model": "pylate", "method": "cosine"}  # no sentence embedding
    assert_error(await service.client.post("/rerank", json=cosine), 422, "validation_error", "method", "by maxsim,")


async def test_too_long_without_truncation_names_the_side_and_its_length(service: Service) -> None:
    long = {"texts": ["short", TEXTS[3]], "model": "fixed", "truncate": False}
    assert_error(
        await service.client.post("/encode/multi-vector", json=long),
        422,
        "validation_error",
        "texts[1]",
        "more than the document maximum of 20",
    )
    query = {**long, "is_query": True}
    assert_error(
        await service.client.post("/encode/multi-vector", json=query),
        422,
        "validation_error",
        "texts[1]",
        "query maximum of 12",
    )
    assert (await service.client.post("/encode/multi-vector", json={**long, "truncate": True})).status_code == 200


def test_unserved_layouts_are_refused_at_load(directories: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    images = shutil.copytree(directories["fixed"], tmp_path / "images")
    mask = images / "2_MultiVectorMask" / "config.json"
    mask.write_text(json.dumps({**json.loads(mask.read_text()), "keep_only_token_ids": [5]}))
    with pytest.raises(ValueError, match="keep_only_token_ids"):
        load_model(images, device="cpu")
    residual = shutil.copytree(directories["fixed"], tmp_path / "residual")
    dense = residual / "1_Dense" / "config.json"
    dense.write_text(json.dumps({**json.loads(dense.read_text()), "use_residual": True}))
    with pytest.raises(ValueError, match="each token vector"):
        load_model(residual, device="cpu")


@pytest.mark.parametrize("name", ["fixed", "min"])
async def test_similarity_explains_maxsim_by_each_source_vectors_best_match(
    service: Service, directories: dict[str, Path], name: str
) -> None:
    source, texts = "who jumps over the dog?", TEXTS[:3]
    body = {"source": source, "texts": texts, "model": name, "explain": True}
    response = await service.client.post("/similarity", json=body)
    assert response.status_code == 200, response.text
    reference = encoder_reference(directories[name])
    (query,) = [np.asarray(v) for v in reference.encode_query([source], convert_to_numpy=True)]
    documents = [np.asarray(v) for v in reference.encode_document(texts, convert_to_numpy=True)]
    expected = reference.similarity([query], documents)[0].numpy()
    for item, document in zip(response.json()["data"], documents, strict=True):
        assert item["score"] == pytest.approx(float(expected[item["index"]]), rel=1e-5, abs=1e-5)
        explanation = item["explanation"]
        assert explanation["method"] == "maxsim"
        contributions = np.array(explanation["contributions"])
        assert contributions.shape == (len(query), len(document))
        assert len(explanation["source_tokens"]) == len(query) and len(explanation["tokens"]) == len(document)
        assert contributions.sum() == pytest.approx(item["score"], rel=1e-4, abs=1e-5)
        products = query @ document.T
        share = len(query) if name == "min" else 1  # the "min" model averages (meanmaxsim)
        for row, best in zip(contributions, products, strict=True):
            assert np.count_nonzero(row) == 1
            assert row[np.argmax(best)] == pytest.approx(best.max() / share, abs=3e-5)
    plain = await service.client.post("/similarity", json={**body, "explain": False})
    assert [item["score"] for item in plain.json()["data"]] == pytest.approx(
        [item["score"] for item in response.json()["data"]], abs=1e-6
    )


async def test_vectors_a_request_may_return_are_bounded_and_info_says_how_many(
    directories: dict[str, Path],
) -> None:
    model = load_model(directories["fixed"], name="fixed", device="cpu", dtype="float32")
    app = create_app(Settings(max_vectors_per_request=30), {"fixed": model})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            await wait_until_ready(client)
            info = (await client.get("/info")).json()
            assert info["limits"]["max_vectors_per_request"] == 30
            # three short queries: each is filled to the expansion's 12 tokens, 36 vectors
            queries = {"texts": ["hi", "hi", "hi"], "is_query": True}
            response = await client.post("/encode/multi-vector", json=queries)
            assert_error(response, 422, "validation_error", "texts", "36 token vectors, more than the limit of 30")
            assert (
                await client.post("/encode/multi-vector", json={**queries, "texts": ["hi", "hi"]})
            ).status_code == 200
            rerank = {"query": "hi", "documents": [TEXTS[0]] * 4}
            assert_error(await client.post("/rerank", json=rerank), 422, "validation_error", "documents", "limit of 30")
            similar = {"source": TEXTS[0] * 3, "texts": ["hi"]}
            assert (await client.post("/similarity", json=similar)).status_code == 200
