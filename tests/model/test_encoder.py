"""The encoder's pieces against references: torch.nn.MultiheadAttention, numpy, the seed notebooks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from model import (
    Encoder,
    EncoderConfig,
    MultiHeadAttention,
    TextEncoder,
    scaled_dot_product_attention,
    sinusoidal_positional_encoding,
)
from model.nn.encoder import Keep, PositionwiseFeedForward, padding_mask
from model.spec.config import Activation, PositionEmbedding

# Printed in seeds/multi_head_attention_positional_encoding_layernorm.txt for sequence_length=10, d_model=6.
SEED_PE_10x6 = [
    [0.0000, 1.0000, 0.0000, 1.0000, 0.0000, 1.0000],
    [0.8415, 0.5403, 0.0464, 0.9989, 0.0022, 1.0000],
    [0.9093, -0.4161, 0.0927, 0.9957, 0.0043, 1.0000],
    [0.1411, -0.9900, 0.1388, 0.9903, 0.0065, 1.0000],
    [-0.7568, -0.6536, 0.1846, 0.9828, 0.0086, 1.0000],
    [-0.9589, 0.2837, 0.2300, 0.9732, 0.0108, 0.9999],
    [-0.2794, 0.9602, 0.2749, 0.9615, 0.0129, 0.9999],
    [0.6570, 0.7539, 0.3192, 0.9477, 0.0151, 0.9999],
    [0.9894, -0.1455, 0.3629, 0.9318, 0.0172, 0.9999],
    [0.4121, -0.9111, 0.4057, 0.9140, 0.0194, 0.9998],
]
# Printed in seeds/transformer_core_functions.txt for PositionalEncoding(5, 4).
SEED_PE_5x4 = [
    [0.0000, 1.0000, 0.0000, 1.0000],
    [0.8415, 0.5403, 0.0100, 0.9999],
    [0.9093, -0.4161, 0.0200, 0.9998],
    [0.1411, -0.9900, 0.0300, 0.9996],
    [-0.7568, -0.6536, 0.0400, 0.9992],
]
TINY = EncoderConfig(vocab_size=50, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_positions=32)


@pytest.mark.parametrize(
    ("length", "d_model", "table"),
    [
        (10, 6, SEED_PE_10x6),  # the positional-encoding notebook
        (5, 4, SEED_PE_5x4),  # the transformer core-functions notebook
    ],
)
def test_sinusoidal_encoding_equals_seed_table(length: int, d_model: int, table: list[list[float]]) -> None:
    pe = sinusoidal_positional_encoding(length, d_model)
    assert pe.shape == (length, d_model)
    # The notebooks print 4 decimals: half a unit of the last place, plus float32 rounding at the boundary.
    torch.testing.assert_close(pe, torch.tensor(table), atol=5e-5 + 1e-6, rtol=0)


@pytest.mark.parametrize(
    ("length", "d_model", "base", "message"),
    [
        (0, 6, 10000.0, "length"),  # no positions
        (10, 5, 10000.0, "even"),  # odd width
        (10, 6, 1.0, "base"),  # base must exceed 1
        (10, 6, float("inf"), "base"),  # and be finite
    ],
)
def test_sinusoidal_encoding_rejects_bad_arguments(length: int, d_model: int, base: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sinusoidal_positional_encoding(length, d_model, base)


def numpy_self_attention(X, mask, W_KQV, W_out, n_heads):
    """The seed notebook's numpy attention, per head: softmax(Q Kᵀ / √d + mask) V W_out."""
    T, d = X.shape
    Q, K, V = np.split(X @ W_KQV, 3, axis=1)
    dh = d // n_heads
    heads, attns = [], []
    for h in range(n_heads):
        q, k, v = (M[:, h * dh : (h + 1) * dh] for M in (Q, K, V))
        Z = q @ k.T / np.sqrt(dh) + mask
        Z = np.exp(Z - Z.max(axis=-1, keepdims=True))
        attn = Z / Z.sum(axis=-1, keepdims=True)
        heads.append(attn @ v)
        attns.append(attn)
    return np.concatenate(heads, axis=1) @ W_out, np.stack(attns)


