"""The embedding pass compiled by OpenVINO (model/runtime/openvino_pass.py), and how a runtime is chosen at load
(model/runtime/loader.py, ``choose_runtime``): equal to the torch pass in float32 for every family, across shapes;
bfloat16 and int8 within the bounds measured on the bundled model; the refusals and fall-backs, each with its
message."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from model import EncoderConfig, TextEncoder, load_model
from model.runtime import loader
from model.runtime.backends import AlignedLength, BucketedRows, OneText, TracedPass, length_groups, unwrapped
from model.runtime.openvino_pass import (
    CONTRACTION_KEPT,
    WEIGHTS_ALONE,
    Int8Scheme,
    OpenVINOPass,
    batch_bucket,
    convert,
    int8_weights,
)
from tests.families import FAMILIES, FAMILY_SPECS, SAMPLE_TEXTS, stored_in_bfloat16, write_family_model
from tests.helpers import needs_cpu_bfloat16

TEXTS = [text if isinstance(text, str) else text[0] for text in SAMPLE_TEXTS.values()]
PAIRS = [None if isinstance(text, str) else text[1] for text in SAMPLE_TEXTS.values()]


def shapes(model: TextEncoder) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Batches of every kind a pass meets: padded, pairs, one row, one token short of the longest, the longest."""
    tokenizer = model.card.tokenizer
    longest = " ".join(["attention"] * (model.card.max_tokens * 2))  # cut to the longest the model takes
    batches = [
        tokenizer.encode(TEXTS),
        tokenizer.encode(TEXTS, PAIRS),
        tokenizer.encode(TEXTS[:1]),
        tokenizer.encode([longest, TEXTS[0]]),
    ]
    return [model.to_tensors(tokenizer.pad(encodings)) for encodings in batches]


def load_uncompilable(
    directory: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, **options: str
) -> TextEncoder:
    """The model at ``directory`` loaded (as "tiny") where OpenVINO refuses to convert it, the log captured."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Cannot convert operation aten::made_up")

    monkeypatch.setattr(OpenVINOPass, "__init__", refuse)
    with caplog.at_level(logging.INFO, logger="model.runtime.loader"):
        return load_model(directory, device="cpu", name="tiny", **options)  # type: ignore[arg-type]


def padded_pass(model: TextEncoder) -> OpenVINOPass:
    """The model's padded OpenVINO pass (bfloat16, int8): its first backend, alone or for one text (``OneText``)."""
    first = model.backends[0]
    ov_pass = first.inner if isinstance(first, OneText) else first
    assert isinstance(ov_pass, OpenVINOPass) and ov_pass.padded, model.runtime
    return ov_pass


def real_tokens(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return hidden.float()[mask.bool()]  # (N, D): padding is don't-care


@pytest.mark.parametrize("family", FAMILIES)
def test_the_compiled_pass_equals_the_torch_pass_in_float32(tmp_path: Path, family: str) -> None:
    """Every family, its own kind of checkpoint (a reranker's causal LM included), within 1e-5."""
    directory = write_family_model(tmp_path, family, head=FAMILY_SPECS[family].heads[0])
    compiled = load_model(directory, device="cpu", dtype="float32", runtime="openvino")
    assert compiled.runtime == "openvino" and isinstance(compiled.backends[0], OpenVINOPass)
    reference = load_model(directory, device="cpu", dtype="float32", runtime="torch", traced=False)
    for input_ids, mask, types in shapes(reference):
        with torch.inference_mode():
            ours = compiled.backends[0](input_ids, mask, types)
            theirs = reference.last_hidden_state(input_ids, mask, types)
        assert ours is not None, "the compiled pass takes the batch"
        torch.testing.assert_close(real_tokens(ours, mask), real_tokens(theirs, mask), atol=1e-5, rtol=1e-5)


def test_every_task_of_the_bundled_model_equals_the_torch_pass(bundled_model: TextEncoder) -> None:
    """What the services call (embeddings of every layer and pooling, tokens) through the compiled pass."""
    compiled = load_model(device="cpu", dtype="float32", runtime="openvino")
    assert compiled.runtime == "openvino"
    texts = ["The quick brown fox jumps over the lazy dog.", "Hi", "Attention is all you need, they said."]
    torch.testing.assert_close(compiled.embed(texts), bundled_model.embed(texts), atol=1e-5, rtol=0)
    torch.testing.assert_close(
        compiled.embed(texts, pooling="cls", normalize_embeddings=False),
        bundled_model.embed(texts, pooling="cls", normalize_embeddings=False),
        atol=1e-5,
        rtol=0,
    )


@needs_cpu_bfloat16
def test_bfloat16_stays_within_the_measured_bounds(bundled_model: TextEncoder) -> None:
    """OpenVINO's bfloat16 pass on the bundled model against float32 torch: on an Intel Xeon with AMX the sentence
    embeddings of 64 generated sentences kept cosine ≥ 0.9999 (docs/benchmarks/cpu-runtimes.md, "Runtimes and
    precisions (CPU)"); held to 0.9995."""
    from bench.run import make_sentences

    compiled = load_model(device="cpu", dtype="bfloat16", runtime="openvino")
    assert compiled.runtime.startswith("openvino") and compiled.dtype == torch.bfloat16  # one pass, or two
    texts = make_sentences(64, seed=7)
    ours, theirs = compiled.embed(texts).double(), bundled_model.embed(texts).double()
    alone = torch.cat([compiled.embed([text]) for text in texts[:8]]).double()  # the padded pass, where two
    assert torch.nn.functional.cosine_similarity(alone, theirs[:8], dim=-1).min() >= 0.9995
    cosine = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)
    assert cosine.min() >= 0.9995, cosine.min()
    assert not torch.equal(ours, theirs), "bfloat16 products, not float32's"


