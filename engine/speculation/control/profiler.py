"""Start-up profile of the step-time cost model (DESIGN §6: "seeded by a short profile").

`seed_cost_model` loads a cached fit for (model, device, dtype, threads), or has the runner time
synthetic steps for `spec_profile_seconds` (a StepTimer: engine/runner/step_timer.py, which
holds the safety invariant: it runs before any real request, on borrowed free blocks), fits
`OnlineLinearCostModel` to them and caches the result, so only the first start on a machine
pays for the profile. This module only chooses the shapes and fits: it runs nothing itself.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.config import SchedulerConfig, SpecConfig
from engine.speculation.control.cost_cache import CostModelCache, cache_key
from engine.speculation.control.cost_model import OnlineLinearCostModel
from engine.speculation.control.step_features import StepFeatures, profile_grid
from kernels.graph_shapes import NO_GRAPHS, GraphShapes

logger = logging.getLogger(__name__)

# Grid extents: a few seconds must span the features on a CPU, so the largest shapes stay
# moderate; the linear model (with its hinge) extrapolates, and online refits correct it.
PROFILE_MAX_BATCHED_TOKENS = 256
PROFILE_MAX_SEQS = 16
PROFILE_MAX_CONTEXT = 512
# Plain decode batches of at least PLAIN_CORE_FROM requests, each holding at most SHORT_CONTEXT
# tokens, are in the profile's core (in_core).
PLAIN_CORE_FROM = 8
SHORT_CONTEXT = 32

# (context_len, num_new_tokens, num_draft_tokens) of one request, as in StepFeatures.from_shapes
Shape = tuple[int, int, int]
# The draft proposer's passes over a synthetic step's requests (DraftModelProposer.time_passes).
DraftPasses = Callable[..., float]


class StepTimer(Protocol):
    """The runner's timer of synthetic steps (engine/runner/step_timer.py)."""

    num_blocks: int
    block_size: int
    max_model_len: int

    @property
    def identity(self) -> tuple[str, str, str, int]: ...  # (model, device, dtype, threads)

    def __call__(
        self,
        shapes: Sequence[Shape],
        num_draft_passes: int = 0,
        draft_passes=None,
        num_catchup_tokens: int = 0,
    ) -> float: ...


def shapes_for(features: StepFeatures) -> list[Shape]:
    """Per-request shapes whose `StepFeatures.from_shapes` gives back `features` (drafts
    ignored for num_draft_steps): totals split as evenly as integers allow, drafts over the
    first num_spec_requests requests."""
    num_requests = features.num_requests
    num_spec_requests = min(features.num_spec_requests, num_requests)
    num_draft_tokens = features.num_draft_tokens
    num_new = features.num_batched_tokens - num_draft_tokens
    num_context = features.num_kv_tokens - features.num_batched_tokens
    if (
        num_requests == 0
        or num_new < num_requests
        or num_context < 0
        or num_draft_tokens < num_spec_requests
    ):
        raise ValueError(f"no batch has these features: {features}")
    if num_draft_tokens and not num_spec_requests:
        raise ValueError(f"no batch has these features (drafts, no spec requests): {features}")
    return [
        (
            _share(num_context, num_requests, i),
            _share(num_new, num_requests, i),
            _share(num_draft_tokens, num_spec_requests, i) if i < num_spec_requests else 0,
        )
        for i in range(num_requests)
    ]


def _share(total: int, parts: int, index: int) -> int:
    return total // parts + (index < total % parts)


