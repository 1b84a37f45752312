"""Shared fixtures: a tiny random-weight BERT written to a temporary directory, and the bundled model."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:  # a dependency of the service wherever it installs; a GPU host given only its wheels lacks it
    import openvino  # noqa: F401

    OPENVINO = True
except ImportError:
    OPENVINO = False
# Every service the tests start, in this process or in its own, computes its embedding pass compiled by OpenVINO
# (the runtime on, whatever the rule of this CPU would give); tests of the choice itself set ENCODER_RUNTIME. Where
# OpenVINO is missing (the GPU host's CUDA tests, scripts/gpu_check.sh), the CPU's pass runs on torch.
os.environ.setdefault("ENCODER_RUNTIME", "openvino" if OPENVINO else "torch")

import pytest

from model import TextEncoder, default_model_path, load_model
from tests.helpers import write_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-bert"))


# The session's shared models run their embedding pass compiled by OpenVINO, as the service runs it where that is
# the faster: every test through them (the services' parity with the references among them) runs with the runtime
# on. Tests of the torch pass itself load their own models with runtime="torch" (load_model's default).
RUNTIME = "openvino" if OPENVINO else "torch"


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> TextEncoder:
    return load_model(tiny_model_dir, device="cpu", dtype="float32", runtime=RUNTIME)


@pytest.fixture(scope="session")
def bundled_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def bundled_model() -> TextEncoder:
    return load_model(device="cpu", dtype="float32", runtime=RUNTIME)


@pytest.fixture(scope="session")
def hf_bert(bundled_path: Path):
    """transformers' BertModel on the bundled checkpoint, eager attention so it can return probabilities."""
    from transformers import BertModel

    return BertModel.from_pretrained(bundled_path, attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def hf_tokenizer(bundled_path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_path)


@pytest.fixture(scope="session")
def sentence_transformer(bundled_path: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(bundled_path), device="cpu")
