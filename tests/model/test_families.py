"""Every family on tiny random checkpoints, against transformers' eager models and sentence-transformers."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from model import TextEncoder, load_model, tasks
from model.nn.encoder import Keep, Packing
from model.spec.config import DECODERS as DECODER_TYPES
from model.spec.tokenizer import Batch
from tests.families import FAMILIES, FAMILY_SPECS, SAMPLE_TEXTS, hf_model, stored_in_bfloat16, write_family_model
from tests.helpers import needs_cpu_bfloat16

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
    "deberta-v2": "disentangled",
    **dict.fromkeys(DECODER_TYPES, "rotary"),
}


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    family, head = request.param
    return write_family_model(tmp_path_factory.mktemp(f"{family}-{head}"), family, head=head)


def batch_of(model: TextEncoder) -> Batch:
    batch = model.card.tokenizer.pad(model.card.tokenizer.encode(TEXTS, PAIRS))
    assert batch.attention_mask.min() == 0, "the batch must hold padding for the comparison to mean anything"
    return batch


def left_padded(batch: Batch) -> Batch:
    """The same rows padded on the left, as sentence-transformers and most decoder code pad."""
    arrays = []
    for array in (batch.input_ids, batch.attention_mask, batch.token_type_ids):
        shifted = np.zeros_like(array)
        for row, n in enumerate(batch.attention_mask.sum(axis=1)):
            shifted[row, array.shape[1] - n :] = array[row, :n]
            shifted[row, : array.shape[1] - n] = array[row, n:]  # the padding ids, moved
        arrays.append(shifted)
    return Batch(*arrays)


def reference(directory: Path, model: TextEncoder, batch: Batch, **outputs: bool):
    inputs = {
        "input_ids": torch.from_numpy(batch.input_ids),
        "attention_mask": torch.from_numpy(batch.attention_mask),
    }
    if model.card.config.type_vocab_size > 1:
        inputs["token_type_ids"] = torch.from_numpy(batch.token_type_ids)
    with torch.inference_mode():
        return hf_model(directory)(**inputs, **outputs)


CASES = [(family, head) for family in FAMILIES for head in FAMILY_SPECS[family].heads]

# (device, dtype, absolute and relative tolerance on the explicit path's hidden states and attention, least
# cosine of the sentence embeddings), each against the references in float32 on the CPU. Where a GPU is present
# every family runs there too. The explicit path is float32 under either dtype; a GPU's float32 products land
# up to 4e-5 off on these random models' values (up to ~10), hence 1e-4 there. Under float16 the embedding
# pass runs in float16 (cosine as in tests/model/test_parity.py).
TARGETS = [("cpu", "float32", 1e-5, 1e-5, 0.99999)]
if torch.cuda.is_available():
    TARGETS += [
        ("cuda", "float32", 1e-4, 1e-4, 0.99999),
        ("cuda", "float16", 1e-4, 1e-4, 0.9999),
        ("cuda", "bfloat16", 1e-4, 1e-4, 0.999),
    ]
TARGET_IDS = [f"{device}-{dtype}" for device, dtype, *_ in TARGETS]


@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("family_dir", CASES, ids=[f"{f}-{h or 'bare'}" for f, h in CASES], indirect=True)
def test_hidden_states_and_attentions_equal_transformers(family_dir: Path, target: tuple) -> None:
    device, dtype, atol, rtol, _ = target
    model = load_model(family_dir, device=device, dtype=dtype)
    batch = batch_of(model)
    ours = model.forward(batch, Keep(hidden_states=True, attentions=True))
    assert ours.hidden_states is not None and ours.attentions is not None
    lengths = batch.attention_mask.sum(axis=1)
    real = torch.from_numpy(batch.attention_mask).bool()  # padded rows are don't-care

    def close(mine: torch.Tensor, reference_tensor: torch.Tensor, rtol: float = rtol) -> None:
        torch.testing.assert_close(mine.float().cpu(), reference_tensor, atol=atol, rtol=rtol)

    # The decoders against transformers padded on either side: their positions act only through i − j, so the
    # results are the same. On the right, ours equal transformers' to the bit in float32 on the CPU; on the left,
    # transformers rotates each row by positions shifted by its padding and so rounds a few values otherwise
    # (its left-padded states differ from its right-padded ones by up to ~2e-5 where the layers' outputs reach
    # ~45), hence a relative 1e-4 there.
    sides = ["right", "left"] if model.card.config.family in DECODER_TYPES else ["right"]
    for side in sides:
        side_rtol = rtol if side == "right" else max(rtol, 1e-4)
        padded = batch if side == "right" else left_padded(batch)
        theirs = reference(family_dir, model, padded, output_hidden_states=True, output_attentions=True)
        theirs_real = torch.from_numpy(padded.attention_mask).bool()
        close(ours.last_hidden_state[real], theirs.last_hidden_state[theirs_real], side_rtol)
        assert len(ours.hidden_states) == len(theirs.hidden_states) == model.card.config.n_layers + 1
        for mine, reference_state in zip(ours.hidden_states, theirs.hidden_states, strict=True):
            close(mine[real], reference_state[theirs_real], side_rtol)
        for mine, reference_attention in zip(ours.attentions, theirs.attentions, strict=True):
            for row, n in enumerate(lengths):
                start = 0 if side == "right" else batch.input_ids.shape[1] - n
                window = slice(start, start + n)
                close(mine[row, :, :n, :n], reference_attention[row, :, window, window], side_rtol)
    # the fast path (padding skipped, one fused q/k/v product, the fused attention kernel) gives the same, to
    # float32's rounding: summed in other orders, an element of the last hidden state lands up to ~2e-5 off
    fast = model.forward(batch, Keep(hidden_states=True))
    theirs = reference(family_dir, model, batch)
    last = theirs.last_hidden_state[real]
    torch.testing.assert_close(fast.last_hidden_state[real].float().cpu(), last, atol=max(atol, 3e-5), rtol=1e-4)


BARE = [(family, None) for family in FAMILIES if None in FAMILY_SPECS[family].heads]


@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("family_dir", BARE, ids=[family for family, _ in BARE], indirect=True)
def test_the_packed_attention_core_equals_transformers(family_dir: Path, target: tuple) -> None:
    """With ``Encoder.varlen`` the pass runs attention on the packed tokens themselves (flash attention's
    variable-length kernel on a GPU in float16 or bfloat16 where the head width allows, each row in turn
    elsewhere): every real token's last hidden state as transformers computes it in float32 (as the padded core
    in the lower dtypes), rotary positions, per-head norms, grouped-query and causal attention included; the
    families with a position bias, relative embeddings or windows keep the padded core in those layers."""
    device, dtype, atol, *_ = target
    model = load_model(family_dir, device=device, dtype=dtype, traced=False, cuda_graphs=False)
    model.passes.varlen = True
    batch = batch_of(model)
    real = torch.from_numpy(batch.attention_mask).bool()
    with torch.inference_mode():
        ours = model.last_hidden_state(*model.to_tensors(batch)).float().cpu()[real]  # (N, D)
    if model.dtype == torch.float32:
        theirs = reference(family_dir, model, batch).last_hidden_state[real]  # (N, D)
        torch.testing.assert_close(ours, theirs, atol=max(atol, 3e-5), rtol=1e-4)
    else:
        # In float16 and bfloat16, against the padded core in the same dtype, token by token: the two kernels
        # accumulate in float32 and round once, and on an H100 every family's tokens came out equal to the bit.
        model.passes.varlen = False
        with torch.inference_mode():
            padded = model.last_hidden_state(*model.to_tensors(batch)).float().cpu()[real]  # (N, D)
        cosine = torch.nn.functional.cosine_similarity(ours.double(), padded.double(), dim=-1)
        assert cosine.min() >= {"float16": 0.9999, "bfloat16": 0.999}[dtype], cosine.min()


def unpadded(batch: Batch) -> Batch:
    """Every row cut to the shortest row's tokens: a batch without padding."""
    shortest = int(batch.attention_mask.sum(axis=1).min())
    return Batch(
        *(array[:, :shortest].copy() for array in (batch.input_ids, batch.attention_mask, batch.token_type_ids))
    )


