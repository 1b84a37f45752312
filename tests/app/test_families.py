"""Every encoder family served over HTTP: /encode equals sentence-transformers, /attention equals transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from app.settings import Settings
from model import TextEncoder
from tests.families import FAMILIES, SAMPLE_TEXTS, hf_model, write_family_model
from tests.helpers import assert_error, serving

TEXTS = [text for text in SAMPLE_TEXTS.values() if isinstance(text, str)]


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    return write_family_model(tmp_path_factory.mktemp(request.param), request.param)


async def test_encode_attention_and_info_over_http(family_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    model = TextEncoder.load(family_dir, device="cpu", dtype="float32")
    async with serving(Settings(), model) as service:
        client = service.client
        info = (await client.get("/info")).json()["architecture"]
        assert info["family"] == model.config.family == family_dir.name.rstrip("0123456789")

        body = (await client.post("/encode", json={"texts": TEXTS})).json()
        ours = np.array([item["embedding"] for item in body["data"]])
        theirs = SentenceTransformer(str(family_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)
        cosine = (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
        assert cosine.min() >= 0.99999, cosine

        text = SAMPLE_TEXTS["long"]
        response = (await client.post("/attention", json={"text": text})).json()
        encoding = model.tokenizer.encode([text])[0]  # type: ignore[list-item]
        assert response["tokens"] == encoding.tokens
        with torch.inference_mode():
            reference = hf_model(family_dir)(
                input_ids=torch.tensor([encoding.ids]), output_attentions=True
            ).attentions  # L × (1, H, T, T)
        expected = torch.stack(reference)[:, 0].numpy()  # (L, H, T, T)
        np.testing.assert_allclose(np.array(response["attention"]), expected, atol=1e-5)


async def test_positional_encodings_of_each_kind(family_dir: Path) -> None:
    model = TextEncoder.load(family_dir, device="cpu", dtype="float32")
    config = model.config
    async with serving(Settings(), model) as service:
        client = service.client
        learned = await client.get("/positional-encoding", params={"kind": "learned", "length": 5})
        if config.position_embedding == "rotary":
            assert_error(learned, 422, "validation_error", "kind", "no position table: its positions are rotary")
            response = (await client.get("/positional-encoding", params={"kind": "rotary", "length": 6})).json()
            Dh, base = config.head_dim, config.rope_theta
            expected = np.arange(6)[:, None] / base ** (np.arange(0, Dh, 2) / Dh)[None, :]  # pos / base^(2i/Dh)
            assert (response["d_model"], response["base"]) == (Dh, base)
            np.testing.assert_allclose(np.array(response["encoding"]), expected, rtol=1e-6)
        else:
            assert learned.status_code == 200
            tensors = load_file(family_dir / "model.safetensors")
            (name,) = [n for n in tensors if n.endswith("position_embeddings.weight")]
            np.testing.assert_allclose(np.array(learned.json()["encoding"]), tensors[name][:5].numpy(), atol=1e-6)
