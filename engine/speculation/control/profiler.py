"""Start-up profile of the step-time cost model (DESIGN §6: "seeded by a short profile").

`seed_cost_model` loads a cached fit for (model, device, dtype, threads), or times synthetic
steps on the real model for `spec_profile_seconds`, fits `OnlineLinearCostModel` to them and
caches the result, so only the first start on a machine pays for the profile.

Safety invariant: dummy batches run before any real request exists, on a pristine pool (every
block free, nothing in the prefix cache; checked, else RuntimeError). They borrow free block
ids without allocating them, so the BlockManager (free lists, ref counts, prefix cache) is never
touched. The K/V they write is garbage in free blocks; a real request only reads positions it
computed itself or took from the prefix cache, and nothing written here is ever hashed into it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import SchedulerConfig, SpecConfig
from engine.core.block_manager import BlockManager
from engine.outputs import Drafts, ScheduledRequest, SchedulerOutput
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.speculation.control.cost_model import CostModelCache, OnlineLinearCostModel, cache_key
from engine.speculation.control.step_features import StepFeatures, profile_grid
from kernels.graph_shapes import NO_GRAPHS, GraphShapes

logger = logging.getLogger(__name__)

# Grid extents: a few seconds must span the features on a CPU, so the largest shapes stay
# moderate; the linear model (with its hinge) extrapolates, and online refits correct it.
PROFILE_MAX_BATCHED_TOKENS = 256
PROFILE_MAX_SEQS = 16
PROFILE_MAX_CONTEXT = 512
_GREEDY = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

Shape = tuple[int, int, int]  # (context_len, num_new_tokens, k), as in StepFeatures.from_shapes


def shapes_for(features: StepFeatures) -> list[Shape]:
    """Per-request shapes whose `StepFeatures.from_shapes` gives back `features` (drafts
    ignored for num_draft_steps): totals split as evenly as integers allow, drafts over the
    first num_spec_requests requests."""
    num_requests = features.num_requests
    num_spec = min(features.num_spec_requests, num_requests)
    num_draft_tokens = features.num_draft_tokens
    num_new = features.num_batched_tokens - num_draft_tokens
    num_context = features.num_kv_tokens - features.num_batched_tokens
    if (
        num_requests == 0
        or num_new < num_requests
        or num_context < 0
        or num_draft_tokens < num_spec
    ):
        raise ValueError(f"no batch has these features: {features}")
    if num_draft_tokens and not num_spec:
        raise ValueError(f"no batch has these features (drafts, no spec requests): {features}")
    return [
        (
            _share(num_context, num_requests, i),
            _share(num_new, num_requests, i),
            _share(num_draft_tokens, num_spec, i) if i < num_spec else 0,
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
    """The grid with contexts shrunk so each batch fits the KV pool and the context length;
    points that cannot fit at all are dropped, duplicates removed (order kept)."""
    fitted: dict[StepFeatures, None] = {}
    for features in grid:
        shapes = shapes_for(features)
        per_request = min(num_blocks // len(shapes) * block_size, max_model_len)
        clipped = [(min(c, per_request - n - k), n, k) for c, n, k in shapes]
        if all(c >= 0 for c, _, _ in clipped):
            fitted[StepFeatures.from_shapes(clipped, draft_model, graphs)] = None
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
) -> list[StepFeatures]:
    """Profile shapes for this engine, cheapest first (profile() warms up on grid[0]); with a
    draft model, steps with k drafts include k draft passes; each step is marked eager or not
    as the runner's graphs (`graphs`) will run it."""
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
    )
    grid = fit_to_pool(grid, num_blocks, block_size, max_model_len, draft_model, graphs)
    cheapest = min(range(len(grid)), key=lambda i: (grid[i].num_kv_tokens, i), default=0)
    return grid[cheapest : cheapest + 1] + grid[:cheapest] + grid[cheapest + 1 :]