@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("family_dir", BARE, ids=[family for family, _ in BARE], indirect=True)
def test_a_batch_without_padding_takes_one_attention_call_equal_to_transformers(
    family_dir: Path, target: tuple
) -> None:
    """Rows of one length through the packed pass take the attention core as one (B, H, T, Dh) batch without a mask
    (``Sequences.uniform``; grouped-query families keep the variable-length kernel): every token as transformers
    computes it in float32. In float16 and bfloat16 another kernel rounds otherwise (cuDNN's on an H100), so there
    each token is held against transformers' float32 values: no further from them than three times the padded
    core's furthest token (1 − cosine; measured on an H100: ModernBERT in bfloat16 0.0144 against the padded
    core's 0.0066, in float16 the padded core 0.00064, Mistral's 0.00018)."""
    device, dtype, atol, *_ = target
    model = load_model(family_dir, device=device, dtype=dtype, traced=False, cuda_graphs=False)
    model.passes.varlen = True
    batch = unpadded(batch_of(model))
    input_ids, attention_mask, token_type_ids = model.to_tensors(batch)
    sequences = Packing.from_mask(attention_mask, varlen=True).sequences
    assert sequences is not None and sequences.uniform
    with torch.inference_mode():
        ours = model.last_hidden_state(input_ids, attention_mask, token_type_ids).float().cpu()  # (B, T, D)
    theirs = reference(family_dir, model, batch).last_hidden_state  # float32
    if model.dtype == torch.float32:
        torch.testing.assert_close(ours, theirs, atol=max(atol, 3e-5), rtol=1e-4)
    else:
        model.passes.varlen = False
        with torch.inference_mode():
            padded = model.last_hidden_state(input_ids, attention_mask, token_type_ids).float().cpu()

        def furthest(states: torch.Tensor) -> float:  # 1 − the least cosine of a token against float32
            return float(1 - torch.nn.functional.cosine_similarity(states.double(), theirs.double(), dim=-1).min())

        assert furthest(padded) < {"float16": 2e-3, "bfloat16": 2e-2}[dtype], furthest(padded)
        assert furthest(ours) <= 3 * furthest(padded), (furthest(ours), furthest(padded))