@pytest.mark.parametrize("n_heads", [1, 4])
def test_multi_head_attention_equals_torch_multihead_attention(n_heads: int) -> None:
    torch.manual_seed(0)
    B, T, D = 3, 7, 16
    reference = nn.MultiheadAttention(D, n_heads, bias=True, batch_first=True).eval()
    ours = MultiHeadAttention(D, n_heads).eval()
    with torch.no_grad():
        reference.in_proj_bias.normal_()
        reference.out_proj.bias.normal_()
        ours.qkv.weight.copy_(reference.in_proj_weight)
        ours.qkv.bias.copy_(reference.in_proj_bias)
        ours.out.weight.copy_(reference.out_proj.weight)
        ours.out.bias.copy_(reference.out_proj.bias)
    x = torch.randn(B, T, D)
    lengths = torch.tensor([7, 4, 1])
    attention_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T)
    with torch.no_grad():
        expected, expected_weights = reference(
            x, x, x, key_padding_mask=attention_mask == 0, need_weights=True, average_attn_weights=False
        )
        explicit, weights, _ = ours(x, padding_mask(attention_mask), need_weights=True)
        fast, none, _ = ours(x, padding_mask(attention_mask), need_weights=False)
    torch.testing.assert_close(explicit, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fast, expected, atol=1e-5, rtol=1e-5)
    assert none is None


def test_multi_head_attention_equals_seed_numpy_attention_with_causal_mask() -> None:
    torch.manual_seed(1)
    T, D, H = 12, 16, 4
    ours = MultiHeadAttention(D, H, bias=False).eval()
    x = torch.randn(1, T, D)
    M = torch.triu(-float("inf") * torch.ones(T, T), 1)  # the seed's upper-triangular -inf mask
    expected, expected_attn = numpy_self_attention(
        x[0].numpy(), M.numpy(), ours.qkv.weight.detach().numpy().T, ours.out.weight.detach().numpy().T, H
    )
    with torch.no_grad():
        y, attn, _ = ours(x, padding_mask(torch.ones(1, T), causal=True), need_weights=True)
    assert np.linalg.norm(y[0].numpy() - expected) < 1e-5
    np.testing.assert_allclose(attn[0].numpy(), expected_attn, atol=1e-6)


def test_scaled_dot_product_attention_rows_sum_to_one_and_skip_masked_keys() -> None:
    torch.manual_seed(2)
    q, k, v = torch.randn(3, 2, 2, 5, 8).unbind(0)
    mask = torch.tensor([True, True, True, False, False])[None, None, None, :]
    values, attention = scaled_dot_product_attention(q, k, v, mask)
    assert attention is not None
    torch.testing.assert_close(attention.sum(-1), torch.ones(2, 2, 5))
    assert attention[..., 3:].abs().max() == 0
    torch.testing.assert_close(values, attention @ v)


