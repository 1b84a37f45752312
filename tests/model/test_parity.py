"""The bundled all-MiniLM-L6-v2 through our encoder equals the reference libraries."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model import AttentionSelection, EmbeddingSpec, TextEncoder
from tests.helpers import hf_forward

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention is all you need.",
    "A much longer sentence, with punctuation; numbers like 3.14159 and 2026, and unusual words: "
    "transmogrification, antidisestablishmentarianism, naïve café déjà vu.",
    "Hi",
]
PAIRS = [None, "Is it, though?", None, "Hello there, general Kenobi."]  # two sentence pairs in the batch


# Where a GPU is present the parity tests run there too. float16 keeps ~3 significant digits, so its
# tolerances are looser: 2e-2 on hidden states (values up to ~10), 2e-3 on attention probabilities,
# cosine 0.9999 on sentence embeddings. float32 on any device is held to 1e-5. On the CPU, bfloat16 runs
# the embedding pass's matrix products in bfloat16 (autocast, float32 weights; what `auto` picks on CPUs
# with AMX or AVX512-BF16): its sentence embeddings are held to cosine 0.9999, and everything computed
# outside that pass (model.forward, /attention) stays float32 and is held to 1e-5.
TARGETS = [("cpu", "float32", 1e-5, 1e-5, 0.99999), ("cpu", "bfloat16", 1e-5, 1e-5, 0.9999)]
if torch.cuda.is_available():
    TARGETS += [("cuda", "float32", 1e-5, 1e-5, 0.99999), ("cuda", "float16", 2e-2, 2e-3, 0.9999)]


@pytest.fixture(scope="module", params=TARGETS, ids=[f"{d}-{t}" for d, t, *_ in TARGETS])
def target(request, bundled_model: TextEncoder):
    device, dtype, hidden_tol, attention_tol, min_cosine = request.param
    model = bundled_model if (device, dtype) == ("cpu", "float32") else TextEncoder.load(device=device, dtype=dtype)
    return model, hidden_tol, attention_tol, min_cosine


@pytest.fixture(scope="module")
def batch(bundled_model: TextEncoder):
    return bundled_model.tokenizer.pad(bundled_model.tokenizer.encode(TEXTS, PAIRS))


def test_token_ids_equal_transformers_tokenizer(bundled_model: TextEncoder, hf_tokenizer) -> None:
    for text, pair in zip(TEXTS, PAIRS):
        ours = bundled_model.tokenizer.encode([text], [pair])[0]
        theirs = hf_tokenizer(text, pair)
        assert ours.ids == theirs["input_ids"]
        assert ours.type_ids == theirs["token_type_ids"]


def test_padded_pair_batch_equals_transformers_bert(target, hf_bert, batch) -> None:
    model, hidden_tol, attention_tol, _ = target
    assert batch.attention_mask.min() == 0, "the batch must contain padding for this test to mean anything"
    assert batch.token_type_ids.max() == 1, "the batch must contain a sentence pair"
    output = model.forward(batch, return_hidden_states=True, return_attentions=True)
    ours = type(output)(
        last_hidden_state=output.last_hidden_state.float().cpu(),
        hidden_states=[h.float().cpu() for h in output.hidden_states],
        attentions=[a.float().cpu() for a in output.attentions],
    )
    theirs = hf_forward(hf_bert, batch, output_attentions=True, output_hidden_states=True)
    real = torch.from_numpy(batch.attention_mask).bool()  # compare real tokens; padded rows are don't-care
    torch.testing.assert_close(ours.last_hidden_state[real], theirs.last_hidden_state[real], atol=hidden_tol, rtol=0)
    assert len(ours.hidden_states) == len(theirs.hidden_states) == 7
    for mine, reference in zip(ours.hidden_states, theirs.hidden_states):
        torch.testing.assert_close(mine[real], reference[real], atol=hidden_tol, rtol=0)
    assert len(ours.attentions) == len(theirs.attentions) == 6
    for mine, reference in zip(ours.attentions, theirs.attentions):
        assert mine.shape == reference.shape
        for row, n in enumerate(batch.attention_mask.sum(axis=1)):
            torch.testing.assert_close(mine[row, :, :n, :n], reference[row, :, :n, :n], atol=attention_tol, rtol=0)
            assert mine[row, :, :, n:].abs().sum() == 0  # no weight on padding keys


def test_fast_path_hidden_states_equal_transformers_bert(target, hf_bert, batch) -> None:
    """Without attention probabilities the padded batch takes the packed fast path (padding skipped)."""
    model, hidden_tol, _, _ = target
    output = model.forward(batch, return_hidden_states=True)
    assert output.attentions is None
    theirs = hf_forward(hf_bert, batch, output_hidden_states=True)
    real = torch.from_numpy(batch.attention_mask).bool()
    for mine, reference in zip(output.hidden_states, theirs.hidden_states, strict=True):
        torch.testing.assert_close(mine.float().cpu()[real], reference[real], atol=hidden_tol, rtol=0)
    assert output.last_hidden_state.float().cpu()[~real].abs().sum() == 0  # padded rows are never computed


def test_sentence_embeddings_equal_sentence_transformers(target, sentence_transformer) -> None:
    model, _, _, min_cosine = target
    texts = [*TEXTS, "word " * 400]  # the last one is cut at the model's 256 tokens by both
    ours = model.embed(texts).float().cpu().numpy()
    theirs = sentence_transformer.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    cosine = (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
    assert cosine.min() >= min_cosine, cosine
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_max_tokens_follows_sentence_transformers_config(bundled_model: TextEncoder, sentence_transformer) -> None:
    assert bundled_model.max_tokens == sentence_transformer.max_seq_length == 256


def test_the_service_path_equals_sentence_transformers_in_a_mixed_batch(target, sentence_transformer) -> None:
    """embed_encodings is what requests run: rows with the defaults equal sentence-transformers even when
    rows of other layers and poolings share their pass."""
    model, _, _, min_cosine = target
    encodings = model.tokenizer.encode(TEXTS)
    default = EmbeddingSpec(layer=model.config.n_layers, pooling="mean", normalize=True)
    other = EmbeddingSpec(layer=3, pooling="cls", normalize=False, token_vectors=True)
    specs = [default, other, default, other]
    results = model.embed_encodings(encodings, specs)
    theirs = sentence_transformer.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    for row in (0, 2):
        ours = results[row].sentence
        cosine = float(ours @ theirs[row] / (np.linalg.norm(ours) * np.linalg.norm(theirs[row])))
        assert cosine >= min_cosine, (row, cosine)
    for row in (1, 3):  # layer 3's [CLS] vector, as transformers computes it
        alone = model.embed([TEXTS[row]], pooling="cls", normalize_embeddings=False, layer=3)[0]
        np.testing.assert_allclose(results[row].sentence, alone.float().cpu().numpy(), atol=1e-4)
        assert results[row].tokens is not None and results[row].tokens.shape == (len(encodings[row].ids), 384)


def test_selected_attention_equals_transformers(target, hf_bert) -> None:
    """Under every precision: the explicit attention path runs in the weights' dtype, float32 on the CPU."""
    model, _, attention_tol, _ = target
    encoding = model.tokenizer.encode([TEXTS[0]], [PAIRS[1]])[0]
    theirs = hf_forward(hf_bert, model.tokenizer.pad([encoding]), output_attentions=True).attentions
    full = torch.stack(theirs)[:, 0].numpy()  # (L, H, T, T)
    picked = model.attention(encoding, AttentionSelection(layers=(5, 0), heads=(3, 1)))
    np.testing.assert_allclose(picked, full[[5, 0]][:, [3, 1]], atol=attention_tol)
    mean = model.attention(encoding, AttentionSelection(layers=(2,), heads=(0, 7, 11), aggregate="mean"))
    np.testing.assert_allclose(mean, full[[2]][:, [0, 7, 11]].mean(axis=1, keepdims=True), atol=attention_tol)
