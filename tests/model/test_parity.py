"""The bundled all-MiniLM-L6-v2 through our encoder equals the reference libraries."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from model import AttentionSelection, EmbeddingSpec, TextEncoder, load_model, tasks
from model.nn.encoder import Keep
from model.runtime.loader import cpu_bfloat16
from tests.helpers import hf_forward

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention is all you need.",
    "A much longer sentence, with punctuation; numbers like 3.14159 and 2026, and unusual words: "
    "transmogrification, antidisestablishmentarianism, naïve café déjà vu.",
    "Hi",
]
PAIRS = [None, "Is it, though?", None, "Hello there, general Kenobi."]  # two sentence pairs in the batch


@dataclass(frozen=True)
class Target:
    """A device and dtype, with what its results are held to against the references (float32, on the CPU)."""

    device: str
    dtype: str
    pass_tol: float  # the embedding pass's last hidden state (values up to ~6), in the target's dtype
    min_cosine: float  # sentence embeddings
    batch_rtol: float  # a row computed beside other rows against the same row alone (atol 1e-4 besides)

    @property
    def id(self) -> str:
        return f"{self.device}-{self.dtype}"


# The explicit path (model.forward: hidden states and attention maps, /attention) runs in float32 on every
# device and is held to 1e-5 everywhere. The embedding pass runs in the target's dtype: bfloat16 products on
# the CPU (autocast over float32 weights; what `auto` picks on CPUs with AMX: measured up to
# 0.015 off transformers, 0.7 % by norm), float16 on a GPU. A lower dtype's kernels round a row differently
# beside other rows (a layer-3 [CLS] element 0.25 % off on a CPU with AMX), hence batch_rtol.
TARGETS = [Target("cpu", "float32", 1e-5, 0.99999, 1e-7)]
if cpu_bfloat16():  # elsewhere bfloat16 is refused on a CPU (tests/model/test_openvino.py)
    TARGETS.append(Target("cpu", "bfloat16", 5e-2, 0.9999, 1e-2))
if torch.cuda.is_available():  # where a GPU is present the parity tests run there too
    TARGETS += [Target("cuda", "float32", 1e-5, 0.99999, 1e-7), Target("cuda", "float16", 5e-2, 0.9999, 1e-2)]
EXPLICIT_TOL = 1e-5


@pytest.fixture(scope="module", params=TARGETS, ids=[target.id for target in TARGETS])
def target(request, bundled_model: TextEncoder) -> tuple[TextEncoder, Target]:
    wanted: Target = request.param
    if (wanted.device, wanted.dtype) == ("cpu", "float32"):
        return bundled_model, wanted
    return load_model(device=wanted.device, dtype=wanted.dtype), wanted


@pytest.fixture(scope="module")
def batch(bundled_model: TextEncoder):
    return bundled_model.card.tokenizer.pad(bundled_model.card.tokenizer.encode(TEXTS, PAIRS))


def test_token_ids_equal_transformers_tokenizer(bundled_model: TextEncoder, hf_tokenizer) -> None:
    for text, pair in zip(TEXTS, PAIRS):
        ours = bundled_model.card.tokenizer.encode([text], [pair])[0]
        theirs = hf_tokenizer(text, pair)
        assert ours.ids == theirs["input_ids"]
        assert ours.type_ids == theirs["token_type_ids"]


def test_padded_pair_batch_equals_transformers_bert(target, hf_bert, batch) -> None:
    model, _ = target
    hidden_tol = attention_tol = EXPLICIT_TOL
    assert batch.attention_mask.min() == 0, "the batch must contain padding for this test to mean anything"
    assert batch.token_type_ids.max() == 1, "the batch must contain a sentence pair"
    output = model.forward(batch, Keep(hidden_states=True, attentions=True))
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
    model, _ = target
    hidden_tol = EXPLICIT_TOL
    output = model.forward(batch, Keep(hidden_states=True))
    assert output.attentions is None
    theirs = hf_forward(hf_bert, batch, output_hidden_states=True)
    real = torch.from_numpy(batch.attention_mask).bool()
    for mine, reference in zip(output.hidden_states, theirs.hidden_states, strict=True):
        torch.testing.assert_close(mine.float().cpu()[real], reference[real], atol=hidden_tol, rtol=0)
    assert output.last_hidden_state.float().cpu()[~real].abs().sum() == 0  # padded rows are never computed


def test_the_embedding_pass_equals_transformers_bert_in_its_dtype(target, hf_bert, batch) -> None:
    """The pass requests run (the traced graph, on the pass's own weights): within the target's tolerance, and
    within 1 % by norm under a lower dtype."""
    model, wanted = target
    with torch.inference_mode():
        ours = model.last_hidden_state(*model.to_tensors(batch))
    assert ours.dtype == (torch.float16 if wanted.dtype == "float16" else torch.float32)  # CPU: autocast, float32 out
    theirs = hf_forward(hf_bert, batch).last_hidden_state
    real = torch.from_numpy(batch.attention_mask).bool()
    mine, reference = ours.float().cpu()[real], theirs[real]
    torch.testing.assert_close(mine, reference, atol=wanted.pass_tol, rtol=0)
    assert float((mine - reference).norm() / reference.norm()) <= (1e-2 if wanted.dtype != "float32" else 1e-5)


def test_sentence_embeddings_equal_sentence_transformers(target, sentence_transformer) -> None:
    model, wanted = target
    min_cosine = wanted.min_cosine
    texts = [*TEXTS, "word " * 400]  # the last one is cut at the model's 256 tokens by both
    ours = model.embed(texts).float().cpu().numpy()
    theirs = sentence_transformer.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    cosine = (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
    assert cosine.min() >= min_cosine, cosine
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_max_tokens_follows_sentence_transformers_config(bundled_model: TextEncoder, sentence_transformer) -> None:
    assert bundled_model.card.max_tokens == sentence_transformer.max_seq_length == 256


def test_the_service_path_equals_sentence_transformers_in_a_mixed_batch(target, sentence_transformer) -> None:
    """tasks.embed_texts is what requests run: rows with the defaults equal sentence-transformers even when
    rows of other layers and poolings share their pass."""
    model, wanted = target
    min_cosine = wanted.min_cosine
    encodings = model.card.tokenizer.encode(TEXTS)
    default = EmbeddingSpec(layer=model.card.config.n_layers, pooling="mean", normalize=True)
    other = EmbeddingSpec(layer=3, pooling="cls", normalize=False, token_vectors=True)
    specs = [default, other, default, other]
    results = tasks.embed_texts(model, encodings, specs)
    theirs = sentence_transformer.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    for row in (0, 2):
        ours = results[row].sentence
        cosine = float(ours @ theirs[row] / (np.linalg.norm(ours) * np.linalg.norm(theirs[row])))
        assert cosine >= min_cosine, (row, cosine)
    for row in (1, 3):  # layer 3's [CLS] vector, as transformers computes it
        alone = model.embed([TEXTS[row]], pooling="cls", normalize_embeddings=False, layer=3)[0]
        np.testing.assert_allclose(
            results[row].sentence, alone.float().cpu().numpy(), atol=1e-4, rtol=wanted.batch_rtol
        )
        assert results[row].tokens is not None and results[row].tokens.shape == (len(encodings[row].ids), 384)


def test_selected_attention_equals_transformers(target, hf_bert) -> None:
    """Under every precision: the explicit attention path runs in float32 on every device."""
    model, _ = target
    attention_tol = EXPLICIT_TOL
    encoding = model.card.tokenizer.encode([TEXTS[0]], [PAIRS[1]])[0]
    theirs = hf_forward(hf_bert, model.card.tokenizer.pad([encoding]), output_attentions=True).attentions
    full = torch.stack(theirs)[:, 0].numpy()  # (L, H, T, T)
    picked = tasks.attention_maps(model, encoding, AttentionSelection(layers=(5, 0), heads=(3, 1)))
    np.testing.assert_allclose(picked, full[[5, 0]][:, [3, 1]], atol=attention_tol)
    mean = tasks.attention_maps(model, encoding, AttentionSelection(layers=(2,), heads=(0, 7, 11), aggregate="mean"))
    np.testing.assert_allclose(mean, full[[2]][:, [0, 7, 11]].mean(axis=1, keepdims=True), atol=attention_tol)
