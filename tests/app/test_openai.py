"""/v1/embeddings and /v1/models through the official openai client; several models in one service."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import numpy as np
import openai
import pytest
import torch

from app.settings import Settings
from model import TextEncoder
from tests.helpers import Service, assert_error, serving

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.", "Hi"]


@pytest.fixture(scope="module")
async def two_models(bundled_model: TextEncoder, tiny_model: TextEncoder) -> AsyncIterator[Service]:
    """The bundled model (the default) and the tiny BERT, in one service."""
    from app.main import create_app
    from tests.helpers import wait_until_ready

    app = create_app(Settings(), {"minilm": bundled_model, "tiny": tiny_model})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            await wait_until_ready(client)
            yield Service(app, client)


def openai_client(service: Service) -> openai.AsyncOpenAI:
    """The official client, talking to the app in-process."""
    return openai.AsyncOpenAI(
        base_url="http://testserver/v1",
        api_key="unused",
        # the client's type names its own httpx; an httpx client with the app as its transport works alike
        http_client=httpx.AsyncClient(  # type: ignore[arg-type]
            transport=httpx.ASGITransport(app=service.app), base_url="http://testserver"
        ),
        max_retries=0,
    )


async def test_openai_client_embeddings_equal_sentence_transformers(two_models: Service, sentence_transformer) -> None:
    client = openai_client(two_models)
    reference = sentence_transformer.encode(TEXTS, normalize_embeddings=True)
    default = await client.embeddings.create(input=TEXTS, model="minilm")  # the client's default: base64
    assert default.model == "minilm" and [d.index for d in default.data] == [0, 1, 2]
    floats = await client.embeddings.create(input=TEXTS, model="minilm", encoding_format="float")
    for got in (default, floats):
        ours = np.array([d.embedding for d in got.data])
        np.testing.assert_allclose((ours * reference).sum(axis=1), 1.0, atol=1e-5)  # cosine with unit vectors
        np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)  # and element by element
    single = await client.embeddings.create(input=TEXTS[1], model="minilm")
    np.testing.assert_allclose(single.data[0].embedding, floats.data[1].embedding, atol=1e-6)
    assert single.usage.prompt_tokens == single.usage.total_tokens == 8  # [CLS] attention is all you need . [SEP]


async def test_dimensions_keep_the_first_components_normalised_again(two_models: Service) -> None:
    client = openai_client(two_models)
    full = await client.embeddings.create(input=TEXTS, model="minilm", encoding_format="float")
    cut = await client.embeddings.create(input=TEXTS, model="minilm", dimensions=64, encoding_format="float")
    for whole, part in zip(full.data, cut.data, strict=True):
        expected = np.array(whole.embedding[:64]) / np.linalg.norm(whole.embedding[:64])
        assert len(part.embedding) == 64
        np.testing.assert_allclose(part.embedding, expected, atol=1e-6)
    encode = (await two_models.client.post("/encode", json={"texts": TEXTS, "dimensions": 64})).json()
    assert encode["dim"] == 64
    np.testing.assert_allclose(encode["data"][0]["embedding"], cut.data[0].embedding, atol=1e-6)


async def test_token_ids_are_taken_as_they_are(two_models: Service, hf_bert, bundled_model: TextEncoder) -> None:
    client = openai_client(two_models)
    ids = [[7592, 2088], [1996, 4248, 2829, 4419]]  # "hello world", "the quick brown fox": no [CLS] or [SEP]
    got = await client.embeddings.create(input=ids, model="minilm", encoding_format="float")
    one = await client.embeddings.create(input=ids[1], model="minilm", encoding_format="float")
    for row, expected_ids in enumerate(ids):
        with torch.inference_mode():
            hidden = hf_bert(input_ids=torch.tensor([expected_ids])).last_hidden_state[0]  # (T, D)
        mean = hidden.mean(0).numpy()
        np.testing.assert_allclose(got.data[row].embedding, mean / np.linalg.norm(mean), atol=1e-5)
    np.testing.assert_allclose(one.data[0].embedding, got.data[1].embedding, atol=1e-6)
    assert got.usage.prompt_tokens == 6


async def test_openai_client_errors(two_models: Service) -> None:
    client = openai_client(two_models)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.embeddings.create(input="x", model="no-such-model")
    assert missing.value.code == "model_not_found"
    for bad in ({"dimensions": 385}, {"dimensions": 0}):
        with pytest.raises(openai.UnprocessableEntityError):
            await client.embeddings.create(input="x", model="minilm", **bad)  # type: ignore[arg-type]
    response = await two_models.client.post("/v1/embeddings", json={"input": [[101, 40000]]})
    assert_error(response, 422, "validation_error", "input[0][1]", "token id 40000 is outside the vocabulary")
    response = await two_models.client.post("/v1/embeddings", json={"input": [5, 40000]})  # one row given bare
    assert_error(response, 422, "validation_error", "input[1]", "token id 40000 is outside the vocabulary")
    response = await two_models.client.post("/v1/embeddings", json={"input": [5, -1]})
    assert response.status_code == 422
    empties: list[object] = ["", [], [[]], [""]]
    for empty in empties:
        assert (await two_models.client.post("/v1/embeddings", json={"input": empty})).status_code == 422


async def test_models_are_listed_and_chosen_by_name(two_models: Service) -> None:
    listed = await openai_client(two_models).models.list()
    assert [m.id for m in listed.data] == ["minilm", "tiny"]
    assert all(m.owned_by == "encoder-service" for m in listed.data)
    client = two_models.client
    assert (await client.post("/encode", json={"texts": "the cat"})).json()["dim"] == 384  # the first is the default
    tiny = (await client.post("/encode", json={"texts": "the cat", "model": "tiny"})).json()
    assert (tiny["model"], tiny["dim"]) == ("tiny", 16)
    attention = (await client.post("/attention", json={"text": "the cat", "model": "tiny"})).json()
    assert attention["shape"] == [2, 4, 4, 4]
    tokens = (await client.post("/tokenize", json={"texts": "the cat", "model": "tiny"})).json()
    assert tokens["model"] == "tiny"
    assert (await client.get("/info", params={"model": "tiny"})).json()["architecture"]["hidden_size"] == 16
    pe = (await client.get("/positional-encoding", params={"model": "tiny", "kind": "learned", "length": 3})).json()
    assert pe["d_model"] == 16
    for method, path, body, params in [
        ("POST", "/encode", {"texts": "x", "model": "nope"}, None),
        ("POST", "/attention", {"text": "x", "model": "nope"}, None),
        ("POST", "/tokenize", {"texts": "x", "model": "nope"}, None),
        ("GET", "/info", None, {"model": "nope"}),
        ("GET", "/positional-encoding", None, {"model": "nope"}),
    ]:
        response = await client.request(method, path, json=body, params=params)
        assert response.status_code == 404, (path, response.text)
        error = response.json()["error"]
        assert (error["type"], error["param"], error["code"]) == ("model_not_found", "model", "model_not_found")
        assert "served: minilm, tiny" in error["message"]


def test_models_setting_parses_name_directory_pairs(tmp_path) -> None:
    settings = Settings(models=f"a={tmp_path}/a, b={tmp_path}/b")
    assert [(name, str(path)) for name, path in settings.models] == [("a", f"{tmp_path}/a"), ("b", f"{tmp_path}/b")]
    for bad in ("a", "a=", "=x", f"a={tmp_path},a={tmp_path}"):
        with pytest.raises(ValueError):
            Settings(models=bad)


async def test_a_model_of_several_that_cannot_load_is_named(tmp_path, tiny_model_dir) -> None:
    failures: list[str] = []
    settings = Settings(models=f"tiny={tiny_model_dir},broken={tmp_path}/missing")
    async with serving(settings, ready=False, on_load_failure=failures.append):
        from tests.helpers import wait_until

        await wait_until(lambda: bool(failures))
    assert failures[0].startswith(f"cannot serve model 'broken' from {tmp_path}/missing")


async def test_each_model_reports_the_memory_it_took(tmp_path, tiny_model_dir) -> None:
    settings = Settings(models=f"first={tiny_model_dir},second={tiny_model_dir}")
    async with serving(settings) as service:
        metrics = (await service.client.get("/metrics")).text
    lines = [line for line in metrics.splitlines() if line.startswith("encoder_model_memory_bytes{")]
    assert sorted(line.split('"')[1] for line in lines) == ["first", "second"]
    assert all(float(line.split()[-1]) >= 0 for line in lines)
    info = sorted(
        line.split('name="')[1].split('"')[0] for line in metrics.splitlines() if line.startswith("encoder_model_info{")
    )
    assert info == ["first", "second"]  # one model-info sample per served model


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        # OpenAI's input: the param names the wrong entry as texts[3] is named, the message is in the client's
        # words, not pydantic's union names
        ("/v1/embeddings", {"input": [5, -1]}, "input[1]", "input[1]: must be a token id (an integer ≥ 0), got -1"),
        ("/v1/embeddings", {"input": [[1, 2], []]}, "input[1]", "input[1]: must be a non-empty list of token ids"),
        ("/v1/embeddings", {"input": [[1, 2], [3, -4]]}, "input[1][1]", "input[1][1]: must be a token id"),
        ("/v1/embeddings", {"input": ["a", ""]}, "input[1]", "input[1]: must not be empty"),
        ("/v1/embeddings", {"input": [True]}, "input[0]", "got True"),
        (
            "/v1/embeddings",
            {"input": 5},
            "input",
            "a string, a list of strings, a list of token ids or a list of lists",
        ),
        ("/v1/embeddings", {"input": []}, "input", "not empty"),
        ("/tokenize", {"texts": "a", "text_pair": 5}, "text_pair", "a string, a list of strings (or nulls), or null"),
        ("/tokenize", {"texts": ["a", "b"], "text_pair": ["x", ""]}, "text_pair[1]", "text_pair[1]: must not be empty"),
        ("/tokenize", {"texts": "a", "text_pair": [3]}, "text_pair[0]", "text_pair[0]: must be a string or null"),
    ],
)
async def test_union_fields_name_the_wrong_entry(
    client: httpx.AsyncClient, path: str, body: dict, param: str, words: str
) -> None:
    error = assert_error(await client.post(path, json=body), 422, "validation_error", param, words)
    assert "function-after" not in error["message"] and "entry" not in error["message"]