def test_the_packed_pass_of_batches_computes_on_a_stream_a_lane(bundled_model: TextEncoder) -> None:
    """Where the pass of one text and the packed pass of batches are two (bfloat16 or int8 on a CPU without AMX, the
    CPU's kind given as data), the packed one has a stream for each lane the threads allow, one thread each, and says
    so (``passes_at_once``); two threads calling it at once get what one stream gives, within int8's rounding. With
    one lane, or on a CPU with AMX, one stream and no bound."""
    from model.runtime.loader import CpuKind, openvino_passes

    texts = ["The quick brown fox jumps over the lazy dog.", "Hi", "Attention is all you need, they said."] * 4
    batch = bundled_model.to_tensors(bundled_model.card.tokenizer.pad(bundled_model.card.tokenizer.encode(texts)))
    without_amx = CpuKind(amx=False, avx512=True)
    one_stream = load_model(device="cpu", dtype="float32", runtime="torch")
    _, alone = openvino_passes(one_stream, 2, torch.float32, "int8", cpu=without_amx, lanes=1)
    assert one_stream.passes_at_once is None and unwrapped(alone).streams == 1  # type: ignore[attr-defined]
    model = load_model(device="cpu", dtype="float32", runtime="torch")
    one_text, packed = openvino_passes(model, 2, torch.float32, "int8", cpu=without_amx, lanes=3)
    assert isinstance(one_text, OneText) and one_text.inner.streams == 1  # type: ignore[attr-defined]
    assert model.passes_at_once == 2 and unwrapped(packed).streams == 2  # type: ignore[attr-defined]
    halves = [tuple(t[i::2] for t in batch) for i in range(2)]
    with torch.inference_mode(), ThreadPoolExecutor(2) as pool:
        side_by_side = list(pool.map(lambda part: packed(*part), halves))
        for part, ours in zip(halves, side_by_side, strict=True):
            theirs = alone(*part)
            assert ours is not None and theirs is not None
            torch.testing.assert_close(real_tokens(ours, part[1]), real_tokens(theirs, part[1]), atol=1e-4, rtol=0)
    with_amx = load_model(device="cpu", dtype="float32", runtime="torch")
    assert len(openvino_passes(with_amx, 2, torch.float32, "int8", cpu=CpuKind(amx=True, avx512=True), lanes=3)) == 1
    assert with_amx.passes_at_once is None


def test_int8_stays_within_the_measured_bounds(bundled_model: TextEncoder) -> None:
    """int8 weights on the bundled model against float32 torch: over 1,100 generated sentences the least cosine
    measured 0.9980 (float32 around the weights) and 0.9988 (bfloat16), the mean 0.9992 and 0.9995
    (docs/benchmarks/cpu-runtimes.md, "int8 on the CPU"); held to 0.995 and 0.999 here on 200."""
    from bench.run import make_sentences

    compiled = load_model(device="cpu", dtype="int8", runtime="auto")
    assert compiled.runtime.startswith("openvino") and compiled.precision == "int8"
    assert compiled.dtype == torch.float32  # torch's side: the explicit paths, and any pass OpenVINO does not take
    texts = make_sentences(200, seed=7)
    ours, theirs = compiled.embed(texts).double(), bundled_model.embed(texts).double()
    cosine = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)
    assert cosine.min() >= 0.995 and cosine.mean() >= 0.999, (cosine.min(), cosine.mean())
    assert (ours - theirs).abs().max() > 1e-3, "int8 weights, not float32's"


