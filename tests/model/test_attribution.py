"""Integrated gradients (model/nn/attribution.py) against Captum: the quadrature, and the attributions of a plain
function of several texts cut into passes, the ends scored apart or in the points' passes. The models' attributions
are checked against Captum on transformers' models over HTTP (tests/app/test_explain.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from captum.attr._utils.approximation_methods import approximation_parameters

from model.nn.attribution import gauss_legendre, integrated_gradients, passes


@pytest.mark.parametrize("steps", [1, 2, 7, 50, 256])
def test_the_points_and_weights_are_captums(steps: int) -> None:
    """α and the weights equal those of Captum's "gausslegendre" method, which the attributions are held to."""
    step_sizes, alphas = approximation_parameters("gausslegendre")
    ours_alphas, ours_weights = gauss_legendre(steps)
    np.testing.assert_allclose(ours_alphas, alphas(steps), rtol=0, atol=1e-15)
    np.testing.assert_allclose(ours_weights, step_sizes(steps), rtol=0, atol=1e-15)


def test_they_are_computed_once_and_cannot_be_changed() -> None:
    """A second explanation of as many steps gets the same arrays, not a fresh quadrature, and no caller can
    change them for the next."""
    first, second = gauss_legendre(50), gauss_legendre(50)
    assert first[0] is second[0] and first[1] is second[1]
    with pytest.raises(ValueError, match="read-only"):
        first[0][0] = 0.5
    assert gauss_legendre(51)[0] is not first[0]


LENGTHS = [9, 4, 6]  # three texts padded to 9 tokens, 5 wide


def a_score(mix: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A score as the explanations take one: the points (N, L, E) and the text each is of (N,) → (N,), a nonlinear
    function of the text's real tokens, with weights by text (texts ≥ R: the baselines', here the same)."""

    def score(points: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
        real = torch.arange(points.size(1)) < torch.tensor(LENGTHS)[texts % len(LENGTHS)][:, None]  # (N, L)
        values = torch.tanh(points @ mix[texts].unsqueeze(-1)).squeeze(-1)  # (N, L)
        return (values * real).sum(1) ** 2

    return score


@pytest.mark.parametrize("ends_in_passes", [False, True])
@pytest.mark.parametrize("tokens", [9 * 7, 1000])  # passes cut within a text and between texts; one pass
def test_integrated_gradients_equal_captums(ends_in_passes: bool, tokens: int) -> None:
    """Several texts of unlike length, their points cut into passes, the ends scored apart or in the points' passes
    (as on a GPU): each text's attributions, scores and convergence delta those of Captum's IntegratedGradients of the
    same function on that text alone; and steps computed in spans add up to the whole."""
    from captum.attr import IntegratedGradients

    torch.manual_seed(0)
    embedded, baseline = torch.randn(3, 9, 5, dtype=torch.float64), 0.1 * torch.randn(3, 9, 5, dtype=torch.float64)
    weights = torch.randn(3, 5, dtype=torch.float64)
    score = a_score(torch.cat([weights, weights]))
    ours = integrated_gradients(score, embedded, baseline, LENGTHS, 16, tokens, ends_in_passes=ends_in_passes)
    for text, (got, length) in enumerate(zip(ours, LENGTHS, strict=True)):
        alone = lambda x, text=text: score(x, torch.full((x.size(0),), text))  # noqa: E731
        theirs, delta = IntegratedGradients(alone).attribute(
            embedded[text : text + 1, :length],
            baselines=baseline[text : text + 1, :length],
            n_steps=16,
            method="gausslegendre",
            return_convergence_delta=True,
        )
        reference = theirs.sum(-1)[0].numpy()
        bound = 1e-7 * np.abs(reference).max()  # Captum scales the points by its α in float32
        np.testing.assert_allclose(got.attributions, reference, rtol=0, atol=bound)
        assert got.score == pytest.approx(float(alone(embedded[text : text + 1, :length])[0]), abs=1e-12)
        assert got.baseline_score == pytest.approx(float(alone(baseline[text : text + 1, :length])[0]), abs=1e-12)
        assert got.convergence_delta == pytest.approx(float(delta[0]), abs=length * bound)
    spans = [
        integrated_gradients(score, embedded, baseline, LENGTHS, 16, tokens, range(*span), ends_in_passes)
        for span in ((0, 5), (5, 16))
    ]
    for text, got in enumerate(ours):
        summed = spans[0][text].attributions + spans[1][text].attributions
        np.testing.assert_allclose(summed, got.attributions, rtol=0, atol=1e-12)
        assert spans[1][text].score == pytest.approx(got.score, abs=1e-12)


def test_the_ends_are_scored_with_the_baselines_own_ids() -> None:
    """Texts ≥ R stand for the baselines, scored with the baselines' ids (a decoder's head reads them): where those
    weigh differently, the score at the baseline is theirs, both ways."""
    torch.manual_seed(1)
    embedded, baseline = torch.randn(3, 9, 5, dtype=torch.float64), 0.1 * torch.randn(3, 9, 5, dtype=torch.float64)
    mix = torch.randn(6, 5, dtype=torch.float64)
    score = a_score(mix)
    for ends_in_passes in (False, True):
        got = integrated_gradients(score, embedded, baseline, LENGTHS, 8, 40, ends_in_passes=ends_in_passes)
        for text, answer in enumerate(got):
            expected = float(score(baseline[text : text + 1], torch.tensor([text + 3]))[0])
            assert answer.baseline_score == pytest.approx(expected, abs=1e-12)
            assert answer.score == pytest.approx(float(score(embedded[text : text + 1], torch.tensor([text]))[0]))


def test_a_pass_that_scores_the_ends_holds_their_rows() -> None:
    """With the ends in the points' passes, a text's first point counts three rows against the pass's tokens."""
    assert passes([4, 4], range(3), 20) == [[(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)], [(1, 2)]]
    assert passes([4, 4], range(3), 20, ends=True) == [[(0, 0), (0, 1), (0, 2)], [(1, 0), (1, 1), (1, 2)]]
