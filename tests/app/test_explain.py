"""/explain against Captum on transformers' models: integrated gradients (Gauss–Legendre) and gradient × input at the
embedding block's output, for a cross-encoder, classifiers of two families and a yes/no reranker; its bad inputs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from app.main import create_app
from app.settings import Settings
from model import TextEncoder, load_model, tasks
from tests.app.test_tasks import classifier_dir, cross_encoder_dir
from tests.families import FAMILY_SPECS, write_family_model
from tests.helpers import Service, assert_error, start_server, wait_until_ready

TEXT, PAIR = "what does the cat do", "the cat sat on the mat"
MODEL_DIRS: dict[str, Path] = {}


@pytest.fixture(scope="module")
async def explaining(tmp_path_factory: pytest.TempPathFactory, tiny_model: TextEncoder) -> AsyncIterator[Service]:
    root = tmp_path_factory.mktemp("explain")
    models = {
        "bert-ce": cross_encoder_dir(root, "bert"),
        "bert-cls": classifier_dir(root, "bert"),
        "roberta-cls": classifier_dir(root, "roberta"),
        "reranker": write_family_model(root / "reranker", "qwen3-reranker", head="causal-lm"),
    }
    loaded = {"plain": tiny_model} | {
        name: load_model(path, device="cpu", dtype="float32", name=name) for name, path in models.items()
    }
    app = create_app(Settings(max_explain_steps=64, max_explained_texts=3), loaded)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=120) as client:
            await wait_until_ready(client)
            MODEL_DIRS.update(models)
            yield Service(app, client)


def captum(name: str, ids: list[int], types: list[int], target: int, method: str, steps: int) -> dict[str, Any]:
    """Captum's attributions (summed over the hidden size), score, baseline score and delta, on transformers' model
    of ``name``, for the input ``ids``: the baseline keeps the special tokens and puts the pad token elsewhere."""
    from captum.attr import LayerGradientXActivation, LayerIntegratedGradients
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    directory = MODEL_DIRS[name]
    tokenizer = AutoTokenizer.from_pretrained(directory)
    # the named special tokens, and those the vocabulary marks special (<|im_start|>, …)
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    pad = tokenizer.pad_token_id
    baseline = torch.tensor([[i if i in special else pad for i in ids]])
    input_ids, token_types = torch.tensor([ids]), torch.tensor([types])
    mask = torch.ones_like(input_ids)
    # the input's positions for the baseline too (RoBERTa's would count the baseline's pad tokens out otherwise)
    offset = pad + 1 if name.startswith("roberta") else 0
    positions = offset + torch.arange(len(ids))[None]
    if name == "reranker":
        model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
        layer = model.model.embed_tokens
        yes, no = (tokenizer.get_vocab()[token] for token in ("yes", "no"))

        def f(i: torch.Tensor, t: torch.Tensor, a: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            logits = model(input_ids=i, attention_mask=a, position_ids=p).logits[:, -1]  # the last token's
            return logits[:, yes] - logits[:, no]
    else:
        model = AutoModelForSequenceClassification.from_pretrained(directory, attn_implementation="eager").eval()
        layer = model.base_model.embeddings

        def f(i: torch.Tensor, t: torch.Tensor, a: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            return model(input_ids=i, token_type_ids=t, attention_mask=a, position_ids=p).logits[:, target]

    with torch.no_grad():
        score = float(f(input_ids, token_types, mask, positions)[0])
        baseline_score = float(f(baseline, token_types, mask, positions)[0])
    extra = (token_types, mask, positions)
    if method == "gradient_x_input":
        attributions = LayerGradientXActivation(f, layer).attribute(input_ids, additional_forward_args=extra)
        return {"attributions": attributions.sum(-1)[0].detach().numpy(), "score": score}
    attributions, delta = LayerIntegratedGradients(f, layer).attribute(
        input_ids,
        baselines=baseline,
        additional_forward_args=extra,
        n_steps=steps,
        method="gausslegendre",
        return_convergence_delta=True,
    )
    return {
        "attributions": attributions.sum(-1)[0].detach().numpy(),
        "score": score,
        "baseline_score": baseline_score,
        "convergence_delta": float(delta[0]),
    }


def assert_equal_to_captum(body: dict[str, Any], expected: dict[str, Any]) -> None:
    """Attributions within 1e-4 of the largest; scores within 1e-5 (of their size, where it is over 1: float32's
    sums in another order); the delta as defined, and within what the scores and the attributions' sum it is made of
    may differ by (1e-5 of each's size: a difference of sums near 1 carries their rounding)."""
    attributions = np.asarray(body["attributions"])
    largest = np.abs(expected["attributions"]).max()
    assert np.abs(attributions - expected["attributions"]).max() <= 1e-4 * largest, (attributions, expected)
    for key in ("score", "baseline_score"):
        if key in expected:
            assert body[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-5), key
    if "convergence_delta" in expected:
        assert body["convergence_delta"] == pytest.approx(
            sum(body["attributions"]) - (body["score"] - body["baseline_score"]), abs=1e-5
        )
        parts = abs(body["score"]) + abs(body.get("baseline_score", 0.0)) + abs(sum(body["attributions"]))
        assert body["convergence_delta"] == pytest.approx(expected["convergence_delta"], abs=1e-5 * max(1.0, parts))


def captum_of(answer: dict[str, Any], name: str, method: str, steps: int) -> dict[str, Any]:
    """Captum's reference for an /explain answer of ``name`` on TEXT and PAIR: the ids of its tokens (for a
    classifier the pair as transformers' tokenizer reads it, with its token types), its target's index."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIRS[name])
    vocabulary = tokenizer.get_vocab()
    ids = [vocabulary[token] for token in answer["tokens"]]
    types = [0] * len(ids)
    if name != "reranker":  # a yes/no reranker's pair is in its template, one segment
        encoded = tokenizer(TEXT, PAIR)
        assert ids == encoded["input_ids"]  # the pair as transformers' tokenizer reads it
        types = list(encoded["token_type_ids"]) if "token_type_ids" in encoded else types
    target = 0 if answer["target"] is None else answer["target"]["index"]
    return captum(name, ids, types, target, method, steps)


@pytest.mark.parametrize(
    ("name", "target", "method", "steps"),
    [
        ("bert-ce", None, "integrated_gradients", 50),
        ("bert-cls", 2, "integrated_gradients", 50),
        ("bert-cls", "LABEL_1", "gradient_x_input", 50),
        ("roberta-cls", 0, "integrated_gradients", 7),
        ("reranker", None, "integrated_gradients", 20),
        ("reranker", None, "gradient_x_input", 50),
    ],
)
async def test_explain_equals_captum(
    explaining: Service, name: str, target: int | str | None, method: str, steps: int
) -> None:
    body = {"model": name, "text": TEXT, "text_pair": PAIR, "method": method, "steps": steps}
    if target is not None:
        body["target"] = target
    response = await explaining.client.post("/explain", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    if name == "reranker":
        rerank = {"model": name, "query": TEXT, "documents": [PAIR], "raw_scores": True}
        ranked = (await explaining.client.post("/rerank", json=rerank)).json()
        assert answer["score"] == pytest.approx(ranked["results"][0]["relevance_score"], abs=1e-4)
        assert answer["target"] is None
    else:
        labels = [f"LABEL_{i}" for i in range(1 if name == "bert-ce" else 3)]
        index = labels.index(target) if isinstance(target, str) else 0 if target is None else target
        assert answer["target"] == {"index": index, "label": labels[index]}
    reference = captum_of(answer, name, method, steps)
    assert len(answer["attributions"]) == len(answer["tokens"])
    assert answer["method"] == method and answer["steps"] == (steps if method == "integrated_gradients" else None)
    assert_equal_to_captum(answer, reference)
    if method == "gradient_x_input":
        assert answer["baseline_score"] is None and answer["convergence_delta"] is None


async def test_a_classifier_explains_its_top_label_by_default(explaining: Service) -> None:
    classified = (await explaining.client.post("/classify", json={"model": "bert-cls", "texts": [TEXT]})).json()
    top = classified["data"][0]["labels"][0]["label"]
    body = {"model": "bert-cls", "text": TEXT, "method": "gradient_x_input"}
    answer = (await explaining.client.post("/explain", json=body)).json()
    assert answer["target"]["label"] == top
    raw = {"model": "bert-cls", "texts": [TEXT], "raw_scores": True}
    logits = {
        row["label"]: row["score"]
        for row in (await explaining.client.post("/classify", json=raw)).json()["data"][0]["labels"]
    }
    assert answer["score"] == pytest.approx(logits[top], abs=1e-5)


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": "plain", "text": TEXT}, "model", "/similarity"),
        ({"model": "bert-cls", "text": TEXT, "steps": 0}, "steps", "between 1 and 64"),
        ({"model": "bert-cls", "text": TEXT, "steps": 65}, "steps", "between 1 and 64"),
        ({"model": "bert-cls", "text": TEXT, "target": 3}, "target", "has 3 labels, LABEL_0, LABEL_1, LABEL_2"),
        ({"model": "bert-ce", "text": TEXT, "text_pair": PAIR, "target": 1}, "target", "has 1 label, LABEL_0"),
        ({"model": "bert-cls", "text": TEXT, "target": "nope"}, "target", "LABEL_0, LABEL_1, LABEL_2"),
        ({"model": "bert-cls", "text": TEXT, "method": "saliency"}, "method", ""),
        ({"model": "bert-cls", "text": " "}, "text", "empty"),
        ({"model": "reranker", "text": TEXT}, "text_pair", "pair"),
        ({"model": "reranker", "text": TEXT, "text_pair": PAIR, "target": 1}, "target", "one score"),
    ],
)
async def test_bad_explain_requests_name_their_field(
    explaining: Service, body: dict[str, Any], param: str, words: str
) -> None:
    response = await explaining.client.post("/explain", json=body)
    assert_error(response, 422, "validation_error", param, words)


async def test_rerank_and_classify_with_explain_add_what_explain_answers(explaining: Service) -> None:
    client = explaining.client
    documents = [PAIR, "a dog", "the cat"]
    for name in ("bert-ce", "reranker"):
        ranked = (
            await client.post("/rerank", json={"model": name, "query": TEXT, "documents": documents, "explain": True})
        ).json()
        assert len(ranked["results"]) == 3
        for result in ranked["results"]:
            alone = {"model": name, "text": TEXT, "text_pair": documents[result["index"]]}
            explained = (await client.post("/explain", json=alone)).json()
            explanation = result["explanation"]
            assert explanation["tokens"] == explained["tokens"]
            # the same computation, perhaps on a compute lane with another thread count: float32's last bits
            np.testing.assert_allclose(explanation["attributions"], explained["attributions"], atol=1e-5)
            for key in ("score", "baseline_score", "convergence_delta"):
                assert explanation[key] == pytest.approx(explained[key], abs=1e-5)
        plain = (await client.post("/rerank", json={"model": name, "query": TEXT, "documents": documents})).json()
        assert all("explanation" not in result for result in plain["results"])
    texts = [TEXT, PAIR]
    classified = (await client.post("/classify", json={"model": "bert-cls", "texts": texts, "explain": True})).json()
    for row, text in zip(classified["data"], texts, strict=True):
        top = row["labels"][0]["label"]
        explained = (await client.post("/explain", json={"model": "bert-cls", "text": text, "target": top})).json()
        np.testing.assert_allclose(row["explanation"]["attributions"], explained["attributions"], atol=1e-5)
        assert row["explanation"]["score"] == pytest.approx(explained["score"], abs=1e-5)


async def test_explain_on_rerank_and_classify_is_bounded_and_refused_where_there_is_no_score(
    explaining: Service,
) -> None:
    client = explaining.client
    four = {"query": TEXT, "documents": ["a", "b", "c", "d"], "explain": True}
    assert_error(
        await client.post("/rerank", json={"model": "bert-ce", **four}), 422, "validation_error", "explain", "at most 3"
    )
    texts = {"texts": ["a", "b", "c", "d"], "explain": True}
    assert_error(
        await client.post("/classify", json={"model": "bert-cls", **texts}),
        422,
        "validation_error",
        "explain",
        "at most 3",
    )
    by_cosine = {"model": "plain", "query": TEXT, "documents": ["a"], "explain": True}
    assert_error(await client.post("/rerank", json=by_cosine), 422, "validation_error", "explain", "/similarity")


CLASSIFIER_FAMILIES = [
    "bert",
    *(name for name, spec in FAMILY_SPECS.items() if "sequence-classification" in spec.heads),
]


@pytest.fixture(scope="module")
def family_classifiers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, TextEncoder]]:
    root = tmp_path_factory.mktemp("explain-families")
    found = {}
    for family in CLASSIFIER_FAMILIES:
        directory = classifier_dir(root, family)
        found[family] = (directory, load_model(directory, device="cpu", dtype="float32", name=family))
    return found


@pytest.mark.parametrize("family", CLASSIFIER_FAMILIES)
def test_every_classifier_family_attributes_as_captum_does(
    family_classifiers: dict[str, tuple[Path, TextEncoder]], family: str
) -> None:
    """tasks.attribute (the /explain task's pass) against Captum on transformers' classifier of each family
    that has one, for its second label: integrated gradients and gradient × input."""
    import inspect

    from captum.attr import LayerGradientXActivation, LayerIntegratedGradients
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from app.services.tasks import baseline_of
    from model import AttributionOptions

    directory, model = family_classifiers[family]
    (encoding,) = model.card.tokenizer.encode([TEXT], [PAIR])
    ours = {
        method: tasks.attribute(
            model, [encoding], AttributionOptions((1,), method, 20, (baseline_of(encoding, model.card.tokenizer),))
        )[0]
        for method in ("integrated_gradients", "gradient_x_input")
    }
    reference = AutoModelForSequenceClassification.from_pretrained(directory, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    # the pad token: the config's, else the vocabulary's [PAD] or <pad>, else 0 (the rule model/spec/tokenizer.py
    # states)
    vocabulary = tokenizer.get_vocab()
    named = (reference.config.pad_token_id, vocabulary.get("[PAD]"), vocabulary.get("<pad>"), 0)
    pad = next(i for i in named if i is not None)
    if reference.config.pad_token_id is None:  # so that transformers takes a batch (Captum's steps): an id never met
        reference.config.pad_token_id = -1  # the last token is then the last one, as the service reads it
    ids = torch.tensor([encoding.ids])
    baseline = torch.tensor([[i if i in special else pad for i in encoding.ids]])
    base = reference.base_model
    layer = base.embeddings if hasattr(base, "embeddings") else base.embed_tokens
    taken = inspect.signature(reference.forward).parameters
    extra: dict[str, torch.Tensor] = {"attention_mask": torch.ones_like(ids)}
    if "token_type_ids" in taken and reference.config.to_dict().get("type_vocab_size", 0) > 1:
        extra["token_type_ids"] = torch.tensor([encoding.type_ids])
    if "position_ids" in taken:  # the input's positions for the baseline too (RoBERTa's count the pad tokens out)
        by_padding = type(layer).__name__ != "Embedding" and getattr(layer, "padding_idx", None) is not None
        extra["position_ids"] = (layer.padding_idx + 1 if by_padding else 0) + torch.arange(ids.size(1))[None]
    names = list(extra)

    def f(i: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return reference(input_ids=i, **dict(zip(names, rest, strict=True))).logits[:, 1]

    args = tuple(extra.values())
    attributions, delta = LayerIntegratedGradients(f, layer).attribute(
        ids,
        baselines=baseline,
        additional_forward_args=args,
        n_steps=20,
        method="gausslegendre",
        return_convergence_delta=True,
    )
    with torch.no_grad():
        expected = {
            "attributions": attributions.sum(-1)[0].detach().numpy(),
            "score": float(f(ids, *args)[0]),
            "baseline_score": float(f(baseline, *args)[0]),
            "convergence_delta": float(delta[0]),
        }
    got = ours["integrated_gradients"]
    assert_equal_to_captum(
        {
            "attributions": got.attributions.tolist(),
            "score": got.score,
            "baseline_score": got.baseline_score,
            "convergence_delta": got.convergence_delta,
        },
        expected,
    )
    by_gradient = LayerGradientXActivation(f, layer).attribute(ids, additional_forward_args=args).sum(-1)[0]
    got = ours["gradient_x_input"]
    assert_equal_to_captum(
        {"attributions": got.attributions.tolist(), "score": got.score},
        {"attributions": by_gradient.detach().numpy(), "score": expected["score"]},
    )


@pytest.mark.parametrize("family", CLASSIFIER_FAMILIES)
def test_texts_of_unlike_length_attributed_together_as_each_alone(
    family_classifiers: dict[str, tuple[Path, TextEncoder]], family: str
) -> None:
    """Several texts of one task (a request's explanations, app/services/tasks.py ``explained_together``): padded into
    one batch, their points in shared passes, some of them cut between two texts; each text's answer that of the text
    alone (itself checked against Captum above), for each method."""
    from app.services.tasks import baseline_of
    from model import AttributionOptions

    _, model = family_classifiers[family]
    tokenizer = model.card.tokenizer
    encodings = tokenizer.encode([TEXT, "a dog", PAIR, "the cat sat"], [PAIR, None, TEXT, None])
    baselines = tuple(baseline_of(encoding, tokenizer) for encoding in encodings)
    targets = (1, 0, 2, 1)
    longest = max(len(encoding.ids) for encoding in encodings)
    for method in ("integrated_gradients", "gradient_x_input"):
        together = tasks.attribute(model, encodings, AttributionOptions(targets, method, 7, baselines, 5 * longest))
        for encoding, target, baseline, got in zip(encodings, targets, baselines, together, strict=True):
            (alone,) = tasks.attribute(model, [encoding], AttributionOptions((target,), method, 7, (baseline,)))
            assert got.attributions.shape == (len(encoding.ids),)
            largest = np.abs(alone.attributions).max()
            # within the bounds held against Captum: float32's sums in another order (padded rows, packed tokens)
            assert np.abs(got.attributions - alone.attributions).max() <= 1e-4 * largest, (method, got, alone)
            assert got.score == pytest.approx(alone.score, rel=1e-5, abs=1e-5)
            if method == "integrated_gradients":
                assert got.baseline_score == pytest.approx(alone.baseline_score, rel=1e-5, abs=1e-5)
                # a sum of the attributions: within theirs, summed
                bound = 1e-4 * max(1.0, float(np.abs(alone.attributions).sum()))
                assert got.convergence_delta == pytest.approx(alone.convergence_delta, abs=bound)
            else:
                assert got.baseline_score is None and got.convergence_delta is None


def test_explanations_go_in_tasks_of_about_a_pass() -> None:
    """A request's texts shortest first, in groups whose points (steps × the group's longest text, as a pass pads
    them) fit one pass; a text larger than a pass alone in its group."""
    from app.services.tasks import explained_together

    assert explained_together([10, 10, 30, 5], 50, 2000) == [[3, 0, 1], [2]]
    assert explained_together([10, 100, 10], 50, 2000) == [[0, 2], [1]]
    assert explained_together([8] * 5, 50, 16384) == [[0, 1, 2, 3, 4]]
    # padded, three texts of 12 are 1,800 tokens of points: 10, 12 and 12 held by their own lengths (1,700) are not
    assert explained_together([12, 10, 12, 9], 50, 1700) == [[3, 1], [0, 2]]


def test_one_texts_steps_go_in_spans_of_about_a_pass() -> None:
    """Integrated gradients' steps of one text in spans [first, stop) of as many points as a pass holds, one at
    least, covering every step once."""
    from app.services.tasks import step_spans

    assert step_spans(15, 50, 100) == [
        (0, 6),
        (6, 12),
        (12, 18),
        (18, 24),
        (24, 30),
        (30, 36),
        (36, 42),
        (42, 48),
        (48, 50),
    ]
    assert step_spans(63, 50, 16384) == [(0, 50)]
    assert step_spans(63, 256, 4096) == [(0, 65), (65, 130), (130, 195), (195, 256)]
    assert step_spans(500, 3, 100) == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize(("name", "pass_tokens"), [("bert-cls", 400), ("reranker", 4000)])
async def test_an_explanation_larger_than_a_pass_goes_in_turn_and_equals_captum(
    explaining: Service, monkeypatch: pytest.MonkeyPatch, name: str, pass_tokens: int
) -> None:
    """Small passes (400 tokens, a quarter of them an explanation's task: 50 steps of a 15-token pair are 9 tasks of
    the engine; the reranker's template is longer), a span of the steps each, queued one after another (the requests
    that arrive meanwhile go between them); their sum is Captum's attribution."""
    spans: list[tuple[int, int] | None] = []
    attribute = tasks.attribute

    def recording(model: TextEncoder, texts: Any, options: Any) -> Any:
        spans.append(options.span)
        return attribute(model, texts, options)

    monkeypatch.setattr(tasks, "attribute", recording)
    loaded = {name: load_model(MODEL_DIRS[name], device="cpu", dtype="float32", name=name)}
    app = create_app(Settings(max_batch_tokens=pass_tokens, max_explain_steps=64), loaded)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=120) as client:
            await wait_until_ready(client)
            body = {"text": TEXT, "text_pair": PAIR, "steps": 50}
            response = await client.post("/explain", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    length = len(answer["tokens"])
    each = pass_tokens // 4 // length
    assert len(spans) > 1 and spans == [(first, min(first + each, 50)) for first in range(0, 50, each)]
    assert_equal_to_captum(answer, captum_of(answer, name, "integrated_gradients", 50))


async def test_an_explanation_in_spans_equals_captum_with_the_engine_apart(explaining: Service) -> None:
    """The spans cross to an engine process of its own (ENCODER_WORKERS=2) and back, one after another."""
    directory = MODEL_DIRS["bert-cls"]
    env = {"ENCODER_MODELS": f"bert-cls={directory}", "ENCODER_WORKERS": "2", "ENCODER_MAX_BATCH_TOKENS": "400"}
    process, url = start_server(env, supervised=True)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            await wait_until_ready(client)
            body = {"text": TEXT, "text_pair": PAIR, "steps": 50, "target": 1}
            response = await client.post("/explain", json=body)
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["target"]["index"] == 1
    assert 50 * len(answer["tokens"]) > 400 // 4  # several spans
    assert_equal_to_captum(answer, captum_of(answer, "bert-cls", "integrated_gradients", 50))