@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("family_dir", BARE, ids=[family for family, _ in BARE], indirect=True)
def test_sentence_embeddings_equal_sentence_transformers(family_dir: Path, target: tuple) -> None:
    """With the directory's modules (Pooling of each kind, Dense, Normalize) and prompts: none, each named one and a
    literal one, as encode(prompt_name=..., prompt=...) takes them."""
    from sentence_transformers import SentenceTransformer

    device, dtype, _, _, min_cosine = target
    model = load_model(family_dir, device=device, dtype=dtype)
    reference_model = SentenceTransformer(str(family_dir), device="cpu")
    # (prompt_name, prompt): none, each named one the model has, a literal one
    prompts = [
        (None, None),
        *((name, None) for name in model.card.prompts if model.card.prompts[name]),
        (None, "Search: "),
    ]
    for prompt_name, prompt in prompts:
        ours = model.embed(TEXTS, prompt_name=prompt_name, prompt=prompt).numpy()
        theirs = reference_model.encode(TEXTS, normalize_embeddings=True, prompt_name=prompt_name, prompt=prompt)
        assert isinstance(theirs, np.ndarray) and ours.shape == theirs.shape
        cosine = (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
        assert cosine.min() >= min_cosine, (prompt_name, prompt, cosine)
        if dtype == "float32":  # and element by element: a cosine of 0.99999 lets one be off by about 4e-3
            np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0, err_msg=f"{prompt_name=}, {prompt=}")
    assert model.card.config.position_embedding == POSITION_ENCODINGS[model.card.config.family]


