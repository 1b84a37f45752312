"""The quadrature of integrated gradients (model/nn/attribution.py) against Captum's own; the attributions
themselves are checked against Captum over HTTP (tests/app/test_explain.py)."""

from __future__ import annotations

import numpy as np
import pytest
from captum.attr._utils.approximation_methods import approximation_parameters

from model.nn.attribution import gauss_legendre


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
