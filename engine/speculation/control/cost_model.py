"""Step-time cost model: how many seconds one engine step takes, predicted from its shape.

The goodput policy divides expected emitted tokens by this prediction (DESIGN §6, SmartSpec
arXiv 2406.14066), so a prediction must be positive, cheap (hundreds per step) and follow drift.
The model is linear in a few shape features plus a piecewise-linear term in batched rows (one
ramp per segment between the knots of step_features.ROW_KNOTS, so a measured jump between two
row counts, or the change from memory-bound to compute-bound matmuls, is representable), fixed
costs per speculating request, per draft-model pass, per eager (non-graph) step and per step
that verifies any drafts, a term per token a draft model feeds to catch up (apart from its
passes), refitted on the last `window` steps by weighted ridge least squares (ridge.py):

    theta = argmin  sum_t w_t (x_t . theta - seconds_t)^2 + ridge |theta - prior|^2_s
                    + SLOPE_SMOOTHING sum_j (slope_j+1 - slope_j)^2,      theta >= 0

where slope_j is row segment j's seconds per row and |.|_s takes the ramps' ridge on their
slopes: a segment no step reached continues the last slope measured (docs/benchmarks.md §5zs).

w_t = forgetting^age x a Huber-style weight from a few reweighting passes, so a step stalled by
something else (a busy core, GC) cannot drag the fit, x (median seconds / seconds_t)^2, so each
step's error counts relative to its length (a 1 s prefill does not outweigh 40 ms decodes).
theta >= 0: work never makes a step faster, which keeps the policy's marginal costs sane.
Directions the window does not excite (draft steps while nobody speculates) rest at the prior:
the start-up profile's fit.

The profile's own samples stay in every refit as anchors, at ANCHOR_WEIGHT each (the window's
~100 effective samples outweigh them ~4:1 where both speak): live traffic fills the window from
a narrow region (a batch with a few speculating requests, noisy prefills), and a window alone
then extrapolates the shapes it never sees, such as every request speculating, by collinear
accidents (on an H200 the refit priced 16 speculating requests at 1.7x their measured time, so
goodput stopped speculating on chat under load; docs/benchmarks.md §4e).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from engine.speculation.control.ridge import (
    median,
    nonnegative_ridge,
    relative_weights,
    slope_penalty,
)
from engine.speculation.control.step_features import (
    FEATURE_NAMES,
    ROW_KNOTS,
    StepFeatures,
)
from kernels.graph_shapes import NO_GRAPHS, GraphShapes

# Fixed feature scales keep the normal equations well conditioned; coefficients() undoes them.
# Powers of two, so scaling and unscaling are exact.
_SCALES = (1.0, 256.0, *(1.0,) * (len(ROW_KNOTS) - 1), 16.0, 16384.0, 64.0, 4.0, 16.0, 1.0)
_SCALES += (256.0, 256.0, 1.0)  # eager rows, catch-up tokens, verify steps
_NUM_RAMPS = len(ROW_KNOTS) - 1
_FIRST_RAMP = FEATURE_NAMES.index("rows_1_2")  # after the intercept and the rows' slope
_TAIL = _FIRST_RAMP + _NUM_RAMPS  # the terms after the ramps: requests, kv tokens, ...
_INVERSE_SCALES = 1.0 / np.array(_SCALES)


_KNOTS_LO = np.array(ROW_KNOTS[:-1], dtype=float)
_KNOTS_WIDTH = np.diff(np.array(ROW_KNOTS, dtype=float))
# The row ramps' slopes held together in every fit (ridge.py: an unseen segment continues the
# last slope measured; docs/benchmarks.md §5zs).
_SMOOTH = slope_penalty(len(FEATURE_NAMES), _FIRST_RAMP, _KNOTS_WIDTH)


def feature_vectors(features: Sequence[StepFeatures]) -> np.ndarray:
    """The model's scaled feature rows (FEATURE_NAMES) of many steps at once: the row terms
    read a step's rows per _split_rows, each ramp how far they crossed its segment between
    consecutive knots, in [0, 1]. Written column by column into one array: a refit runs
    between engine steps, where every numpy call is cold (docs/benchmarks.md §5zi)."""
    raw = np.array(
        [
            (
                f.num_batched_tokens,
                f.num_eager_steps,
                f.num_graph_rows,
                f.num_requests,
                f.num_kv_tokens,
                f.num_draft_tokens,
                f.num_draft_steps,
                f.num_spec_requests,
                f.num_catchup_tokens,
            )
            for f in features
        ],
        dtype=float,
    ).reshape(-1, 9)
    batched, eager, graph_rows = raw[:, 0], raw[:, 1] > 0, raw[:, 2]
    rows = np.where(eager, 0.0, np.where(graph_rows > 0, graph_rows, batched))
    x = np.empty((len(raw), len(FEATURE_NAMES)))
    x[:, 0] = 1.0
    x[:, 1] = rows
    ramps = x[:, _FIRST_RAMP:_TAIL]
    np.clip((rows[:, None] - _KNOTS_LO) / _KNOTS_WIDTH, 0.0, 1.0, out=ramps)
    x[:, _TAIL : _TAIL + 5] = raw[:, 3:8]  # requests, kv, drafts, draft steps, spec requests
    x[:, _TAIL + 5] = eager
    x[:, _TAIL + 6] = np.where(eager, batched, 0.0)  # eager rows
    x[:, _TAIL + 7] = raw[:, 8]  # catch-up tokens
    x[:, _TAIL + 8] = raw[:, 7] > 0  # verify steps: any speculating request
    x *= _INVERSE_SCALES
    return x


def _replayed(
    base: StepFeatures, drafts: np.ndarray, spec: np.ndarray, graphs: GraphShapes
) -> tuple[np.ndarray, np.ndarray]:
    """StepFeatures.with_drafts's eager flag and graph rows, for arrays of plans."""
    drafts, spec = np.broadcast_arrays(drafts, spec)
    longest = np.where(spec > 0, -(-drafts // np.maximum(spec, 1)), 0)
    query_len = np.maximum(base.max_query_len, np.where(drafts > 0, 1 + longest, 0))
    eager = np.full(drafts.shape, bool(base.num_eager_steps))
    if graphs.eager_on_drafts:
        eager |= drafts > 0
    if graphs.enabled:
        eager |= query_len > graphs.max_query_len
    if not graphs.enabled or not 0 < base.num_requests <= graphs.batch_sizes[-1]:
        return eager, np.zeros(drafts.shape)
    batch, _ = graphs.padded(base.num_requests, 1)
    return eager, np.where(eager, 0.0, batch * query_len)


def _split_rows(f: StepFeatures) -> tuple[int, int]:
    """(rows of an eager step, rows of any other step): a step that leaves the CUDA-graph path
    pays per row on its own term, so that prefill chunks (eager, hundreds of rows) do not set
    the row ramps that price replayed verification (tens of rows, nearly free). A replayed
    step's rows are those its graph computes, padding included."""
    rows = f.num_batched_tokens
    return (rows, 0) if f.num_eager_steps else (0, f.num_graph_rows or rows)


OUTLIER_FACTOR = 3.0  # log errors beyond this many times the median one are down-weighted
ANCHOR_WEIGHT = 0.2  # weight of each profile sample in a refit (a window sample's is <= 1)


class StepCostModel(Protocol):
    num_observations: int

    def predict(self, features: StepFeatures) -> float: ...  # seconds, > 0

    def observe(self, features: StepFeatures, measured_seconds: float) -> None: ...

    @property
    def fitted(self) -> bool: ...

    def accuracy(self) -> float | None: ...  # recent median |predicted - measured| / measured


class OnlineLinearCostModel:
    """Linear step-time model refitted online; see the module docstring for the objective."""

    def __init__(
        self,
        window: int = 256,
        forgetting: float = 0.99,
        ridge: float = 1e-3,
        min_seconds: float = 1e-6,
        refit_every: int = 1,
        refit_share: float = 0.0,
    ) -> None:
        """refit_every: observations between refits of the window when predicting;
        refit_share: besides, the observed steps since the last refit must have lasted the
        last refit's seconds over this share (0: no such bound). A refit costs 0.3-0.6 ms
        between engine steps (its arrays and numpy's code are cold there; ~0.15 ms in a
        loop), a tenth of a batch-1 SmolLM2 step on the AVX-512 kernels: the engine refits
        at most every 8 steps and within 0.25% of the steps' time (docs/benchmarks.md §5zd,
        §5zi: near saturation every such share comes out several times over in latency)."""
        if not 0.0 < forgetting <= 1.0 or window < 1 or refit_every < 1 or refit_share < 0.0:
            raise ValueError(
                "need 0 < forgetting <= 1, window >= 1, refit_every >= 1 and refit_share >= 0, "
                f"got {forgetting}, {window}, {refit_every}, {refit_share}"
            )
        self.forgetting = forgetting
        self.ridge = ridge
        self.min_seconds = min_seconds
        self.num_observations = 0
        self._samples: deque[tuple[StepFeatures, float]] = deque(maxlen=window)
        # The same window as a ring buffer: slot i holds observation i mod window, written at
        # the refit that first reads it (_write_ring: one array op, not one per step).
        self._x = np.zeros((window, len(FEATURE_NAMES)))  # scaled features
        self._y = np.zeros(window)  # seconds
        self._count = 0  # observations ever taken into the window
        self._written = 0  # of them, those written to the ring
        self._errors: deque[float] = deque(maxlen=64)  # relative, for accuracy()
        self._prior = np.zeros(len(FEATURE_NAMES))
        self._anchors: list[tuple[StepFeatures, float]] = []  # the profile's samples
        self._anchor_x = np.zeros((0, len(FEATURE_NAMES)))
        self._anchor_y = np.zeros(0)
        self._seeded = False  # profiled or loaded: trust it before num_observations is large
        self._set_theta(self._prior)
        self._ever_solved = False  # the prior is not a fit
        self.refit_every, self.refit_share = refit_every, refit_share
        self._pending = 0  # observations since the last refit
        self._pending_seconds = 0.0  # their measured seconds
        self._refit_seconds = 0.0  # what the last refit took

    def predict(self, features: StepFeatures) -> float:
        if self._dirty and self._refit_due():
            self._refit()
        # Written out (not feature_vectors): the policy calls this hundreds of times a step.
        c, f = self._coefficients, features
        eager_rows, rows = _split_rows(f)
        seconds = self._row_seconds(rows)
        tail = c[_TAIL:]
        seconds += tail[0] * f.num_requests + tail[1] * f.num_kv_tokens
        seconds += tail[2] * f.num_draft_tokens + tail[3] * f.num_draft_steps
        seconds += tail[4] * f.num_spec_requests + tail[5] * f.num_eager_steps
        seconds += tail[6] * eager_rows + tail[7] * f.num_catchup_tokens
        if f.num_spec_requests:
            seconds += tail[8]
        return max(self.min_seconds, seconds)

    def predict_drafts(
        self,
        base: StepFeatures,
        num_draft_tokens: np.ndarray,
        num_spec_requests: np.ndarray,
        num_draft_steps: np.ndarray | int = 0,
        graphs: GraphShapes = NO_GRAPHS,
    ) -> np.ndarray:
        """predict(base.with_drafts(d, s, p, graphs)) for arrays of d, s, p at once (the
        search's candidate plans). Equal to the scalar predictions up to float rounding."""
        if self._dirty and self._refit_due():
            self._refit()
        c, f = self._coefficients, base
        drafts = np.asarray(num_draft_tokens, dtype=float)
        spec = np.asarray(num_spec_requests)
        rows = f.num_batched_tokens + drafts
        # Without graphs and with a base that is not eager, no plan runs eagerly: every plan's
        # rows are priced on the row terms, and the eager terms add zeros (left out: the same
        # floats).
        eager_terms = graphs.enabled or f.num_eager_steps
        if eager_terms:
            eager, graph_rows = _replayed(f, drafts, spec, graphs)
            rows_priced = np.where(graph_rows > 0, graph_rows, rows)
        else:
            rows_priced = rows
        ramps = np.interp(rows_priced, ROW_KNOTS, self._ramp_sums)
        row_seconds = c[0] + c[1] * rows_priced + ramps
        if eager_terms:
            row_seconds = np.where(eager, c[0], row_seconds)
        tail = c[_TAIL:]
        steps = np.maximum(f.num_draft_steps, num_draft_steps)
        seconds = row_seconds + tail[0] * f.num_requests + tail[1] * (f.num_kv_tokens + drafts)
        seconds += tail[2] * (f.num_draft_tokens + drafts) + tail[3] * steps
        seconds += tail[4] * (f.num_spec_requests + spec)
        if eager_terms:
            seconds += tail[5] * eager + tail[6] * np.where(eager, rows, 0.0)
        seconds += tail[7] * f.num_catchup_tokens + tail[8] * (f.num_spec_requests + spec > 0)
        return np.maximum(self.min_seconds, seconds)

    def _row_seconds(self, rows: int) -> float:
        """Intercept + linear + piecewise-linear row cost, from the ramps' running sums."""
        c = self._coefficients
        seconds = c[0] + c[1] * rows
        if rows <= ROW_KNOTS[0]:
            return seconds
        if rows >= ROW_KNOTS[-1]:
            return seconds + self._ramp_sums[-1]
        segment = bisect.bisect_right(ROW_KNOTS, rows) - 1
        lo, hi = ROW_KNOTS[segment], ROW_KNOTS[segment + 1]
        return seconds + self._ramp_sums[segment] + c[2 + segment] * (rows - lo) / (hi - lo)

    def _refit_due(self) -> bool:
        """Whether a prediction refits first: the first, and then after refit_every
        observations that lasted at least the last refit's seconds over refit_share."""
        if not self._ever_solved:
            return True
        if self._pending < self.refit_every:
            return False
        share = self.refit_share
        return share == 0.0 or self._pending_seconds * share >= self._refit_seconds

    def _refit(self) -> None:
        start = time.perf_counter()
        self._write_ring()
        self._take_errors()
        self._solve()
        self._refit_seconds = time.perf_counter() - start

    def _take_errors(self) -> None:
        """accuracy()'s samples: the relative errors of the observations since the last fit
        under that fit (what predict gave for such steps: out of sample), one array op, where
        that fit was trusted. Taken here, not per observed step, where it cost a resting
        driver a prediction (and every 16th step a refit) it had no other use for."""
        if not (self._fit_trusted or self._seeded):
            return
        new = min(self._pending, len(self._y), self._errors.maxlen or 0)
        if new == 0:
            return
        slots = np.arange(self._count - new, self._count) % len(self._y)
        seconds = self._y[slots]
        predicted = np.maximum(self._x[slots] @ np.asarray(self._theta), self.min_seconds)
        self._errors.extend((np.abs(predicted - seconds) / seconds).tolist())

    def observe(self, features: StepFeatures, measured_seconds: float) -> None:
        """Take a step in: appended only (its row is written, and its error under the fit it
        was predicted by is taken, at the next refit: _refit)."""
        if measured_seconds <= 0.0:
            return
        self._append(features, measured_seconds)
        self._dirty = True
        self._pending += 1
        self._pending_seconds += measured_seconds

    def _append(self, features: StepFeatures, seconds: float) -> None:
        self._samples.append((features, seconds))
        self._count += 1
        self.num_observations += 1

    def _write_ring(self) -> None:
        """The observations since the last write into the ring, as one array: turning a
        step into its feature row one at a time cost ~0.025 ms of every observed step, a
        quarter of what a resting driver spent on a 4.6 ms SmolLM2 step (docs/benchmarks.md
        §5ze)."""
        window = len(self._y)
        new = min(self._count - self._written, window)
        if new == 0:
            return
        recent = list(itertools.islice(self._samples, len(self._samples) - new, None))
        slots = np.arange(self._count - new, self._count) % window
        self._x[slots] = feature_vectors([features for features, _ in recent])
        self._y[slots] = [seconds for _, seconds in recent]
        self._written = self._count

    def _solve(self, passes: int = 1, fresh: bool = False) -> None:
        """Refit the window. Each pass first re-derives the outlier weights from the current
        fit (Huber-style, on the log error around its median, so a constant misfit is corrected
        rather than mistaken for outliers), then solves; one pass per step amortises IRLS.
        fresh: no fit to derive weights from yet, so the first pass is unweighted."""
        self._write_ring()
        n = min(self._count, len(self._y))
        if n == 0:
            return self._set_theta(self._prior)
        x = np.concatenate([self._x[:n], self._anchor_x])
        y = np.concatenate([self._y[:n], self._anchor_y])
        ages = (self._count - 1 - np.arange(n)) % len(self._y)
        base = np.concatenate([self.forgetting**ages, np.full(len(self._anchor_y), ANCHOR_WEIGHT)])
        base *= relative_weights(y, self.min_seconds)
        robust = np.ones(len(y))
        theta = np.asarray(self._theta)
        for i in range(passes):
            if self.fitted and not (fresh and i == 0):
                log_errors = np.log(y / np.maximum(x @ theta, self.min_seconds))
                deviations = np.abs(log_errors - median(log_errors))
                bound = OUTLIER_FACTOR * max(median(deviations), 0.01)
                robust = np.minimum(1.0, bound / np.maximum(deviations, 1e-12))
            theta = nonnegative_ridge(x, y, base * robust, self.ridge, self._prior, _SMOOTH)
        self._set_theta(theta)

    def _set_samples(self, samples: Iterable[tuple[StepFeatures, float]]) -> None:
        samples = list(samples)
        self._samples.clear()
        self._count = self._written = self.num_observations = 0
        for features, seconds in samples:
            self._append(features, seconds)
        self._dirty = True

    def _set_theta(self, theta: np.ndarray) -> None:
        theta = np.asarray(theta, dtype=float)
        self._theta = tuple(theta.tolist())  # in scaled feature units
        coefficients = theta * _INVERSE_SCALES  # exact: the scales are powers of two
        self._coefficients = tuple(coefficients.tolist())
        self._ramp_sums = [0.0, *np.cumsum(coefficients[_FIRST_RAMP:_TAIL]).tolist()]
        self._dirty = False
        self._pending, self._pending_seconds = 0, 0.0
        self._ever_solved = True
        self._fit_trusted = self.fitted  # its predictions' errors count in accuracy()

    @property
    def fitted(self) -> bool:
        return self._seeded or self.num_observations >= len(FEATURE_NAMES)

    def accuracy(self) -> float | None:
        return statistics.median(self._errors) if self._errors else None

    def coefficients(self) -> dict[str, float]:
        """Seconds per unit of each feature (the intercept in seconds)."""
        if self._dirty:
            self._solve()
        return dict(zip(FEATURE_NAMES, self._coefficients, strict=True))

    def fit(self, samples: Sequence[tuple[StepFeatures, float]]) -> None:
        """Refit on `samples` (replacing the window); the fit becomes the prior."""
        samples = [(f, seconds) for f, seconds in samples if seconds > 0.0]
        if not samples:
            raise ValueError("fit needs at least one (features, seconds > 0) sample")
        self._set_samples(samples)
        self._solve(passes=4, fresh=True)
        self._prior = np.asarray(self._theta)
        self._set_anchors(samples)
        self._seeded = True

    @property
    def profile_samples(self) -> list[tuple[StepFeatures, float]]:
        """The start-up profile's (features, seconds), kept as anchors (fit, load_params)."""
        return list(self._anchors)

    def _set_anchors(self, samples: Sequence[tuple[StepFeatures, float]]) -> None:
        self._anchors = list(samples)
        self._anchor_x = feature_vectors([f for f, _ in samples])
        self._anchor_y = np.array([seconds for _, seconds in samples], dtype=float)

    def to_params(self) -> dict[str, Any]:
        if self._dirty:
            self._solve()
        return {
            "features": list(FEATURE_NAMES),
            "theta": list(self._theta),
            "prior": self._prior.tolist(),
            "step_fields": [field.name for field in dataclasses.fields(StepFeatures)],
            "samples": [[*dataclasses.astuple(f), s] for f, s in self._samples],
            "anchors": [[*dataclasses.astuple(f), s] for f, s in self._anchors],
            "num_observations": self.num_observations,
        }

    def load_params(self, params: dict[str, Any]) -> None:
        """Restore a saved fit (its window and prior)."""
        if params.get("features") != list(FEATURE_NAMES):
            raise ValueError(f"cost model params are for features {params.get('features')}")
        self._prior = np.asarray(params["prior"], dtype=float)
        features = _row_reader(params.get("step_fields"))
        self._set_samples((features(row[:-1]), row[-1]) for row in params["samples"])
        rows = params.get("anchors", [])  # absent in caches written before anchors existed
        self._set_anchors([(features(row[:-1]), row[-1]) for row in rows])
        self.num_observations = int(params["num_observations"])
        self._set_theta(np.asarray(params["theta"], dtype=float))
        self._seeded = True


def _row_reader(names: Sequence[str] | None) -> Callable[[Sequence[float]], StepFeatures]:
    """StepFeatures from a saved row: by the field names saved with it, so a cache written by a
    version with more or fewer fields still loads (unknown ones dropped, missing ones at their
    defaults); by position in caches written before the names were."""
    if names is None:
        return lambda values: StepFeatures(*map(int, values))
    known = {field.name for field in dataclasses.fields(StepFeatures)}
    return lambda values: StepFeatures(
        **{name: int(v) for name, v in zip(names, values, strict=True) if name in known}
    )