def test_dense_modules_change_the_width_as_sentence_transformers_does(tmp_path: Path) -> None:
    directory = write_family_model(tmp_path / "gemma", "embeddinggemma", seed=1)
    model = load_model(directory, device="cpu", dtype="float32")
    assert [module.linear.out_features for module in model.dense] == [32, 16] and model.card.dimension == 16
    assert [spec.out_features for spec in model.card.pooling.dense] == [32, 16]
    # the Dense modules matter: pooling alone gives another direction
    pooled = model.forward(model.card.tokenizer.pad(model.card.tokenizer.encode(TEXTS[:1]))).last_hidden_state.mean(1)[
        0
    ]
    assert torch.nn.functional.cosine_similarity(pooled, model.embed(TEXTS[:1])[0], dim=0) < 0.99


WINDOWED = ["modernbert", "qwen2", "mistral", "gemma3_text", "embeddinggemma"]


@pytest.mark.parametrize("family_dir", [(f, None) for f in WINDOWED], ids=WINDOWED, indirect=True)
def test_local_layers_put_no_weight_outside_their_window(family_dir: Path) -> None:
    """Sliding windows as transformers builds them: within W // 2 each side bidirectionally (a bidirectional
    Gemma's abs(i − j) < W // 2 + 1), the W − 1 keys before the query causally; causal layers put nothing above
    the diagonal (the seeds' triangular mask), bidirectional ones do."""
    model = load_model(family_dir, device="cpu", dtype="float32")
    config = model.card.config
    encoding = model.card.tokenizer.encode([SAMPLE_TEXTS["long"]])[0]  # type: ignore[list-item]
    T = len(encoding.ids)
    assert config.window_reach + 2 < T, "the text must reach past the window"
    attentions = model.forward(model.card.tokenizer.pad([encoding]), Keep(attentions=True)).attentions
    assert attentions is not None
    distance = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs()  # (T, T)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    outside = distance > config.window_reach
    local = [i for i in range(config.n_layers) if config.is_local(i)]
    assert local, "the tiny model must have local layers"
    for i, attention in enumerate(attentions):
        weights = attention[0]  # (H, T, T)
        if config.causal:
            assert weights[:, future].abs().max().item() == 0.0
        else:
            assert weights[:, future].max().item() > 0.0
        if i in local:
            assert weights[:, outside].abs().max().item() == 0.0
        else:  # a global layer reaches past the window
            assert weights[:, outside & ~future].max().item() > 0.0


CLASSIFIERS: list[tuple[str, dict[str, object]]] = [
    ("bert", {}),
    *((family, {}) for family in FAMILIES if "sequence-classification" in FAMILY_SPECS[family].heads),
    ("modernbert", {"classifier_pooling": "mean", "classifier_bias": True}),  # its other pooling, a dense bias
    ("roberta", {"problem_type": "multi_label_classification"}),  # a sigmoid per label
]


@pytest.mark.parametrize(
    ("family", "overrides"), CLASSIFIERS, ids=[f"{f}-{'-'.join(o) or 'default'}" for f, o in CLASSIFIERS]
)
def test_classification_heads_equal_transformers(tmp_path: Path, family: str, overrides: dict) -> None:
    """The decoders score the last token that is not the padding token: Qwen's tokenizers append
    <|endoftext|>, its padding token too, so the token before it (transformers' rule); Llama and Mistral name no
    padding token, so the last token, which transformers takes one text at a time."""
    from transformers import AutoModelForSequenceClassification

    if family == "bert":
        from tests.helpers import write_tiny_model

        directory = write_tiny_model(tmp_path / "bert", head="sequence-classification", num_labels=3)
    else:
        directory = write_family_model(
            tmp_path / family, family, head="sequence-classification", num_labels=3, **overrides
        )
    model = load_model(directory, device="cpu", dtype="float32")
    assert model.classifier is not None and len(model.classifier.head.labels) == 3
    encodings = model.card.tokenizer.encode(TEXTS, PAIRS)
    ours = tasks.logits(model, encodings)
    reference = AutoModelForSequenceClassification.from_pretrained(directory, attn_implementation="eager").eval()
    one_at_a_time = reference.config.pad_token_id is None
    theirs = []
    for group in [[e] for e in encodings] if one_at_a_time else [encodings]:
        batch = model.card.tokenizer.pad(group)
        inputs = {
            "input_ids": torch.from_numpy(batch.input_ids),
            "attention_mask": torch.from_numpy(batch.attention_mask),
        }
        if model.card.config.type_vocab_size > 1:
            inputs["token_type_ids"] = torch.from_numpy(batch.token_type_ids)
        with torch.inference_mode():
            theirs.append(reference(**inputs).logits)
    torch.testing.assert_close(ours, torch.cat(theirs), atol=1e-5, rtol=1e-5)
    probabilities = model.classifier.probabilities(ours)
    if overrides.get("problem_type") == "multi_label_classification":
        torch.testing.assert_close(probabilities, torch.sigmoid(torch.cat(theirs)))
    else:
        torch.testing.assert_close(probabilities.sum(-1), torch.ones(len(TEXTS)))
    if model.card.config.family == "qwen3":
        (encoding,) = model.card.tokenizer.encode(["Hello world!"])
        assert encoding.tokens[-1] == "<|endoftext|>", "the case of transformers' rule: the padding token appended"