class DummyBatchRunner:
    """run_step(features) -> seconds: one synthetic step of that shape through the runner
    (greedy verification of random drafts over random tokens), timed as the engine times a
    real step (ModelOutput.step_time), plus its draft-model passes when a draft runner is
    given (one batched single-token pass per draft position, as chains are drafted). See the
    module docstring for why it is safe: draft passes too write only borrowed free blocks."""

    def __init__(
        self, runner, block_manager: BlockManager, seed: int = 0, draft_runner=None
    ) -> None:
        self.runner = runner
        self.draft_runner = draft_runner
        self.block_manager = block_manager
        self.block_size = block_manager.block_size
        self.vocab_size = runner.arch.vocab_size
        self.rng = random.Random(seed)
        self.num_steps = 0

    def check_pristine(self) -> None:
        manager = self.block_manager
        if manager.num_free_blocks != manager.num_total_blocks or manager.num_cached_blocks:
            raise RuntimeError(
                "the cost-model profile runs only on an idle KV pool (every block free, empty "
                f"prefix cache); found {manager.num_free_blocks}/{manager.num_total_blocks} "
                f"free and {manager.num_cached_blocks} cached"
            )

    def __call__(self, features: StepFeatures) -> float:
        self.check_pristine()
        free_block_ids = self.block_manager.free_block_ids()
        scheduled, chains = [], {}
        for index, (context, num_new, k) in enumerate(shapes_for(features)):
            request = self._fake_request(index, context + num_new)
            num_blocks = -(-(context + num_new + k) // self.block_size)
            if num_blocks > len(free_block_ids):
                raise ValueError(f"{features} does not fit the KV pool; use fit_to_pool")
            request.block_ids = free_block_ids[:num_blocks]
            del free_block_ids[:num_blocks]
            request.num_computed_tokens = context
            scheduled.append(ScheduledRequest(request, num_new + k, k, start=context))
            if k:
                chains[request.request_id] = self._tokens(k)
        sched = SchedulerOutput(tuple(scheduled), num_batched_tokens=features.num_batched_tokens)
        draft_seconds = self._draft_passes(scheduled, features.num_draft_steps)
        output = self.runner.execute(sched, Drafts(chains=chains))
        self.num_steps += 1
        return output.step_time + draft_seconds

    def _draft_passes(self, scheduled: list[ScheduledRequest], num_passes: int) -> float:
        if self.draft_runner is None or num_passes == 0:
            return 0.0
        from engine.speculation.proposers.draft_runner import DraftQuery

        drafting = [s for s in scheduled if s.num_draft_tokens > 0]
        start = time.perf_counter()
        for j in range(num_passes):
            queries = [
                DraftQuery(self._tokens(1), s.start + s.num_new_tokens - s.num_draft_tokens + j,
                           s.request.block_ids)
                for s in drafting
                if j < s.num_draft_tokens
            ]  # fmt: skip
            if queries:
                self.draft_runner.logits(queries).sum().item()  # synced, as the proposer is
        return time.perf_counter() - start

    def _fake_request(self, index: int, num_tokens: int) -> Request:
        return Request(f"__profile-{self.num_steps}-{index}", self._tokens(num_tokens), _GREEDY)

    def _tokens(self, count: int) -> list[int]:
        return [self.rng.randrange(self.vocab_size) for _ in range(count)]


@dataclass(frozen=True)
class SeedReport:
    source: str  # "profile" | "cache" | "skipped" | "failed"
    key: str = ""
    num_steps: int = 0
    seconds: float = 0.0
    cache_path: str | None = None


def runner_cache_key(runner) -> str:
    """(model, device, dtype and weight format, threads): the model by file name and
    architecture, so a rebuilt copy of the same model in another directory shares the entry;
    the weight format names the native kernels' build, so new kernels get a new profile."""
    arch = runner.arch
    model = f"{Path(runner.model_path).name}:{arch.num_layers}x{arch.hidden_size}"
    model += f"x{arch.intermediate_size}:h{arch.num_heads}/{arch.num_kv_heads}:v{arch.vocab_size}"
    backend = getattr(runner.backend, "name", type(runner.backend).__name__)
    dtype = str(runner.dtype).removeprefix("torch.")
    dtype += f"/{getattr(runner, 'weight_format', 'dense')}"
    return cache_key(model, f"{runner.device}/{backend}", dtype, torch.get_num_threads())


def seed_cost_model(
    cost_model: OnlineLinearCostModel,
    runner,
    block_manager: BlockManager,
    spec_config: SpecConfig,
    scheduler_config: SchedulerConfig,
    max_draft_tokens: int,
    draft_runner=None,
    graphs: GraphShapes = NO_GRAPHS,
) -> SeedReport:
    """Load the cached fit, or profile and cache it; logs one line saying which. `graphs`:
    the step shapes replayed as CUDA graphs, as the speculation driver sees them."""
    if spec_config.spec_profile_seconds <= 0:
        logger.info("cost model: no start-up profile (spec_profile_seconds=0); learning online")
        return SeedReport("skipped")
    key = runner_cache_key(runner)
    if graphs.enabled:  # which steps replay graphs changes the costs
        key += f"|graphs={graphs.describe()}"
    if draft_runner is not None:  # its passes are part of the fit
        key += f"|draft={spec_config.draft_model}"
    path = spec_config.cost_cache_path
    cache = CostModelCache(path) if path else None
    if cache is not None and _load_cached(cost_model, cache, key):
        return SeedReport("cache", key, cache_path=str(cache.path))
    grid = startup_grid(
        scheduler_config,
        max_draft_tokens,
        block_manager.num_total_blocks,
        block_manager.block_size,
        _max_model_len(runner),
        draft_model=draft_runner is not None,
        graphs=graphs,
    )
    run_step = DummyBatchRunner(
        runner, block_manager, seed=runner.config.model.seed, draft_runner=draft_runner
    )
    start = time.perf_counter()
    try:
        run_step.check_pristine()
        num_steps = cost_model.profile(run_step, spec_config.spec_profile_seconds, grid)
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


def _max_model_len(runner) -> int:
    limit = runner.arch.max_position_embeddings
    return min(runner.config.model.max_model_len or limit, limit)


def _median_fit_error(cost_model: OnlineLinearCostModel) -> float:
    samples = cost_model.to_params()["samples"]
    errors = sorted(
        abs(cost_model.predict(StepFeatures(*map(int, row[:-1]))) - row[-1]) / row[-1]
        for row in samples
    )
    return errors[len(errors) // 2] if errors else 0.0
