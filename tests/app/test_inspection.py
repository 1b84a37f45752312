"""/similarity with explain, /attention's norm weighting, word level and npz answer, and /attention/heads, each
against references computed here from transformers' own outputs and weights (hidden states, attentions, the
value and output projections) and sentence-transformers' embeddings, on the bundled model and on tiny RoBERTa.
"""

from __future__ import annotations

import io
import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from app.main import create_app
from app.settings import Settings
from model import TextEncoder, load_model
from tests.families import hf_model, write_family_model
from tests.helpers import assert_error, wait_until_ready

TEXT = "The unbelievably tokenization, isn't it? Yes!"
PAIR = "A second segment; with punctuation."
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world!",
    TEXT,
    "Attention is all you need (they say).",
]
STATISTICS = ("entropy", "distance", "to_cls", "to_sep", "to_punctuation", "to_self", "to_previous", "to_next")


class Reference:
    """transformers' model and tokenizer for one served model."""

    def __init__(self, directory: Path, max_length: int) -> None:
        from transformers import AutoTokenizer

        self.model = hf_model(directory)
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.max_length = max_length  # the served model's, at which the service truncates

    def encode(self, text: str, pair: str | None = None) -> Any:
        return self.tokenizer(text, pair, return_offsets_mapping=True, truncation=True, max_length=self.max_length)

    def outputs(self, encoding: Any) -> Any:
        with torch.inference_mode():
            return self.model(
                input_ids=torch.tensor([encoding["input_ids"]]),
                token_type_ids=torch.tensor([encoding["token_type_ids"]]) if "token_type_ids" in encoding else None,
                output_attentions=True,
                output_hidden_states=True,
            )

    def attention(self, encoding: Any) -> np.ndarray:
        """(L, H, T, T) attention probabilities."""
        return torch.stack(self.outputs(encoding).attentions)[:, 0].double().numpy()

    def norm_weighted(self, encoding: Any) -> np.ndarray:
        """Kobayashi et al. (2020), from the layers' input hidden states and their value and output projections:
        ‖α_ij f_h(x_j)‖ with f_h(x) = (x W_V + b_V)[head h's columns] · W_O[:, head h's columns]ᵀ."""
        outputs = self.outputs(encoding)
        config = self.model.config
        H = config.num_attention_heads
        Dh = config.hidden_size // H
        with torch.no_grad():
            return self._norm_weighted(outputs, H, Dh)

    def _norm_weighted(self, outputs: Any, H: int, Dh: int) -> np.ndarray:
        maps = []
        for index, layer in enumerate(self.model.encoder.layer):
            x = outputs.hidden_states[index][0].double()  # (T, D): the layer's input (post-LN families)
            value = layer.attention.self.value
            output = layer.attention.output.dense
            v = x @ value.weight.double().T + value.bias.double()  # (T, D)
            heads = []
            for h in range(H):
                columns = slice(h * Dh, (h + 1) * Dh)
                f = v[:, columns] @ output.weight.double()[:, columns].T  # (T, D): f_h(x_j) for every key j
                heads.append(outputs.attentions[index][0, h].double() * f.norm(dim=-1)[None, :])  # (T, T)
            maps.append(torch.stack(heads))
        return torch.stack(maps).numpy()  # (L, H, T, T)

    def words(self, encoding: Any, texts: tuple[str, ...]) -> tuple[list[str], list[list[int]]]:
        """Words from transformers' tokenizer: its word and sequence ids, special tokens alone."""
        words: list[str] = []
        groups: list[list[int]] = []
        last = None
        for position, (word, sequence) in enumerate(zip(encoding.word_ids(), encoding.sequence_ids())):
            key = None if word is None else (sequence, word)
            if key is not None and key == last:
                groups[-1].append(position)
            else:
                groups.append([position])
            last = key
        for group in groups:
            sequence = encoding.sequence_ids()[group[0]]
            if sequence is None:
                words.append(str(self.tokenizer.convert_ids_to_tokens(encoding["input_ids"][group[0]])))
            else:
                start, end = encoding["offset_mapping"][group[0]][0], encoding["offset_mapping"][group[-1]][1]
                words.append(texts[sequence][start:end])
        return words, groups

    def last_hidden_state(self, text: str) -> np.ndarray:
        return self.outputs(self.encode(text)).last_hidden_state[0].double().numpy()  # (T, D)


