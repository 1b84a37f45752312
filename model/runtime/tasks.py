"""What each kind of task computes with a loaded model (model/runtime/text_encoder.py): one function per kind, which the
engine's declaration of the kind names as its pass (app/engine/messages.py, ``KINDS``) — sentence and token vectors,
sparse and multi-vector outputs, scores and their attributions, attention maps and the inspection views, positional
encodings. The loaded model gives them its weights and the pass's prologue (``TextEncoder.hidden``); each returns
arrays and small records, run on a compute lane."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from model.nn import inspection
from model.nn.attribution import gradient_x_input, integrated_gradients
from model.nn.encoder import (
    EncoderOutput,
    Keep,
    in_dtype,
    relative_embedding_rows,
    relative_position_buckets,
    rotary_angles,
    sinusoidal_positional_encoding,
)
from model.nn.inspection import explain_similarity, merge_words, norm_weighted, select_attention
from model.nn.pooling import last_token, normalize, sentence_embeddings, splade
from model.spec.checkpoint import Pooling
from model.spec.outputs import (
    HEAD_STEP_ARRAYS,
    AttentionSelection,
    Attribution,
    AttributionOptions,
    EmbeddedTexts,
    EmbeddingSpec,
    HeadSteps,
    MultiVectorOptions,
    MultiVectors,
    PositionQuery,
    ScoredTexts,
    SparseOptions,
    SparseVector,
)
from model.spec.tokenizer import Batch, TokenSequence

if TYPE_CHECKING:
    from model.runtime.text_encoder import TextEncoder


@torch.inference_mode()
def embed_texts(
    model: TextEncoder, encodings: Sequence[TokenSequence], specs: Sequence[EmbeddingSpec]
) -> EmbeddedTexts:
    """One forward pass over tokenised texts, each with its own layer, pooling and normalisation.

    Layers above the deepest one asked for are not computed; each distinct (layer, pooling,
    normalisation) is pooled once for all the rows that share it.
    """
    assert len(encodings) == len(specs) > 0, "one spec per encoding, at least one"
    batch = model.card.tokenizer.pad(encodings)
    input_ids, attention_mask, token_type_ids = model.to_tensors(batch)
    distinct = list({id(spec): spec for spec in specs}.values())  # a pass's texts share a few: one per request
    deepest = max(spec.layer for spec in distinct)
    mixed_layers = any(spec.layer != deepest for spec in distinct)
    if not mixed_layers and deepest == model.card.config.n_layers:  # what nearly every request asks for
        output = EncoderOutput(model.last_hidden_state(input_ids, attention_mask, token_type_ids))
    else:
        with model.computing():
            keep = Keep(hidden_states=mixed_layers)
            output = model.passes(input_ids, attention_mask, token_type_ids, keep, n_layers=deepest)

    as_float: dict[int, Tensor] = {}

    def hidden(layer: int) -> Tensor:
        """The hidden state of a layer in float32, (B, T, D), converted once."""
        if layer not in as_float:
            states = output.hidden_states[layer] if output.hidden_states is not None else output.last_hidden_state
            as_float[layer] = states.float()
        return as_float[layer]

    rows_by_kind: dict[tuple[int, Pooling, bool], list[int]] = {}
    if len(distinct) == 1:
        rows_by_kind[(deepest, distinct[0].pooling, distinct[0].normalize)] = list(range(len(specs)))
    else:
        for row, spec in enumerate(specs):
            rows_by_kind.setdefault((spec.layer, spec.pooling, spec.normalize), []).append(row)
    skipping = any(spec.skip for spec in distinct)
    sentences = np.empty((len(specs), model.card.dimension), dtype=np.float32)  # (B, D')
    for (layer, pooling, normalize_rows), rows in rows_by_kind.items():
        states, mask = hidden(layer), attention_mask
        if len(rows) < len(specs):
            index = torch.tensor(rows, device=states.device)
            states, mask = states.index_select(0, index), mask.index_select(0, index)  # (b, T, D), (b, T)
        skips = [specs[row].skip for row in rows] if skipping else []
        skip = torch.tensor(skips, device=states.device) if any(skips) else None
        pooled = sentence_embeddings(states, mask, pooling, normalize_rows, model.dense, skip)  # (b, D')
        sentences[rows] = pooled.float().cpu().numpy()

    token_layers = {spec.layer for spec in distinct if spec.token_vectors}
    if not token_layers:
        return EmbeddedTexts(sentences)
    token_vectors = {layer: hidden(layer).cpu().numpy() for layer in token_layers}  # layer → (B, T, D)
    lengths = batch.attention_mask.sum(axis=1).tolist()  # (B,) each text's own tokens
    return EmbeddedTexts(
        sentences,
        [
            token_vectors[spec.layer][row, : lengths[row]] if spec.token_vectors else None
            for row, spec in enumerate(specs)
        ],
    )


@torch.inference_mode()
def sparse_vectors(
    model: TextEncoder, encodings: Sequence[TokenSequence], options: Sequence[SparseOptions]
) -> list[SparseVector]:
    """One pass of a sparse model over tokenised texts: each text's vocabulary weights (``sparse``), pooled over
    its real tokens as SpladePooling pools them or BGE-M3's lexical weights, the non-zero ones by ascending id
    (the ``top_k`` largest where a text's options ask). A SPLADE model's vocabulary-wide logits are computed a
    text at a time, over its own tokens: a (T, V) block, never (B, T, V)."""
    sparse = model.card.sparse
    assert sparse is not None and (model.masked_lm or model.lexical) is not None, "not a sparse model"
    input_ids, _, _, hidden = model.hidden(encodings)
    hidden = hidden.float()  # (B, T, D)
    excluded = torch.tensor(sparse.excluded, dtype=torch.long, device=hidden.device)
    vectors = []
    for row, (encoding, option) in enumerate(zip(encodings, options, strict=True)):
        n = len(encoding.ids)
        if model.masked_lm is not None:
            logits = model.masked_lm(hidden[row, :n])  # (n, V)
            weights = splade(logits, sparse.activation, sparse.pooling)  # (V,)
        else:
            assert model.lexical is not None
            token_weights = torch.relu(model.lexical(hidden[row, :n])).squeeze(-1)  # (n,)
            weights = torch.zeros(model.card.config.vocab_size, device=hidden.device)  # (V,)
            weights.scatter_reduce_(0, input_ids[row, :n], token_weights, reduce="amax")  # the largest an id
            weights[excluded] = 0
        indices = torch.nonzero(weights > 0).squeeze(1)  # ascending
        if option.top_k is not None and option.top_k < indices.numel():
            kept = weights[indices].topk(option.top_k).indices
            indices = indices[kept].sort().values
        vectors.append(SparseVector(indices.cpu().numpy(), weights[indices].cpu().numpy()))
    return vectors


@torch.inference_mode()
def multi_vectors(
    model: TextEncoder, encodings: Sequence[TokenSequence], options: Sequence[MultiVectorOptions]
) -> list[MultiVectors]:
    """One pass of a multi-vector model over tokenised texts (already cut to their side's length): a ColBERT
    checkpoint's vectors (``colbert_vectors``), or BGE-M3's, normalize(colbert(h)) for every real token after the
    first, as FlagEmbedding computes them (queries and documents alike)."""
    if model.card.late_interaction is not None:
        return colbert_vectors(model, encodings, options)
    assert model.colbert is not None, "not a multi-vector model"
    hidden = model.hidden(encodings)[3].float()  # (B, T, D)
    vectors = normalize(model.colbert(hidden[:, 1:]))  # (B, T − 1, D')
    results = []
    for row, encoding in enumerate(encodings):
        n = len(encoding.ids)
        results.append(MultiVectors(vectors[row, : n - 1].cpu().numpy(), np.arange(1, n, dtype=np.int64)))
    return results


def colbert_vectors(
    model: TextEncoder, encodings: Sequence[TokenSequence], options: Sequence[MultiVectorOptions]
) -> list[MultiVectors]:
    """A ColBERT checkpoint's vectors, as sentence-transformers' MultiVectorEncoder computes them: each query
    filled with the expansion token up to the expansion's length (attended to or not, as the checkpoint says),
    the Dense projections and the L2 norm on every token vector, then the scored ones kept: a query's real and
    expansion tokens, a document's real tokens less the skiplist's."""
    late = model.card.late_interaction
    assert late is not None
    expansion = late.expansion
    rows = []
    for encoding, option in zip(encodings, options, strict=True):
        n = len(encoding.ids)
        extra = max(expansion.length - n, 0) if option.query and expansion is not None else 0
        rows.append((encoding, n, extra))
    B, T = len(rows), max(n + extra for _, n, extra in rows)
    input_ids = np.full((B, T), model.card.tokenizer.pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((B, T), dtype=np.int64)
    token_type_ids = np.zeros((B, T), dtype=np.int64)
    computed = np.zeros((B, T), dtype=np.bool_)
    for row, (encoding, n, extra) in enumerate(rows):
        computed[row, : n + extra] = True
        input_ids[row, :n] = encoding.ids
        token_type_ids[row, :n] = encoding.type_ids
        attention_mask[row, :n] = 1
        if extra:
            assert expansion is not None and late.expansion_id is not None
            input_ids[row, n : n + extra] = late.expansion_id
            attention_mask[row, n : n + extra] = int(expansion.attend)
    batch = Batch(input_ids, attention_mask, token_type_ids)
    if expansion is not None and not expansion.attend and any(extra for _, _, extra in rows):
        # the filler is seen by no key but has outputs of its own: the eager pass, told what to compute
        tensors = model.to_tensors(batch)
        seen = torch.from_numpy(computed).to(model.device)
        if model.expansion_graph is not None:
            with torch.jit.optimized_execution(False):  # as the embedding pass's graph runs
                vectors = model.expansion_graph(*tensors, seen).float()  # (B, T, D)
        else:
            with model.computing():
                vectors = model.passes(*tensors, computed=seen).last_hidden_state.float()  # (B, T, D)
    else:
        vectors = model.last_hidden_state(*model.to_tensors(batch)).float()  # (B, T, D)
    for module in model.projections:
        vectors = module(vectors)  # (B, T, D')
    if late.normalize:
        vectors = normalize(vectors)
    skip = np.array(sorted(late.skip_ids), dtype=np.int64)
    results = []
    for row, ((_, n, extra), option) in enumerate(zip(rows, options, strict=True)):
        positions = np.arange(n + extra, dtype=np.int64)
        if late.skips(option.query):
            kept = ~np.isin(input_ids[row, : n + extra], skip) | (positions >= n)
            positions = positions[kept]
        index = torch.from_numpy(positions).to(vectors.device)
        results.append(MultiVectors(vectors[row].index_select(0, index).cpu().numpy(), positions))
    return results


@torch.inference_mode()
def logits(model: TextEncoder, encodings: Sequence[TokenSequence]) -> Tensor:
    """Logits (B, labels) in float32 for tokenised texts (or pairs): the classification head's, or for a yes/no
    reranker one logit, logit(yes) − logit(no) at each text's last token."""
    if model.classifier is None and model.reranker is None:
        raise ValueError(f"model {model.card.name!r} has no classification head")
    input_ids, attention_mask, _, hidden = model.hidden(encodings)  # hidden (B, T, D)
    if model.autocast_dtype is None:  # the heads are in the explicit paths' dtype (loader.py, ``load_heads``)
        hidden = hidden.to(model.explicit_dtype)
    with model.computing():
        if model.classifier is not None:
            return model.classifier(hidden, attention_mask, input_ids).float()  # (B, labels)
        assert model.reranker is not None
        last = last_token(attention_mask)  # (B,): the last real token
        answers = model.reranker(hidden[torch.arange(hidden.size(0), device=hidden.device), last]).float()  # (B, 2)
        return (answers[:, 0] - answers[:, 1]).unsqueeze(1)  # (B, 1): yes − no


def probabilities(model: TextEncoder, logits: Tensor) -> Tensor:
    """The scores of ``logits``: the classification head's (softmax, or sigmoids), or the sigmoid of
    a reranker's yes − no."""
    if model.classifier is not None:
        return model.classifier.probabilities(logits)
    return torch.sigmoid(logits.float())


def scores(model: TextEncoder, encodings: Sequence[TokenSequence]) -> ScoredTexts:
    """Each text's logits and probabilities, from one pass (``logits`` and ``probabilities``)."""
    computed = logits(model, encodings)  # (B, labels)
    return ScoredTexts(computed.cpu().numpy(), probabilities(model, computed).cpu().numpy())


def attribute(model: TextEncoder, encodings: Sequence[TokenSequence], options: AttributionOptions) -> list[Attribution]:
    """Which tokens of each text (or pair) made its score, float32 on the model's device, the explicit path's
    weights: the classification head's logit ``options.targets[i]``, or a yes/no reranker's yes − no at the last
    token, attributed at the embedding block's output (model/nn/attribution.py). The texts are padded into one
    batch, and integrated gradients compute the points of all of them in passes of at most ``options.tokens``
    tokens. Gradients are taken here alone: every other pass runs without them."""
    if model.classifier is None and model.reranker is None:
        raise ValueError(f"model {model.card.name!r} has no score to attribute")
    batch = model.card.tokenizer.pad(encodings)
    input_ids, attention_mask, token_type_ids = model.to_tensors(batch)  # (R, T) each
    lengths = [len(encoding.ids) for encoding in encodings]
    baseline_ids = input_ids.clone()  # each text's baseline, padded as the text is
    for row, (baseline, length) in enumerate(zip(options.baselines, lengths, strict=True)):
        baseline_ids[row, :length] = torch.tensor(baseline, dtype=input_ids.dtype)
    targets = torch.tensor(options.targets, device=model.device)
    encoder, f32 = model.encoder, torch.float32
    # the heads in float32 once a request (a copy where they are kept in half precision), not once a pass
    classifier = in_dtype(model.classifier, f32) if model.classifier is not None else None
    reranker = in_dtype(model.reranker, f32) if model.reranker is not None else None
    with torch.inference_mode(False), torch.enable_grad():
        embeddings = encoder.embeddings
        embedded, baseline = (
            embeddings(ids, token_type_ids, attention_mask, f32, projected=False) for ids in (input_ids, baseline_ids)
        )  # (R, T, E) each: ELECTRA's before their projection up to D, as transformers' embedding block gives them

        # texts ≥ R are the baselines (model/nn/attribution.py's Score): the tables twice, the baselines' ids second
        given = torch.cat([input_ids, baseline_ids])
        masks, types_of, targets = attention_mask.repeat(2, 1), token_type_ids.repeat(2, 1), targets.repeat(2)

        def score(points: Tensor, texts: Tensor) -> Tensor:  # (N, L, E), (N,) → (N,)
            length = points.size(1)
            ids, mask, types = (t[texts, :length] for t in (given, masks, types_of))
            hidden = encoder(ids, mask, types, dtype=f32, embedded=embeddings.up(points)).last_hidden_state
            rows = torch.arange(points.size(0), device=points.device)
            if classifier is not None:
                return classifier(hidden, mask, ids)[rows, targets[texts]]
            assert reranker is not None
            answers = reranker(hidden[rows, last_token(mask)])  # (N, 2)
            return answers[:, 0] - answers[:, 1]  # yes − no

        if options.method == "gradient_x_input":
            return gradient_x_input(score, embedded.detach(), lengths)
        span = None if options.span is None else range(*options.span)
        return integrated_gradients(
            score,
            embedded.detach(),
            baseline.detach(),
            lengths,
            options.steps,
            options.tokens,
            span,
            ends_in_passes=model.device.type == "cuda",  # where the launches bound it (integrated_gradients)
        )


@torch.inference_mode()
def attention_maps(model: TextEncoder, encoding: TokenSequence, selection: AttentionSelection) -> np.ndarray:
    """The selected attention maps of one tokenised text, float32, (L, H', T, T) or, merged into words,
    (L, H', W, W); see select_attention, norm_weighted and merge_words.

    One pass of the explicit attention path up to the deepest selected layer; it also returns the value
    norms when the maps are norm-weighted.
    """
    keep = Keep(attentions=True, value_norms=selection.weighting == "norm")
    output = model.forward(model.card.tokenizer.pad([encoding]), keep, n_layers=selection.deepest)
    assert output.attentions is not None
    computed = torch.stack(output.attentions)[:, 0].float()  # (L', H, T, T)
    if keep.value_norms:
        assert output.value_norms is not None
        computed = norm_weighted(computed, torch.stack(output.value_norms)[:, 0])  # (L', H, T, T)
    maps = select_attention(computed, selection)  # (L, H', T, T)
    if selection.words is not None:
        maps = merge_words(maps, selection.words)  # (L, H', W, W)
    return maps.cpu().numpy()


@torch.inference_mode()
def neuron_view(model: TextEncoder, encoding: TokenSequence, layer: int, head: int) -> HeadSteps:
    """One head of one layer on one tokenised text, step by step, in float32 on the CPU (the explicit path's
    precision): queries, keys, values, scale, scores, attention, context (see HeadSteps), as numpy arrays."""
    input_ids, _, token_type_ids = model.to_tensors(model.card.tokenizer.pad([encoding]))
    steps = model.encoder.head_steps(input_ids, token_type_ids, layer, head, dtype=torch.float32)
    return steps._replace(**{name: getattr(steps, name).float().cpu().numpy() for name in HEAD_STEP_ARRAYS})


@torch.inference_mode()
def head_statistics(
    model: TextEncoder, encodings: Sequence[TokenSequence], separators: np.ndarray, punctuation: np.ndarray
) -> np.ndarray:
    """HEAD_STATISTICS of every layer and head for each text of one batch, one explicit-path pass for all:
    (S, B, L, H) float64. ``separators`` and ``punctuation`` (B, T) mark those keys of the padded batch."""
    batch = model.card.tokenizer.pad(encodings)
    output = model.forward(batch, Keep(attentions=True))
    assert output.attentions is not None
    lengths = torch.from_numpy(batch.attention_mask.sum(1)).to(model.device)  # (B,)
    marks = [torch.from_numpy(np.asarray(m, dtype=bool)).to(model.device) for m in (separators, punctuation)]
    per_layer = []
    while output.attentions:  # layer by layer, each layer's maps freed once counted
        per_layer.append(inspection.head_statistics(output.attentions.pop(0), lengths, *marks))  # (S, B, H)
    return torch.stack(per_layer, dim=2).cpu().numpy()  # (S, B, L, H)


def explain_similarities(
    model: TextEncoder, source: np.ndarray, texts: Sequence[np.ndarray], skip: int
) -> list[tuple[np.ndarray, str]]:
    """Each text's token-by-token contributions to its cosine with the source, from the final token vectors
    (n, D) of the source and (m, D) of each text, and the method's name (explain_similarity); through the
    Dense modules after pooling where the model has them. One text at a time: memory stays flat."""
    a = torch.from_numpy(source)  # (n, D)
    project = partial(project_tokens, model) if model.dense else None
    explained = []
    for vectors in texts:
        contributions, method = explain_similarity(
            a, torch.from_numpy(vectors), model.card.pooling.mode, project, (skip, skip)
        )  # (n, m)
        explained.append((contributions.numpy().astype(np.float32), method))
    return explained


@torch.inference_mode()
def project_tokens(model: TextEncoder, vectors: Tensor) -> Tensor:
    """Token vectors (T, D) on the CPU through the Dense modules after pooling: (T, D') in float64 (the
    explanations' precision)."""
    vectors = vectors.double()
    for module in model.dense:
        weight, bias = module.linear.weight.double().cpu(), _double(module.linear.bias)
        vectors = module.activation(F.linear(vectors, weight, bias))
    return vectors


@torch.inference_mode()
def position_encoding(model: TextEncoder, query: PositionQuery) -> np.ndarray:
    """A positional encoding (see PositionQuery): (length, d_model) float32; rotary (length, d_model / 2); the
    learned table (length, E); relative (length, length) int64."""
    if query.kind == "learned":
        table = model.encoder.embeddings.position_table()
        if table is None:
            raise ValueError(f"model {model.card.name!r} has no position table")
        return table[: query.length].detach().float().cpu().numpy()
    if query.kind == "relative":  # the bucket each query i and key j use: MPNet's bias row, DeBERTa's embedding row
        config = model.card.config
        rows = relative_position_buckets if config.position_embedding == "relative_buckets" else relative_embedding_rows
        return rows(query.length, config.relative_buckets, config.relative_max_distance, torch.device("cpu")).numpy()
    if query.kind == "rotary":
        return rotary_angles(query.length, query.d_model, query.base, scaling=query.scaling).numpy()
    return sinusoidal_positional_encoding(query.length, query.d_model, query.base).numpy()


def _double(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.double().cpu()
