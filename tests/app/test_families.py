"""Every encoder family served over HTTP: /encode equals sentence-transformers, /attention equals transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from app.settings import Settings
from model import load_model
from model.spec.config import DECODERS as DECODER_TYPES
from tests.families import FAMILIES, FAMILY_SPECS, SAMPLE_TEXTS, hf_model, write_family_model
from tests.helpers import assert_error, serving

TEXTS = [text for text in SAMPLE_TEXTS.values() if isinstance(text, str)]


EMBEDDERS = [family for family in FAMILIES if None in FAMILY_SPECS[family].heads]


@pytest.fixture(scope="module", params=EMBEDDERS)
def family_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    return write_family_model(tmp_path_factory.mktemp("family") / request.param, request.param)


async def test_encode_attention_and_info_over_http(family_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    model = load_model(family_dir, device="cpu", dtype="float32")
    config = model.card.config
    async with serving(Settings(), model) as service:
        client = service.client
        info = (await client.get("/info")).json()["architecture"]
        assert info["family"] == config.family == FAMILY_SPECS[family_dir.name].model_type
        hf = json.loads((family_dir / "config.json").read_text())
        decoder = config.family in DECODER_TYPES
        bidirectional = not decoder or bool(hf.get("use_bidirectional_attention"))
        assert info["attention"] == ("bidirectional" if bidirectional else "causal")
        assert info["kv_heads"] == hf.get("num_key_value_heads", config.n_heads)
        assert info["norm"] == ("rmsnorm" if decoder else "layernorm")

        body = (await client.post("/encode", json={"texts": TEXTS})).json()
        ours = np.array([item["embedding"] for item in body["data"]])
        theirs = SentenceTransformer(str(family_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)
        assert body["dim"] == theirs.shape[1] == info["dimension"]
        cosine = (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
        assert cosine.min() >= 0.99999, cosine
        np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)  # element by element too

        text = SAMPLE_TEXTS["long"]
        response = (await client.post("/attention", json={"text": text})).json()
        encoding = model.card.tokenizer.encode([text])[0]  # type: ignore[list-item]
        assert response["tokens"] == encoding.tokens
        with torch.inference_mode():
            reference = hf_model(family_dir)(
                input_ids=torch.tensor([encoding.ids]), output_attentions=True
            ).attentions  # L × (1, H, T, T)
        expected = torch.stack(reference)[:, 0].numpy()  # (L, H, T, T)
        np.testing.assert_allclose(np.array(response["attention"]), expected, atol=1e-5)
        if not bidirectional:  # the causal triangle: nothing above the diagonal
            assert np.abs(np.triu(np.array(response["attention"]), k=1)).max() == 0.0


async def test_positional_encodings_of_each_kind(family_dir: Path) -> None:
    """Learned tables as stored; rotary angles pos / base^(2i/Dh) with the model's base (and its scaling, as
    transformers' rotary module computes its frequencies); relative buckets as transformers' MPNet and DeBERTa
    compute them; a 422 for a kind the model has not."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    model = load_model(family_dir, device="cpu", dtype="float32")
    config = model.card.config
    async with serving(Settings(), model) as service:
        client = service.client
        learned = await client.get("/positional-encoding", params={"kind": "learned", "length": 5})
        relative = await client.get("/positional-encoding", params={"kind": "relative", "length": 40})
        if config.position_embedding == "rotary":
            assert_error(learned, 422, "validation_error", "kind", "no position table: its positions are rotary")
            response = (await client.get("/positional-encoding", params={"kind": "rotary", "length": 6})).json()
            Dh, base = config.head_dim, config.rope_theta
            if config.rope_scaling is None:
                frequencies = 1 / base ** (np.arange(0, Dh, 2) / Dh)
            else:  # Llama 3's scaling
                frequencies = hf_model(family_dir).rotary_emb.inv_freq.numpy()
            expected = np.arange(6)[:, None] * frequencies[None, :]  # pos / base^(2i/Dh)
            assert (response["d_model"], response["base"]) == (Dh, base)
            np.testing.assert_allclose(np.array(response["encoding"]), expected, rtol=1e-6)
        elif config.position_embedding == "disentangled":
            assert_error(
                learned, 422, "validation_error", "kind", "its positions are disentangled (ask for kind=relative)"
            )
        else:
            assert learned.status_code == 200
            tensors = load_file(family_dir / "model.safetensors")
            (name,) = [n for n in tensors if n.endswith("position_embeddings.weight")]
            np.testing.assert_allclose(np.array(learned.json()["encoding"]), tensors[name][:5].numpy(), atol=1e-6)
        if config.position_embedding == "relative_buckets":
            position = torch.arange(40)
            buckets = MPNetEncoder.relative_position_bucket(
                position[None, :] - position[:, None], config.relative_buckets
            )
            assert relative.json()["buckets"] == config.relative_buckets
            assert relative.json()["encoding"] == buckets.tolist()
        elif config.position_embedding == "disentangled":
            states = torch.zeros(1, 40, 1)
            span = config.relative_buckets
            delta = build_relative_position(states, states, bucket_size=span, max_position=config.relative_max_distance)
            expected = (delta[0] + span).clamp(0, 2 * span - 1)  # the row of the relative embeddings c2p and p2c read
            body = relative.json()
            assert (body["kind"], body["length"], body["buckets"]) == ("relative", 40, 2 * span)
            assert body["encoding"] == expected.tolist()
            assert len({value for row in body["encoding"] for value in row}) > 8, "log buckets past the exact range"
        else:
            assert_error(relative, 422, "validation_error", "kind", "has no relative positions")