@pytest.mark.parametrize("kind", ["AVX-512 without AMX", "no AVX-512 or AMX"])
def test_int8_stays_within_the_measured_bounds_in_each_cpu_kinds_scheme(bundled_model: TextEncoder, kind: str) -> None:
    """Each scheme the rule gives (``int8_scheme``, the CPU's kind as data), computed on this CPU: on AVX-512 without
    AMX the contraction kept in the precision around and the activations in groups of 64 measured least cosine
    0.9982, mean 0.9992, top-10 0.957 over 1,100 sentences (docs/benchmarks/cpu-runtimes.md, "int8: the contraction
    kept, groups of 64, on AVX-512 without AMX (CPU)"); held, as the other, to 0.995 and 0.999 on 200 here."""
    from bench.run import make_sentences
    from model.runtime.loader import CpuKind, cpu_bfloat16, openvino_passes

    cpu = CpuKind(amx=False, avx512=kind == "AVX-512 without AMX")
    model = load_model(device="cpu", dtype="float32", runtime="torch")
    around = torch.bfloat16 if cpu_bfloat16() else torch.float32
    model.backends = (*openvino_passes(model, 2, around, "int8", cpu=cpu), *model.backends)
    texts = make_sentences(200, seed=7)
    ours, theirs = model.embed(texts).double(), bundled_model.embed(texts).double()
    cosine = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)
    assert cosine.min() >= 0.995 and cosine.mean() >= 0.999, (cosine.min(), cosine.mean())
    assert (ours - theirs).abs().max() > 1e-3, "int8 weights, not float32's"


@pytest.mark.parametrize(
    ("cpu", "scheme"), [(loader.CpuKind(False, True), CONTRACTION_KEPT), (loader.CpuKind(True, True), WEIGHTS_ALONE)]
)
def test_the_int8_scheme_on_each_cpu_kind(cpu: loader.CpuKind, scheme: Int8Scheme) -> None:
    """On AVX-512 without AMX, where it was measured the faster, the feed-forward's contraction is kept out of int8 and
    the activations go in groups of 64; on AMX and on AVX2 alone, every layer in int8, OpenVINO's groups of 32."""
    assert loader.int8_scheme(cpu) == scheme
    assert loader.int8_scheme(loader.CpuKind(False, False)) == WEIGHTS_ALONE
    assert Int8Scheme((".contract/",), 64, "the feed-forward's contraction") == CONTRACTION_KEPT
    assert Int8Scheme((), 32) == WEIGHTS_ALONE
    assert str(CONTRACTION_KEPT) == (
        "the linear layers' weights in int8 but the feed-forward's contraction, the activations meeting them in groups "
        "of 64"
    )
    assert str(WEIGHTS_ALONE) == "the linear layers' weights in int8, the activations meeting them in groups of 32"


def test_int8_keeps_what_its_scheme_keeps_and_quantizes_the_activations_in_its_groups(
    bundled_model: TextEncoder,
) -> None:
    """Under ``CONTRACTION_KEPT`` every linear layer's weights are stored as uint8 (NNCF's asymmetric int8) but the
    feed-forward's contraction's, which stay float32's; under ``WEIGHTS_ALONE`` every one. The compiled pass quantizes
    the activations in the scheme's groups."""

    def stored(kept: tuple[str, ...]) -> dict[str, str]:  # each linear layer of the first block → its weights' type
        converted = int8_weights(convert(bundled_model.encoder, loader.example_batch(bundled_model)), kept)
        types = {}
        for op in converted.get_ordered_ops():
            if op.get_type_name() == "MatMul" and ".layers.0." in op.get_friendly_name():
                node = op.input_value(1).get_node()
                while node.get_type_name() != "Constant":  # through the decompression: Convert, Subtract, Multiply
                    node = node.input_value(0).get_node()
                types[op.get_friendly_name().split(".")[-1].split("/")[0]] = node.get_element_type().get_type_name()
        return types

    assert stored(CONTRACTION_KEPT.kept) == {"qkv": "u8", "out": "u8", "expand": "u8", "contract": "f32"}
    assert stored(WEIGHTS_ALONE.kept) == {"qkv": "u8", "out": "u8", "expand": "u8", "contract": "u8"}
    for scheme in (CONTRACTION_KEPT, WEIGHTS_ALONE):
        compiled = unwrapped(
            loader.compile_openvino(bundled_model, 1, torch.float32, "int8", padded=False, int8=scheme)
        )
        assert isinstance(compiled, OpenVINOPass)
        assert int(compiled.compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")) == scheme.group


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_serves_every_family_near_float32(tmp_path: Path, family: str) -> None:
    """Random weights say nothing about accuracy (tiny random layers quantize worse than trained ones); this holds
    that every family compiles with int8 weights and stays near its float32 pass: real tokens' hidden states at
    cosine ≥ 0.99 on average, ≥ 0.8 each (the least measured: 0.88, MPNet's; a broken pass lands near 0)."""
    directory = write_family_model(tmp_path, family, head=FAMILY_SPECS[family].heads[0])
    compiled = load_model(directory, device="cpu", dtype="int8", runtime="openvino")
    assert compiled.runtime.startswith("openvino") and compiled.precision == "int8"
    reference = load_model(directory, device="cpu", dtype="float32", runtime="torch", traced=False)
    input_ids, mask, types = shapes(reference)[0]
    with torch.inference_mode():
        ours = compiled.last_hidden_state(input_ids, mask, types)
        theirs = reference.last_hidden_state(input_ids, mask, types)
    cosine = torch.nn.functional.cosine_similarity(real_tokens(ours, mask), real_tokens(theirs, mask), dim=-1)
    assert cosine.mean() >= 0.99 and cosine.min() >= 0.8, (cosine.mean(), cosine.min())


def test_int8_with_the_torch_runtime_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="ENCODER_DTYPE=int8 runs on OpenVINO's pass, and ENCODER_RUNTIME=torch"):
        load_model(tiny_model_dir, device="cpu", dtype="int8", runtime="torch")


