"""The models people pick now, served: decoder embedders with prompts and Dense modules, decoder cross-encoders,
a yes/no reranker in Qwen3-Reranker's template, DeBERTa-v3 classifiers, and every inspection on them; against
sentence-transformers, transformers and the formulas of API.md, on tiny random checkpoints."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from app.main import create_app
from app.metrics import Metrics
from app.serving.registry import ModelLoadError, load_registry
from app.settings import Settings
from model import TextEncoder, load_model
from model.spec.checkpoint import YES_NO
from tests.families import write_family_model
from tests.helpers import Service, assert_error, local_model, wait_until_ready

QUERY = "What does the cat do?"
DOCUMENTS = ["The cat sat on the mat.", "A lazy dog.", "Hello world!", "The quick brown fox jumps over the lazy dog."]
TEXTS = ["Where does the cat sit?", "The quick brown fox.", "Hello world!"]
INSTRUCTION = "Given a question, find the passage that answers it"
DIRS: dict[str, Path] = {}  # name → directory of the models the fixture below serves


@pytest.fixture(scope="module")
async def decoders(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    root = tmp_path_factory.mktemp("decoders")
    DIRS.update(
        {
            "qwen3": write_family_model(root / "qwen3", "qwen3"),
            "gemma": write_family_model(root / "gemma", "embeddinggemma"),
            "reranker": write_family_model(root / "reranker", "qwen3-reranker", head="causal-lm"),
            "qwen3-ce": write_family_model(root / "qwen3-ce", "qwen3", head="sequence-classification", num_labels=1),
            "qwen3-cls": write_family_model(root / "qwen3-cls", "qwen3", head="sequence-classification", num_labels=3),
            "deberta-cls": write_family_model(
                root / "deberta-cls", "deberta-v2", head="sequence-classification", num_labels=3
            ),
        }
    )
    loaded = {name: load_model(path, device="cpu", dtype="float32", name=name) for name, path in DIRS.items()}
    app = create_app(Settings(), loaded)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            await wait_until_ready(client)
            yield Service(app, client)


def cosines(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    return (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))


# ---- reranking ----


def yes_no_reference(directory: Path, ids: list[list[int]]) -> np.ndarray:
    """sigmoid(logit(yes) − logit(no)) at the last token, from transformers' causal LM, one sequence at a time."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    reference = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    scores = []
    for sequence in ids:
        with torch.inference_mode():
            logits = reference(input_ids=torch.tensor([sequence])).logits[0, -1]
        scores.append(torch.sigmoid(logits[yes] - logits[no]).item())
    return np.array(scores)


async def test_yes_no_rerank_equals_cross_encoder_and_transformers_on_the_template(decoders: Service) -> None:
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer

    client, directory = decoders.client, DIRS["reranker"]
    tokenizer = AutoTokenizer.from_pretrained(directory)
    for instruction in (None, INSTRUCTION):  # None: the contract's default instruction
        body = {"query": QUERY, "documents": DOCUMENTS, "model": "reranker", "return_documents": True}
        if instruction is not None:
            body["instruction"] = instruction
        response = (await client.post("/rerank", json=body)).json()
        assert response["method"] == "yes-no"
        formatted = [YES_NO.formatted(instruction or YES_NO.instruction, QUERY, document) for document in DOCUMENTS]
        ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in formatted]
        expected = yes_no_reference(directory, ids)
        # sentence-transformers' CrossEncoder on the formatted strings, given as pairs split where the suffix
        # begins (at the special token <|im_end|>, so that they tokenise as the whole strings do)
        pairs = [(text.removesuffix(YES_NO.suffix), YES_NO.suffix) for text in formatted]
        predicted = CrossEncoder(str(directory), device="cpu").predict(pairs)
        np.testing.assert_allclose(predicted, expected, atol=1e-5)
        results = response["results"]
        got = {item["index"]: item["relevance_score"] for item in results}
        np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], expected, atol=1e-5)
        assert [item["index"] for item in results] == list(np.argsort(-expected, kind="stable"))
        assert [item["document"] for item in results] == [DOCUMENTS[item["index"]] for item in results]
        assert response["usage"]["prompt_tokens"] == sum(len(sequence) for sequence in ids)
    raw = (await client.post("/rerank", json={**body, "raw_scores": True})).json()
    logits = {item["index"]: item["relevance_score"] for item in raw["results"]}
    probabilities = 1 / (1 + np.exp(-np.array([logits[i] for i in range(len(DOCUMENTS))])))
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)


