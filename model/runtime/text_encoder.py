"""A loaded model: its card (model/spec/card.py), its weights on a device and the backends that run its embedding pass,
and the pass's prologue that every task shares (a batch padded, on the device, through the encoder). What each kind of
task computes with it — sentence and token vectors, sparse and multi-vector outputs, scores, attention maps and the
inspection views — is model/runtime/tasks.py's; loading one is model/runtime/loader.py's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from model.nn.encoder import LAST_ONLY, Encoder, EncoderOutput, Keep
from model.nn.heads import LanguageModelHead, MaskedLanguageModelHead, SequenceClassificationHead
from model.nn.pooling import Dense
from model.runtime.backends import EagerPass, PassBackend, TracedPass, release_memory, unwrapped
from model.runtime.graphs import GraphedPass
from model.runtime.tasks import attention_maps, embed_texts  # the library's calls, not the engine's (KINDS)
from model.spec.card import ModelCard
from model.spec.checkpoint import Pooling
from model.spec.outputs import AttentionSelection, EmbeddingSpec
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
    # Passes of batches the backends compute side by side at most (OpenVINO's streams: loader.py, ``openvino_passes``);
    # None where they set no bound of their own (torch's: as many as the caller's lanes).
    passes_at_once: int | None = None
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
        service's (``embed_texts``, model/runtime/tasks.py).
        """
        before = self.card.prompt(prompt_name, prompt)
        spec = EmbeddingSpec(
            self.card.resolve_layer(layer),
            pooling or self.card.pooling.mode,
            normalize_embeddings,
            skip=self.card.prompt_skip(before),
        )
        encodings = self.card.tokenizer.encode(self.card.prompted(texts, prompt_name, prompt), truncate=truncate)
        return torch.from_numpy(embed_texts(self, encodings, [spec] * len(encodings)).sentences)  # (B, D')

    def release_memory(self) -> None:
        """Hand back what the compiled passes keep for the shapes they have met (``backends.release_memory``): for
        a quiet moment after a burst, since the next pass prepares its shape again."""
        for backend in self.backends:
            release_memory(backend)

    def warm_up(self) -> None:
        """One forward pass on each attention path, so that the first request pays no start-up cost."""
        encodings = self.card.tokenizer.encode(["warm up"])
        embed_texts(self, encodings, [EmbeddingSpec(self.card.config.n_layers, self.card.pooling.mode, True)])
        attention_maps(self, encodings[0], AttentionSelection((self.card.config.n_layers - 1,), (0,)))
