"""A loaded model: its card (model/spec/card.py) and its weights on a device, and what it computes with them — sentence
and token vectors, sparse and multi-vector outputs, scores, attention maps and the inspection views. Loading one is
model/runtime/loader.py's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.nn.attribution import gradient_x_input, integrated_gradients
from model.nn.encoder import (
    LAST_ONLY,
    Encoder,
    EncoderOutput,
    Keep,
    in_dtype,
    relative_embedding_rows,
    relative_position_buckets,
    rotary_angles,
    sinusoidal_positional_encoding,
)
from model.nn.heads import LanguageModelHead, MaskedLanguageModelHead, SequenceClassificationHead
from model.nn.inspection import explain_similarity, head_statistics, merge_words, norm_weighted, select_attention
from model.nn.pooling import Dense, last_token, normalize, sentence_embeddings, splade
from model.runtime.backends import EagerPass, PassBackend, TracedPass, release_memory, unwrapped
from model.runtime.graphs import GraphedPass
from model.spec.card import ModelCard
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

PassGraph = Callable[[Tensor, Tensor, Tensor], Tensor]  # (input ids, mask, segments) (B, T) → last hidden state
# (input ids, mask, segments, computed positions) (B, T) → last hidden state: ColBERT's query expansion
ExpansionGraph = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(kw_only=True)
class TextEncoder:
    """A model's card (config, tokenizer, pooling, prompts, heads) and its weights: everything needed to turn texts
    into token vectors, sentence vectors, attention maps and scores."""

    card: ModelCard  # what the model is, apart from its weights: what the services and front ends hold
    encoder: Encoder  # the explicit paths' weights (float32 results); the pass's too unless ``pass_encoder``
    device: torch.device
    dtype: torch.dtype  # what the matrix products run in (reported in /info)
    classifier: SequenceClassificationHead | None = None  # when the checkpoint is a sequence classifier
    # when the checkpoint is a causal LM whose vocabulary has the tokens ``yes`` and ``no``: their rows of its head
    reranker: LanguageModelHead | None = None
    dense: tuple[Dense, ...] = ()  # the Dense modules after pooling, with their weights (``pooling.dense``)
    masked_lm: MaskedLanguageModelHead | None = None  # a SPLADE model's vocabulary head (``sparse``)
    lexical: nn.Linear | None = None  # BGE-M3's token-weight layer, D → 1 (``sparse``)
    colbert: nn.Linear | None = None  # BGE-M3's multi-vector projection, D → D' (``multi_vector``)
    projections: tuple[Dense, ...] = ()  # a ColBERT checkpoint's Dense modules on each token vector
    weights_dtype: torch.dtype | None = None  # what the embedding pass's weights are kept in; ``dtype`` when None
    explicit_dtype: torch.dtype = torch.float32  # what ``encoder``'s weights are kept in
    # What computes the embedding pass, asked in order (model/runtime/backends.py): on a CPU OpenVINO's compiled pass or
    # the traced graph, on a GPU the CUDA graphs; the eager pass, last, takes what none of them takes.
    backends: tuple[PassBackend, ...] = ()
    quantized: str | None = None  # "int8" where the first backend keeps its weights so (OpenVINO's pass on a CPU)
    expansion_graph: ExpansionGraph | None = None  # ColBERT queries' pass, traced (trace_expansion_pass)
    # The embedding and classification passes' own copy of the encoder in a lower dtype: on a GPU under float16 or
    # bfloat16 for a float32 checkpoint, whole; on a CPU under bfloat16 autocast, its linear layers alone, the
    # rest shared (model/runtime/loader.py, ``products_in``). None where they use ``encoder`` itself (float32, or a
    # checkpoint kept in its own dtype). The explicit paths (/attention, the inspection endpoints) run on
    # ``encoder`` in float32 and equal transformers.
    pass_encoder: Encoder | None = None

    @property
    def graph(self) -> PassGraph | None:
        """The embedding pass as a traced graph (trace_pass), where it has one."""
        traced = next((inner for inner in map(unwrapped, self.backends) if isinstance(inner, TracedPass)), None)
        return None if traced is None else traced.graph

    @property
    def graphs(self) -> GraphedPass | None:
        """On a GPU, the embedding pass as CUDA graphs (model/runtime/graphs.py), where it has them."""
        return next((backend for backend in self.backends if isinstance(backend, GraphedPass)), None)

    @property
    def runtime(self) -> str:
        """What computes the embedding pass: the first backend's name (reported in /info, /metrics, the log)."""
        return self.backends[0].name if self.backends else EagerPass.name

    @property
    def precision(self) -> str:
        """What the embedding pass computes in, as /info, /metrics and the logs name it: ``quantized`` where set,
        else the products' dtype."""
        return self.quantized or str(self.dtype).removeprefix("torch.")

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype the embedding and classification passes' products are autocast to, where it is lower than
        the weights' (the CPU under bfloat16); None where they run in the weights' own dtype."""
        return None if self.weights_dtype in (None, self.dtype) else self.dtype

    @torch.inference_mode()
    def position_encoding(self, query: PositionQuery) -> np.ndarray:
        """A positional encoding (see PositionQuery): (length, d_model) float32; rotary (length, d_model / 2); the
        learned table (length, E); relative (length, length) int64."""
        if query.kind == "learned":
            table = self.encoder.embeddings.position_table()
            if table is None:
                raise ValueError(f"model {self.card.name!r} has no position table")
            return table[: query.length].detach().float().cpu().numpy()
        if query.kind == "relative":  # the bucket each query i and key j use: MPNet's bias row, DeBERTa's embedding row
            config = self.card.config
            rows = (
                relative_position_buckets
                if config.position_embedding == "relative_buckets"
                else relative_embedding_rows
            )
            return rows(
                query.length, config.relative_buckets, config.relative_max_distance, torch.device("cpu")
            ).numpy()
        if query.kind == "rotary":
            return rotary_angles(query.length, query.d_model, query.base, scaling=query.scaling).numpy()
        return sinusoidal_positional_encoding(query.length, query.d_model, query.base).numpy()

    def explain(self, source: np.ndarray, texts: Sequence[np.ndarray], skip: int) -> list[tuple[np.ndarray, str]]:
        """Each text's token-by-token contributions to its cosine with the source, from the final token vectors
        (n, D) of the source and (m, D) of each text, and the method's name (explain_similarity); through the
        Dense modules after pooling where the model has them. One text at a time: memory stays flat."""
        a = torch.from_numpy(source)  # (n, D)
        project = self.project_tokens if self.dense else None
        explained = []
        for vectors in texts:
            contributions, method = explain_similarity(
                a, torch.from_numpy(vectors), self.card.pooling.mode, project, (skip, skip)
            )  # (n, m)
            explained.append((contributions.numpy().astype(np.float32), method))
        return explained

    @torch.inference_mode()
    def project_tokens(self, vectors: Tensor) -> Tensor:
        """Token vectors (T, D) on the CPU through the Dense modules after pooling: (T, D') in float64 (the
        explanations' precision)."""
        vectors = vectors.double()
        for module in self.dense:
            weight, bias = module.linear.weight.double().cpu(), _double(module.linear.bias)
            vectors = module.activation(F.linear(vectors, weight, bias))
        return vectors

    def computing(self) -> AbstractContextManager[object]:
        """The context the eager embedding and classification passes run in: autocast to ``autocast_dtype``
        where there is one. /attention's explicit path runs outside it."""
        dtype = self.autocast_dtype
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    @property
    def passes(self) -> Encoder:
        """The encoder the embedding and classification passes run: ``pass_encoder`` where there is one."""
        return self.pass_encoder if self.pass_encoder is not None else self.encoder

    def last_hidden_state(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor:
        """The last layer's output (B, T, D) of a padded batch, in the embedding pass's precision: from the first
        of ``backends`` that takes the batch, else eagerly."""
        for backend in self.backends:
            hidden = backend(input_ids, attention_mask, token_type_ids)
            if hidden is not None:
                return hidden
        return EagerPass(self.passes, self.autocast_dtype)(input_ids, attention_mask, token_type_ids)

    def hidden(self, encodings: Sequence[TokenSequence]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The pass's prologue, written once: tokenised texts padded into a batch, its tensors on the device, and
        the last hidden state in the pass's precision. (input ids, attention mask, token type ids) (B, T), hidden
        (B, T, D)."""
        input_ids, attention_mask, token_type_ids = self.to_tensors(self.card.tokenizer.pad(encodings))
        hidden = self.last_hidden_state(input_ids, attention_mask, token_type_ids)
        return input_ids, attention_mask, token_type_ids, hidden

    def to_tensors(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """The batch's arrays as tensors on the model's device."""
        return tuple(  # type: ignore[return-value]
            torch.from_numpy(array).to(self.device, non_blocking=True)
            for array in (batch.input_ids, batch.attention_mask, batch.token_type_ids)
        )

    @torch.inference_mode()
    def forward(
        self,
        batch: Batch,
        keep: Keep = LAST_ONLY,
        *,
        n_layers: int | None = None,
    ) -> EncoderOutput:
        """Run the encoder on a padded batch, keeping what ``keep`` says beside the last hidden state: the explicit
        path, float32 on every device."""
        input_ids, attention_mask, token_type_ids = self.to_tensors(batch)
        return self.encoder(input_ids, attention_mask, token_type_ids, keep, n_layers=n_layers, dtype=torch.float32)

    def embed(
        self,
        texts: Sequence[str],
        *,
        pooling: Pooling | None = None,
        normalize_embeddings: bool = True,
        layer: int = -1,
        truncate: bool = True,
        prompt_name: str | None = None,
        prompt: str | None = None,
    ) -> Tensor:
        """Sentence embeddings (B, D') in float32, the model's own pooling unless another is named, with the
        prompt (``prompt``, or the one named, or the model's default) before each text.

        ``layer`` picks the hidden state (0 = embeddings, negative from the end). The same pass as the
        service's (``embed_encodings``).
        """
        before = self.card.prompt(prompt_name, prompt)
        spec = EmbeddingSpec(
            self.card.resolve_layer(layer),
            pooling or self.card.pooling.mode,
            normalize_embeddings,
            skip=self.card.prompt_skip(before),
        )
        encodings = self.card.tokenizer.encode(self.card.prompted(texts, prompt_name, prompt), truncate=truncate)
        return torch.from_numpy(self.embed_encodings(encodings, [spec] * len(encodings)).sentences)  # (B, D')

    @torch.inference_mode()
    def embed_encodings(self, encodings: Sequence[TokenSequence], specs: Sequence[EmbeddingSpec]) -> EmbeddedTexts:
        """One forward pass over tokenised texts, each with its own layer, pooling and normalisation.

        Layers above the deepest one asked for are not computed; each distinct (layer, pooling,
        normalisation) is pooled once for all the rows that share it.
        """
        assert len(encodings) == len(specs) > 0, "one spec per encoding, at least one"
        batch = self.card.tokenizer.pad(encodings)
        input_ids, attention_mask, token_type_ids = self.to_tensors(batch)
        distinct = list({id(spec): spec for spec in specs}.values())  # a pass's texts share a few: one per request
        deepest = max(spec.layer for spec in distinct)
        mixed_layers = any(spec.layer != deepest for spec in distinct)
        if not mixed_layers and deepest == self.card.config.n_layers:  # what nearly every request asks for
            output = EncoderOutput(self.last_hidden_state(input_ids, attention_mask, token_type_ids))
        else:
            with self.computing():
                keep = Keep(hidden_states=mixed_layers)
                output = self.passes(input_ids, attention_mask, token_type_ids, keep, n_layers=deepest)

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
        sentences = np.empty((len(specs), self.card.dimension), dtype=np.float32)  # (B, D')
        for (layer, pooling, normalize_rows), rows in rows_by_kind.items():
            states, mask = hidden(layer), attention_mask
            if len(rows) < len(specs):
                index = torch.tensor(rows, device=states.device)
                states, mask = states.index_select(0, index), mask.index_select(0, index)  # (b, T, D), (b, T)
            skips = [specs[row].skip for row in rows] if skipping else []
            skip = torch.tensor(skips, device=states.device) if any(skips) else None
            pooled = sentence_embeddings(states, mask, pooling, normalize_rows, self.dense, skip)  # (b, D')
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
    def sparse_encodings(
        self, encodings: Sequence[TokenSequence], options: Sequence[SparseOptions]
    ) -> list[SparseVector]:
        """One pass of a sparse model over tokenised texts: each text's vocabulary weights (``sparse``), pooled over
        its real tokens as SpladePooling pools them or BGE-M3's lexical weights, the non-zero ones by ascending id
        (the ``top_k`` largest where a text's options ask). A SPLADE model's vocabulary-wide logits are computed a
        text at a time, over its own tokens: a (T, V) block, never (B, T, V)."""
        sparse = self.card.sparse
        assert sparse is not None and (self.masked_lm or self.lexical) is not None, "not a sparse model"
        input_ids, _, _, hidden = self.hidden(encodings)
        hidden = hidden.float()  # (B, T, D)
        excluded = torch.tensor(sparse.excluded, dtype=torch.long, device=hidden.device)
        vectors = []
        for row, (encoding, option) in enumerate(zip(encodings, options, strict=True)):
            n = len(encoding.ids)
            if self.masked_lm is not None:
                logits = self.masked_lm(hidden[row, :n])  # (n, V)
                weights = splade(logits, sparse.activation, sparse.pooling)  # (V,)
            else:
                assert self.lexical is not None
                token_weights = torch.relu(self.lexical(hidden[row, :n])).squeeze(-1)  # (n,)
                weights = torch.zeros(self.card.config.vocab_size, device=hidden.device)  # (V,)
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
        self, encodings: Sequence[TokenSequence], options: Sequence[MultiVectorOptions]
    ) -> list[MultiVectors]:
        """One pass of a multi-vector model over tokenised texts (already cut to their side's length): a ColBERT
        checkpoint's vectors (``colbert_pass``), or BGE-M3's, normalize(colbert(h)) for every real token after the
        first, as FlagEmbedding computes them (queries and documents alike)."""
        if self.card.late_interaction is not None:
            return self.colbert_pass(encodings, options)
        assert self.colbert is not None, "not a multi-vector model"
        hidden = self.hidden(encodings)[3].float()  # (B, T, D)
        vectors = normalize(self.colbert(hidden[:, 1:]))  # (B, T − 1, D')
        results = []
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            results.append(MultiVectors(vectors[row, : n - 1].cpu().numpy(), np.arange(1, n, dtype=np.int64)))
        return results

    def colbert_pass(
        self, encodings: Sequence[TokenSequence], options: Sequence[MultiVectorOptions]
    ) -> list[MultiVectors]:
        """A ColBERT checkpoint's vectors, as sentence-transformers' MultiVectorEncoder computes them: each query
        filled with the expansion token up to the expansion's length (attended to or not, as the checkpoint says),
        the Dense projections and the L2 norm on every token vector, then the scored ones kept: a query's real and
        expansion tokens, a document's real tokens less the skiplist's."""
        late = self.card.late_interaction
        assert late is not None
        expansion = late.expansion
        rows = []
        for encoding, option in zip(encodings, options, strict=True):
            n = len(encoding.ids)
            extra = max(expansion.length - n, 0) if option.query and expansion is not None else 0
            rows.append((encoding, n, extra))
        B, T = len(rows), max(n + extra for _, n, extra in rows)
        input_ids = np.full((B, T), self.card.tokenizer.pad_token_id, dtype=np.int64)
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
            tensors = self.to_tensors(batch)
            seen = torch.from_numpy(computed).to(self.device)
            if self.expansion_graph is not None:
                with torch.jit.optimized_execution(False):  # as the embedding pass's graph runs
                    vectors = self.expansion_graph(*tensors, seen).float()  # (B, T, D)
            else:
                with self.computing():
                    vectors = self.passes(*tensors, computed=seen).last_hidden_state.float()  # (B, T, D)
        else:
            vectors = self.last_hidden_state(*self.to_tensors(batch)).float()  # (B, T, D)
        for module in self.projections:
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
    def attention(self, encoding: TokenSequence, selection: AttentionSelection) -> np.ndarray:
        """The selected attention maps of one tokenised text, float32, (L, H', T, T) or, merged into words,
        (L, H', W, W); see select_attention, norm_weighted and merge_words.

        One pass of the explicit attention path up to the deepest selected layer; it also returns the value
        norms when the maps are norm-weighted.
        """
        keep = Keep(attentions=True, value_norms=selection.weighting == "norm")
        output = self.forward(self.card.tokenizer.pad([encoding]), keep, n_layers=selection.deepest)
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
    def neuron(self, encoding: TokenSequence, layer: int, head: int) -> HeadSteps:
        """One head of one layer on one tokenised text, step by step, in float32 on the CPU (the explicit path's
        precision): queries, keys, values, scale, scores, attention, context (see HeadSteps), as numpy arrays."""
        input_ids, _, token_type_ids = self.to_tensors(self.card.tokenizer.pad([encoding]))
        steps = self.encoder.head_steps(input_ids, token_type_ids, layer, head, dtype=torch.float32)
        return steps._replace(**{name: getattr(steps, name).float().cpu().numpy() for name in HEAD_STEP_ARRAYS})

    @torch.inference_mode()
    def head_statistics(
        self, encodings: Sequence[TokenSequence], separators: np.ndarray, punctuation: np.ndarray
    ) -> np.ndarray:
        """HEAD_STATISTICS of every layer and head for each text of one batch, one explicit-path pass for all:
        (S, B, L, H) float64. ``separators`` and ``punctuation`` (B, T) mark those keys of the padded batch."""
        batch = self.card.tokenizer.pad(encodings)
        output = self.forward(batch, Keep(attentions=True))
        assert output.attentions is not None
        lengths = torch.from_numpy(batch.attention_mask.sum(1)).to(self.device)  # (B,)
        marks = [torch.from_numpy(np.asarray(m, dtype=bool)).to(self.device) for m in (separators, punctuation)]
        per_layer = []
        while output.attentions:  # layer by layer, each layer's maps freed once counted
            per_layer.append(head_statistics(output.attentions.pop(0), lengths, *marks))  # (S, B, H)
        return torch.stack(per_layer, dim=2).cpu().numpy()  # (S, B, L, H)

    @torch.inference_mode()
    def classify(self, encodings: Sequence[TokenSequence]) -> Tensor:
        """Logits (B, labels) in float32 for tokenised texts (or pairs): the classification head's, or for a yes/no
        reranker one logit, logit(yes) − logit(no) at each text's last token."""
        if self.classifier is None and self.reranker is None:
            raise ValueError(f"model {self.card.name!r} has no classification head")
        input_ids, attention_mask, _, hidden = self.hidden(encodings)  # hidden (B, T, D)
        with self.computing():
            if self.classifier is not None:
                return self.classifier(hidden, attention_mask, input_ids).float()  # (B, labels)
            assert self.reranker is not None
            last = last_token(attention_mask)  # (B,): the last real token
            answers = self.reranker(hidden[torch.arange(hidden.size(0), device=hidden.device), last]).float()  # (B, 2)
            return (answers[:, 0] - answers[:, 1]).unsqueeze(1)  # (B, 1): yes − no

    def attribute(self, encodings: Sequence[TokenSequence], options: AttributionOptions) -> list[Attribution]:
        """Which tokens of each text (or pair) made its score, float32 on the model's device, the explicit path's
        weights: the classification head's logit ``options.targets[i]``, or a yes/no reranker's yes − no at the last
        token, attributed at the embedding block's output (model/nn/attribution.py). The texts are padded into one
        batch, and integrated gradients compute the points of all of them in passes of at most ``options.tokens``
        tokens. Gradients are taken here alone: every other pass runs without them."""
        if self.classifier is None and self.reranker is None:
            raise ValueError(f"model {self.card.name!r} has no score to attribute")
        batch = self.card.tokenizer.pad(encodings)
        input_ids, attention_mask, token_type_ids = self.to_tensors(batch)  # (R, T) each
        lengths = [len(encoding.ids) for encoding in encodings]
        baseline_ids = input_ids.clone()  # each text's baseline, padded as the text is
        for row, (baseline, length) in enumerate(zip(options.baselines, lengths, strict=True)):
            baseline_ids[row, :length] = torch.tensor(baseline, dtype=input_ids.dtype)
        targets = torch.tensor(options.targets, device=self.device)
        encoder, f32 = self.encoder, torch.float32
        # the heads in float32 once a request (a copy where they are kept in half precision), not once a pass
        classifier = in_dtype(self.classifier, f32) if self.classifier is not None else None
        reranker = in_dtype(self.reranker, f32) if self.reranker is not None else None
        with torch.inference_mode(False), torch.enable_grad():
            embeddings = encoder.embeddings
            embedded, baseline = (
                embeddings(ids, token_type_ids, attention_mask, f32, projected=False)
                for ids in (input_ids, baseline_ids)
            )  # (R, T, E) each: ELECTRA's before their projection up to D, as transformers' embedding block gives them

            def score(points: Tensor, texts: Tensor, given: Tensor = input_ids) -> Tensor:  # (N, L, E), (N,) → (N,)
                length = points.size(1)
                ids, mask, types = (t[texts, :length] for t in (given, attention_mask, token_type_ids))
                hidden = encoder(ids, mask, types, dtype=f32, embedded=embeddings.up(points)).last_hidden_state
                rows = torch.arange(points.size(0), device=points.device)
                if classifier is not None:
                    return classifier(hidden, mask, ids)[rows, targets[texts]]
                assert reranker is not None
                answers = reranker(hidden[rows, last_token(mask)])  # (N, 2)
                return answers[:, 0] - answers[:, 1]  # yes − no

            if options.method == "gradient_x_input":
                return gradient_x_input(score, embedded.detach(), lengths)
            # a head that finds its token by the ids (a decoder's last one that is not padding) scores the baseline
            # by the baseline's ids, as transformers' model given them does
            at_baseline = lambda points, texts: score(points, texts, baseline_ids)  # noqa: E731
            return integrated_gradients(
                score, embedded.detach(), baseline.detach(), lengths, options.steps, options.tokens, at_baseline
            )

    def scores(self, encodings: Sequence[TokenSequence]) -> ScoredTexts:
        """Each text's logits and probabilities, from one pass (``classify`` and ``probabilities``)."""
        logits = self.classify(encodings)  # (B, labels)
        probabilities = self.probabilities(logits)  # (B, labels)
        return ScoredTexts(logits.cpu().numpy(), probabilities.cpu().numpy())

    def probabilities(self, logits: Tensor) -> Tensor:
        """The scores of ``classify``'s logits: the classification head's (softmax, or sigmoids), or the sigmoid of
        a reranker's yes − no."""
        if self.classifier is not None:
            return self.classifier.probabilities(logits)
        return torch.sigmoid(logits.float())

    def release_memory(self) -> None:
        """Hand back what the compiled passes keep for the shapes they have met (``backends.release_memory``): for
        a quiet moment after a burst, since the next pass prepares its shape again."""
        for backend in self.backends:
            release_memory(backend)

    def warm_up(self) -> None:
        """One forward pass on each attention path, so that the first request pays no start-up cost."""
        encodings = self.card.tokenizer.encode(["warm up"])
        self.embed_encodings(encodings, [EmbeddingSpec(self.card.config.n_layers, self.card.pooling.mode, True)])
        self.attention(encodings[0], AttentionSelection((self.card.config.n_layers - 1,), (0,)))


def _double(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.double().cpu()
