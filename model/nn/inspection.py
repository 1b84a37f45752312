"""What the inspection endpoints compute from a forward pass: attention selected, weighted by value norms,
aggregated and merged into words; head statistics; token-by-token explanations of a similarity.

Shape key: B texts, L layers, H heads, T tokens, W words, D model width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from model.spec.outputs import AttentionSelection


def head_mean(attention: Tensor) -> Tensor:
    """(L, H, T, T) → (L, 1, T, T): the average over heads."""
    return attention.mean(dim=1, keepdim=True)


def attention_rollout(attention: Tensor) -> Tensor:
    """Abnar & Zuidema (2020): per layer, head mean plus identity with rows renormalised, multiplied up.

    (L, H, T, T) → (L, T, T), entry l being the rollout through layers 0..l.
    """
    T = attention.size(-1)
    mixed = attention.mean(dim=1) + torch.eye(T, dtype=attention.dtype, device=attention.device)  # (L, T, T)
    mixed = mixed / mixed.sum(dim=-1, keepdim=True)  # (L, T, T), rows sum to 1
    rollout = [mixed[0]]
    for layer in mixed[1:]:
        rollout.append(layer @ rollout[-1])  # (T, T)
    return torch.stack(rollout)  # (L, T, T)


def select_attention(attentions: Tensor, selection: AttentionSelection) -> Tensor:
    """The selected layers and heads of (L', H, T, T) maps, L' ≥ deepest selected layer + 1, aggregated.

    → (L, H', T, T) for ``none``, (L, 1, T, T) for ``mean`` and ``rollout``. Rollout runs through every
    computed layer below each selected one, over the selected heads.
    """
    L, H = attentions.shape[:2]
    every_head = list(selection.heads) == list(range(H))
    heads = attentions if every_head else attentions[:, list(selection.heads)]  # (L', H', T, T)
    layers = list(selection.layers)
    if selection.aggregate == "none":
        return heads if layers == list(range(L)) else heads[layers]  # (L, H', T, T): no copy when all are asked
    if selection.aggregate == "mean":
        return head_mean(heads[layers])  # (L, 1, T, T)
    if selection.aggregate == "rollout":
        return attention_rollout(heads)[layers].unsqueeze(1)  # (L, 1, T, T)
    raise ValueError(f"aggregate must be none, mean or rollout, got {selection.aggregate!r}")


def norm_weighted(attention: Tensor, value_norms: Tensor) -> Tensor:
    """Kobayashi et al. (2020): ‖α_ij f_h(x_j)‖ = α_ij ‖f_h(x_j)‖. (L, H, T, T) and (L, H, T) → (L, H, T, T)."""
    return attention * value_norms.unsqueeze(-2)  # key j's norm scales column j


def merge_words(maps: Tensor, words: Sequence[Sequence[int]]) -> Tensor:
    """Clark et al. (2019): the maps of tokens made maps of words. (..., T, T) → (..., W, W).

    A word's row is the mean of its tokens' rows (what the word as a query attends to), its column the sum of
    its tokens' columns (the weight put on any part of it), so rows that summed to 1 still do.
    """
    T = maps.size(-1)
    rows = torch.zeros(len(words), T, dtype=maps.dtype, device=maps.device)  # (W, T): averages of rows
    columns = torch.zeros(T, len(words), dtype=maps.dtype, device=maps.device)  # (T, W): sums of columns
    for w, positions in enumerate(words):
        rows[w, list(positions)] = 1.0 / len(positions)
        columns[list(positions), w] = 1.0
    return rows @ maps @ columns  # (..., W, W)


def head_statistics(attention: Tensor, lengths: Tensor, separators: Tensor, punctuation: Tensor) -> Tensor:
    """Each statistic of HEAD_STATISTICS for each text and head of one layer, the mean over the text's queries.

    attention (B, H, T, T) is a padded batch's (padding keys weigh 0, padding queries are left out), lengths (B,)
    the texts' token counts, separators and punctuation (B, T) which keys are separators and punctuation.
    → (S, B, H) in float64; to_previous and to_next are NaN for a text of one token (no neighbour to average).
    """
    A = attention.double()  # (B, H, T, T)
    B, H, T, _ = A.shape
    position = torch.arange(T, device=A.device)
    queries = (position[None, :] < lengths[:, None]).double()  # (B, T): real query positions
    n_queries = lengths.double()  # (B,)
    distance = (position[None, :] - position[:, None]).abs().double()  # (T, T): |i − j|
    per_query = {
        "entropy": torch.special.entr(A).sum(-1),  # (B, H, T): −Σ_j A ln A, with 0 ln 0 = 0
        "distance": (A * distance).sum(-1),
        "to_cls": A[..., 0],
        "to_sep": torch.einsum("bhij,bj->bhi", A, separators.double()),
        "to_punctuation": torch.einsum("bhij,bj->bhi", A, punctuation.double()),
        "to_self": torch.diagonal(A, dim1=-2, dim2=-1),
    }
    statistics = [(values * queries[:, None, :]).sum(-1) / n_queries[:, None] for values in per_query.values()]
    # Neighbours: A[i, i − 1] for i = 1 … T − 1 and A[i, i + 1] for i = 0 … T − 2: T − 1 positions each.
    pairs = (position[None, : T - 1] < (lengths[:, None] - 1)).double()  # (B, T − 1)
    n_pairs = (lengths.double() - 1)[:, None]  # (B, 1), 0 for a text of one token
    for offset in (-1, 1):
        neighbour = torch.diagonal(A, offset=offset, dim1=-2, dim2=-1)  # (B, H, T − 1)
        statistics.append((neighbour * pairs[:, None, :]).sum(-1) / n_pairs)  # 0 / 0 = NaN for one token
    return torch.stack(statistics)  # (S, B, H)


def pooling_weights(n: int, pooling: str, skip: int = 0) -> Tensor:
    """The weights w (n,), summing to 1, with which a pooling that is a weighted sum of the token vectors makes
    the sentence vector Σ w_i x_i: mean (1/n each; the mean over √n points the same way), the weighted mean
    (position + 1, from the first token), the first or the last token. The first ``skip`` tokens (a prompt the
    model leaves out) weigh 0."""
    position = torch.arange(n, dtype=torch.float64)
    counted = (position >= skip).double()  # (n,)
    if pooling in ("mean", "mean_sqrt_len_tokens"):
        weights = counted
    elif pooling == "weightedmean":
        weights = counted * (position + 1)
    elif pooling in ("cls", "lasttoken"):
        weights = torch.zeros(n, dtype=torch.float64)
        weights[skip if pooling == "cls" else n - 1] = 1.0
    else:
        raise ValueError(f"pooling {pooling!r} is not a weighted sum of the token vectors")
    return weights / weights.sum()


EXPLANATION_METHODS = {
    "mean": "mean_pooling_exact",
    "mean_sqrt_len_tokens": "mean_pooling_exact",  # the same direction as the mean: the same cosine
    "weightedmean": "weighted_mean_exact",
    "cls": "cls_token",
    "lasttoken": "last_token",
    "max": "max_pooling_component_holders",
}


def explain_similarity(
    a: Tensor,
    b: Tensor,
    pooling: str,
    project: Callable[[Tensor], Tensor] | None = None,
    skips: tuple[int, int] = (0, 0),
) -> tuple[Tensor, str]:
    """Token-by-token contributions to the cosine of two pooled sentence vectors, summing to it exactly.

    a (n, D) and b (m, D) are the final token vectors of the two texts (every token the pooling sees). The
    cosine is bilinear in the pooled vectors, ā · b̄ / (‖ā‖ ‖b̄‖), and each pooling writes them as sums over
    tokens, so the cosine splits into one term per (source token, text token):

    - a weighted sum (``pooling_weights``: mean, weighted mean, first token, last token), ā = Σ_i w_i a_i, so
      contribution[i][j] = w_i v_j a_i · b_j / (‖ā‖ ‖b̄‖); for the mean, a_i · b_j / (n m ‖ā‖ ‖b̄‖) (API.md's
      formula); for the first (last) token, the whole score in that pair of tokens;
    - ``max``: component k of ā is that of the token holding the maximum, i*(k); so contribution[i][j] =
      Σ over k with i*(k) = i and j*(k) = j of a_ik b_jk / (‖ā‖ ‖b̄‖): each component credited to the two
      tokens that hold it.

    ``project`` maps token vectors through the model's Dense modules after pooling, which must be affine (then
    f(Σ w_i a_i) = Σ w_i f(a_i), as the weights sum to 1); ``skips`` the first tokens of each text the pooling
    leaves out (a prompt), which contribute 0. Returns the (n, m) matrix and the method's name.
    """
    if project is not None:
        if pooling == "mean_sqrt_len_tokens":  # its weights sum to √n, not 1: an affine map does not go through
            raise ValueError("mean_sqrt_len_tokens pooling is explained on the token vectors themselves")
        a, b = project(a), project(b)  # (n, D'), (m, D')
    a, b = a.double(), b.double()
    if pooling == "max":
        if project is not None or any(skips):
            raise ValueError("max pooling is explained on the token vectors themselves, with no Dense module")
        holders_a = F.one_hot(a.argmax(0), a.size(0)).T.to(a.dtype)  # (n, D): 1 where token i holds component k
        holders_b = F.one_hot(b.argmax(0), b.size(0)).T.to(b.dtype)  # (m, D)
        pooled_a, pooled_b = a.max(0).values, b.max(0).values  # (D,)
        scale = pooled_a.norm() * pooled_b.norm()
        return ((a * holders_a) @ (b * holders_b).T) / scale, EXPLANATION_METHODS[pooling]  # (n, m)
    w, v = pooling_weights(a.size(0), pooling, skips[0]), pooling_weights(b.size(0), pooling, skips[1])  # (n,), (m,)
    weighted_a, weighted_b = a * w[:, None], b * v[:, None]  # (n, D), (m, D)
    scale = weighted_a.sum(0).norm() * weighted_b.sum(0).norm()
    return (weighted_a @ weighted_b.T) / scale, EXPLANATION_METHODS[pooling]  # (n, m)
