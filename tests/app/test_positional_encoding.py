"""GET /positional-encoding: the seed notebook's table and the checkpoint's learned table."""

from __future__ import annotations

import httpx
import numpy as np
from safetensors import safe_open

from tests.model.test_encoder import SEED_PE_10x6


async def test_sinusoidal_10_by_6_equals_the_seed_notebook(client: httpx.AsyncClient) -> None:
    response = await client.get("/positional-encoding", params={"length": 10, "d_model": 6})
    assert response.status_code == 200
    body = response.json()
    assert {k: body[k] for k in ("kind", "length", "d_model", "base")} == {
        "kind": "sinusoidal",
        "length": 10,
        "d_model": 6,
        "base": 10000,
    }
    np.testing.assert_allclose(body["encoding"], SEED_PE_10x6, atol=5e-5 + 1e-6)


async def test_defaults_are_50_positions_of_the_model_width(client: httpx.AsyncClient) -> None:
    body = (await client.get("/positional-encoding")).json()
    assert np.array(body["encoding"]).shape == (50, 384)
    assert (body["length"], body["d_model"], body["base"]) == (50, 384, 10000)


async def test_base_changes_the_wavelengths(client: httpx.AsyncClient) -> None:
    body = (await client.get("/positional-encoding", params={"length": 4, "d_model": 4, "base": 100})).json()
    position, i = 3, 1  # column 2i = 2: sin(pos / base^(2i/d_model))
    assert abs(body["encoding"][position][2] - np.sin(position / 100 ** (2 * i / 4))) < 1e-6


async def test_learned_is_the_checkpoints_position_table(client: httpx.AsyncClient, bundled_path) -> None:
    body = (await client.get("/positional-encoding", params={"kind": "learned", "length": 20})).json()
    with safe_open(str(bundled_path / "model.safetensors"), "np") as checkpoint:
        table = checkpoint.get_tensor("embeddings.position_embeddings.weight")
    assert (body["kind"], body["length"], body["d_model"], body["base"]) == ("learned", 20, 384, None)
    np.testing.assert_array_equal(np.array(body["encoding"], dtype=np.float32), table[:20])
