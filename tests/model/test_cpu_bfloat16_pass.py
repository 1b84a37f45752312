"""The CPU's bfloat16 pass: its linear weights cast once, its real tokens rounded up to a few dozen row counts, and
neither changing a number."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from model import load_model
from model.runtime.backends import AlignedLength, BucketedRows, EagerPass, TracedPass, row_bucket
from tests.helpers import RecordingPass, needs_cpu_bfloat16

WORDS = "the quick brown fox jumps over a lazy dog while cats sat on mats and said hello to the world".split()


def batch(model, texts: list[str]) -> tuple[Tensor, Tensor, Tensor]:
    return model.to_tensors(model.card.tokenizer.pad(model.card.tokenizer.encode(texts)))


@pytest.mark.parametrize(
    ("tokens", "bucket"),
    [
        (1, 16),
        (16, 16),
        (17, 24),
        (24, 24),
        (25, 32),
        (33, 40),
        (63, 64),
        (64, 64),
        (65, 72),
        (128, 128),
        (129, 144),
        (300, 320),
        (1000, 1024),
        (1025, 1152),
        (4096, 4096),
        (4097, 4608),
    ],
)
def test_row_buckets(tokens: int, bucket: int) -> None:
    assert row_bucket(tokens) == bucket


def test_row_buckets_are_few_and_waste_at_most_an_eighth_above_64() -> None:
    buckets = {row_bucket(n) for n in range(1, 4097)}
    assert len(buckets) == 55
    assert all(row_bucket(n) <= n * 9 / 8 for n in range(64, 4097))


def test_filler_rows_round_the_real_tokens_up_and_are_dropped() -> None:
    inner = RecordingPass()
    ids = torch.tensor([[101, 5, 6, 102, 0], [101, 7, 8, 9, 102]])  # 9 real tokens: 16 in the bucket
    mask = (ids != 0).long()
    hidden = BucketedRows(inner, filler_id=0)(ids, mask, torch.zeros_like(ids))
    ((seen_ids, seen_mask, _),) = inner.seen
    assert int(seen_mask.sum()) == 16 and seen_mask.shape == (4, 5)  # two filler rows of 5 and 2 tokens
    assert seen_mask[2:].flatten().tolist() == [1] * 7 + [0] * 3
    assert hidden is not None and torch.equal(seen_ids[:2], ids) and hidden.shape == (2, 5, 4)
    assert torch.equal(hidden[..., 0], ids.float())


def test_a_batch_already_in_a_bucket_passes_as_it_is() -> None:
    inner = RecordingPass()
    ids = torch.ones(2, 8, dtype=torch.long)
    BucketedRows(inner)(ids, torch.ones_like(ids), torch.zeros_like(ids))
    assert inner.seen[0][0] is ids


def test_buckets_change_no_number_of_the_rows_kept(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, device="cpu", dtype="float32", traced=False)
    rng = random.Random(2)
    for n in (1, 3, 7):
        texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30))) for _ in range(n)]
        ids, mask, types = batch(model, texts)
        plain = EagerPass(model.passes)(ids, mask, types)
        bucketed = BucketedRows(EagerPass(model.passes), model.card.config.pad_token_id)(ids, mask, types)
        assert bucketed is not None and bucketed.shape == plain.shape
        real = mask.bool()
        torch.testing.assert_close(bucketed[real], plain[real], atol=1e-6, rtol=0)


@needs_cpu_bfloat16
def test_the_bfloat16_pass_casts_its_linear_weights_once_and_shares_the_rest(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, device="cpu", dtype="bfloat16")
    assert model.pass_encoder is not None
    explicit = model.encoder.state_dict()
    assert all(tensor.dtype == torch.float32 for tensor in explicit.values())  # /attention's weights, float32
    linear = {
        f"{name}.{kind}"
        for name, module in model.pass_encoder.named_modules()
        if isinstance(module, nn.Linear)
        for kind in ("weight", "bias")
        if getattr(module, kind) is not None
    }
    assert linear
    for name, tensor in model.pass_encoder.state_dict().items():
        if name in linear:
            assert tensor.dtype == torch.bfloat16, name
            torch.testing.assert_close(tensor, explicit[name].to(torch.bfloat16), atol=0, rtol=0)
        else:
            assert tensor.data_ptr() == explicit[name].data_ptr(), f"{name} is copied, not shared"


@needs_cpu_bfloat16
def test_the_bfloat16_pass_equals_autocast_over_the_float32_weights(tiny_model_dir: Path) -> None:
    """torch's autocast, which casts the float32 weights on every call, gives the same numbers to the last bit."""
    model = load_model(tiny_model_dir, device="cpu", dtype="bfloat16")
    (aligned,) = model.backends
    assert isinstance(aligned, AlignedLength) and isinstance(aligned.inner, BucketedRows)
    assert isinstance(aligned.inner.inner, TracedPass)
    assert model.runtime == "torch (traced)"
    texts = ["the quick brown fox", "hello world", "a lazy dog sat on the mats while the cats said hello"]
    ids, mask, types = batch(model, texts)
    with torch.inference_mode():
        ours = model.last_hidden_state(ids, mask, types)
        # at the same aligned length: the attention kernel's sums over another length round otherwise
        reference = AlignedLength(EagerPass(model.encoder, torch.bfloat16), aligned.longest)(ids, mask, types)
    assert ours is not None and reference is not None
    assert ours.dtype == reference.dtype  # float32: the last norm runs so under autocast
    real = mask.bool()
    torch.testing.assert_close(ours[real], reference[real], atol=0, rtol=0)


def test_float32_keeps_its_pass_as_it_was(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, device="cpu", dtype="float32")
    assert model.pass_encoder is None
    assert not any(isinstance(backend, BucketedRows) for backend in model.backends)