RERANKERS = ["qwen3-reranker", "llama", "gemma3_text"]  # a tied head; an untied one; Gemma's soft-capped logits
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
FORMATTED = [
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web '
    f"search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: {document}{SUFFIX}"
    for query, document in [("What is a fox?", "The quick brown fox jumps."), ("hello", "A cat sat on the mat.")]
]


@pytest.mark.parametrize("family", RERANKERS)
def test_yes_no_reranker_equals_transformers_and_cross_encoder(tmp_path: Path, family: str) -> None:
    """sigmoid(logit(yes) − logit(no)) at the last token, as transformers' causal LM gives them, and as
    sentence-transformers' CrossEncoder scores the formatted strings (given as pairs split where the template's
    suffix begins, at a special token, so that they tokenise as the whole strings do)."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForCausalLM

    directory = write_family_model(tmp_path / family, family, head="causal-lm")
    model = load_model(directory, device="cpu", dtype="float32")
    assert model.reranker is not None and model.card.scores_method == "yes-no"
    encodings = model.card.tokenizer.encode(FORMATTED, special_tokens=False)
    ours = tasks.probabilities(model, tasks.logits(model, encodings))[:, 0]

    reference = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    yes, no = (model.card.tokenizer.token_id(token) for token in ("yes", "no"))
    expected = []
    for encoding in encodings:  # one at a time: the last token is the last position
        with torch.inference_mode():
            logits = reference(input_ids=torch.tensor([encoding.ids])).logits[0, -1]
        expected.append(torch.sigmoid(logits[yes] - logits[no]))
    torch.testing.assert_close(ours, torch.stack(expected), atol=1e-5, rtol=1e-5)
    if family == "qwen3-reranker":
        pairs = [(text.removesuffix(SUFFIX), SUFFIX) for text in FORMATTED]
        predicted = CrossEncoder(str(directory), device="cpu").predict(pairs)
        np.testing.assert_allclose(ours.numpy(), predicted, atol=1e-5)


@pytest.mark.parametrize(
    ("rope", "named"),
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}}, "yarn"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}, "dynamic"),
        ({"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}, "longrope"),
    ],
)
def test_a_rope_scaling_not_implemented_is_refused_at_start_naming_it(tmp_path: Path, rope: dict, named: str) -> None:
    directory = write_family_model(tmp_path / "qwen3", "qwen3")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **rope}))
    with pytest.raises(ValueError, match=f"rope scaling.*{named}.*supported: linear, llama3"):
        load_model(directory, device="cpu", dtype="float32")


@needs_cpu_bfloat16
def test_a_bfloat16_checkpoint_is_kept_in_bfloat16_without_a_float32_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the products run in the checkpoint's dtype, its weights are loaded as they are stored, and the
    explicit path widens them to float32 a layer at a time: it equals transformers' float32 model of the same
    (bfloat16-valued) weights. Computing in float32, the weights are widened once, at load."""
    directory = stored_in_bfloat16(write_family_model(tmp_path / "qwen3", "qwen3", seed=3))
    with caplog.at_level(logging.INFO, logger="model.runtime.loader"):
        model = load_model(directory, device="cpu", dtype="bfloat16")
    assert model.pass_encoder is None and model.explicit_dtype == model.weights_dtype == torch.bfloat16
    assert {p.dtype for p in model.encoder.parameters()} == {torch.bfloat16}
    assert "the checkpoint's bfloat16 weights kept in bfloat16, products in bfloat16" in caplog.text
    batch = batch_of(model)
    ours = model.forward(batch, Keep(hidden_states=True, attentions=True))
    theirs = reference(directory, model, batch, output_hidden_states=True, output_attentions=True)
    real = torch.from_numpy(batch.attention_mask).bool()
    assert ours.last_hidden_state.dtype == torch.float32
    for mine, reference_state in zip(ours.hidden_states or [], theirs.hidden_states, strict=True):
        torch.testing.assert_close(mine[real], reference_state[real], atol=1e-5, rtol=1e-5)
    wide = load_model(directory, device="cpu", dtype="float32")
    assert {p.dtype for p in wide.encoder.parameters()} == {torch.float32} and wide.pass_encoder is None
    cosine = torch.nn.functional.cosine_similarity(model.embed(TEXTS), wide.embed(TEXTS), dim=1)
    assert cosine.min() >= 0.99, cosine  # the pass itself runs in bfloat16


