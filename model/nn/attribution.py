"""Which input tokens made a score: integrated gradients and gradient × input at the output of the embedding block,
computed as Captum's ``LayerIntegratedGradients`` (``method="gausslegendre"``) and ``LayerGradientXActivation`` compute
them on transformers' models.

Integrated gradients (Sundararajan, Taly and Yan, 2017) follow the straight path from a baseline's embeddings e₀ to
the input's e and integrate the score's gradient along it: a(e) = (e − e₀) ⊙ ∫₀¹ ∇f(e₀ + α (e − e₀)) dα, the integral
by Gauss–Legendre quadrature over ``steps`` points, several points a pass (each point is one row of a batch), the
points of several texts in the same passes. Summed over the hidden size that is one number per token, and the numbers
sum to f(e) − f(e₀) up to the quadrature's error, which is reported as the convergence delta. Gradient × input is
e ⊙ ∇f(e), summed likewise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from model.spec.outputs import Attribution

# The embedding block's output of N points (N, L, E) and the text each point is of (N,) → each point's score (N,):
# the points may be cut to their texts' longest length L (the rest is padding). Of R texts, a point of text i < R is
# scored with text i's token ids; i ≥ R stands for the baseline of text i − R, scored with the baseline's own ids
# (where a head reads the ids: a decoder's last token that is not padding), as transformers' model given them does.
Score = Callable[[Tensor, Tensor], Tensor]


@functools.lru_cache(maxsize=64)
def gauss_legendre(steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The quadrature's points α in (0, 1) and their weights, which sum to 1 (Captum's "gausslegendre"), read-only.

    Computed once for each number of steps: numpy's nodes are the eigenvalues of a steps × steps matrix refined by
    Newton's method, 1.2-1.6 ms for 50 steps on a GPU host's core, paid by every explanation where its pass took
    5.8 ms of the device (docs/benchmarks/cuda.md)."""
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    alphas, weights = 0.5 * (nodes + 1), 0.5 * weights
    alphas.setflags(write=False)
    weights.setflags(write=False)
    return alphas, weights


def passes(lengths: list[int], steps: range, tokens: int, ends: bool = False) -> list[list[tuple[int, int]]]:
    """Every text's points of ``steps``, (text, step), text by text, cut into passes: as many points a pass as keep it
    within ``tokens`` (rows × the longest of their texts), one at least. With ``ends`` a text's first point counts
    three rows: the pass that holds it scores the text at both ends too (``integrated_gradients``)."""
    cut: list[list[tuple[int, int]]] = [[]]
    rows = longest = 0
    for text, length in enumerate(lengths):
        for step in steps:
            need = 3 if ends and step == steps[0] else 1
            if cut[-1] and (rows + need) * max(longest, length) > tokens:
                cut.append([])
                rows = longest = 0
            cut[-1].append((text, step))
            rows += need
            longest = max(longest, length)
    return cut


def integrated_gradients(
    score: Score,
    embedded: Tensor,
    baseline: Tensor,
    lengths: list[int],
    steps: int,
    tokens: int,
    span: range | None = None,
    ends_in_passes: bool = False,
) -> list[Attribution]:
    """Integrated gradients of ``score`` from ``baseline`` to ``embedded`` (both (R, T, E): R texts, padded to T;
    ``lengths`` their real tokens), the points of every text computed together, ``tokens`` a pass at most (forward and
    backward; ``passes``); the score at both ends, for the answer and its convergence delta, in one pass of both.
    ``span``: the quadrature's points computed, of ``steps`` (all where None); the attributions of spans that cover
    the steps add up to the whole, and the caller takes the convergence delta of their sum (each span's own is of its
    part).

    With ``ends_in_passes`` the ends are scored in the pass that holds a text's first point instead, as two more rows
    that take no gradient. Why: on a GPU an explanation is bound by the host's launches (384 kernels taking 5.8 ms of
    the device in 19-24 ms, docs/benchmarks/cuda.md), and a pass of their own was 28 % of its operations; on a CPU,
    bound by the arithmetic, the two rows through the backward cost more than the small pass they save (1.00-1.03x)."""
    alphas, weights = gauss_legendre(steps)
    computed, device, R = span or range(steps), embedded.device, len(lengths)
    difference = embedded - baseline  # (R, T, E)
    gradients = torch.zeros_like(embedded)  # Σ weight · ∇f over each text's points
    both = torch.cat([embedded, baseline])  # (2R, T, E): text i's input, and at R + i its baseline
    at_ends = embedded.new_zeros(2 * R)  # f at each text's input (i) and at its baseline (R + i)
    for points_of in passes(lengths, computed, tokens, ends_in_passes):
        texts = torch.tensor([text for text, _ in points_of], device=device)
        alpha, weight = (
            torch.tensor([values[step] for _, step in points_of], dtype=embedded.dtype, device=device)
            for values in (alphas, weights)
        )
        length = max(lengths[text] for text, _ in points_of)
        start, way = baseline[texts, :length], difference[texts, :length]  # (S, L, E) each
        points = (start + alpha[:, None, None] * way).requires_grad_(True)
        begin = [text for text, step in points_of if step == computed[0]] if ends_in_passes else []
        if begin:  # the k texts whose points begin here, at both ends (texts ≥ R: scored with the baselines' ids)
            ends = torch.tensor(begin + [text + R for text in begin], dtype=torch.long, device=device)  # (2k,)
            scored = score(torch.cat([points, both[ends, :length]]), torch.cat([texts, ends]))  # (S + 2k,)
            at_ends[ends] = scored[len(points_of) :].detach()
        else:
            scored = score(points, texts)  # (S,)
        (gradient,) = torch.autograd.grad(scored[: len(points_of)].sum(), points)
        gradients[:, :length].index_add_(0, texts, gradient * weight[:, None, None])
    if not ends_in_passes:
        with torch.no_grad():  # f at the inputs and at the baselines (texts ≥ R), in one pass (2R,)
            at_ends = score(both, torch.arange(2 * R, device=device))
    at_input, at_start = at_ends[: len(lengths)], at_ends[len(lengths) :]
    attributions = (difference * gradients).sum(-1)  # (R, T)
    return [
        Attribution(
            row[:length].detach().cpu().numpy(),
            float(at_input[text]),
            float(at_start[text]),
            float(row[:length].sum() - (at_input[text] - at_start[text])),
        )
        for text, (row, length) in enumerate(zip(attributions, lengths, strict=True))
    ]


def gradient_x_input(score: Score, embedded: Tensor, lengths: list[int]) -> list[Attribution]:
    """The embedding block's output times the score's gradient there, summed over the hidden size, for each of R
    texts at once. (R, T, E) → (T,) per text, cut to its ``lengths``."""
    point = embedded.detach().requires_grad_(True)  # (R, T, E)
    value = score(point, torch.arange(len(lengths), device=embedded.device))
    (gradient,) = torch.autograd.grad(value.sum(), point)
    attributions, scores = (point * gradient).sum(-1), value.detach()  # (R, T), (R,)
    return [
        Attribution(row[:length].detach().cpu().numpy(), float(scores[text]), None, None)
        for text, (row, length) in enumerate(zip(attributions, lengths, strict=True))
    ]