def test_int8_on_a_gpu_is_refused() -> None:
    with pytest.raises(ValueError, match="int8 is a CPU precision here .* on a GPU use float16 or bfloat16"):
        loader.resolve_precision("int8", torch.device("cuda"))


def test_int8_without_nncf_is_refused_at_start(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("model.runtime.openvino_pass.quantizer_available", lambda: False)
    with pytest.raises(ValueError, match=r"ENCODER_DTYPE=int8 needs NNCF .* install the int8 extra"):
        load_model(tiny_model_dir, device="cpu", dtype="int8", runtime="auto")


def test_int8_a_model_openvino_cannot_compile_keeps_float32_torch_and_says_why(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_uncompilable(tiny_model_dir, caplog, monkeypatch, dtype="int8", runtime="auto")
    assert (model.runtime, model.precision) == ("torch (traced)", "float32")
    assert "tiny: OpenVINO could not compile it: RuntimeError: Cannot convert operation aten::made_up" in caplog.text
    assert "so float32 on torch" in caplog.text


def test_torch_asked_for_keeps_the_traced_pass(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="torch")
    assert model.runtime == "torch (traced)" and [type(unwrapped(b)) for b in model.backends] == [TracedPass]


AMX, AVX512, AVX2 = loader.CpuKind(amx=True, avx512=True), loader.CpuKind(False, True), loader.CpuKind(False, False)


@pytest.mark.parametrize(
    ("cpu", "dtype", "decoder", "runtime"),
    [
        (AMX, torch.float32, False, "torch"),  # an Intel Xeon with AMX: oneDNN's products level with OpenVINO's
        (AMX, torch.bfloat16, False, "openvino for one text"),
        (AVX512, torch.float32, False, "openvino"),  # an AMD EPYC with AVX-512 and AVX512-BF16
        (AVX512, torch.bfloat16, False, "openvino"),
        (AVX2, torch.float32, False, "torch"),  # an AMD EPYC with AVX2 alone
        (AMX, torch.float32, True, "torch"),  # a decoder, anywhere
        (AMX, torch.bfloat16, True, "torch"),
        (AVX512, torch.bfloat16, True, "torch"),
        (AVX2, torch.float32, True, "torch"),
    ],
)
def test_the_runtime_rule_on_each_cpu_kind(
    cpu: loader.CpuKind, dtype: torch.dtype, decoder: bool, runtime: str
) -> None:
    minilm = loader.layer_weights(EncoderConfig())  # all-MiniLM-L6-v2's shape: 6 layers, 384 wide
    assert loader.runtime_rule(cpu, dtype, decoder, minilm)[0] == runtime


@pytest.mark.parametrize(
    ("layers", "width", "weights"),
    [(6, 384, 10_616_832), (3, 256, 2_359_296), (1, 32, 12_288)],  # 6 × (4 × 384² + 2 × 384 × 1536), ...
)
def test_an_encoder_below_a_million_layer_weights_runs_on_torch_on_every_cpu(
    layers: int, width: int, weights: int
) -> None:
    config = EncoderConfig(n_layers=layers, d_model=width, n_heads=4, d_ff=4 * width)
    assert loader.layer_weights(config) == weights
    small = weights < 1_000_000
    for cpu in (AMX, AVX512, AVX2):
        chosen, why = loader.runtime_rule(cpu, torch.float32, False, weights)
        assert (chosen == "torch") if small else (chosen == ("openvino" if cpu == AVX512 else "torch")), (cpu, chosen)
        assert ("a small encoder" in why) == small


@pytest.mark.parametrize(
    ("capability", "amx", "expected"),
    [("AVX512", True, AMX), ("AVX512", False, AVX512), ("AVX2", False, AVX2), ("DEFAULT", False, AVX2)],
)
def test_the_cpu_kind_is_read_from_torch(
    monkeypatch: pytest.MonkeyPatch, capability: str, amx: bool, expected: loader.CpuKind
) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert loader.CpuKind.here() == expected


@pytest.mark.parametrize(("cpu", "runtime"), [(AMX, "torch (traced)"), (AVX512, "openvino"), (AVX2, "torch (traced)")])
def test_auto_serves_what_the_rule_says_and_why(
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    cpu: loader.CpuKind,
    runtime: str,
) -> None:
    """No timing: the same CPU kind, model and settings give the same runtime at every load, and the log says by
    which part of the rule (the tiny model counted as large here: the rule's size term is tested below)."""
    monkeypatch.setattr(loader.CpuKind, "here", classmethod(lambda cls: cpu))
    monkeypatch.setattr(loader, "SMALL_ENCODER_WEIGHTS", 0)
    with caplog.at_level(logging.INFO, logger="model.runtime.loader"):
        model = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="auto")
    assert model.runtime == runtime
    line = next(record.getMessage() for record in caplog.records if record.getMessage().startswith("loaded"))
    assert f"the embedding pass runs on {runtime} (ENCODER_RUNTIME=auto: an encoder " in line, line
    assert str(cpu) in line and " ms" not in line  # the CPU kind that decided, and no timing


def test_auto_serves_a_small_encoder_on_torch_and_says_why(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(loader.CpuKind, "here", classmethod(lambda cls: AVX512))  # a larger encoder: OpenVINO
    with caplog.at_level(logging.INFO, logger="model.runtime.loader"):
        model = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="auto")
    assert model.runtime == "torch (traced)"
    line = next(record.getMessage() for record in caplog.records if record.getMessage().startswith("loaded"))
    assert "ENCODER_RUNTIME=auto: a small encoder (" in line and "million weights in its layers, under 1)" in line


def test_the_rule_sends_a_decoder_to_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader.CpuKind, "here", classmethod(lambda cls: AVX512))  # an encoder would get OpenVINO
    monkeypatch.setattr(loader, "SMALL_ENCODER_WEIGHTS", 0)  # however small
    write_family_model(tmp_path, "qwen3")
    model = load_model(tmp_path, device="cpu", dtype="float32", runtime="auto")
    assert model.runtime == "torch (traced)"