def test_distilbert_sinusoidal_positions_are_the_seeds_sinusoid(tmp_path: Path) -> None:
    directory = write_family_model(tmp_path / "distilbert-sin", "distilbert", sinusoidal=True)
    model = load_model(directory, device="cpu", dtype="float32")
    assert model.card.config.position_embedding == "sinusoidal" and model.encoder.embeddings.position is None
    batch = batch_of(model)
    theirs = reference(directory, model, batch)
    real = torch.from_numpy(batch.attention_mask).bool()
    ours = model.forward(batch).last_hidden_state
    torch.testing.assert_close(ours[real], theirs.last_hidden_state[real], atol=1e-5, rtol=1e-5)


def test_a_bare_model_has_no_classification_head(tmp_path: Path) -> None:
    model = load_model(write_family_model(tmp_path / "bare", "roberta"), device="cpu", dtype="float32")
    assert model.classifier is None and model.reranker is None and model.card.scores_method is None
    with pytest.raises(ValueError, match="has no classification head"):
        tasks.logits(model, model.card.tokenizer.encode(["hello"]))


def test_long_inputs_take_the_local_layers_block_by_block_as_transformers_computes_them(tmp_path: Path) -> None:
    """Past four blocks of queries a local layer attends block by block (windowed_attention), eagerly; the states
    equal transformers' whole pass, for a padded batch too."""
    from model.nn.encoder import windowed

    directory = write_family_model(tmp_path / "modernbert", "modernbert", max_position_embeddings=1024)
    for name, key in (("tokenizer_config.json", "model_max_length"), ("sentence_bert_config.json", "max_seq_length")):
        path = directory / name
        if path.is_file():
            path.write_text(json.dumps({**json.loads(path.read_text()), key: 1024}))
    model = load_model(directory, device="cpu", dtype="float32")
    texts = [" ".join(TEXTS) * 5, " ".join(TEXTS) * 3]
    encodings = model.card.tokenizer.encode(texts)
    lengths = [len(encoding.ids) for encoding in encodings]
    assert windowed(lengths[1], model.card.config.window_reach) and lengths[0] <= 1024, lengths
    ours = model.last_hidden_state(*model.to_tensors(model.card.tokenizer.pad(encodings))).float()
    reference = hf_model(directory)
    for row, (encoding, n) in enumerate(zip(encodings, lengths, strict=True)):
        with torch.no_grad():
            theirs = reference(input_ids=torch.tensor([encoding.ids])).last_hidden_state[0]
        torch.testing.assert_close(ours[row, :n], theirs, atol=2e-4, rtol=1e-4)
