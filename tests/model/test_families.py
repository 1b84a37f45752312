"""Every encoder family on tiny random checkpoints, against transformers' eager models and sentence-transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from model import TextEncoder
from model.tokenizer import Batch
from tests.families import FAMILIES, SAMPLE_TEXTS, hf_model, write_family_model

TEXTS = [text if isinstance(text, str) else text[0] for text in SAMPLE_TEXTS.values()]
PAIRS = [None if isinstance(text, str) else text[1] for text in SAMPLE_TEXTS.values()]
POSITION_ENCODINGS = {
    "roberta": "learned_offset",
    "xlm-roberta": "learned_offset",
    "camembert": "learned_offset",
    "distilbert": "learned",
    "mpnet": "relative_buckets",
    "electra": "learned",
    "modernbert": "rotary",
}


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    family, head = request.param
    return write_family_model(tmp_path_factory.mktemp(f"{family}-{head}"), family, head=head)


def batch_of(model: TextEncoder) -> Batch:
    batch = model.tokenizer.pad(model.tokenizer.encode(TEXTS, PAIRS))
    assert batch.attention_mask.min() == 0, "the batch must hold padding for the comparison to mean anything"
    return batch


def reference(directory: Path, model: TextEncoder, batch: Batch, **outputs: bool):
    inputs = {
        "input_ids": torch.from_numpy(batch.input_ids),
        "attention_mask": torch.from_numpy(batch.attention_mask),
    }
    if model.config.type_vocab_size > 1:
        inputs["token_type_ids"] = torch.from_numpy(batch.token_type_ids)
    with torch.inference_mode():
        return hf_model(directory)(**inputs, **outputs)


CASES = [(family, head) for family in FAMILIES for head in (None, "sequence-classification", "masked-lm")]

# (device, dtype, absolute and relative tolerance on the explicit path's hidden states and attention, least
# cosine of the sentence embeddings), each against the references in float32 on the CPU. Where a GPU is present
# every family runs there too. The explicit path is float32 under either dtype; a GPU's float32 products land
# up to 4e-5 off on these random models' values (up to ~10), hence 1e-4 there. Under float16 the embedding
# pass runs in float16 (cosine as in tests/model/test_parity.py).
TARGETS = [("cpu", "float32", 1e-5, 1e-5, 0.99999)]
if torch.cuda.is_available():
    TARGETS += [("cuda", "float32", 1e-4, 1e-4, 0.99999), ("cuda", "float16", 1e-4, 1e-4, 0.9999)]
TARGET_IDS = [f"{device}-{dtype}" for device, dtype, *_ in TARGETS]


@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("family_dir", CASES, ids=[f"{f}-{h or 'bare'}" for f, h in CASES], indirect=True)
def test_hidden_states_and_attentions_equal_transformers(family_dir: Path, target: tuple) -> None:
    device, dtype, atol, rtol, _ = target
    model = TextEncoder.load(family_dir, device=device, dtype=dtype)
    batch = batch_of(model)
    ours = model.forward(batch, return_hidden_states=True, return_attentions=True)
    theirs = reference(family_dir, model, batch, output_hidden_states=True, output_attentions=True)
    assert ours.hidden_states is not None and ours.attentions is not None
    real = torch.from_numpy(batch.attention_mask).bool()  # padded rows are don't-care

    def close(mine: torch.Tensor, reference_tensor: torch.Tensor) -> None:
        torch.testing.assert_close(mine.float().cpu(), reference_tensor, atol=atol, rtol=rtol)

    close(ours.last_hidden_state[real], theirs.last_hidden_state[real])
    assert len(ours.hidden_states) == len(theirs.hidden_states) == model.config.n_layers + 1
    for mine, reference_state in zip(ours.hidden_states, theirs.hidden_states, strict=True):
        close(mine[real], reference_state[real])
    for mine, reference_attention in zip(ours.attentions, theirs.attentions, strict=True):
        for row, n in enumerate(batch.attention_mask.sum(axis=1)):
            close(mine[row, :, :n, :n], reference_attention[row, :, :n, :n])
    # the fast path (padding skipped, fused attention) gives the same
    fast = model.forward(batch, return_hidden_states=True)
    close(fast.last_hidden_state[real], theirs.last_hidden_state[real])


BARE = [(family, None) for family in FAMILIES]


@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("family_dir", BARE, ids=list(FAMILIES), indirect=True)
def test_sentence_embeddings_equal_sentence_transformers(family_dir: Path, target: tuple) -> None:
    from sentence_transformers import SentenceTransformer

    device, dtype, _, _, min_cosine = target
    model = TextEncoder.load(family_dir, device=device, dtype=dtype)
    ours = model.embed(TEXTS).numpy()
    theirs = SentenceTransformer(str(family_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)
    cosine = (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
    assert cosine.min() >= min_cosine, cosine
    assert model.config.position_embedding == POSITION_ENCODINGS[model.config.family]


@pytest.mark.parametrize("family_dir", [("modernbert", None)], ids=["modernbert"], indirect=True)
def test_modernbert_local_layers_put_no_weight_outside_their_window(family_dir: Path) -> None:
    model = TextEncoder.load(family_dir, device="cpu", dtype="float32")
    config = model.config
    encoding = model.tokenizer.encode([SAMPLE_TEXTS["long"]])[0]  # type: ignore[list-item]
    T = len(encoding.ids)
    assert config.local_window // 2 + 1 < T, "the text must reach past the window"
    attentions = model.forward(model.tokenizer.pad([encoding]), return_attentions=True).attentions
    assert attentions is not None
    distance = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs()  # (T, T)
    outside = distance > config.local_window // 2
    local = [i for i in range(config.n_layers) if config.is_local(i)]
    assert local and len(local) < config.n_layers, "the tiny model must have local and global layers"
    for i, attention in enumerate(attentions):
        weight_outside = attention[0][:, outside].abs().max().item()
        if i in local:
            assert weight_outside == 0.0
        else:
            assert weight_outside > 0.0


def test_distilbert_sinusoidal_positions_are_the_seeds_sinusoid(tmp_path: Path) -> None:
    directory = write_family_model(tmp_path / "distilbert-sin", "distilbert", sinusoidal=True)
    model = TextEncoder.load(directory, device="cpu", dtype="float32")
    assert model.config.position_embedding == "sinusoidal" and model.encoder.embeddings.position is None
    batch = batch_of(model)
    theirs = reference(directory, model, batch)
    real = torch.from_numpy(batch.attention_mask).bool()
    ours = model.forward(batch).last_hidden_state
    torch.testing.assert_close(ours[real], theirs.last_hidden_state[real], atol=1e-5, rtol=1e-5)


CLASSIFIERS: list[tuple[str, dict[str, object]]] = [(family, {}) for family in ("bert", *FAMILIES)] + [
    ("modernbert", {"classifier_pooling": "mean", "classifier_bias": True}),  # its other pooling, a dense bias
    ("roberta", {"problem_type": "multi_label_classification"}),  # a sigmoid per label
]


@pytest.mark.parametrize(
    ("family", "overrides"), CLASSIFIERS, ids=[f"{f}-{'-'.join(o) or 'default'}" for f, o in CLASSIFIERS]
)
def test_classification_heads_equal_transformers(tmp_path: Path, family: str, overrides: dict) -> None:
    from transformers import AutoModelForSequenceClassification

    if family == "bert":
        from tests.helpers import write_tiny_model

        directory = write_tiny_model(tmp_path / "bert", head="sequence-classification", num_labels=3)
    else:
        directory = write_family_model(
            tmp_path / family, family, head="sequence-classification", num_labels=3, **overrides
        )
    model = TextEncoder.load(directory, device="cpu", dtype="float32")
    assert model.classifier is not None and len(model.classifier.head.labels) == 3
    encodings = model.tokenizer.encode(TEXTS, PAIRS)
    ours = model.classify(encodings)
    batch = model.tokenizer.pad(encodings)
    inputs = {"input_ids": torch.from_numpy(batch.input_ids), "attention_mask": torch.from_numpy(batch.attention_mask)}
    if model.config.type_vocab_size > 1:
        inputs["token_type_ids"] = torch.from_numpy(batch.token_type_ids)
    reference = AutoModelForSequenceClassification.from_pretrained(directory, attn_implementation="eager").eval()
    with torch.inference_mode():
        theirs = reference(**inputs).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    probabilities = model.classifier.probabilities(ours)
    if overrides.get("problem_type") == "multi_label_classification":
        torch.testing.assert_close(probabilities, torch.sigmoid(theirs))
    else:
        torch.testing.assert_close(probabilities.sum(-1), torch.ones(len(TEXTS)))


def test_a_bare_model_has_no_classification_head(tmp_path: Path) -> None:
    model = TextEncoder.load(write_family_model(tmp_path / "bare", "roberta"), device="cpu", dtype="float32")
    assert model.classifier is None
    with pytest.raises(ValueError, match="has no classification head"):
        model.classify(model.tokenizer.encode(["hello"]))
