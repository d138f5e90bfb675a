"""The goodput start-up profile: the runner's synthetic steps (StepTimer), pool safety, and the
cost-model cache.

Engines run a tiny random Llama on one thread with a sub-second profile budget.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random

import pytest

from engine.arg_utils import add_engine_arguments, config_from_args
from engine.config import EngineConfig, SchedulerConfig
from engine.front.llm import LLM
from engine.llm_engine import LLMEngine
from engine.request import Request
from engine.runner.step_timer import StepTimer
from engine.sampling_params import SamplingParams
from engine.speculation.control import profiler
from engine.speculation.control.cost_cache import cache_key
from engine.speculation.control.cost_model import OnlineLinearCostModel
from engine.speculation.control.profiler import fit_to_pool, shapes_for, startup_grid
from engine.speculation.control.step_features import StepFeatures, profile_grid

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9] * 8, [20, 21, 22, 23] * 9 + [40, 41], [30 + i % 13 for i in range(50)]]
NUM_BLOCKS = 64


def engine_config(model_dir, tmp_path, **flat) -> EngineConfig:
    base = dict(
        model=str(model_dir),
        num_kv_blocks=NUM_BLOCKS,
        threads=1,  # a shared 2-core box: two spinning OpenMP threads can be 100x slower
        speculative_proposer="ngram",
        spec_profile_seconds=0.3,
        spec_cost_cache=str(tmp_path / "cost_models.json"),
    )
    return EngineConfig.from_flat({**base, **flat})


def pool_state(engine: LLMEngine) -> tuple:
    manager = engine.scheduler.block_manager
    ref_counts = [manager.ref_count(b) for b in range(manager.num_total_blocks)]
    return manager.free_block_ids(), manager.num_cached_blocks, ref_counts


# ---- shapes -------------------------------------------------------------------------------
def test_shapes_for_inverts_from_shapes():
    """Exactly for the profile's (even) batches; for uneven ones every total, the longest
    query aside (shapes_for spreads the totals evenly)."""
    rng = random.Random(0)
    grid = profile_grid(max_num_batched_tokens=512, max_num_seqs=64, max_draft_tokens=6)
    for features in grid:
        assert StepFeatures.from_shapes(shapes_for(features)) == features
    for _ in range(200):  # uneven batches: prefill chunks, decodes with and without drafts
        shapes = [
            (rng.randint(0, 900), rng.choice([1, 1, rng.randint(2, 300)]), rng.randint(0, 5))
            for _ in range(rng.randint(1, 20))
        ]
        features = StepFeatures.from_shapes(shapes)
        shapes = shapes_for(features)
        got = StepFeatures.from_shapes(shapes)
        assert dataclasses.replace(got, max_query_len=features.max_query_len) == features
        assert all(context >= 0 and new >= 1 and k >= 0 for context, new, k in shapes)


@pytest.mark.parametrize(
    "features",
    [
        StepFeatures(num_batched_tokens=3, num_requests=4, num_kv_tokens=3),  # < 1 token each
        StepFeatures(num_batched_tokens=4, num_requests=2, num_kv_tokens=3),  # kv < batched
        StepFeatures(num_batched_tokens=6, num_requests=2, num_kv_tokens=6, num_draft_tokens=2),
        StepFeatures(),
    ],
)
def test_shapes_for_rejects_impossible_features(features):
    with pytest.raises(ValueError, match="features"):
        shapes_for(features)


def test_fit_to_pool_clips_contexts_and_drops_what_cannot_fit():
    grid = profile_grid(
        max_num_batched_tokens=512, max_num_seqs=64, max_draft_tokens=4, max_context=2048
    )
    fitted = fit_to_pool(grid, num_blocks=40, block_size=16, max_model_len=300)
    assert fitted and len(set(fitted)) == len(fitted)
    for features in fitted:
        shapes = shapes_for(features)
        assert sum(-(-(c + n + k) // 16) for c, n, k in shapes) <= 40
        assert all(c + n + k <= 300 for c, n, k in shapes)
    # Large decode batches keep their size with shorter contexts; 64 requests never fit.
    assert max(f.num_requests for f in fitted) == 32
    assert any(f.num_requests == 8 and f.num_kv_tokens > 8 * 16 for f in fitted)


# ---- dummy batches on a real (tiny) runner ------------------------------------------------
@pytest.fixture(scope="module")
def bare_engine(tiny_model_dir, tmp_path_factory) -> LLMEngine:
    tmp = tmp_path_factory.mktemp("bare")
    return LLMEngine.from_config(engine_config(tiny_model_dir, tmp, spec_profile_seconds=0))


def test_dummy_steps_leave_every_block_free_and_the_prefix_cache_empty(bare_engine):
    engine = bare_engine
    before = pool_state(engine)
    timer = StepTimer(engine.runner, engine.scheduler.block_manager)
    grid = startup_grid(engine.scheduler.config, 4, NUM_BLOCKS, 16, 1024)
    seconds = [timer(shapes_for(features)) for features in grid]
    assert all(s > 0 for s in seconds) and timer.num_steps == len(grid)
    free_ids, num_cached, ref_counts = pool_state(engine)
    assert (free_ids, num_cached, ref_counts) == before  # untouched, order included
    assert len(free_ids) == NUM_BLOCKS and num_cached == 0 and not any(ref_counts)
    assert not engine.has_unfinished_requests()


def test_dummy_steps_refuse_a_pool_in_use(bare_engine):
    manager = bare_engine.scheduler.block_manager
    timer = StepTimer(bare_engine.runner, manager)
    request = Request("live", [1, 2, 3], GREEDY)
    assert manager.allocate_slots(request, 0, 3) == []
    try:
        with pytest.raises(RuntimeError, match="idle KV pool"):
            timer([(16, 1, 0)])
    finally:
        manager.trim(request, 0)
    assert manager.num_free_blocks == NUM_BLOCKS


def test_startup_grid_fits_the_pool_and_warms_up_on_the_cheapest_decode(bare_engine):
    grid = startup_grid(bare_engine.scheduler.config, 4, 20, 16, 1024)
    decodes = [f for f in grid if profiler.in_core(f)]
    assert grid[0] in decodes and grid[0].num_kv_tokens == min(f.num_kv_tokens for f in decodes)
    assert max(f.num_draft_tokens for f in grid) > 0 and min(f.num_draft_tokens for f in grid) == 0
    for features in grid:
        assert sum(-(-(c + n + k) // 16) for c, n, k in shapes_for(features)) <= 20


def test_startup_grid_puts_the_core_first(bare_engine):
    """One request decoding with every draft count, the draft model's catch-up, and plain
    decodes of 8 and 16 requests over the shortest context come before every other shape
    (the profile measures them whatever its budget)."""
    config = bare_engine.scheduler.config
    grid = startup_grid(config, 4, NUM_BLOCKS, 16, 1024, draft_model=True)
    num_core = sum(map(profiler.in_core, grid))
    assert all(map(profiler.in_core, grid[:num_core]))
    assert not any(map(profiler.in_core, grid[num_core:]))
    core = grid[:num_core]
    assert {f.num_draft_tokens for f in core if f.num_requests == 1} == set(range(5))
    assert any(f.num_catchup_tokens for f in core)
    batches = [f for f in core if f.num_requests > 1]
    assert sorted(f.num_requests for f in batches) == [8, 16]
    assert all(f.num_batched_tokens == f.num_requests for f in batches)  # no drafts
    assert all(f.num_kv_tokens == 17 * f.num_requests for f in batches)  # contexts of 16


def test_a_tiny_budget_still_profiles_the_core(tiny_model_dir, tmp_path):
    engine = LLMEngine.from_config(
        engine_config(tiny_model_dir, tmp_path, spec_profile_seconds=1e-6)
    )
    grid = startup_grid(engine.scheduler.config, 4, NUM_BLOCKS, 16, engine.runner.max_model_len)
    num_core = sum(map(profiler.in_core, grid))
    assert num_core >= 10 and engine.spec.seed_report.num_steps >= num_core


# ---- the engine start-up: profile, cache, output unchanged ---------------------------------
def test_profiled_engine_output_equals_an_unprofiled_one(tiny_model_dir, tmp_path):
    """The garbage K/V of the dummy batches is never read: same greedy tokens as an engine
    that never profiled and never speculated, prefix caching on."""
    off = LLM(config=engine_config(tiny_model_dir, tmp_path, spec_policy="off"))
    profiled = LLM(config=engine_config(tiny_model_dir, tmp_path))
    report = profiled.engine.spec.seed_report
    assert report.source == "profile" and report.num_steps > 0
    reference = [o.output_token_ids for o in off.generate(PROMPTS, GREEDY, use_tqdm=False)]
    outputs = profiled.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.output_token_ids for o in outputs] == reference
    [again] = profiled.generate(PROMPTS[0], GREEDY, use_tqdm=False)
    assert again.output_token_ids == reference[0]
    assert again.num_cached_tokens > 0  # served from the prefix cache the profile left empty


def test_cache_round_trips_through_the_engine(tiny_model_dir, tmp_path, caplog, monkeypatch):
    # A quieter moment at the second start must not read as a stale cache (tested below).
    monkeypatch.setattr(profiler, "STALE_SPEEDUP", math.inf)
    caplog.set_level(logging.INFO, logger="engine.speculation.control.profiler")
    first = LLMEngine.from_config(engine_config(tiny_model_dir, tmp_path))
    assert first.spec.seed_report.source == "profile"
    assert "cost model: profiled" in caplog.text
    key = cache_key(*StepTimer(first.runner, first.scheduler.block_manager).identity)
    key += f"|grid={profiler.GRID_VERSION}"  # a fit of another grid is not reused
    assert key == first.spec.seed_report.key and "|float32/dense|1" in key
    assert key in json.loads((tmp_path / "cost_models.json").read_text())
    caplog.clear()
    second = LLMEngine.from_config(engine_config(tiny_model_dir, tmp_path))
    assert second.spec.seed_report.source == "cache"
    assert "cost model: loaded from cache" in caplog.text
    assert second.spec.cost_model.coefficients() == first.spec.cost_model.coefficients()
    assert second.spec.cost_model.fitted


def test_a_corrupt_cache_entry_is_profiled_again(tiny_model_dir, tmp_path):
    config = engine_config(tiny_model_dir, tmp_path)
    key = LLMEngine.from_config(config).spec.seed_report.key
    (tmp_path / "cost_models.json").write_text(json.dumps({key: {"features": ["other"]}}))
    engine = LLMEngine.from_config(config)
    assert engine.spec.seed_report.source == "profile" and engine.spec.cost_model.fitted
    assert json.loads((tmp_path / "cost_models.json").read_text())[key]["features"] != ["other"]


def _scale_cached_seconds(path, key: str, factor: float) -> None:
    """The cached profile as if measured `factor` times slower (its samples and anchors)."""
    entries = json.loads(path.read_text())
    for name in ("samples", "anchors"):
        for row in entries[key][name]:
            row[-1] *= factor
    path.write_text(json.dumps(entries))


def test_a_cache_measured_on_a_busier_machine_is_profiled_again(tiny_model_dir, tmp_path, caplog):
    """Load only slows a step: a cached profile whose single decodes took 20x what they take
    now was taken on a busy machine, and is replaced by a profile taken now."""
    config = engine_config(tiny_model_dir, tmp_path)
    key = LLMEngine.from_config(config).spec.seed_report.key
    path = tmp_path / "cost_models.json"
    _scale_cached_seconds(path, key, 20.0)
    slow = [row[-1] for row in json.loads(path.read_text())[key]["anchors"]]
    caplog.set_level(logging.INFO, logger="engine.speculation.control.profiler")
    engine = LLMEngine.from_config(config)
    assert engine.spec.seed_report.source == "profile"
    assert "faster than the cached profile" in caplog.text
    fresh = [row[-1] for row in json.loads(path.read_text())[key]["anchors"]]
    assert sorted(fresh)[len(fresh) // 2] < sorted(slow)[len(slow) // 2] / 4


def test_a_cache_slower_to_run_now_is_kept(tiny_model_dir, tmp_path):
    """A busy machine now must not replace a profile taken on a quiet one."""
    config = engine_config(tiny_model_dir, tmp_path)
    key = LLMEngine.from_config(config).spec.seed_report.key
    _scale_cached_seconds(tmp_path / "cost_models.json", key, 0.1)
    assert LLMEngine.from_config(config).spec.seed_report.source == "cache"


def test_an_unwritable_cache_only_costs_a_warning(tiny_model_dir, tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    config = engine_config(tiny_model_dir, tmp_path, spec_cost_cache=str(blocker / "c.json"))
    engine = LLMEngine.from_config(config)
    report = engine.spec.seed_report
    assert report.source == "profile" and report.cache_path is None
    assert engine.spec.cost_model.fitted and "cannot write the cache" in caplog.text


def test_zero_seconds_skips_profile_and_cache(tiny_model_dir, tmp_path):
    engine = LLMEngine.from_config(engine_config(tiny_model_dir, tmp_path, spec_profile_seconds=0))
    assert engine.spec.seed_report.source == "skipped"
    assert not engine.spec.cost_model.fitted
    assert not (tmp_path / "cost_models.json").exists()


def test_no_cache_still_profiles(tiny_model_dir, tmp_path):
    engine = LLMEngine.from_config(engine_config(tiny_model_dir, tmp_path, spec_cost_cache="none"))
    report = engine.spec.seed_report
    assert report.source == "profile" and report.cache_path is None
    assert engine.spec.cost_model.fitted and not list(tmp_path.iterdir())


# ---- config -------------------------------------------------------------------------------
@pytest.mark.parametrize("seconds", [-1.0, 601.0, float("nan"), "3"])
def test_config_rejects_bad_profile_seconds(seconds):
    with pytest.raises(ValueError, match="spec_profile_seconds"):
        EngineConfig.from_flat({"spec_profile_seconds": seconds})


def test_flags_reach_the_spec_config():
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--spec-profile-seconds", "1.5", "--spec-cost-cache", "none"])
    spec = config_from_args(args).spec
    assert spec.spec_profile_seconds == 1.5 and spec.cost_cache_path is None
    default = EngineConfig().spec
    assert default.spec_profile_seconds == 3.0
    assert default.cost_cache_path == "~/.cache/goodspeed/cost_models.json"


def test_a_draft_model_profile_times_its_passes(tiny_model_dir, tmp_path):
    """With a draft model the grid has draft steps, the dummy steps run the draft's passes
    (more passes, more seconds), and the cache keys the fit by the draft."""
    flat = dict(speculative_proposer="draft", draft_model="self:1", spec_profile_seconds=1.0)
    llm = LLM(config=engine_config(tiny_model_dir, tmp_path, **flat))
    driver, engine = llm.engine.spec, llm.engine
    assert driver.seed_report.source == "profile" and "draft=self:1" in driver.seed_report.key
    key = driver.seed_report.key  # how the draft runs is part of it too
    assert "draft_weights=auto" in key and "draft_vocab=0" in key
    assert "free_drafts" not in key  # every chain is the draft model's
    auto = dict(flat, speculative_proposer="auto")
    auto_key = LLM(
        config=engine_config(tiny_model_dir, tmp_path, **auto)
    ).engine.spec.seed_report.key
    assert auto_key == key + "|free_drafts"  # n-gram and recycle chains run no passes
    other = dict(flat, draft_vocab=100)
    assert (
        LLM(config=engine_config(tiny_model_dir, tmp_path, **other)).engine.spec.seed_report.key
        != key
    )
    assert not engine.has_unfinished_requests()
    timer = StepTimer(engine.runner, engine.scheduler.block_manager)
    passes = driver.proposer.time_passes
    one, four = (StepFeatures.from_shapes([(32, 1, k)] * 2, draft_model=True) for k in (1, 4))
    assert one.num_draft_steps == 1 and four.num_draft_steps == 4

    def never(*args):
        raise AssertionError("a step without draft passes ran the draft model")

    timer(shapes_for(one), 0, never)  # no passes: the draft model is not asked
    times = {
        f.num_draft_steps: min(timer(shapes_for(f), f.num_draft_steps, passes) for _ in range(3))
        for f in (one, four)
    }
    assert times[4] > times[1]
    assert pool_state(engine) == (list(range(NUM_BLOCKS)), 0, [0] * NUM_BLOCKS)


def test_a_separate_draft_model_profile_times_its_catchup(tiny_model_dir, tmp_path):
    """A separate draft model (its own KV cache) is profiled catching up too: the fit's samples
    include catch-up steps, run on the real draft runner without touching the pool."""
    flat = dict(
        speculative_proposer="draft", draft_model=str(tiny_model_dir), spec_profile_seconds=1.0
    )
    engine = LLM(config=engine_config(tiny_model_dir, tmp_path, **flat)).engine
    assert engine.spec.seed_report.source == "profile"
    samples = engine.spec.cost_model.to_params()["anchors"]
    column = [f.name for f in dataclasses.fields(StepFeatures)].index("num_catchup_tokens")
    assert any(row[column] > 0 for row in samples)  # rows: StepFeatures' fields, then seconds
    timer = StepTimer(engine.runner, engine.scheduler.block_manager)
    shapes = shapes_for(StepFeatures.from_shapes([(200, 1, 2)], draft_model=True))
    assert timer(shapes, 2, engine.spec.proposer.time_passes, 150) > 0
    assert pool_state(engine) == (list(range(NUM_BLOCKS)), 0, [0] * NUM_BLOCKS)


def test_the_cache_key_names_the_weight_format(tiny_model_dir, tmp_path):
    """A fit measured on float32 weights must not be reused for the quantized kernels."""
    engine = LLMEngine.from_config(engine_config(tiny_model_dir, tmp_path))
    timer = StepTimer(engine.runner, engine.scheduler.block_manager)
    dense = cache_key(*timer.identity)
    engine.runner.weight_format = "gguf:0123abcd"
    assert cache_key(*timer.identity) == dense.replace("/dense|", "/gguf:0123abcd|")


def test_the_cache_key_names_the_processor(tiny_model_dir, tmp_path):
    """A fit measured on one processor must not be reused on another (a shared home)."""
    from engine.runner.step_timer import processor_name

    engine = LLMEngine.from_config(engine_config(tiny_model_dir, tmp_path))
    timer = StepTimer(engine.runner, engine.scheduler.block_manager)
    name = processor_name(engine.runner.device)
    assert name and f"@{name}|" in cache_key(*timer.identity)


def test_the_grid_times_every_draft_count_for_one_and_two_requests():
    """Each extra verify row of a small batch is its own profile sample (row ramps can jump
    between any two row counts); larger batches keep the sparse k's."""
    grid = profile_grid(max_num_seqs=8, max_draft_tokens=6)
    for size in (1, 2):
        decodes = [f for f in grid if f.num_requests == size and f.num_batched_tokens <= 7 * size]
        assert {f.num_batched_tokens // size for f in decodes} == set(range(1, 8))
    eight = {f.num_batched_tokens // 8 for f in grid if f.num_requests == 8}
    assert eight == {1, 2, 4, 7}


def _synthetic_step_seconds(features: StepFeatures) -> float:
    """A step's seconds as a CPU pays them: 40 ms, rows 2-9 at 7-12 ms each, a draft pass
    15 ms, a catch-up token 1.1 ms, 1.5 ms a verifying request."""
    rows = features.num_batched_tokens
    row_ms = (7, 8, 10, 12, 9, 10, 10, 10)
    extra = sum(ms for r, ms in zip(range(1, 9), row_ms) if rows > r)
    return 1e-3 * (
        40
        + extra
        + 0.002 * features.num_kv_tokens
        + 15 * features.num_draft_steps
        + 1.1 * features.num_catchup_tokens
        + 1.5 * features.num_spec_requests
    )


def _model_free_draft_error(free_drafts: bool, seed: int) -> float:
    """The profile's fit (its core and 12 other shapes, timed with 5% noise) of a draft
    model's engine: the largest relative error of the seconds it adds to one request's step
    for 1-4 drafts that run no draft pass (a model-free proposer's)."""
    rng = random.Random(seed)
    grid = profile_grid(256, 16, 4, 512, draft_model=True, seed=seed, free_drafts=free_drafts)
    grid = fit_to_pool(grid, 128, 16, 2048, draft_model=True)
    core = [f for f in grid if profiler.in_core(f)]
    points = core + rng.sample([f for f in grid if not profiler.in_core(f)], 12)
    model = OnlineLinearCostModel()
    model.fit([(f, _synthetic_step_seconds(f) * rng.uniform(0.95, 1.05)) for f in points])
    plain = StepFeatures.from_shapes([(800, 1, 0)])
    errors = []
    for k in range(1, 5):
        drafting = StepFeatures.from_shapes([(800, 1, k)])
        assert drafting.num_draft_steps == 0
        fitted = model.predict(drafting) - model.predict(plain)
        true = _synthetic_step_seconds(drafting) - _synthetic_step_seconds(plain)
        errors.append(abs(fitted / true - 1.0))
    return max(errors)


def test_a_draft_model_beside_model_free_proposers_profiles_drafts_without_passes():
    """With free_drafts one and two requests' chains are also timed without draft passes
    (and stay without them when fitted to the pool); where every chain came with as many
    passes as drafts, the fit split their seconds between passes and verify rows at will
    and priced model-free drafts up to ~33% off (the Qwen pair's auto drafted shorter chains
    than the n-gram proposer alone: docs/benchmarks.md §5zp)."""
    config = SchedulerConfig()
    grid = startup_grid(config, 4, NUM_BLOCKS, 16, 1024, draft_model=True, free_drafts=True)
    for size in (1, 2):
        free = {
            f.num_draft_tokens
            for f in grid
            if f.num_requests == size and f.num_draft_tokens and not f.num_draft_steps
        }
        assert free == {size * k for k in range(1, 5)}
    assert not any(
        f.num_requests > 2 and f.num_draft_tokens and not f.num_draft_steps for f in grid
    )
    old = startup_grid(config, 4, NUM_BLOCKS, 16, 1024, draft_model=True)
    assert not any(f.num_draft_tokens and not f.num_draft_steps for f in old)
    assert all(_model_free_draft_error(True, seed) < 0.15 for seed in range(4))
    assert max(_model_free_draft_error(False, seed) for seed in range(4)) > 0.2
