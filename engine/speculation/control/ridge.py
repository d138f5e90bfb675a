"""The cost model's solver (cost_model.py): weighted ridge least squares with non-negative
coefficients, its ridge toward a prior, and a penalty that holds the slopes of a piecewise-
linear term's neighbouring segments together; the samples' relative-error weights and a fast
median. Pure numpy, nothing about steps.
"""

from __future__ import annotations

import numpy as np

# How strongly neighbouring row segments are held to one slope (seconds per row): without it a
# segment no step reached rested at its prior, and the profile's prior is flat past the rows it
# timed. On the Qwen pair a 3 s profile timed one request's chains only (1-5 rows) and priced
# 128 rows at 0.27 s where they take ~1.1; under load `auto` then verified 12 requests' chains
# (48-60 rows) as if rows were nearly free and ran 1.28x off's latency at x2, one repeat 1.57x
# (docs/benchmarks.md §5zs). Held to the last slope seen, an unseen segment continues it; a
# measured kink (the 5 -> 6 rows jump) still stands, as a sample outweighs this pull.
SLOPE_SMOOTHING = 0.1
# The ridge on a segment's slope, a share of the others' ridge: each unseen segment keeps
# 1 - sqrt(RAMP_RIDGE x ridge / SLOPE_SMOOTHING) of its neighbour's slope (0.997 here; with the
# full ridge, 0.90, and 128 rows were priced at 0.76 of a slope that held).
RAMP_RIDGE = 1e-3


def relative_weights(seconds: np.ndarray, min_seconds: float) -> np.ndarray:
    """Least-squares weights that make each sample's error count relative to its seconds
    (scaled to 1 at the median, which keeps the ridge's weight): the policy compares plans
    by ratios, and steps span 40 ms to seconds. Absolute errors let a few long steps set
    the fit; on the Qwen pair a 1.3 s catch-up sample priced a first draft (pass and row) at
    0 and a second at 36 ms, measured 16 and 21 (docs/benchmarks.md §5l)."""
    seconds = np.maximum(seconds, min_seconds)
    return (median(seconds) / seconds) ** 2


def median(values: np.ndarray) -> float:
    """np.median of a 1-d array by a partial sort: a quarter of np.median's time on a
    window's few hundred values (its checks and copies dominate there)."""
    n = len(values)
    half = n // 2
    if n % 2:
        return float(np.partition(values, half)[half])
    lower, upper = np.partition(values, (half - 1, half))[half - 1 : half + 1]
    return 0.5 * float(lower + upper)


def slope_penalty(
    num_features: int, first: int, widths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(the ridge's scale per coefficient, SLOPE_SMOOTHING x D'D) for coefficients whose
    columns first .. first + len(widths) - 1 are ramps over segments of those widths: a ramp's
    coefficient is the seconds across its segment, so its ridge is taken on its slope (divided
    by the width squared, times RAMP_RIDGE; a wide unseen segment is otherwise held near its
    prior's seconds by the ridge alone), and D differences neighbouring segments' slopes."""
    ramps = len(widths)
    scale = np.ones(num_features)
    scale[first : first + ramps] = RAMP_RIDGE / widths**2
    d = np.zeros((ramps - 1, num_features))
    for j in range(ramps - 1):
        d[j, first + j] = -1.0 / widths[j]
        d[j, first + j + 1] = 1.0 / widths[j + 1]
    return scale, SLOPE_SMOOTHING * d.T @ d


def nonnegative_ridge(
    x: np.ndarray,
    y: np.ndarray,
    weights: np.ndarray,
    ridge: float,
    prior: np.ndarray,
    smooth: tuple[np.ndarray, np.ndarray],
) -> np.ndarray:
    """argmin sum w (x.theta - y)^2 + ridge sum s (theta - prior)^2 + theta' S theta with
    theta >= 0, where `smooth` = (s, S) (slope_penalty), by a small active-set pass: drop
    negative coefficients and re-solve (exact NNLS is not needed here)."""
    hessian = x.T @ (weights[:, None] * x)
    scale, penalty = smooth
    hessian.flat[:: x.shape[1] + 1] += ridge * scale  # + ridge * diag(s)
    hessian += penalty
    target = x.T @ (weights * y) + ridge * scale * prior
    theta = np.linalg.solve(hessian, target)  # every coefficient free: no index copies
    free = np.ones(x.shape[1], dtype=bool)
    for _ in range(x.shape[1] - 1):
        if (theta >= 0.0).all():
            break
        free &= theta > 0.0
        theta = np.zeros(x.shape[1])
        theta[free] = np.linalg.solve(hessian[np.ix_(free, free)], target[free])
    return np.maximum(theta, 0.0)
