"""How far a variant's embeddings are from a reference's: what bench/runtimes.py and bench/cpu_peers.py report (numpy
alone, so that the peers' own environment reads it too)."""

from __future__ import annotations

import numpy as np


def top10_agreement(ours: np.ndarray, theirs: np.ndarray, queries: int = 100) -> float:
    """Mean share of each query's 10 nearest neighbours (cosine, among the texts after the queries) that are the
    reference's too."""
    shared = []
    for q in range(queries):
        mine = np.argsort(-(ours[queries:] @ ours[q]))[:10]
        reference = np.argsort(-(theirs[queries:] @ theirs[q]))[:10]
        shared.append(len(set(mine) & set(reference)) / 10)
    return float(np.mean(shared))


def accuracy_cells(vectors: np.ndarray, reference: np.ndarray) -> str:
    """A variant's least and mean cosine to the reference (both normalised) and its top-10 agreement, as three cells
    of a Markdown table row."""
    cosine = (vectors * reference).sum(axis=1)
    return f"{cosine.min():.6f} | {cosine.mean():.6f} | {top10_agreement(vectors, reference):.3f}"
