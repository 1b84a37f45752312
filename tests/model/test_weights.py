"""Loading checkpoints: a tiny random BERT equals transformers; every defect is named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from model import EncoderLayer, TextEncoder, load_model
from model.nn.encoder import Keep
from tests.helpers import hf_forward, write_tiny_model


def copy_model(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def rewrite_checkpoint(directory: Path, edit) -> None:
    tensors = load_file(directory / "model.safetensors")
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "model.safetensors")


def test_tiny_random_model_equals_transformers(tiny_model: TextEncoder, tiny_model_dir: Path) -> None:
    from transformers import BertModel

    reference = BertModel.from_pretrained(tiny_model_dir, attn_implementation="eager").eval()
    batch = tiny_model.card.tokenizer.pad(
        tiny_model.card.tokenizer.encode(["the quick brown fox jumps", "hello"], ["over the lazy dog", None])
    )
    ours = tiny_model.forward(batch, Keep(hidden_states=True, attentions=True))
    theirs = hf_forward(reference, batch, output_attentions=True, output_hidden_states=True)
    real = torch.from_numpy(batch.attention_mask).bool()
    assert ours.hidden_states is not None and ours.attentions is not None
    for mine, reference_state in zip(ours.hidden_states, theirs.hidden_states, strict=True):
        torch.testing.assert_close(mine[real], reference_state[real], atol=1e-5, rtol=1e-5)
    for mine, reference_attention in zip(ours.attentions, theirs.attentions, strict=True):
        torch.testing.assert_close(mine[1, :, :3, :3], reference_attention[1, :, :3, :3], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(mine[0], reference_attention[0], atol=1e-6, rtol=1e-5)


def test_fused_qkv_is_query_key_value_stacked(tiny_model: TextEncoder, tiny_model_dir: Path) -> None:
    tensors = load_file(tiny_model_dir / "model.safetensors")
    expected = torch.cat([tensors[f"encoder.layer.1.attention.self.{n}.weight"] for n in ("query", "key", "value")])
    layer = tiny_model.encoder.layers[1]
    assert isinstance(layer, EncoderLayer)
    torch.testing.assert_close(layer.attention.qkv.weight, expected, atol=0, rtol=0)


def test_task_model_prefix_and_ignored_heads_load(
    tiny_model_dir: Path, tiny_model: TextEncoder, tmp_path: Path
) -> None:
    directory = copy_model(tiny_model_dir, tmp_path / "masked-lm")

    def as_masked_lm(tensors: dict) -> None:
        for key in list(tensors):
            tensors[f"bert.{key}"] = tensors.pop(key)
        tensors["cls.predictions.bias"] = torch.zeros(3)

    rewrite_checkpoint(directory, as_masked_lm)
    loaded = load_model(directory, device="cpu", dtype="float32")
    for a, b in zip(loaded.encoder.parameters(), tiny_model.encoder.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_missing_tensor_is_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = copy_model(tiny_model_dir, tmp_path / "missing")
    rewrite_checkpoint(directory, lambda t: t.pop("encoder.layer.1.attention.self.key.bias"))
    with pytest.raises(ValueError, match=r"missing tensors: encoder\.layer\.1\.attention\.self\.key\.bias"):
        load_model(directory, device="cpu")


def test_wrong_shape_is_named_with_both_shapes(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = copy_model(tiny_model_dir, tmp_path / "wrong-shape")
    rewrite_checkpoint(
        directory, lambda t: t.update({"encoder.layer.0.intermediate.dense.weight": torch.zeros(31, 16)})
    )
    with pytest.raises(
        ValueError,
        match=r"wrong shapes: encoder\.layer\.0\.intermediate\.dense\.weight \(31, 16\) \(expected \(32, 16\)\)",
    ):
        load_model(directory, device="cpu")


def test_unexpected_tensor_is_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = copy_model(tiny_model_dir, tmp_path / "unexpected")
    rewrite_checkpoint(directory, lambda t: t.update({"encoder.layer.2.output.dense.weight": torch.zeros(16, 32)}))
    with pytest.raises(ValueError, match=r"unexpected tensors: encoder\.layer\.2\.output\.dense\.weight"):
        load_model(directory, device="cpu")


def test_more_layers_in_config_than_checkpoint_reports_missing_layer(tmp_path: Path) -> None:
    directory = write_tiny_model(tmp_path / "short")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match=r"missing tensors: encoder\.layer\.2\."):
        load_model(directory, device="cpu")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # a family we do not serve: the message lists those we do
        ({"model_type": "gpt2"}, "model_type.*supported: bert, roberta, xlm-roberta, camembert, distilbert, mpnet"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),  # relative positions
        ({"hidden_act": "quick_gelu"}, "hidden_act"),  # an activation we do not run
        ({"is_decoder": True}, "is_decoder"),  # a decoder
        ({"num_attention_heads": 5}, "divisible"),  # 16 is not divisible by 5
        ({"hidden_size": None}, "hidden_size"),  # a required field missing
    ],
)
def test_unsupported_config_is_named(tiny_model_dir: Path, tmp_path: Path, edit: dict, message: str) -> None:
    directory = copy_model(tiny_model_dir, tmp_path / "config")
    config = json.loads((directory / "config.json").read_text())
    config.update(edit)
    config = {k: v for k, v in config.items() if v is not None}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        load_model(directory, device="cpu")


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("config.json", "no config.json"),
        ("model.safetensors", "model.safetensors"),
        ("tokenizer.json", "tokenizer.json"),
    ],
)
def test_directory_without_a_model_is_named(tiny_model_dir: Path, tmp_path: Path, remove: str, message: str) -> None:
    directory = copy_model(tiny_model_dir, tmp_path / "incomplete")
    (directory / remove).unlink()
    with pytest.raises(ValueError, match=message):
        load_model(directory, device="cpu")


def test_nonexistent_directory_and_damaged_files_are_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_model(tmp_path / "nowhere", device="cpu")
    directory = copy_model(tiny_model_dir, tmp_path / "damaged")
    (directory / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_model(directory, device="cpu")
    (directory / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model(directory, device="cpu")
