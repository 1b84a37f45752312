"""Which input tokens made a score: integrated gradients and gradient × input at the output of the embedding block,
computed as Captum's ``LayerIntegratedGradients`` (``method="gausslegendre"``) and ``LayerGradientXActivation`` compute
them on transformers' models.

Integrated gradients (Sundararajan, Taly and Yan, 2017) follow the straight path from a baseline's embeddings e₀ to
the input's e and integrate the score's gradient along it: a(e) = (e − e₀) ⊙ ∫₀¹ ∇f(e₀ + α (e − e₀)) dα, the integral
by Gauss–Legendre quadrature over ``steps`` points, several points a pass (each point is one row of a batch). Summed
over the hidden size that is one number per token, and the numbers sum to f(e) − f(e₀) up to the quadrature's error,
which is reported as the convergence delta. Gradient × input is e ⊙ ∇f(e), summed likewise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from model.spec.outputs import Attribution

Score = Callable[[Tensor], Tensor]  # the embedding block's output for S rows (S, T, D) → each row's score (S,)


def gauss_legendre(steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The quadrature's points α in (0, 1) and their weights, which sum to 1 (Captum's "gausslegendre")."""
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    return 0.5 * (nodes + 1), 0.5 * weights


def integrated_gradients(
    score: Score, embedded: Tensor, baseline: Tensor, steps: int, rows: int, at_baseline: Score | None = None
) -> Attribution:
    """Integrated gradients of ``score`` from ``baseline`` to ``embedded`` (both (T, D)), at most ``rows`` points a
    pass (forward and backward). ``at_baseline`` scores the baseline itself where that differs from ``score`` (a
    head that finds its token by the ids: the baseline's own)."""
    alphas, weights = gauss_legendre(steps)
    difference = embedded - baseline  # (T, D)
    gradients = torch.zeros_like(embedded)  # Σ weight · ∇f over the points
    for start in range(0, steps, rows):
        alpha, weight = (
            torch.tensor(values[start : start + rows], dtype=embedded.dtype, device=embedded.device)[:, None, None]
            for values in (alphas, weights)
        )
        points = (baseline + alpha * difference).requires_grad_(True)  # (S, T, D)
        (gradient,) = torch.autograd.grad(score(points).sum(), points)
        gradients += (gradient * weight).sum(0)
    with torch.no_grad():
        at_input, at_start = score(embedded[None])[0], (at_baseline or score)(baseline[None])[0]  # f at both ends
    attributions = (difference * gradients).sum(-1)  # (T,)
    delta = attributions.sum() - (at_input - at_start)
    return Attribution(attributions.detach().cpu().numpy(), float(at_input), float(at_start), float(delta))


def gradient_x_input(score: Score, embedded: Tensor) -> Attribution:
    """The embedding block's output times the score's gradient there, summed over the hidden size. (T, D) → (T,)"""
    point = embedded.detach()[None].requires_grad_(True)  # (1, T, D)
    value = score(point)
    (gradient,) = torch.autograd.grad(value.sum(), point)
    attributions = (point * gradient).sum(-1)[0]  # (T,)
    return Attribution(attributions.detach().cpu().numpy(), float(value.detach()[0]), None, None)