async def test_a_long_document_is_cut_never_the_template(decoders: Service) -> None:
    """With truncate, the document's tokens are cut so that prefix + (instruction, query, document) + suffix fit,
    as Qwen3-Reranker's model card cuts them; without, the pair is a 422 naming the document."""
    from transformers import AutoTokenizer

    client, directory = decoders.client, DIRS["reranker"]
    model: TextEncoder = local_model(decoders.app.state.registry.get("reranker"))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    long_document = "The quick brown fox jumps over the lazy dog. " * 60
    documents = [long_document, DOCUMENTS[0]]
    response = (await client.post("/rerank", json={"query": QUERY, "documents": documents, "model": "reranker"})).json()
    prefix = tokenizer(YES_NO.prefix, add_special_tokens=False)["input_ids"]
    suffix = tokenizer(YES_NO.suffix, add_special_tokens=False)["input_ids"]
    room = model.card.max_tokens - len(prefix) - len(suffix)
    middles = [YES_NO.head(YES_NO.instruction, QUERY) + document for document in documents]
    ids = [prefix + tokenizer(m, add_special_tokens=False)["input_ids"][:room] + suffix for m in middles]
    assert len(ids[0]) == model.card.max_tokens and ids[0][-len(suffix) :] == suffix
    got = {item["index"]: item["relevance_score"] for item in response["results"]}
    np.testing.assert_allclose([got[0], got[1]], yes_no_reference(directory, ids), atol=1e-5)
    assert_error(
        await client.post(
            "/rerank", json={"query": QUERY, "documents": documents, "model": "reranker", "truncate": False}
        ),
        422,
        "validation_error",
        "documents[0]",
        f"more than the maximum of {model.card.max_tokens} (send truncate: true to cut the document)",
    )
    assert_error(
        await client.post("/rerank", json={"query": long_document, "documents": ["a"], "model": "reranker"}),
        422,
        "validation_error",
        "query",
        "leaving no room for a document",
    )


