"""The CPU's torch passes at aligned lengths: a padded batch's length rounded up to a multiple of 16 for the
attention kernel, the appended columns masked and dropped, no number of a real token changed, in any family."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model import load_model
from model.runtime.backends import AlignedLength, EagerPass, aligned_length, unwrapped
from model.spec.config import DECODERS
from tests.families import FAMILIES, FAMILY_SPECS, SAMPLE_TEXTS, write_family_model
from tests.helpers import RecordingPass
from tests.model.test_families import left_padded

TEXTS = [text if isinstance(text, str) else text[0] for text in SAMPLE_TEXTS.values()]


@pytest.mark.parametrize(
    ("length", "longest", "aligned"),
    [
        (1, 512, 16),
        (5, 512, 16),
        (16, 512, 16),
        (17, 512, 32),
        (55, 512, 64),
        (60, 64, 64),
        (60, 62, 60),  # no further than the model's positions
        (120, 512, 128),
        (129, 512, 129),  # longer ones as they are
        (300, 512, 300),
    ],
)
def test_aligned_lengths(length: int, longest: int, aligned: int) -> None:
    assert aligned_length(length, longest) == aligned


def test_padding_columns_are_appended_masked_and_dropped() -> None:
    inner = RecordingPass()
    ids = torch.tensor([[101, 5, 6, 102, 0], [101, 7, 8, 9, 102]])
    mask = (ids != 0).long()
    types = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 1, 1, 1]])
    hidden = AlignedLength(inner, longest=512)(ids, mask, types)
    ((seen_ids, seen_mask, seen_types),) = inner.seen
    assert seen_ids.shape == seen_mask.shape == seen_types.shape == (2, 16)
    assert torch.equal(seen_ids[:, :5], ids) and torch.equal(seen_mask[:, :5], mask)
    assert torch.equal(seen_types[:, :5], types)
    assert not seen_mask[:, 5:].any() and not seen_ids[:, 5:].any() and not seen_types[:, 5:].any()
    assert hidden is not None and hidden.shape == (2, 5, 4) and hidden.is_contiguous()
    assert torch.equal(hidden[..., 0], ids.float())


@pytest.mark.parametrize("shape", [(1, 5), (2, 16), (3, 48), (2, 200)])
def test_one_text_and_batches_at_an_aligned_or_long_length_pass_as_they_are(shape: tuple[int, int]) -> None:
    inner = RecordingPass()
    ids = torch.ones(shape, dtype=torch.long)
    AlignedLength(inner, longest=512)(ids, torch.ones_like(ids), torch.zeros_like(ids))
    assert inner.seen[0][0] is ids


def test_the_cpu_torch_passes_are_aligned(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="torch")
    (backend,) = model.backends
    assert isinstance(backend, AlignedLength) and backend.longest == model.passes.embeddings.max_length
    assert unwrapped(backend) is not backend and model.graph is not None  # the traced pass inside


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    family = request.param
    return write_family_model(tmp_path_factory.mktemp(family), family, head=FAMILY_SPECS[family].heads[0])


def test_every_family_equals_its_pass_at_the_batch_length(family_dir: Path) -> None:
    """Float32, every family (positions learned, relative, disentangled, rotary; local windows; causal decoders
    padded on either side): each real token's last hidden state as the unaligned pass gives it, within 1e-5."""
    model = load_model(family_dir, device="cpu", dtype="float32", traced=False, runtime="torch")
    batch = model.card.tokenizer.pad(model.card.tokenizer.encode(TEXTS))
    assert batch.input_ids.shape[1] % 16 != 0 and batch.attention_mask.min() == 0  # something to align
    sides = [batch, left_padded(batch)] if model.card.config.family in DECODERS else [batch]
    for padded in sides:
        ids, mask, types = model.to_tensors(padded)
        with torch.inference_mode():
            plain = EagerPass(model.passes)(ids, mask, types)
            aligned = AlignedLength(EagerPass(model.passes), model.passes.embeddings.max_length)(ids, mask, types)
        assert aligned is not None and aligned.shape == plain.shape
        real = mask.bool()
        torch.testing.assert_close(aligned[real], plain[real], atol=1e-5, rtol=1e-5)