def merged(maps: np.ndarray, groups: list[list[int]]) -> np.ndarray:
    """Clark et al. (2019) by loops: a word's row is the mean of its tokens' rows, its column their sum."""
    W = len(groups)
    out = np.zeros(maps.shape[:-2] + (W, W))
    for a, rows in enumerate(groups):
        for b, columns in enumerate(groups):
            out[..., a, b] = maps[..., rows, :][..., :, columns].sum(-1).mean(-1)
    return out


def reference_statistics(reference: Reference, texts: list[str]) -> dict[str, np.ndarray]:
    """API.md's head statistics from transformers' attentions, each text alone (no padding), by the definitions."""
    per_text: dict[str, list[np.ndarray]] = {name: [] for name in STATISTICS}
    for text in texts:
        encoding = reference.encode(text)
        A = reference.attention(encoding)  # (L, H, T, T)
        T = A.shape[-1]
        tokens = reference.tokenizer.convert_ids_to_tokens(encoding["input_ids"])
        special = reference.tokenizer.get_special_tokens_mask(encoding["input_ids"], already_has_special_tokens=True)
        separators = np.array([token in ("[SEP]", "</s>") for token in tokens])
        spans = [text[start:end] for start, end in encoding["offset_mapping"]]
        punctuation = np.array(
            [
                not s and bool(span) and all(unicodedata.category(c).startswith("P") for c in span)
                for span, s in zip(spans, special)
            ]
        )
        i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
        with np.errstate(divide="ignore", invalid="ignore"):
            plogp = np.where(A > 0, A * np.log(A), 0.0)
        per_text["entropy"].append(-plogp.sum(-1).mean(-1))
        per_text["distance"].append((A * np.abs(i - j)).sum(-1).mean(-1))
        per_text["to_cls"].append(A[..., :, 0].mean(-1))
        per_text["to_sep"].append(A[..., :, separators].sum(-1).mean(-1))
        per_text["to_punctuation"].append(A[..., :, punctuation].sum(-1).mean(-1))
        per_text["to_self"].append(np.stack([A[..., k, k] for k in range(T)], -1).mean(-1))
        per_text["to_previous"].append(np.stack([A[..., k, k - 1] for k in range(1, T)], -1).mean(-1))
        per_text["to_next"].append(np.stack([A[..., k, k + 1] for k in range(T - 1)], -1).mean(-1))
    return {name: np.mean(values, axis=0) for name, values in per_text.items()}  # (L, H) each


MODELS: dict[str, Path] = {}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory, bundled_path: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inspection")
    return {
        "minilm": bundled_path,
        "roberta": write_family_model(root / "roberta", "roberta"),
        "roberta-max": write_family_model(root / "roberta-max", "roberta", seed=1, pooling="max"),
        "roberta-cls": write_family_model(root / "roberta-cls", "roberta", seed=2, pooling="cls"),
    }


async def start(settings: Settings, models: dict[str, TextEncoder]) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, models)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=120) as client:
            await wait_until_ready(client)
            yield client


@pytest.fixture(scope="module")
def loaded(model_dirs: dict[str, Path], bundled_model: TextEncoder) -> dict[str, TextEncoder]:
    return {"minilm": bundled_model} | {
        name: load_model(path, device="cpu", dtype="float32", name=name)
        for name, path in model_dirs.items()
        if name != "minilm"
    }


@pytest.fixture(scope="module")
async def client(loaded: dict[str, TextEncoder]) -> AsyncIterator[httpx.AsyncClient]:
    async for client in start(Settings(), loaded):
        yield client


@pytest.fixture(scope="module")
def references(model_dirs: dict[str, Path], loaded: dict[str, TextEncoder]) -> dict[str, Reference]:
    return {name: Reference(path, loaded[name].card.max_tokens) for name, path in model_dirs.items()}


# ---- /attention: norm weighting, word level ----