@pytest.mark.parametrize("cpu", [AVX512, AVX2])
def test_one_load_after_another_serves_the_same_runtime_and_bits(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, cpu: loader.CpuKind
) -> None:
    """Loaded twice with the same settings, on OpenVINO (as on AVX-512) and on torch: the same runtime, and
    embeddings equal to the bit (the timing race this replaced could serve torch at one start and OpenVINO at the
    next)."""
    monkeypatch.setattr(loader.CpuKind, "here", classmethod(lambda cls: cpu))
    monkeypatch.setattr(loader, "SMALL_ENCODER_WEIGHTS", 0)
    first, second = (load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="auto") for _ in range(2))
    assert first.runtime == second.runtime
    for texts in (TEXTS[:1], TEXTS):
        assert first.embed(texts).numpy().tobytes() == second.embed(texts).numpy().tobytes()


def test_openvino_for_one_text_leaves_larger_batches_to_torch(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where OpenVINO took only single texts, a pass of one text is its (equal to torch's within 1e-5) and a pass
    of more is torch's traced pass."""
    monkeypatch.setattr(
        loader, "runtime_rule", lambda cpu, dtype, decoder, weights: (loader.OPENVINO_FOR_ONE_TEXT, "made up")
    )
    model = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="auto")
    reference = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="torch")
    first, aligned = model.backends
    torch_pass = unwrapped(aligned)
    assert isinstance(first, OneText) and isinstance(first.inner, OpenVINOPass) and isinstance(torch_pass, TracedPass)
    one, two = (
        reference.to_tensors(reference.card.tokenizer.pad(reference.card.tokenizer.encode(TEXTS[:n]))) for n in (1, 2)
    )
    with torch.inference_mode():
        assert first(*two) is None  # the next backend's
        ours = first(*one)
        assert ours is not None
        torch.testing.assert_close(ours, reference.last_hidden_state(*one), atol=1e-5, rtol=1e-5)
    texts = TEXTS[:3]
    torch.testing.assert_close(model.embed(texts[:1]), reference.embed(texts[:1]), atol=1e-5, rtol=0)
    torch.testing.assert_close(model.embed(texts), reference.embed(texts), atol=0, rtol=0)  # torch's own pass


