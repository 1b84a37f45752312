"""POST /attention/neuron: one head's computation step by step, against transformers' own weights and hidden
states, computed here: on the bundled model, tiny RoBERTa, MPNet (a position bias) and ModernBERT (rotary
positions, a sliding window)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from app.main import create_app
from app.settings import Settings
from model import TextEncoder, load_model
from tests.families import hf_model, write_family_model
from tests.helpers import assert_error, wait_until_ready

TEXT = "The quick brown fox jumps over the lazy dog and the cat sat on the mat, hello world: attention is all."
PAIR = "A cat sat on the mat."


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory, bundled_path: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("neuron")
    return {"minilm": bundled_path} | {
        family: write_family_model(root / family, family) for family in ("roberta", "mpnet", "modernbert")
    }


@pytest.fixture(scope="module")
async def client(model_dirs: dict[str, Path], bundled_model: TextEncoder) -> AsyncIterator[httpx.AsyncClient]:
    models = {"minilm": bundled_model} | {
        name: load_model(path, device="cpu", dtype="float32", name=name)
        for name, path in model_dirs.items()
        if name != "minilm"
    }
    app = create_app(Settings(), models)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=120) as client:
            await wait_until_ready(client)
            yield client


def reference(directory: Path, text: str, pair: str | None, max_length: int):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    encoding = tokenizer(text, pair, truncation=True, max_length=max_length)
    model = hf_model(directory)
    with torch.inference_mode():
        outputs = model(
            input_ids=torch.tensor([encoding["input_ids"]]),
            token_type_ids=torch.tensor([encoding["token_type_ids"]]) if "token_type_ids" in encoding else None,
            output_attentions=True,
            output_hidden_states=True,
        )
    return model, tokenizer.convert_ids_to_tokens(encoding["input_ids"]), outputs


def array(body: dict, name: str) -> np.ndarray:
    return np.array(body[name], dtype=np.float64)


@pytest.mark.parametrize("name", ["minilm", "roberta"])
@pytest.mark.parametrize(("layer", "head", "pair"), [(0, 0, None), (-1, -1, PAIR), (1, 2, None)])
async def test_steps_equal_the_projections_of_transformers_hidden_states(
    client: httpx.AsyncClient, model_dirs: dict[str, Path], name: str, layer: int, head: int, pair: str | None
) -> None:
    response = await client.post(
        "/attention/neuron", json={"text": TEXT, "text_pair": pair, "layer": layer, "head": head, "model": name}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    info = (await client.get("/info", params={"model": name})).json()
    model, tokens, outputs = reference(model_dirs[name], TEXT, pair, info["limits"]["max_attention_tokens"])
    config = model.config
    H = config.num_attention_heads
    Dh = config.hidden_size // H
    L = config.num_hidden_layers
    assert (body["layer"], body["head"]) == (layer % L, head % H)
    assert body["tokens"] == tokens
    T = len(tokens)

    hf_layer = model.encoder.layer[layer % L]
    x = outputs.hidden_states[layer % L][0].double()  # (T, D): the layer's input
    columns = slice((head % H) * Dh, (head % H + 1) * Dh)
    with torch.no_grad():
        projections = {
            part: (x @ module.weight.double().T + module.bias.double())[:, columns].numpy()
            for part, module in (
                ("queries", hf_layer.attention.self.query),
                ("keys", hf_layer.attention.self.key),
                ("values", hf_layer.attention.self.value),
            )
        }
    for part, expected in projections.items():
        assert array(body, part).shape == (T, Dh)
        np.testing.assert_allclose(array(body, part), expected, atol=1e-5, err_msg=part)

    assert body["scale"] == pytest.approx(1 / math.sqrt(Dh))
    q, k = projections["queries"], projections["keys"]
    # float32 scores reach ~20 on the random models: a relative 1e-5 besides (float32 keeps ~6e-8 per step)
    np.testing.assert_allclose(array(body, "scores"), (q @ k.T) / math.sqrt(Dh), atol=1e-5, rtol=1e-5)
    attention = array(body, "attention")
    expected_attention = outputs.attentions[layer % L][0, head % H].double().numpy()
    np.testing.assert_allclose(attention, expected_attention, atol=1e-5)
    scores = array(body, "scores")
    softmax = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(attention, softmax / softmax.sum(-1, keepdims=True), atol=1e-6)
    np.testing.assert_allclose(array(body, "context"), attention @ array(body, "values"), atol=1e-5)

    ours = await client.post(
        "/attention", json={"text": TEXT, "text_pair": pair, "layers": [layer], "heads": [head], "model": name}
    )
    np.testing.assert_allclose(attention, np.array(ours.json()["attention"])[0, 0], atol=1e-5)


async def test_mpnet_scores_carry_the_position_bias(client: httpx.AsyncClient, model_dirs: dict[str, Path]) -> None:
    body = (await client.post("/attention/neuron", json={"text": TEXT, "layer": 1, "head": 1, "model": "mpnet"})).json()
    _, tokens, outputs = reference(model_dirs["mpnet"], TEXT, None, 32)
    q, k = array(body, "queries"), array(body, "keys")
    bias = array(body, "scores") - body["scale"] * (q @ k.T)
    assert np.abs(bias).max() > 1e-3, "the scores hold the relative position bias"
    # the bias depends on the relative position only: constant along each diagonal within the exact buckets
    assert bias[3, 4] == pytest.approx(bias[5, 6], abs=1e-5)
    attention = array(body, "attention")
    np.testing.assert_allclose(attention, outputs.attentions[1][0, 1].double().numpy(), atol=1e-5)
    scores = array(body, "scores")
    softmax = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(attention, softmax / softmax.sum(-1, keepdims=True), atol=1e-6)


@pytest.mark.parametrize("layer", [0, 1])  # ModernBERT's layer 0 is global, layer 1 local (a sliding window)
async def test_modernbert_queries_and_keys_are_rotated(
    client: httpx.AsyncClient, model_dirs: dict[str, Path], layer: int
) -> None:
    body = (
        await client.post("/attention/neuron", json={"text": TEXT, "layer": layer, "head": 1, "model": "modernbert"})
    ).json()
    model, tokens, outputs = reference(model_dirs["modernbert"], TEXT, None, 32)
    config = model.config
    D, H = config.hidden_size, config.num_attention_heads
    Dh = D // H
    hf_layer = model.layers[layer]
    with torch.no_grad():
        x = hf_layer.attn_norm(outputs.hidden_states[layer][0]).double()  # (T, D)
        qkv = (x @ hf_layer.attn.Wqkv.weight.double().T).numpy()  # (T, 3D), no bias in ModernBERT
    columns = slice(Dh, 2 * Dh)
    unrotated = {"queries": qkv[:, :D][:, columns], "keys": qkv[:, D : 2 * D][:, columns]}
    np.testing.assert_allclose(array(body, "values"), qkv[:, 2 * D :][:, columns], atol=1e-5)
    half = Dh // 2
    for part, plain in unrotated.items():
        rotated = array(body, part)
        # a rotation of each pair (i, i + Dh/2): the pairs' lengths stay, their directions change with position
        np.testing.assert_allclose(
            np.hypot(rotated[:, :half], rotated[:, half:]), np.hypot(plain[:, :half], plain[:, half:]), atol=1e-5
        )
        np.testing.assert_allclose(rotated[0], plain[0], atol=1e-5)  # position 0: no rotation
        assert np.abs(rotated[1:] - plain[1:]).max() > 1e-3
    attention = array(body, "attention")
    np.testing.assert_allclose(attention, outputs.attentions[layer][0, 1].double().numpy(), atol=1e-5)
    if layer == 1:  # outside the window the scores are there, the attention is zero
        T = attention.shape[0]
        far = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :]) > config.local_attention // 2
        assert far.any() and attention[far].max() == 0.0 and np.abs(array(body, "scores")[far]).max() > 0
    np.testing.assert_allclose(array(body, "context"), attention @ array(body, "values"), atol=1e-5)


async def test_bad_neuron_requests_get_their_error(client: httpx.AsyncClient) -> None:
    cases = [
        ({"text": "hi", "layer": 6}, "layer", "out of range"),
        ({"text": "hi", "layer": -7}, "layer", "out of range"),
        ({"text": "hi", "head": 12}, "head", "out of range"),
        ({"text": ""}, "text", "must not be empty"),
        ({"text": "hi", "head": "1"}, "head", ""),
        ({"text": " ".join(["word"] * 300), "truncate": False}, "text", "more than the maximum"),
        ({"text": "hi", "neuron": 1}, "neuron", "unknown field"),
    ]
    for body, param, message in cases:
        assert_error(await client.post("/attention/neuron", json=body), 422, "validation_error", param, message)
