"""/info: the model, its architecture, device and dtype, and the limits in force."""

from __future__ import annotations

from app import __version__
from app.schemas import Architecture, InfoResponse, Limits
from app.serving.registry import ServedModel
from app.settings import Settings


def limits(served: ServedModel, settings: Settings) -> Limits:
    """The settings' limits, by their own names, plus the three that depend on the model."""
    from_settings = {name: getattr(settings, name) for name in Limits.model_fields if hasattr(settings, name)}
    return Limits(
        **from_settings
        | {
            "max_tokens_per_text": served.card.max_tokens,
            "max_attention_tokens": served.max_attention_tokens,
            "max_batch_tokens": served.facts.max_batch_tokens,
            "max_windows_per_request": settings.max_batch_texts,  # the windows are texts of one request
        }
    )


def info(served: ServedModel, settings: Settings) -> InfoResponse:
    card, config, facts = served.card, served.card.config, served.facts
    return InfoResponse(
        model=served.name,
        path=str(card.path),
        architecture=Architecture(
            layers=config.n_layers,
            heads=config.n_heads,
            hidden_size=config.d_model,
            intermediate_size=config.d_ff,
            vocab_size=config.vocab_size,
            max_positions=config.max_positions,
            position_embedding=config.position_embedding,
            family=config.family,
            position_encoding=config.position_embedding,
            activation=config.activation,
            pooling=card.pooling.mode,
            normalize=card.pooling.normalize,
            attention=config.attention,
            kv_heads=config.kv_heads,
            head_dim=config.head_dim,
            norm=config.norm,
            sliding_window=config.local_window or None,
            local_layers=list(config.local_layers),
            dimension=card.dimension,
        ),
        device=facts.device,
        dtype=facts.dtype,
        weights_dtype=facts.weights_dtype,
        explicit_weights_dtype=facts.explicit_weights_dtype,
        runtime=facts.runtime,
        rerank=next(iter(card.rerank_methods), None),
        sparse=card.sparse.kind if card.sparse is not None else None,
        multi_vector=card.multi_vector,
        limits=limits(served, settings),
        auth=bool(settings.api_keys),
        version=__version__,
    )