def test_a_model_openvino_cannot_compile_keeps_the_torch_pass_and_says_why(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_uncompilable(tiny_model_dir, caplog, monkeypatch, dtype="float32", runtime="openvino")
    assert model.runtime == "torch (traced)"
    assert (
        "tiny: OpenVINO could not compile it: RuntimeError: Cannot convert operation aten::made_up; the torch "
        "pass serves it" in caplog.text
    )
    assert "the embedding pass runs on torch (traced) (OpenVINO could not compile it" in caplog.text
    reference = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="torch")
    np.testing.assert_array_equal(model.embed(["hello world"]).numpy(), reference.embed(["hello world"]).numpy())


def test_openvino_asked_for_but_missing_is_refused_at_start(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("model.runtime.openvino_pass.available", lambda: False)
    with pytest.raises(ValueError, match="ENCODER_RUNTIME=openvino, but the openvino package is not installed"):
        load_model(tiny_model_dir, device="cpu", runtime="openvino")
    monkeypatch.setattr(loader.CpuKind, "here", classmethod(lambda cls: AVX512))  # where the rule says OpenVINO
    monkeypatch.setattr(loader, "SMALL_ENCODER_WEIGHTS", 0)
    model = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="auto")
    assert model.runtime == "torch (traced)"


def test_an_unknown_runtime_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="runtime must be one of auto, torch, openvino, got 'onnx'"):
        load_model(tiny_model_dir, device="cpu", runtime="onnx")


def test_bfloat16_on_a_cpu_without_it_is_refused_at_start(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a slow fallback: a CPU with neither AVX512-BF16 nor AMX would emulate its products."""
    monkeypatch.setattr(loader, "cpu_bfloat16", lambda: False)
    with pytest.raises(ValueError, match="bfloat16 on this CPU: it has neither AVX512-BF16 nor AMX.*float32"):
        load_model(tiny_model_dir, device="cpu", dtype="bfloat16")
    assert load_model(tiny_model_dir, device="cpu", dtype="float32").dtype == torch.float32


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "expected"), [(True, False, True), (False, True, True), (False, False, False)]
)
def test_cpu_bfloat16_follows_the_cpu_flags(
    monkeypatch: pytest.MonkeyPatch, avx512_bf16: bool, amx: bool, expected: bool
) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert loader.cpu_bfloat16() is expected


@pytest.mark.parametrize(
    ("rows", "length", "longest", "shape"),
    [
        (1, 10, 512, (1, 16)),
        (2, 30, 512, (2, 32)),
        (3, 17, 512, (4, 24)),
        (33, 70, 512, (36, 72)),
        (100, 300, 512, (104, 320)),
        (1, 121, 124, (1, 124)),
        (1, 129, 130, (1, 130)),  # the length no further than the model's positions
    ],
)
def test_padded_batches_are_rounded_up_to_a_few_shapes(rows: int, length: int, longest: int, shape: tuple) -> None:
    assert batch_bucket(rows, length, longest) == shape


class RecordingModel:
    """A compiled model whose infer requests record the shapes they are given (into ``shapes``) and pass them on."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self.shapes: list[tuple[int, ...]] = []

    def create_infer_request(self) -> RecordingModel.Request:
        return RecordingModel.Request(self.compiled.create_infer_request(), self.shapes)

    class Request:
        def __init__(self, request: Any, shapes: list[tuple[int, ...]]) -> None:
            self.request, self.shapes = request, shapes

        def set_input_tensor(self, index: int, tensor: Any) -> None:
            if index == 0:
                self.shapes.append(tuple(tensor.shape))
            self.request.set_input_tensor(index, tensor)

        def __getattr__(self, name: str) -> Any:  # infer, get_output_tensor: the request's own
            return getattr(self.request, name)


@needs_cpu_bfloat16
@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_bfloat16_and_int8_run_padded_batches_of_bucketed_shapes(tiny_model_dir: Path, dtype: str) -> None:
    """Under bfloat16 and int8 the compiled pass computes the padding, masked, on shapes rounded up to buckets (a
    new shape costs OpenVINO more than the products there); the rows and positions added are dropped, and the
    embeddings stay as near float32's as the packed pass's."""
    compiled = load_model(tiny_model_dir, device="cpu", dtype=dtype, runtime="openvino")
    reference = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="torch")
    ov_pass = padded_pass(compiled)
    recording = ov_pass.compiled = RecordingModel(ov_pass.compiled)
    texts = ["the quick brown fox jumps", "hello world", "a lazy dog sat on the mats while the cats said hello"]
    ids, mask, types = compiled.to_tensors(compiled.card.tokenizer.pad(compiled.card.tokenizer.encode(texts)))
    assert ids.shape[1] not in (16, 24, 32)
    with ThreadPoolExecutor(1) as fresh:  # a thread that has no infer request yet: it makes one of the recording's
        hidden = fresh.submit(ov_pass, ids, mask, types).result()
    assert hidden is not None
    assert recording.shapes == [batch_bucket(3, ids.shape[1], compiled.encoder.embeddings.max_length)]
    assert hidden.shape == (3, ids.shape[1], compiled.card.config.d_model)
    ours, theirs = compiled.embed(texts).double(), reference.embed(texts).double()
    assert torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).min() >= 0.99