def fit_to_pool(
    grid: Sequence[StepFeatures],
    num_blocks: int,
    block_size: int,
    max_model_len: int,
    draft_model: bool = False,
    graphs: GraphShapes = NO_GRAPHS,
) -> list[StepFeatures]:
    """The grid with contexts shrunk so each batch fits the KV pool and the context length
    (and a draft model's catch-up within the drafting requests' contexts); points that
    cannot fit at all are dropped, duplicates removed (order kept)."""
    fitted: dict[StepFeatures, None] = {}
    for features in grid:
        shapes = shapes_for(features)
        per_request = min(num_blocks // len(shapes) * block_size, max_model_len)
        clipped = [(min(c, per_request - n - k), n, k) for c, n, k in shapes]
        if all(c >= 0 for c, _, _ in clipped):
            catchup = min(features.num_catchup_tokens, sum(c for c, _, k in clipped if k))
            passes = draft_model and features.num_draft_steps > 0  # free_drafts: some not
            point = StepFeatures.from_shapes(clipped, passes, graphs)
            fitted[dataclasses.replace(point, num_catchup_tokens=catchup)] = None
    return list(fitted)


def startup_grid(
    scheduler_config: SchedulerConfig,
    max_draft_tokens: int,
    num_blocks: int,
    block_size: int,
    max_model_len: int,
    seed: int = 0,
    draft_model: bool = False,
    graphs: GraphShapes = NO_GRAPHS,
    free_drafts: bool = False,
) -> list[StepFeatures]:
    """Profile shapes for this engine: the core (`in_core`), its cheapest first (profile()
    warms up on grid[0]), then the others; with a draft model, steps with k drafts
    include k draft passes (and, with `free_drafts`, one and two requests' also none: see
    profile_grid); each step is marked eager or not as the runner's graphs (`graphs`) will
    run it."""
    grid = profile_grid(
        max_num_batched_tokens=min(
            scheduler_config.max_num_batched_tokens, PROFILE_MAX_BATCHED_TOKENS
        ),
        max_num_seqs=min(scheduler_config.max_num_seqs, PROFILE_MAX_SEQS),
        max_draft_tokens=max(1, max_draft_tokens),
        max_context=min(max_model_len, PROFILE_MAX_CONTEXT),
        draft_model=draft_model,
        seed=seed,
        graphs=graphs,
        free_drafts=free_drafts,
    )
    grid = fit_to_pool(grid, num_blocks, block_size, max_model_len, draft_model, graphs)
    core = [f for f in grid if in_core(f)]
    grid = core + [f for f in grid if not in_core(f)]
    cheapest = min(
        range(len(core) or len(grid)), key=lambda i: (grid[i].num_kv_tokens, i), default=0
    )
    return grid[cheapest : cheapest + 1] + grid[:cheapest] + grid[cheapest + 1 :]


def in_core(features: StepFeatures) -> bool:
    """A shape the profile measures whatever its budget: one request decoding with each draft
    count (the marginal draft at batch 1, where speculation pays most), a draft model's
    catch-up (no other shape excites that term), and plain decodes of PLAIN_CORE_FROM or more
    requests over the shortest contexts (the rows past one request's chains: on the Qwen pair
    a profile of one request's chains priced 128 rows at a quarter of their seconds,
    docs/benchmarks.md §5zs; with 2- and 4-request batches in the core too, the fit of one
    request's model-free drafts got worse: median error over 24 seeds of the synthetic test
    0.064 -> 0.127, with 8 and 16 only 0.088).
    On the Qwen pair a 3 s budget measured 4 random shapes of 72, none of these (§5k)."""
    single_decode = features.num_requests == 1 and (
        features.num_batched_tokens == 1 + features.num_draft_tokens
    )
    requests = features.num_requests
    plain_batch = requests >= PLAIN_CORE_FROM and features.num_batched_tokens == requests
    short = features.num_kv_tokens <= SHORT_CONTEXT * requests
    return single_decode or (plain_batch and short) or features.num_catchup_tokens > 0


@dataclass(frozen=True)
class SeedReport:
    source: str  # "profile" | "cache" | "skipped" | "failed"
    key: str = ""
    num_steps: int = 0
    seconds: float = 0.0
    cache_path: str | None = None


# A cached profile whose plain one-request decodes run this many times faster now than when it
# was taken was measured on a busier machine (load only slows a step): it is profiled again.
# On the Xeon VM a profile cached during other work priced one row at 19-22 ms where it took
# 10.6 and a verifying step at +6.9 ms (+0.2 profiled idle); every engine started there drafted
# almost nothing for its first ~100-150 Poisson requests and read 1.04-1.05x off's latency,
# 0.98 with a fresh profile (docs/benchmarks.md §5zl). A cache slower than now is kept: a
# start on a busy machine must not overwrite a quiet profile with a busy one.
STALE_SPEEDUP = 1.25
STALE_CHECKS = 3  # the cached single decodes timed again (after one untimed)

# Bumped when the profile's shapes, their order or how they are fitted change: an older cached
# fit is not reused (5: samples weighted by relative error, ridge.relative_weights; 6: plain
# decode batches in the core, unseen row segments continuing their neighbours' slope).
GRID_VERSION = 6


def seed_cost_model(
    cost_model: OnlineLinearCostModel,
    timer: StepTimer,
    spec_config: SpecConfig,
    scheduler_config: SchedulerConfig,
    max_draft_tokens: int,
    draft_passes: DraftPasses | None = None,
    graphs: GraphShapes = NO_GRAPHS,
    free_drafts: bool = False,
) -> SeedReport:
    """Load the cached fit, or profile and cache it; logs one line saying which. `graphs`:
    the step shapes replayed as CUDA graphs, as the speculation driver sees them;
    `draft_passes`: the draft model's passes, timed with each step that drafts;
    `free_drafts`: model-free proposers draft beside the draft model (startup_grid)."""
    if spec_config.spec_profile_seconds <= 0:
        logger.info("cost model: no start-up profile (spec_profile_seconds=0); learning online")
        return SeedReport("skipped")
    key = cache_key(*timer.identity) + f"|grid={GRID_VERSION}"
    if graphs.enabled:  # which steps replay graphs changes the costs
        key += f"|graphs={graphs.describe()}"
    if draft_passes is not None:  # its passes are part of the fit, and so is how they run
        key += f"|draft={spec_config.draft_model}|draft_weights={spec_config.draft_weights}"
        key += f"|draft_vocab={spec_config.draft_vocab}"
        key += "|free_drafts" if free_drafts else ""
    path = spec_config.cost_cache_path
    cache = CostModelCache(path) if path else None

    def run_step(features: StepFeatures) -> float:
        steps, catchup = features.num_draft_steps, features.num_catchup_tokens
        return timer(shapes_for(features), steps, draft_passes, catchup)

    if cache is not None and _load_cached(cost_model, cache, key):
        speedup = _speedup_since(cost_model, run_step)
        if speedup < STALE_SPEEDUP:
            return SeedReport("cache", key, cache_path=str(cache.path))
        logger.info(
            "cost model: single decodes run %.2fx faster than the cached profile was "
            "measured (a busier machine then); profiling again",
            speedup,
        )
    grid = startup_grid(
        scheduler_config,
        max_draft_tokens,
        timer.num_blocks,
        timer.block_size,
        timer.max_model_len,
        draft_model=draft_passes is not None,
        graphs=graphs,
        free_drafts=free_drafts,
    )
    start = time.perf_counter()
    try:
        num_steps = profile(
            cost_model, run_step, spec_config.spec_profile_seconds, grid, sum(map(in_core, grid))
        )
    except Exception:  # a failed profile must not stop the engine: it learns online instead
        logger.exception("cost model: start-up profile failed; learning online")
        return SeedReport("failed", key)
    seconds = time.perf_counter() - start
    saved = cache is not None and num_steps > 0 and _save(cache, key, cost_model)
    logger.info(
        "cost model: profiled %d steps (%d shapes) in %.1f s, median in-sample error %.0f%%%s",
        num_steps,
        len(grid),
        seconds,
        100 * _median_fit_error(cost_model),
        f"; cached in {cache.path}" if saved else "",
    )
    return SeedReport("profile", key, num_steps, seconds, str(cache.path) if saved else None)


def profile(
    cost_model: OnlineLinearCostModel,
    run_step: Callable[[StepFeatures], float],
    budget_seconds: float,
    grid: Sequence[StepFeatures] | None = None,
    min_steps: int = 0,
) -> int:
    """Seed the cost model's fit by timing synthetic steps; returns the number of steps measured.

    `run_step` executes a dummy batch of the given shape and returns its seconds. The grid
    is visited in its order (profile_grid shuffles it, so that a short budget still spans
    every feature); its first `min_steps` points are measured even past the budget (the
    shapes the policy cannot price without); past them a point runs only while the budget
    lasts and its rows at the cheapest seconds per row measured so far fit in what is left
    (a 256-row prefill of the Qwen 1.5B, ~4 s, had stretched a 3 s profile to 8 s). The fit
    becomes the ridge prior.
    """
    grid = list(grid) if grid is not None else profile_grid()
    if budget_seconds <= 0:
        return 0
    run_step(grid[0])  # warm-up (allocator, thread pool, caches); not measured
    samples: list[tuple[StepFeatures, float]] = []
    deadline = time.perf_counter() + budget_seconds
    per_row = 0.0  # the cheapest seconds per batched row measured so far
    for visit in range(4 * len(grid)):
        features = grid[visit % len(grid)]
        if len(samples) >= min_steps:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            if features.num_batched_tokens * per_row > left:
                continue
        seconds = run_step(features)
        samples.append((features, seconds))
        rate = seconds / max(1, features.num_batched_tokens)
        per_row = rate if len(samples) == 1 else min(per_row, rate)
    if not samples:
        return 0  # no time to measure anything: stay unfitted and learn online
    cost_model.fit(samples)
    return len(samples)


def _save(cache: CostModelCache, key: str, cost_model: OnlineLinearCostModel) -> bool:
    try:
        cache.save(key, cost_model.to_params())
    except OSError as exc:  # e.g. a read-only home in a container: profile again next start
        logger.warning("cost model: cannot write the cache %s (%s)", cache.path, exc)
        return False
    return True


def _load_cached(cost_model: OnlineLinearCostModel, cache: CostModelCache, key: str) -> bool:
    try:
        params = cache.load(key)
    except OSError as exc:
        logger.warning("cost model: cannot read the cache %s (%s); profiling", cache.path, exc)
        return False
    if params is None:
        return False
    try:
        cost_model.load_params(params)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        logger.warning("cost model: cache entry for %s unusable (%s); profiling", key, exc)
        return False
    logger.info("cost model: loaded from cache %s (%s)", cache.path, key)
    return True


def _speedup_since(
    cost_model: OnlineLinearCostModel, run_step: Callable[[StepFeatures], float]
) -> float:
    """The loaded profile's plain single decodes (up to STALE_CHECKS), their cached seconds
    over the same steps timed now: the median ratio (1.0 where the profile has none)."""
    decodes = [
        (features, seconds)
        for features, seconds in cost_model.profile_samples
        if features.num_requests == 1 and features.num_batched_tokens == 1
    ][:STALE_CHECKS]
    if not decodes:
        return 1.0
    run_step(decodes[0][0])  # warm-up (caches, allocator); not measured
    ratios = sorted(seconds / max(run_step(features), 1e-9) for features, seconds in decodes)
    return ratios[len(ratios) // 2]


def _median_fit_error(cost_model: OnlineLinearCostModel) -> float:
    samples = cost_model.to_params()["samples"]
    errors = sorted(
        abs(cost_model.predict(StepFeatures(*map(int, row[:-1]))) - row[-1]) / row[-1]
        for row in samples
    )
    return errors[len(errors) // 2] if errors else 0.0
