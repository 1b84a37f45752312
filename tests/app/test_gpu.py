"""The service on a CUDA GPU, end to end over HTTP: what /info reports, the numbers against the references on the
CPU, and the GPU memory in /metrics. Runs only where torch sees a GPU (the parity tests cover the model itself:
tests/model/test_parity.py and test_families.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from app.settings import Settings
from tests.helpers import serve

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.", "Hi"]


@pytest.mark.parametrize(
    ("dtype", "graphs", "min_cosine", "weight_bytes"),
    [("auto", True, 0.9999, 4 + 2), ("auto", False, 0.9999, 4 + 2), ("float32", True, 0.99999, 4)],
)
async def test_the_service_on_cuda_equals_the_references(
    dtype, graphs, min_cosine, weight_bytes, sentence_transformer, hf_bert, hf_tokenizer
) -> None:
    """Under float16 the embedding pass runs on a float16 copy of the weights; /attention runs in float32 on the
    float32 weights either way, and equals transformers within 1e-4."""
    async with serve(Settings(device="cuda", dtype=dtype, cuda_graphs=graphs)) as client:
        info = (await client.get("/info")).json()
        assert info["device"].startswith("cuda")
        assert info["dtype"] == ("float16" if dtype == "auto" else "float32")

        response = await client.post("/encode", json={"texts": TEXTS})
        assert response.status_code == 200, response.text
        ours = np.array([item["embedding"] for item in response.json()["data"]])
        theirs = sentence_transformer.encode(TEXTS, normalize_embeddings=True)
        cosine = (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
        assert cosine.min() >= min_cosine, cosine

        response = await client.post("/attention", json={"text": TEXTS[0]})
        assert response.status_code == 200, response.text
        with torch.inference_mode():
            output = hf_bert(**hf_tokenizer(TEXTS[0], return_tensors="pt"), output_attentions=True)
        expected = torch.stack(output.attentions)[:, 0].numpy()
        assert np.abs(np.array(response.json()["attention"]) - expected).max() <= 1e-4

        metrics = (await client.get("/metrics")).text
        held = re.search(r'^encoder_model_gpu_memory_bytes\{model="all-MiniLM-L6-v2"\} (\S+)$', metrics, re.M)
        assert held is not None, "the model's GPU memory is reported"
        weights = sum(p.numel() for p in hf_bert.parameters()) * weight_bytes  # BertModel's pooler: ~1 % more
        assert float(held.group(1)) >= 0.9 * weights
        if not graphs:  # no graphs' scratch memory: the weights, and cuBLAS's workspace where nothing used it before
            assert float(held.group(1)) <= 1.5 * weights
        peak = re.search(r'^encoder_gpu_memory_peak_bytes\{device="cuda[:0-9]*"\} (\S+)$', metrics, re.M)
        assert peak is not None and float(peak.group(1)) >= float(held.group(1))