@pytest.mark.parametrize(
    ("lengths", "per_call", "groups"),
    [
        ([10, 60, 10, 60], 16, [[0, 2], [1, 3]]),  # 2 × 10 + 16 + 2 × 60 + 16 = 172 tokens against 4 × 60 + 16 = 256
        ([50, 10, 11, 12, 49, 48], 16, [[1, 2, 3], [5, 4, 0]]),  # 218 against 316 whole, 232 in three
        ([10, 60, 10, 60], 128, [[0, 2, 1, 3]]),  # 2 × 10 + 128 + 2 × 60 + 128 = 396 against 368 whole
        ([30, 31, 32], 16, [[0, 1, 2]]),  # nothing saved
        ([7], 16, [[0]]),
    ],
)
def test_a_padded_batch_is_cut_into_rows_of_like_length(
    lengths: list[int], per_call: int, groups: list[list[int]]
) -> None:
    assert length_groups(lengths, per_call) == groups


def test_int8_computes_rows_of_like_length_together(tiny_model_dir: Path) -> None:
    """Short texts and long ones in one batch: the padded pass runs them as two calls, each on its group's bucketed
    shape, and each row's numbers are those of its group computed alone (the same call); near float32's."""
    compiled = load_model(tiny_model_dir, device="cpu", dtype="int8", runtime="openvino")
    reference = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="torch")
    ov_pass = padded_pass(compiled)
    recording = ov_pass.compiled = RecordingModel(ov_pass.compiled)
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 8)
    texts = ["hello world", long, "a short one", long + " again", "hi", "the end of it"]
    ids, mask, types = compiled.to_tensors(compiled.card.tokenizer.pad(compiled.card.tokenizer.encode(texts)))
    lengths = mask.sum(1).tolist()
    assert min(lengths[1], lengths[3]) - max(lengths[0], lengths[2], lengths[4], lengths[5]) > 40
    longest = compiled.encoder.embeddings.max_length
    with ThreadPoolExecutor(1) as fresh:  # a thread with no infer request yet: it makes one of the recording's
        hidden = fresh.submit(ov_pass, ids, mask, types).result()
        assert hidden is not None
        short_rows, long_rows = [4, 0, 2, 5], [1, 3]  # by length
        assert recording.shapes == [
            batch_bucket(4, max(lengths[row] for row in short_rows), longest),
            batch_bucket(2, ids.shape[1], longest),
        ]
        for rows in (short_rows, long_rows):
            index, length = torch.tensor(rows), max(lengths[row] for row in rows)
            alone = fresh.submit(ov_pass, ids[index, :length], mask[index, :length], types[index, :length]).result()
            assert alone is not None and torch.equal(hidden[index, :length], alone)
    assert hidden.shape == (6, ids.shape[1], compiled.card.config.d_model)
    ours, theirs = compiled.embed(texts).double(), reference.embed(texts).double()
    assert torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).min() >= 0.99


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("cpu", [AVX512, AMX])
def test_without_amx_one_text_takes_the_padded_pass_and_more_the_packed_one(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, dtype: str, cpu: loader.CpuKind
) -> None:
    """Under bfloat16 and int8 on a CPU without AMX, two compiled passes: the padded one for one text, the packed
    one (its rows in buckets, its lengths aligned, as torch's bfloat16 pass) for more; with AMX the padded one
    alone. Both near float32, and near each other."""
    if dtype == "bfloat16" and not loader.cpu_bfloat16():
        pytest.skip("bfloat16 is refused on a CPU without AVX512-BF16 or AMX (tested above)")
    monkeypatch.setattr(loader.CpuKind, "here", classmethod(lambda cls: cpu))
    compiled = load_model(tiny_model_dir, device="cpu", dtype=dtype, runtime="openvino")
    reference = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="torch")
    calls: list[tuple[str, int]] = []
    infer = OpenVINOPass._infer

    def recorded(self: OpenVINOPass, *batch: torch.Tensor) -> torch.Tensor:
        calls.append((self.name, batch[0].size(0)))
        return infer(self, *batch)

    monkeypatch.setattr(OpenVINOPass, "_infer", recorded)
    texts = ["the quick brown fox jumps", "hello world", "a lazy dog sat on the mats while the cats said hello"]
    together = compiled.embed(texts).double()
    alone = torch.cat([compiled.embed([text]) for text in texts]).double()
    if cpu.amx:
        assert compiled.runtime == "openvino" and isinstance(compiled.backends[0], OpenVINOPass)
        assert [name for name, _ in calls] == ["openvino"] * 4
    else:
        assert compiled.runtime == "openvino for one text, openvino (packed) for more"
        packed = compiled.backends[1]
        assert isinstance(packed, AlignedLength) and isinstance(packed.inner, BucketedRows)
        assert isinstance(packed.inner.inner, OpenVINOPass) and not packed.inner.inner.padded
        assert calls == [("openvino (packed)", 4)] + [("openvino", 1)] * 3  # 3 texts and a filler row; one by one
    theirs = reference.embed(texts).double()
    for ours in (together, alone):
        assert torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).min() >= 0.99
    assert torch.nn.functional.cosine_similarity(together, alone, dim=-1).min() >= 0.999