def random_batch(vocab: int, lengths: list[int], seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    T = max(lengths)
    input_ids = torch.randint(1, vocab, (len(lengths), T), generator=generator)
    attention_mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    token_type_ids = (torch.arange(T)[None, :] >= T // 2).long() * attention_mask
    return input_ids * attention_mask, attention_mask, token_type_ids


@pytest.mark.parametrize("position_embedding", ["learned", "sinusoidal"])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("causal", [False, True])
def test_fast_and_explicit_paths_agree(
    position_embedding: PositionEmbedding, activation: Activation, causal: bool
) -> None:
    torch.manual_seed(3)
    config = replace(TINY, position_embedding=position_embedding, activation=activation)
    encoder = Encoder(config).eval()
    input_ids, attention_mask, token_type_ids = random_batch(config.vocab_size, [9, 5, 2])
    with torch.inference_mode():
        fast = encoder(input_ids, attention_mask, token_type_ids, Keep(hidden_states=True), causal=causal)
        explicit = encoder(
            input_ids, attention_mask, token_type_ids, Keep(hidden_states=True, attentions=True), causal=causal
        )
    assert fast.attentions is None and len(explicit.attentions) == config.n_layers
    real = attention_mask.bool()
    for a, b in zip(fast.hidden_states, explicit.hidden_states):
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)


def test_causal_mask_gives_future_positions_zero_weight() -> None:
    torch.manual_seed(4)
    encoder = Encoder(TINY).eval()
    input_ids, attention_mask, token_type_ids = random_batch(TINY.vocab_size, [8, 8])
    with torch.inference_mode():
        out = encoder(input_ids, attention_mask, token_type_ids, Keep(attentions=True), causal=True)
    future = torch.ones(8, 8, dtype=torch.bool).triu(1)
    for attention in out.attentions:
        assert attention[..., future].abs().max() == 0
        assert attention[..., ~future].min() > 0
        torch.testing.assert_close(attention.sum(-1), torch.ones(2, TINY.n_heads, 8))


def test_text_outputs_do_not_change_when_batched_with_longer_texts(bundled_model: TextEncoder) -> None:
    texts = ["short text", "a considerably longer text that forces plenty of padding onto the short one " * 3]
    alone = bundled_model.card.tokenizer.pad(bundled_model.card.tokenizer.encode(texts[:1]))
    together = bundled_model.card.tokenizer.pad(bundled_model.card.tokenizer.encode(texts))
    n = alone.input_ids.shape[1]
    assert together.input_ids.shape[1] > n
    a = bundled_model.forward(alone, Keep(hidden_states=True, attentions=True))
    b = bundled_model.forward(together, Keep(hidden_states=True, attentions=True))
    assert a.hidden_states and b.hidden_states and a.attentions and b.attentions
    for x, y in zip(a.hidden_states, b.hidden_states):
        torch.testing.assert_close(x[0], y[0, :n], atol=1e-5, rtol=1e-5)
    for x, y in zip(a.attentions, b.attentions):
        torch.testing.assert_close(x[0], y[0, :, :n, :n], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(bundled_model.embed(texts[:1])[0], bundled_model.embed(texts)[0], atol=1e-6, rtol=0)


def test_stopping_early_equals_the_hidden_state_of_that_layer(tiny_model: TextEncoder) -> None:
    batch = tiny_model.card.tokenizer.pad(tiny_model.card.tokenizer.encode(["the quick brown fox", "hello"]))
    full = tiny_model.forward(batch, Keep(hidden_states=True))
    assert full.hidden_states is not None
    for n in range(tiny_model.card.config.n_layers + 1):
        partial = tiny_model.forward(batch, n_layers=n)
        torch.testing.assert_close(partial.last_hidden_state, full.hidden_states[n])


def test_embeddings_reject_sequences_longer_than_the_position_table() -> None:
    encoder = Encoder(TINY).eval()
    with pytest.raises(ValueError, match="33 tokens"):
        encoder(torch.ones(1, 33, dtype=torch.long))


def test_every_activation_a_config_or_checkpoint_can_name_is_one_module_of_the_table() -> None:
    """The configs' activations, the heads', Hugging Face's names and sentence-transformers' Dense classes are read
    without torch (model/spec/config.py, model/spec/checkpoint.py); each must name a module of the one table,
    ACTIVATIONS."""
    from typing import get_args

    from model.nn.encoder import ACTIVATIONS
    from model.spec.checkpoint import DENSE_ACTIVATIONS, HEAD_ACTIVATIONS, HeadActivation
    from model.spec.config import HF_ACTIVATIONS, Activation

    named = {
        *get_args(Activation),
        *get_args(HeadActivation),
        *HF_ACTIVATIONS.values(),
        *HEAD_ACTIVATIONS.values(),
        *DENSE_ACTIVATIONS.values(),
    }
    assert named <= set(ACTIVATIONS), named - set(ACTIVATIONS)
    assert set(get_args(Activation)) == set(HF_ACTIVATIONS.values())  # every config activation is read from one


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))],
)
def test_the_gelu_in_the_products_epilogue_stays_near_the_exact_gelu(device: str) -> None:
    """``PositionwiseFeedForward.fuse_gelu`` (the half-precision passes on a GPU): on the tokens as rows, packed
    (N, D) or padded (B, T, D), the first product and its GELU are one call. cuBLASLt's epilogue computes the tanh
    form, within 4.7 · 10⁻⁴ of the exact GELU; torch computes the exact one on a CPU. Other activations keep the
    module's."""
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(32, 64, "gelu").to(device)
    x = torch.randn(50, 32, device=device) * 3
    with torch.inference_mode():
        hidden = ffn.expand(x)
        exact = ffn.contract(torch.nn.functional.gelu(hidden))
        tanh_form = ffn.contract(torch.nn.functional.gelu(hidden, approximate="tanh"))
        assert ffn.fuse_gelu()
        fused = ffn(x)
        torch.testing.assert_close(fused, tanh_form if device == "cuda" else exact, atol=1e-5, rtol=1e-5)
        bound = 4.7e-4 * ffn.contract.weight.abs().sum(dim=1)  # (D,): each output sums F such differences
        assert ((fused - exact).abs() <= bound + 1e-5).all()
        torch.testing.assert_close(ffn(x[None]), fused[None], atol=1e-6, rtol=1e-6)  # (B, T, D) as rows: the same
        if device == "cuda":
            half = ffn.half()
            torch.testing.assert_close(half(x.half()).float(), tanh_form, atol=2e-2, rtol=1e-2)
    assert not PositionwiseFeedForward(32, 64, "relu").fuse_gelu()
    assert not PositionwiseFeedForward(32, 64, "gelu", glu=True).fuse_gelu()
    assert not PositionwiseFeedForward(32, 64, "gelu", bias=False).fuse_gelu()
