"""Pearson's chi-square goodness-of-fit test, shared by the statistical losslessness tests."""

from __future__ import annotations

from collections.abc import Sequence

import torch

MIN_EXPECTED = 5.0  # outcomes expected fewer times share one bin (the usual validity rule)


def chi_square(
    counts: torch.Tensor, probs: torch.Tensor, min_expected: float = MIN_EXPECTED
) -> tuple[float, int, float]:
    """Statistic, degrees of freedom and p-value of observed counts against probabilities.

    The p-value is the chi-square survival function, the regularised upper incomplete gamma
    function Q(dof / 2, stat / 2).
    """
    counts = counts.double()
    expected = probs.double() * counts.sum()
    big = expected >= min_expected
    observed_bins = torch.cat([counts[big], counts[~big].sum()[None]])
    expected_bins = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected_bins > 0
    observed_bins, expected_bins = observed_bins[keep], expected_bins[keep]
    statistic = float(((observed_bins - expected_bins) ** 2 / expected_bins).sum())
    dof = int(keep.sum()) - 1
    half = torch.tensor([dof / 2, statistic / 2], dtype=torch.float64)
    return statistic, dof, float(torch.special.gammaincc(half[0], half[1]))


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return chi_square(counts, probs)[2]


def joint_counts(
    token_id_lists: Sequence[Sequence[int]], vocab_size: int, num_measured: int
) -> torch.Tensor:
    """Counts [vocab_size ** num_measured] of the first num_measured tokens of each sequence,
    indexed as base-vocab_size numbers (first token most significant)."""
    counts = torch.zeros(vocab_size**num_measured, dtype=torch.float64)
    for token_ids in token_id_lists:
        index = 0
        for token_id in token_ids[:num_measured]:
            index = index * vocab_size + token_id
        counts[index] += 1
    return counts