def test_float32_keeps_the_packed_pass(tiny_model_dir: Path) -> None:
    compiled = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="openvino")
    ov_pass = compiled.backends[0]
    assert isinstance(ov_pass, OpenVINOPass) and not ov_pass.padded


@needs_cpu_bfloat16
@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_a_checkpoint_stored_in_bfloat16_is_served_in_bfloat16(tmp_path: Path, family: str) -> None:
    """A decoder stored in bfloat16 keeps its weights so under bfloat16, and OpenVINO's pass then answers in
    bfloat16 (numpy, which has no bfloat16, holds it as float16 of the same bits): read as bfloat16, its real
    tokens' hidden states are near torch's bfloat16 pass and its float32 one (least cosine measured 0.997 on these
    tiny random weights, torch's own bfloat16 pass against float32 0.999; held to 0.99). Read as float16, as they
    once were, the least cosine was 0.72-0.84."""
    directory = stored_in_bfloat16(write_family_model(tmp_path, family, seed=3))
    compiled = load_model(directory, device="cpu", dtype="bfloat16", runtime="openvino")
    assert compiled.runtime.startswith("openvino") and isinstance(unwrapped(padded_pass(compiled)), OpenVINOPass)
    assert {p.dtype for p in compiled.encoder.parameters()} == {torch.bfloat16}
    eager = load_model(directory, device="cpu", dtype="bfloat16", runtime="torch", traced=False)
    wide = load_model(directory, device="cpu", dtype="float32", runtime="torch", traced=False)
    for input_ids, mask, types in shapes(eager)[:3]:
        with torch.inference_mode():
            ours = compiled.last_hidden_state(input_ids, mask, types)  # the packed pass, and one text the padded
            assert ours.dtype == torch.bfloat16
            for reference in (eager, wide):
                theirs = reference.last_hidden_state(input_ids, mask, types)
                cosine = torch.nn.functional.cosine_similarity(
                    real_tokens(ours, mask), real_tokens(theirs, mask), dim=-1
                )
                assert cosine.min() >= 0.99, (reference.dtype, cosine.min())


class Recording:
    """A compiled model that counts its release_memory calls (and refuses them, ``busy``, as OpenVINO does while a
    pass runs), everything else its own."""

    def __init__(self, compiled: Any, busy: bool = False) -> None:
        self.compiled, self.busy, self.released = compiled, busy, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled, name)

    def release_memory(self) -> None:
        if self.busy:
            raise RuntimeError("Attempt to call release_memory() on a compiled model in a busy state.")
        self.released += 1
        self.compiled.release_memory()


@pytest.mark.parametrize("rule", ["openvino", "openvino for one text"])
def test_the_compiled_pass_hands_back_its_buffers_and_computes_the_same_after(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, rule: str
) -> None:
    """TextEncoder.release_memory reaches OpenVINO's compiled pass, also behind OneText; the next pass prepares its
    shape again and gives the same numbers; OpenVINO's refusal while a pass runs is no failure."""
    monkeypatch.setattr(loader, "runtime_rule", lambda cpu, dtype, decoder, weights: (rule, "made up"))
    model = load_model(tiny_model_dir, device="cpu", dtype="float32", runtime="auto")
    first = unwrapped(model.backends[0])
    compiled = first.inner if isinstance(first, OneText) else first
    assert isinstance(compiled, OpenVINOPass)
    before = model.embed(TEXTS[:1]).numpy()
    original = compiled.compiled
    compiled.compiled = recording = Recording(original)
    model.release_memory()
    assert recording.released == 1
    np.testing.assert_array_equal(model.embed(TEXTS[:1]).numpy(), before)
    compiled.compiled = busy = Recording(original, busy=True)
    model.release_memory()  # refused while busy: nothing raised
    assert busy.released == 0