@pytest.mark.parametrize("name", ["minilm", "roberta"])
async def test_norm_weighting_equals_value_norms_from_transformers(
    client: httpx.AsyncClient, references: dict[str, Reference], name: str
) -> None:
    reference = references[name]
    body = (await client.post("/attention", json={"text": TEXT, "model": name, "weighting": "norm"})).json()
    expected = reference.norm_weighted(reference.encode(TEXT))
    ours = np.array(body["attention"])
    assert body["weighting"] == "norm" and ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5)
    assert np.abs(ours.sum(-1) - 1).max() > 0.1, "norm-weighted rows do not sum to 1"

    # The head mean and the selection act on the weighted maps.
    mean = (
        await client.post(
            "/attention", json={"text": TEXT, "model": name, "weighting": "norm", "layers": [-1], "aggregate": "mean"}
        )
    ).json()
    np.testing.assert_allclose(np.array(mean["attention"])[0, 0], expected[-1].mean(0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["minilm", "roberta"])
@pytest.mark.parametrize("weighting", ["attention", "norm"])
@pytest.mark.parametrize("pair", [None, PAIR])
async def test_word_level_merges_transformers_attention(
    client: httpx.AsyncClient, references: dict[str, Reference], name: str, weighting: str, pair: str | None
) -> None:
    reference = references[name]
    request = {"text": TEXT, "text_pair": pair, "model": name, "weighting": weighting, "level": "word"}
    body = (await client.post("/attention", json=request)).json()
    encoding = reference.encode(TEXT, pair)
    words, groups = reference.words(encoding, (TEXT, pair) if pair else (TEXT,))
    maps = reference.attention(encoding) if weighting == "attention" else reference.norm_weighted(encoding)
    expected = merged(maps, groups)
    assert body["tokens"] == words
    assert "unbelievably" in words  # a word of several tokens, merged
    assert len(words) < len(encoding["input_ids"])
    assert [word["tokens"] for word in body["words"]] == groups
    assert body["shape"] == list(expected.shape)
    np.testing.assert_allclose(np.array(body["attention"]), expected, rtol=1e-4, atol=1e-5)
    if weighting == "attention":
        np.testing.assert_allclose(np.array(body["attention"]).sum(-1), 1.0, atol=1e-5)


# ---- /attention as npz ----


def load_npz(response: httpx.Response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-npz"
    with np.load(io.BytesIO(response.content)) as archive:
        return {key: archive[key] for key in archive.files}


NPZ = {"accept": "application/x-npz"}


@pytest.mark.parametrize(
    "request_body",
    [
        {"text": TEXT},
        {"text": TEXT, "text_pair": PAIR, "layers": [-1, 0], "heads": [3, 0], "weighting": "norm", "decimals": 3},
        {"text": TEXT, "aggregate": "rollout", "level": "word", "model": "roberta"},
    ],
)
async def test_npz_equals_the_json_answer(client: httpx.AsyncClient, request_body: dict) -> None:
    as_json = (await client.post("/attention", json=request_body)).json()
    archive = load_npz(await client.post("/attention", json=request_body, headers=NPZ))
    assert set(archive) == {"attention", "tokens", "layers", "heads"}
    assert archive["attention"].dtype == np.float32
    np.testing.assert_array_equal(archive["attention"], np.array(as_json["attention"], dtype=np.float32))
    assert archive["tokens"].tolist() == as_json["tokens"]
    assert archive["layers"].tolist() == as_json["layers"] and archive["heads"].tolist() == as_json["heads"]


async def test_npz_has_its_own_larger_bound(loaded: dict[str, TextEncoder]) -> None:
    settings = Settings(max_attention_values=10_000, max_attention_values_binary=30_000)
    async for client in start(settings, {"minilm": loaded["minilm"]}):
        text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"  # 16 tokens
        assert_error(await client.post("/attention", json={"text": text}), 422, "validation_error", "layers", "x-npz")
        archive = load_npz(await client.post("/attention", json={"text": text}, headers=NPZ))
        assert archive["attention"].shape == (6, 12, 16, 16)
        longer = " ".join([text] * 2)
        error = assert_error(
            await client.post("/attention", json={"text": longer}, headers=NPZ), 422, "validation_error", "layers"
        )
        assert "30,000" in error["message"]
        # q=0 refuses the binary answer: JSON, under the JSON bound
        refused = await client.post("/attention", json={"text": "hi"}, headers={"accept": "application/x-npz;q=0"})
        assert refused.headers["content-type"] == "application/json"


@pytest.mark.slow
async def test_every_layer_and_head_of_a_512_token_text_as_npz(
    loaded: dict[str, TextEncoder], references: dict[str, Reference]
) -> None:
    """The default binary bound holds all of a 512-token text of the bundled model, served when the attention
    token limit is raised to the position table; the weights equal transformers'."""
    async for client in start(Settings(max_attention_tokens=4096), {"minilm": loaded["minilm"]}):
        info = (await client.get("/info")).json()
        assert info["limits"]["max_attention_tokens"] == 512  # capped at the position table
        assert info["limits"]["max_attention_values_binary"] == 6 * 12 * 512 * 512
        text = " ".join(["word"] * 600)
        archive = load_npz(await client.post("/attention", json={"text": text}, headers=NPZ))
        assert archive["attention"].shape == (6, 12, 512, 512)
        ids = references["minilm"].tokenizer(text, truncation=True, max_length=512)
        expected = references["minilm"].attention(ids)
        np.testing.assert_allclose(archive["attention"], expected, atol=1e-5)


# ---- /attention/heads ----


@pytest.mark.parametrize("name", ["minilm", "roberta"])
async def test_head_statistics_equal_their_definitions_on_transformers_attention(
    client: httpx.AsyncClient, references: dict[str, Reference], name: str
) -> None:
    body = (await client.post("/attention/heads", json={"texts": TEXTS, "model": name})).json()
    expected = reference_statistics(references[name], TEXTS)
    config = references[name].model.config
    assert (body["layers"], body["heads"], body["n_texts"]) == (
        config.num_hidden_layers,
        config.num_attention_heads,
        len(TEXTS),
    )
    assert set(body["statistics"]) == set(STATISTICS)
    for statistic in STATISTICS:
        np.testing.assert_allclose(
            np.array(body["statistics"][statistic]), expected[statistic], atol=1e-5, err_msg=statistic
        )
    # not vacuous: separators and punctuation were found, and heads differ
    assert min(np.array(body["statistics"]["to_sep"]).max(), np.array(body["statistics"]["to_punctuation"]).max()) > 0
    assert np.ptp(np.array(body["statistics"]["entropy"])) > 0.1


async def test_head_statistics_of_one_text_and_in_many_slices(
    client: httpx.AsyncClient, loaded: dict[str, TextEncoder], references: dict[str, Reference]
) -> None:
    one = (await client.post("/attention/heads", json={"texts": TEXT})).json()
    expected = reference_statistics(references["minilm"], [TEXT])
    np.testing.assert_allclose(np.array(one["statistics"]["distance"]), expected["distance"], atol=1e-5)
    assert one["n_texts"] == 1

    # Slices of one text each (the smallest slice bound): the same statistics as one pass of all texts.
    whole = (await client.post("/attention/heads", json={"texts": TEXTS})).json()
    async for sliced_client in start(Settings(inspection_slice_values=1), {"minilm": loaded["minilm"]}):
        sliced = (await sliced_client.post("/attention/heads", json={"texts": TEXTS})).json()
    for statistic in STATISTICS:
        np.testing.assert_allclose(
            sliced["statistics"][statistic], whole["statistics"][statistic], rtol=1e-5, atol=1e-6, err_msg=statistic
        )


async def test_head_statistics_bound_and_bad_input(client: httpx.AsyncClient, loaded: dict[str, TextEncoder]) -> None:
    assert_error(await client.post("/attention/heads", json={"texts": []}), 422, "validation_error", "texts")
    assert_error(await client.post("/attention/heads", json={"texts": ["a", ""]}), 422, "validation_error", "texts[1]")
    missing = await client.post("/attention/heads", json={"texts": ["a"], "model": "nope"})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    long_text = " ".join(["word"] * 400)
    assert_error(
        await client.post("/attention/heads", json={"texts": ["a", long_text], "truncate": False}),
        422,
        "validation_error",
        "texts[1]",
        "more than the maximum",
    )
    async for bounded in start(Settings(max_head_statistics_values=72 * 20 * 20), {"minilm": loaded["minilm"]}):
        error = assert_error(
            await bounded.post("/attention/heads", json={"texts": TEXTS}), 422, "validation_error", "texts"
        )
        assert "fewer or shorter texts" in error["message"]
        assert (await bounded.post("/attention/heads", json={"texts": "Hello, world!"})).status_code == 200


# ---- /similarity ----


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


async def test_similarity_equals_sentence_transformers(client: httpx.AsyncClient, sentence_transformer) -> None:
    body = (await client.post("/similarity", json={"source": TEXT, "texts": TEXTS})).json()
    vectors = sentence_transformer.encode([TEXT, *TEXTS])
    assert [item["index"] for item in body["data"]] == list(range(len(TEXTS)))
    assert all("explanation" not in item for item in body["data"])
    for item, vector in zip(body["data"], vectors[1:]):
        assert item["score"] == pytest.approx(cosine(vectors[0], vector), abs=1e-5)
    assert body["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize("name", ["minilm", "roberta"])
async def test_mean_pooled_explanation_is_the_exact_formula(
    client: httpx.AsyncClient, references: dict[str, Reference], name: str
) -> None:
    body = (
        await client.post("/similarity", json={"source": TEXT, "texts": TEXTS, "model": name, "explain": True})
    ).json()
    reference = references[name]
    a = reference.last_hidden_state(TEXT)  # (n, D)
    for item, text in zip(body["data"], TEXTS):
        b = reference.last_hidden_state(text)  # (m, D)
        mean_a, mean_b = a.mean(0), b.mean(0)
        expected = (a @ b.T) / (len(a) * len(b) * np.linalg.norm(mean_a) * np.linalg.norm(mean_b))
        explanation = item["explanation"]
        contributions = np.array(explanation["contributions"], dtype=np.float64)
        assert explanation["method"] == "mean_pooling_exact"
        assert explanation["source_tokens"] == reference.tokenizer.convert_ids_to_tokens(
            reference.encode(TEXT)["input_ids"]
        )
        assert explanation["tokens"] == reference.tokenizer.convert_ids_to_tokens(reference.encode(text)["input_ids"])
        np.testing.assert_allclose(contributions, expected, atol=1e-6)
        assert contributions.sum() == pytest.approx(item["score"], abs=1e-5)
        assert item["score"] == pytest.approx(cosine(mean_a, mean_b), abs=1e-5)


@pytest.mark.parametrize(
    ("name", "method"), [("roberta-max", "max_pooling_component_holders"), ("roberta-cls", "cls_token")]
)
async def test_max_and_cls_pooled_explanations_sum_to_the_score(
    client: httpx.AsyncClient, model_dirs: dict[str, Path], references: dict[str, Reference], name: str, method: str
) -> None:
    from sentence_transformers import SentenceTransformer

    body = (
        await client.post("/similarity", json={"source": TEXT, "texts": TEXTS, "model": name, "explain": True})
    ).json()
    vectors = SentenceTransformer(str(model_dirs[name]), device="cpu").encode([TEXT, *TEXTS])
    a = references[name].last_hidden_state(TEXT)
    for item, text, vector in zip(body["data"], TEXTS, vectors[1:]):
        contributions = np.array(item["explanation"]["contributions"], dtype=np.float64)
        assert item["explanation"]["method"] == method
        assert item["score"] == pytest.approx(cosine(vectors[0], vector), abs=1e-5)
        assert contributions.sum() == pytest.approx(item["score"], abs=1e-5)
        b = references[name].last_hidden_state(text)
        if method == "cls_token":
            assert contributions[0, 0] == pytest.approx(item["score"], abs=1e-6)
            assert np.count_nonzero(contributions) == 1
        else:  # each component's product credited to the two tokens holding its maximum
            expected = np.zeros((len(a), len(b)))
            for k in range(a.shape[1]):
                i, j = a[:, k].argmax(), b[:, k].argmax()
                expected[i, j] += a[i, k] * b[j, k]
            expected /= np.linalg.norm(a.max(0)) * np.linalg.norm(b.max(0))
            np.testing.assert_allclose(contributions, expected, atol=1e-6)


async def test_similarity_bound_and_bad_input(client: httpx.AsyncClient, loaded: dict[str, TextEncoder]) -> None:
    assert_error(
        await client.post("/similarity", json={"source": "", "texts": ["a"]}), 422, "validation_error", "source"
    )
    assert_error(await client.post("/similarity", json={"source": "a", "texts": []}), 422, "validation_error", "texts")
    assert_error(await client.post("/similarity", json={"source": "a"}), 422, "validation_error", "texts")
    assert_error(
        await client.post("/similarity", json={"source": "a", "texts": ["b"], "explain": "yes"}),
        422,
        "validation_error",
        "explain",
    )
    long_text = " ".join(["word"] * 400)
    assert_error(
        await client.post("/similarity", json={"source": long_text, "texts": ["b"], "truncate": False}),
        422,
        "validation_error",
        "source",
    )
    async for bounded in start(Settings(max_explanation_values=300), {"minilm": loaded["minilm"]}):
        request = {"source": TEXT, "texts": TEXTS, "explain": True}
        error = assert_error(await bounded.post("/similarity", json=request), 422, "validation_error", "texts")
        assert "explain false" in error["message"]
        assert (await bounded.post("/similarity", json=request | {"explain": False})).status_code == 200


async def test_attention_additions_reject_bad_values(client: httpx.AsyncClient) -> None:
    for field, value in (("weighting", "value"), ("level", "sentence"), ("weighting", None)):
        assert_error(await client.post("/attention", json={"text": TEXT, field: value}), 422, "validation_error", field)