async def test_decoder_cross_encoders_and_classifiers_equal_their_references(decoders: Service) -> None:
    """A Qwen3 sequence classifier scored at its last token that is not padding (transformers' rule), as
    CrossEncoder.predict scores it; Qwen3 and DeBERTa-v3 classifiers as transformers classifies."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    client = decoders.client
    expected = CrossEncoder(str(DIRS["qwen3-ce"]), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    body = (await client.post("/rerank", json={"query": QUERY, "documents": DOCUMENTS, "model": "qwen3-ce"})).json()
    assert body["method"] == "cross-encoder"
    got = {item["index"]: item["relevance_score"] for item in body["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], expected, atol=1e-5)
    for name in ("qwen3-cls", "deberta-cls"):
        tokenizer = AutoTokenizer.from_pretrained(DIRS[name])
        reference = AutoModelForSequenceClassification.from_pretrained(DIRS[name], attn_implementation="eager")
        inputs = tokenizer(TEXTS, padding=True, return_tensors="pt")
        with torch.inference_mode():
            probabilities = torch.softmax(reference.eval()(**inputs).logits, -1).numpy()
        response = (await client.post("/classify", json={"texts": TEXTS, "model": name})).json()
        for item in response["data"]:
            scores = {label["label"]: label["score"] for label in item["labels"]}
            got_row = [scores[f"LABEL_{i}"] for i in range(3)]
            np.testing.assert_allclose(got_row, probabilities[item["index"]], atol=1e-5)


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/rerank", {"query": "q", "documents": ["d"], "model": "qwen3", "method": "yes-no"}, "method", "by cosine"),
        ("/rerank", {"query": "q", "documents": ["d"], "model": "qwen3-cls"}, "model", "has 3 outputs"),
        (
            "/rerank",
            {"query": "q", "documents": ["d"], "model": "qwen3-ce", "instruction": "x"},
            "instruction",
            "yes-no",
        ),
        ("/rerank", {"query": "q", "documents": ["d"], "model": "reranker", "instruction": ""}, "instruction", "empty"),
        ("/classify", {"texts": "x", "model": "reranker"}, "model", "cannot classify"),
        ("/encode", {"texts": "x", "model": "qwen3", "prompt": "a", "prompt_name": "query"}, "prompt", "not both"),
        (
            "/v1/embeddings",
            {"input": "x", "model": "qwen3", "prompt": "a", "prompt_name": "query"},
            "prompt",
            "not both",
        ),
        ("/encode", {"texts": "x", "model": "qwen3", "prompt": 5}, "prompt", "string"),
        ("/encode", {"texts": "x", "model": "gemma", "dimensions": 17}, "dimensions", "width 16"),
    ],
)
async def test_bad_requests_to_the_new_families_get_their_422(
    decoders: Service, path: str, body: dict, param: str, words: str
) -> None:
    assert_error(await decoders.client.post(path, json=body), 422, "validation_error", param, words)
    assert (await decoders.client.get("/health")).status_code == 200


# ---- embeddings with prompts ----


async def test_a_literal_prompt_equals_sentence_transformers(decoders: Service) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(DIRS["qwen3"]), device="cpu")
    for prompt_name, prompt in ((None, "Represent this sentence: "), ("query", None)):
        expected = reference.encode(TEXTS, prompt=prompt, prompt_name=prompt_name, normalize_embeddings=True)
        fields = {"prompt": prompt} if prompt is not None else {"prompt_name": prompt_name}
        encode = (await decoders.client.post("/encode", json={"texts": TEXTS, "model": "qwen3", **fields})).json()
        v1 = (await decoders.client.post("/v1/embeddings", json={"input": TEXTS, "model": "qwen3", **fields})).json()
        for body in (encode, v1):
            got = np.array([item["embedding"] for item in body["data"]])
            assert cosines(got, expected).min() >= 0.99999
            np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)  # element by element too


async def test_a_pooling_that_excludes_prompts_leaves_their_tokens_out(tmp_path: Path) -> None:
    """include_prompt false (sentence-transformers' Pooling option): the prompt's tokens, but its trailing special
    token, are left out of the mean, as sentence-transformers leaves them out."""
    from sentence_transformers import SentenceTransformer

    from tests.helpers import serving

    directory = write_family_model(tmp_path / "instructed", "xlm-roberta", seed=4)
    pooling = json.loads((directory / "1_Pooling" / "config.json").read_text())
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "include_prompt": False}))
    model = load_model(directory, device="cpu", dtype="float32")
    assert not model.card.pooling.include_prompt
    reference = SentenceTransformer(str(directory), device="cpu")
    prompt = "Represent the question for retrieval: "
    expected = reference.encode(TEXTS, prompt=prompt, normalize_embeddings=True)
    included = reference.encode([prompt + text for text in TEXTS], normalize_embeddings=True)
    async with serving(Settings(), model) as service:
        body = (await service.client.post("/encode", json={"texts": TEXTS, "prompt": prompt})).json()
    got = np.array([item["embedding"] for item in body["data"]])
    assert cosines(got, expected).min() >= 0.99999
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)  # element by element too
    assert cosines(got, included).max() < 0.9999, "the prompt's tokens must have been left out"


# ---- inspection ----


async def test_similarity_explained_at_the_last_token_and_through_dense_modules(decoders: Service) -> None:
    """Last-token pooling (Qwen3-Embedding): the whole score in the pair of last tokens. Mean pooling followed by
    two Dense modules without activation (EmbeddingGemma): the exact formula with each token vector mapped through
    them, from sentence-transformers' own token embeddings and Dense weights."""
    from sentence_transformers import SentenceTransformer

    client = decoders.client
    body = {"source": QUERY, "texts": DOCUMENTS[:2], "explain": True}
    last = (await client.post("/similarity", json={**body, "model": "qwen3"})).json()
    for item in last["data"]:
        explanation = item["explanation"]
        contributions = np.array(explanation["contributions"])
        assert explanation["method"] == "last_token"
        assert contributions[-1, -1] == pytest.approx(item["score"], abs=1e-5)
        assert np.abs(contributions).sum() == pytest.approx(abs(item["score"]), abs=1e-5)

    mean = (await client.post("/similarity", json={**body, "model": "gemma"})).json()
    reference = SentenceTransformer(str(DIRS["gemma"]), device="cpu")
    tokens = reference.encode([QUERY, *DOCUMENTS[:2]], output_value="token_embeddings")
    dense = [module.get_parameter("linear.weight").detach().double() for module in list(reference.children())[2:4]]
    mapped = [t.double() @ dense[0].T @ dense[1].T for t in tokens]  # each token through both Dense modules
    a = mapped[0]
    for item, b in zip(mean["data"], mapped[1:], strict=True):
        explanation = item["explanation"]
        assert explanation["method"] == "mean_pooling_exact"
        expected = (a @ b.T) / (len(a) * len(b) * a.mean(0).norm() * b.mean(0).norm())
        np.testing.assert_allclose(np.array(explanation["contributions"]), expected.numpy(), atol=1e-5)
        assert np.sum(explanation["contributions"]) == pytest.approx(item["score"], abs=1e-5)


async def test_the_neuron_view_of_grouped_query_heads(decoders: Service) -> None:
    """Qwen3: query heads 0 and 1 share key/value head 0 (same keys and values, their own queries), head 2 has
    key/value head 1; the queries and keys are normed per head and rotated; the scale is 1/√Dh with Dh = 8 ≠ D/H,
    and the scores hold zeros nowhere but the attention is causal. Gemma: its scale, query_pre_attn_scalar^-½."""
    client = decoders.client
    text = "The quick brown fox jumps over the lazy dog."
    steps = [
        (await client.post("/attention/neuron", json={"text": text, "model": "qwen3", "layer": 1, "head": h})).json()
        for h in range(4)
    ]

    # Each head is a request of its own, so a pass of its own, with one torch thread or two by the load it meets; this
    # tiny model's products 16 columns wide round otherwise on one than on two (docs/operations.md, "The same numbers"):
    # a CI run saw head 0's and head 1's keys 4e-7 apart. Same within float32's rounding, then, and others far apart.
    def same(a: list, b: list) -> bool:
        return bool(np.allclose(np.array(a), np.array(b), rtol=0, atol=1e-5))

    assert same(steps[0]["keys"], steps[1]["keys"]) and same(steps[0]["values"], steps[1]["values"])
    assert same(steps[2]["keys"], steps[3]["keys"]) and not same(steps[0]["keys"], steps[2]["keys"])
    assert not same(steps[0]["queries"], steps[1]["queries"])
    assert steps[0]["scale"] == pytest.approx(8**-0.5) and len(steps[0]["queries"][0]) == 8
    for head, step in enumerate(steps):
        q, k, scores = np.array(step["queries"]), np.array(step["keys"]), np.array(step["scores"])
        np.testing.assert_allclose(scores, step["scale"] * q @ k.T, atol=1e-5)
        attention = np.array(step["attention"])
        assert np.abs(np.triu(attention, 1)).max() == 0.0
        sliced = (
            await client.post("/attention", json={"text": text, "model": "qwen3", "layers": [1], "heads": [head]})
        ).json()
        np.testing.assert_allclose(attention, np.array(sliced["attention"])[0, 0], atol=1e-6)
    gemma = (await client.post("/attention/neuron", json={"text": text, "model": "gemma"})).json()
    assert gemma["scale"] == pytest.approx(8**-0.5)  # query_pre_attn_scalar 8 in the tiny model


async def test_norm_weighted_attention_under_grouped_query_attention(decoders: Service) -> None:
    """‖α_ij f_h(x_j)‖ with f_h(x_j) = v_j (of h's key/value head) W_O^h, from transformers' own values (captured
    from v_proj) and o_proj, and its attention probabilities."""
    from tests.families import hf_model

    text = "The quick brown fox jumps over the lazy dog."
    model: TextEncoder = local_model(decoders.app.state.registry.get("qwen3"))
    encoding = model.card.tokenizer.encode([text])[0]
    reference = hf_model(DIRS["qwen3"])
    values: list[torch.Tensor] = []
    hooks = [
        layer.self_attn.v_proj.register_forward_hook(lambda m, i, o: values.append(o)) for layer in reference.layers
    ]
    with torch.inference_mode():
        attentions = reference(input_ids=torch.tensor([encoding.ids]), output_attentions=True).attentions
    for hook in hooks:
        hook.remove()
    reference.requires_grad_(False)
    body = (await decoders.client.post("/attention", json={"text": text, "model": "qwen3", "weighting": "norm"})).json()
    ours = np.array(body["attention"])  # (L, H, T, T)
    H, Hkv, Dh = 4, 2, 8
    for layer, (attention, v) in enumerate(zip(attentions, values, strict=True)):
        W_O = reference.layers[layer].self_attn.o_proj.weight  # (D, H·Dh)
        v = v[0].view(-1, Hkv, Dh)  # (T, Hkv, Dh)
        for head in range(H):
            transformed = v[:, head // (H // Hkv)] @ W_O[:, head * Dh : (head + 1) * Dh].T  # (T, D)
            expected = attention[0, head] * transformed.norm(dim=-1)[None, :]  # (T, T)
            np.testing.assert_allclose(ours[layer, head], expected.numpy(), atol=1e-5)


async def test_head_statistics_and_words_of_a_causal_model(decoders: Service) -> None:
    """A causal model's queries never see the next token; merged into words, rows still sum to 1."""
    client = decoders.client
    statistics = (await client.post("/attention/heads", json={"texts": TEXTS, "model": "qwen3"})).json()["statistics"]
    assert np.abs(np.array(statistics["to_next"])).max() == 0.0
    assert np.array(statistics["to_previous"]).min() > 0.0
    words = (
        await client.post("/attention", json={"text": TEXTS[1], "model": "qwen3", "level": "word", "layers": [-1]})
    ).json()
    np.testing.assert_allclose(np.array(words["attention"]).sum(-1), 1.0, atol=1e-5)


def test_a_rope_scaling_not_implemented_stops_the_service_at_start_naming_it(tmp_path: Path) -> None:
    directory = write_family_model(tmp_path / "yarn", "qwen3")
    config = json.loads((directory / "config.json").read_text())
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    (directory / "config.json").write_text(json.dumps({**config, "rope_scaling": yarn}))
    with pytest.raises(ModelLoadError, match=r"cannot serve model 'yarn'.*rope scaling.*'yarn'"):
        load_registry(Settings(models=[("yarn", directory)]), Metrics())


async def test_an_explanation_that_would_not_be_exact_is_refused_naming_explain(tmp_path: Path) -> None:
    """Dense modules after a pooling whose weights do not sum to 1 (mean_sqrt_len_tokens) or after a max: the
    cosine does not split into token pairs through them, so explain is a 422; without it the scores still come."""
    from tests.helpers import serving

    for pooling in ("mean_sqrt_len_tokens", "max"):
        directory = write_family_model(tmp_path / pooling, "embeddinggemma", pooling=pooling)
        model = load_model(directory, device="cpu", dtype="float32")
        assert model.card.pooling.dense and model.card.pooling.mode == pooling
        async with serving(Settings(), model) as service:
            body = {"source": QUERY, "texts": DOCUMENTS[:2], "explain": True}
            assert_error(
                await service.client.post("/similarity", json=body),
                422,
                "validation_error",
                "explain",
                f"pools by {pooling} and then applies Dense modules: its cosine does not split",
            )
            plain = await service.client.post("/similarity", json={**body, "explain": False})
            assert plain.status_code == 200 and len(plain.json()["data"]) == 2
