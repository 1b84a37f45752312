"""The embedding pass as CUDA graphs (model/runtime/graphs.py): buckets of batch shape, replays equal to the eager
pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model import TextEncoder, load_model
from model.runtime.graphs import bucket_sizes

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_bucket_sizes_are_powers_of_two_up_to_the_limit() -> None:
    assert bucket_sizes(256, 16) == [16, 32, 64, 128, 256]
    assert bucket_sizes(512, 1) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert bucket_sizes(200, 16) == [16, 32, 64, 128, 200]  # the limit itself closes the list
    assert bucket_sizes(8, 16) == [8]


def test_a_cpu_model_has_no_graphs(bundled_model: TextEncoder) -> None:
    assert bundled_model.graphs is None


@pytest.fixture(scope="module")
def on_gpu() -> TextEncoder:
    """float32, so that replays and the eager pass can be held to float32's tolerance."""
    return load_model(device="cuda", dtype="float32")


def random_batch(model: TextEncoder, rows: int, length: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1000, model.card.config.vocab_size, (rows, length), generator=generator)
    lengths = torch.randint(1, length + 1, (rows,), generator=generator)
    lengths[0] = length  # the longest row sets the batch's length
    attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    input_ids = input_ids * attention_mask  # padding is token 0, as the tokenizer pads
    token_type_ids = torch.zeros_like(input_ids)
    return tuple(t.to(model.device) for t in (input_ids, attention_mask, token_type_ids))


@cuda
@pytest.mark.parametrize(("rows", "length", "bucket"), [(1, 5, (1, 16)), (3, 17, (4, 32)), (33, 100, (64, 128))])
def test_replays_equal_the_eager_pass(on_gpu: TextEncoder, rows: int, length: int, bucket: tuple[int, int]) -> None:
    assert on_gpu.graphs is not None
    assert tuple(on_gpu.graphs.bucket(rows, length).input_ids.shape) == bucket  # type: ignore[union-attr]
    batch = random_batch(on_gpu, rows, length, seed=rows)
    other = random_batch(on_gpu, 2, 9, seed=99)
    with torch.inference_mode():
        expected = on_gpu.encoder(*batch).last_hidden_state  # eager, padding skipped
        replayed = on_gpu.graphs(*batch)
        on_gpu.graphs(*other)  # another bucket's replay in between must not change what was returned
    assert replayed is not None and replayed.shape == expected.shape
    real = batch[1].bool()
    torch.testing.assert_close(replayed[real], expected[real], atol=1e-4, rtol=1e-4)


@cuda
def test_a_batch_larger_than_every_bucket_takes_the_traced_pass(on_gpu: TextEncoder) -> None:
    batch = random_batch(on_gpu, 300, 8, seed=3)  # more rows than the largest bucket (256)
    assert on_gpu.graphs is not None and on_gpu.graphs(*batch) is None
    with torch.inference_mode():
        expected = on_gpu.encoder(*batch).last_hidden_state
        computed = on_gpu.last_hidden_state(*batch)
    real = batch[1].bool()
    torch.testing.assert_close(computed[real], expected[real], atol=1e-4, rtol=1e-4)


@cuda
def test_the_buckets_stop_at_the_pass_budget() -> None:
    model = load_model(device="cuda", graph_tokens=1024)
    assert model.graphs is not None
    assert max(rows * length for rows, length in model.graphs.buckets) == 1024
    assert model.graphs.output.shape[0] == 1024  # the shared output holds the largest bucket


@cuda
def test_a_decoder_pass_is_recorded_too(tmp_path: Path) -> None:
    """Qwen3 (rotary positions, grouped-query attention, causal): its rotation frequencies reach the GPU before the
    capture, so the pass records (a copy from the host inside a capture failed it on an H100) and replays equal
    the eager pass."""
    from tests.families import write_family_model

    model = load_model(write_family_model(tmp_path, "qwen3"), device="cuda", dtype="float32")
    assert model.graphs is not None, "recorded"
    texts = ["A cat sat on the mat.", "Hello world!", "The quick brown fox jumps over the lazy dog."]
    batch = model.to_tensors(model.card.tokenizer.pad(model.card.tokenizer.encode(texts)))
    with torch.inference_mode():
        expected = model.encoder(*batch).last_hidden_state
        replayed = model.graphs(*batch)
    assert replayed is not None
    real = batch[1].bool()
    torch.testing.assert_close(replayed[real], expected[real], atol=1e-4, rtol=1e-4)
