"""The step-time cost model: features, online fit, profile seeding, cache."""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import time

import numpy as np
import pytest

from engine.speculation.control import cost_model, ridge
from engine.speculation.control.cost_cache import CostModelCache, cache_key
from engine.speculation.control.cost_model import OnlineLinearCostModel
from engine.speculation.control.profiler import profile
from engine.speculation.control.step_features import StepFeatures, profile_grid
from kernels.graph_shapes import NO_GRAPHS, GraphShapes

# Seconds per unit of each feature (raw units); "jump" is a step of cost between 5 and 6
# batched rows (this CPU's few-row matmul path ends there), "steep" a compute-bound slope.
BATCH_SIZES = (1, 2, 4, 8)
DECODE_GRAPHS = GraphShapes(BATCH_SIZES, 1)  # decode steps replayed, verification eager
VERIFY_GRAPHS = GraphShapes(BATCH_SIZES, 5)  # chains of up to 4 drafts replayed too
VERIFY_16 = GraphShapes((*BATCH_SIZES, 16), 5)
TRUE = {
    "intercept": 0.01,
    "batched_tokens": 2e-4,
    "jump": 5e-3,
    "steep": 1e-3,
    "requests": 5e-4,
    "kv_tokens": 1e-6,
    "draft_tokens": 1e-4,
    "draft_steps": 2e-3,
    "spec_requests": 3e-4,
    "eager_steps": 4e-3,
    "eager_rows": 3e-4,
}


def true_seconds(f: StepFeatures, coefficients: dict = TRUE) -> float:
    """An eager step pays per row on its own slope, as the model assumes (cost_model._split_rows)."""
    eager_rows = f.num_batched_tokens if f.num_eager_steps else 0
    rows = f.num_batched_tokens - eager_rows
    values = {
        "intercept": 1,
        "batched_tokens": rows,
        "jump": float(rows >= 6),
        "steep": max(0, rows - 128),
        "requests": f.num_requests,
        "kv_tokens": f.num_kv_tokens,
        "draft_tokens": f.num_draft_tokens,
        "draft_steps": f.num_draft_steps,
        "spec_requests": f.num_spec_requests,
        "eager_steps": f.num_eager_steps,
        "eager_rows": eager_rows,
    }
    return sum(coefficients[name] * value for name, value in values.items())


def random_features(rng: random.Random) -> StepFeatures:
    shapes = []
    for _ in range(rng.choice([1, 1, 2, 3, rng.randint(1, 24)])):
        if rng.random() < 0.15:
            shapes.append((rng.randint(0, 512), rng.randint(8, 96), 0))  # a prefill chunk
        else:
            shapes.append((rng.randint(8, 2048), 1, rng.randint(0, 6)))
    draft_model, graphs = rng.random() < 0.5, rng.random() < 0.5
    graphs = DECODE_GRAPHS if graphs else NO_GRAPHS
    return StepFeatures.from_shapes(shapes, draft_model=draft_model, graphs=graphs)


def test_from_shapes_counts_every_feature():
    f = StepFeatures.from_shapes([(100, 1, 3), (50, 1, 0), (0, 32, 0)], draft_model=True)
    assert f == StepFeatures(
        num_batched_tokens=4 + 1 + 32,
        num_requests=3,
        num_kv_tokens=104 + 51 + 32,
        num_draft_tokens=3,
        num_draft_steps=3,
        num_spec_requests=1,
        max_query_len=32,
    )
    assert StepFeatures.from_shapes([(100, 1, 3)]).num_draft_steps == 0  # model-free proposer
    assert f.num_eager_steps == 0
    decode = [(100, 1, 0)] * 2
    assert StepFeatures.from_shapes(decode, graphs=DECODE_GRAPHS).num_eager_steps == 0  # replayed
    assert StepFeatures.from_shapes([(100, 1, 1)], graphs=DECODE_GRAPHS).num_eager_steps == 1
    base = StepFeatures.from_shapes(decode, graphs=DECODE_GRAPHS)
    assert base.with_drafts(1, 1, graphs=DECODE_GRAPHS).num_eager_steps == 1


def test_verify_graphs_keep_chains_up_to_their_rows_on_the_graph_path():
    """With verification captured up to 1 + 4 rows, a step is eager only past that: a longer
    query (prefill chunk), a batch past the largest graph, or a tree (decode-only view)."""
    replayed = [[(100, 1, 4)], [(100, 1, 0), (7, 1, 2)], [(0, 5, 0)], [(10, 1, 1)] * 8]
    for shapes in replayed:
        assert StepFeatures.from_shapes(shapes, graphs=VERIFY_GRAPHS).num_eager_steps == 0
    eager = [[(100, 1, 5)], [(0, 6, 0), (9, 1, 0)], [(10, 1, 0)] * 9]
    for shapes in eager:
        assert StepFeatures.from_shapes(shapes, graphs=VERIFY_GRAPHS).num_eager_steps == 1
    trees = VERIFY_GRAPHS.decode_only()
    assert StepFeatures.from_shapes([(100, 1, 2)], graphs=trees).num_eager_steps == 1
    base = StepFeatures.from_shapes([(100, 1, 0)] * 2, graphs=VERIFY_GRAPHS)
    assert base.with_drafts(4, 2, graphs=VERIFY_GRAPHS).num_eager_steps == 0
    assert base.with_drafts(4, 2, graphs=trees).num_eager_steps == 1


def test_a_replayed_step_counts_the_rows_its_padded_graph_computes():
    """One request verifying 4 drafts beside two decodes: the graph runs 4 requests (the
    captured size above 3) x 5 rows, and the cost model's row terms price those 20 rows."""
    f = StepFeatures.from_shapes([(100, 1, 4), (50, 1, 0), (60, 1, 0)], graphs=VERIFY_GRAPHS)
    assert (f.num_batched_tokens, f.max_query_len, f.num_graph_rows) == (7, 5, 20)
    uniform = StepFeatures.from_shapes([(100, 1, 4)] * 4, graphs=VERIFY_GRAPHS)
    assert uniform.num_graph_rows == uniform.num_batched_tokens == 20
    assert StepFeatures.from_shapes([(100, 1, 4)], graphs=NO_GRAPHS).num_graph_rows == 0
    assert StepFeatures.from_shapes([(100, 1, 5)], graphs=VERIFY_GRAPHS).num_graph_rows == 0
    model = OnlineLinearCostModel()  # fitted to steps costing 1 ms + 10 us a computed row
    grid = profile_grid(graphs=VERIFY_GRAPHS, max_num_seqs=8)
    model.fit([(g, 1e-3 + 1e-5 * (g.num_graph_rows or g.num_batched_tokens)) for g in grid])
    assert model.predict(f) == pytest.approx(1e-3 + 20e-5, rel=0.02)
    assert model.predict(f) == pytest.approx(model.predict(uniform), rel=0.02)


def test_with_drafts_pads_to_the_longest_chain_on_the_graph_path():
    base = StepFeatures.from_shapes([(100, 1, 0)] * 3, graphs=VERIFY_GRAPHS)
    assert (base.max_query_len, base.num_graph_rows) == (1, 4)
    one = base.with_drafts(4, 1, graphs=VERIFY_GRAPHS)  # a chain of 4 on one request
    assert (one.num_batched_tokens, one.max_query_len, one.num_graph_rows) == (7, 5, 20)
    spread = base.with_drafts(3, 3, graphs=VERIFY_GRAPHS)  # one draft each by default
    assert (spread.max_query_len, spread.num_graph_rows) == (2, 8)
    longest = base.with_drafts(3, 2, graphs=VERIFY_GRAPHS, longest=2)
    assert (longest.max_query_len, longest.num_graph_rows) == (3, 12)
    more = one.with_drafts(2, 0, graphs=VERIFY_GRAPHS)  # within the padding already paid
    assert (more.max_query_len, more.num_graph_rows) == (5, 20)
    past = base.with_drafts(5, 1, graphs=VERIFY_GRAPHS)  # 6 rows: no graph, eager
    assert (past.num_eager_steps, past.num_graph_rows) == (1, 0)


def test_with_drafts_adds_tokens_and_keeps_the_largest_draft_step_count():
    base = StepFeatures.from_shapes([(10, 1, 0), (20, 1, 0)])
    f = base.with_drafts(num_draft_tokens=5, num_spec_requests=2, num_draft_steps=3)
    assert (f.num_batched_tokens, f.num_kv_tokens, f.num_draft_tokens) == (7, 37, 5)
    assert (f.num_spec_requests, f.num_draft_steps, f.num_requests) == (2, 3, 2)


def test_recovers_known_costs_from_noisy_observations():
    rng = random.Random(0)
    model = OnlineLinearCostModel()
    for i in range(600):
        f = random_features(rng)
        if i % 8 == 0:
            model.predict(f)  # as the policy's plans do: the refits that accuracy() reads
        model.observe(f, true_seconds(f) * rng.gauss(1.0, 0.02))
    fitted = model.coefficients()
    # Requests are nearly collinear with rows in decode batches, and a first speculating
    # request often comes with an eager step: check what stays identifiable.
    for name in ("kv_tokens", "draft_steps"):
        assert fitted[name] == pytest.approx(TRUE[name], rel=0.25), name
    fixed = fitted["spec_requests"] + fitted["eager_steps"]
    assert fixed == pytest.approx(TRUE["spec_requests"] + TRUE["eager_steps"], rel=0.25)
    five, six = (StepFeatures(num_batched_tokens=n, num_requests=1) for n in (5, 6))
    assert model.predict(six) - model.predict(five) == pytest.approx(TRUE["jump"], rel=0.25)
    held_out = [random_features(rng) for _ in range(200)]
    errors = [abs(model.predict(f) - true_seconds(f)) / true_seconds(f) for f in held_out]
    assert statistics.median(errors) < 0.02
    assert model.accuracy() is not None and model.accuracy() < 0.05  # noise is 2%


def test_accuracy_is_each_refits_error_on_the_steps_observed_under_the_fit_before():
    rng = random.Random(7)
    model = OnlineLinearCostModel(refit_every=8)
    model.fit([(f, true_seconds(f)) for f in (random_features(rng) for _ in range(64))])
    errors = []
    for _ in range(8):
        f = random_features(rng)
        seconds = true_seconds(f) * rng.uniform(0.7, 1.3)
        predicted = model.predict(f)  # no refit: fewer than refit_every observations pending
        errors.append(abs(predicted - seconds) / seconds)
        model.observe(f, seconds)
    assert model.accuracy() is None  # taken at the refit, not per observed step
    model.predict(random_features(rng))  # refits: the eight steps' errors under the old fit
    assert model.accuracy() == pytest.approx(statistics.median(errors), rel=1e-9)


def test_stalled_steps_do_not_drag_the_fit():
    # One step in ten is stalled 5x by something unrelated (a busy core); least squares would
    # inflate every prediction by ~40%, the bounded-influence weights keep the typical step.
    rng = random.Random(4)
    model = OnlineLinearCostModel()
    for i in range(400):
        f = random_features(rng)
        model.observe(f, true_seconds(f) * (5.0 if i % 10 == 9 else rng.gauss(1.0, 0.02)))
    held_out = [random_features(rng) for _ in range(200)]
    errors = [abs(model.predict(f) - true_seconds(f)) / true_seconds(f) for f in held_out]
    assert statistics.median(errors) < 0.05


def test_predictions_stay_positive_and_costs_non_negative():
    # A workload where more drafts look *cheaper* (noise, collinearity) must not yield a
    # negative marginal cost, or the policy would speculate without bound.
    model = OnlineLinearCostModel()
    rng = random.Random(1)
    for _ in range(50):
        f = random_features(rng)
        model.observe(f, max(1e-4, 0.02 + 1e-4 * f.num_batched_tokens - 1e-3 * f.num_draft_tokens))
    assert all(value >= 0.0 for value in model.coefficients().values())
    assert model.predict(StepFeatures(num_draft_tokens=1000)) > 0.0
    assert OnlineLinearCostModel().predict(StepFeatures()) > 0.0  # unfitted


def test_stable_with_few_observations():
    model = OnlineLinearCostModel()
    f = StepFeatures.from_shapes([(100, 1, 2)] * 4)
    model.observe(f, 0.02)
    model.observe(f, 0.021)
    assert not model.fitted and model.accuracy() is None
    assert model.predict(f) == pytest.approx(0.0205, rel=0.1)
    assert 0.0 < model.predict(StepFeatures.from_shapes([(100, 1, 2)] * 8)) < 1.0


def test_forgetting_follows_a_change_in_step_time():
    rng = random.Random(2)
    model = OnlineLinearCostModel(forgetting=0.95)
    for _ in range(200):
        f = random_features(rng)
        model.observe(f, true_seconds(f))
    slower = {name: 2.0 * value for name, value in TRUE.items()}
    for _ in range(150):
        f = random_features(rng)
        model.observe(f, true_seconds(f, coefficients=slower))
    f = random_features(rng)
    assert model.predict(f) == pytest.approx(true_seconds(f, coefficients=slower), rel=0.05)


def test_profile_seeds_the_fit_with_its_jumps():
    grid = profile_grid(
        max_num_batched_tokens=512, max_num_seqs=64, max_draft_tokens=4, draft_model=True
    )
    model = OnlineLinearCostModel()
    measured = profile(model, true_seconds, budget_seconds=5.0, grid=grid)
    assert measured == 4 * len(grid)  # the synthetic step is instant: the grid bound stops it
    assert model.fitted
    f = StepFeatures.from_shapes([(300, 1, 3)] * 40, draft_model=True)
    assert model.predict(f) == pytest.approx(true_seconds(f), rel=0.03)
    for rows in (5, 6):  # below and above the jump, as a verify step of one request runs
        f = StepFeatures.from_shapes([(300, 1, rows - 1)], draft_model=True)
        assert model.predict(f) == pytest.approx(true_seconds(f), rel=0.05), rows


def test_rows_past_those_measured_continue_the_last_slope():
    """A profile that timed one request's chains only (1 to 6 rows; a 3 s profile of the Qwen
    1.5B times little more) prices a plain decode of 12 to 128 requests on the slope it
    measured last, not at the seconds of its widest step: flat, 128 rows cost less than a
    quarter of their ~1.1 s, and `auto` verified twelve requests' chains under load as if rows
    were free."""
    slope = 9e-3  # the Qwen 1.5B's seconds per row on the 2-core VM, compute-bound
    truth = {name: 0.0 for name in TRUE} | {"intercept": 0.04, "batched_tokens": slope}
    samples = []
    for k in range(6):
        for context in (16, 64, 512):
            f = StepFeatures.from_shapes([(context, 1, k)])
            samples.append((f, true_seconds(f, truth)))
    model = OnlineLinearCostModel()
    model.fit(samples)
    for requests in (12, 48, 128):
        f = StepFeatures.from_shapes([(64, 1, 0)] * requests)
        assert model.predict(f) == pytest.approx(true_seconds(f, truth), rel=0.1), requests


def test_a_kink_the_steps_show_stands_beside_the_slope_pull():
    """The smoothing of neighbouring slopes gives way to samples: a 5 ms jump from 5 to 6
    rows, timed at every row count from 1 to 24, is priced within 15%."""
    truth = {name: 0.0 for name in TRUE} | {"intercept": 0.01, "batched_tokens": 1e-3}
    truth |= {"jump": 5e-3}
    samples = []
    for rows in range(1, 25):
        f = StepFeatures.from_shapes([(64, 1, 0)] * rows)
        samples += [(f, true_seconds(f, truth))] * 2
    model = OnlineLinearCostModel()
    model.fit(samples)
    five, six = (StepFeatures.from_shapes([(64, 1, 0)] * rows) for rows in (5, 6))
    jump = model.predict(six) - model.predict(five)
    assert jump == pytest.approx(true_seconds(six, truth) - true_seconds(five, truth), rel=0.15)


def test_profile_respects_its_time_budget():
    def slow_step(f: StepFeatures) -> float:
        time.sleep(0.01)
        return true_seconds(f)

    started = time.perf_counter()
    measured = profile(OnlineLinearCostModel(), slow_step, budget_seconds=0.05)
    assert 1 <= measured <= 8
    assert time.perf_counter() - started < 0.5
    unprofiled = OnlineLinearCostModel()
    assert profile(unprofiled, slow_step, budget_seconds=0.0) == 0 and not unprofiled.fitted


def test_profile_measures_its_first_min_steps_past_the_budget():
    """The core shapes (the first min_steps) are measured however short the budget; then the
    budget stops it as before."""
    grid = profile_grid(max_num_batched_tokens=64, max_num_seqs=16, max_draft_tokens=4)
    seen = []

    def slow_step(f: StepFeatures) -> float:
        seen.append(f)
        time.sleep(0.01)
        return true_seconds(f)

    assert (
        profile(OnlineLinearCostModel(), slow_step, budget_seconds=0.001, grid=grid, min_steps=6)
        == 6
    )
    assert seen[1:] == grid[:6]  # seen[0] is the warm-up


def test_profile_skips_a_step_that_would_overrun_its_budget():
    """Past the core, a shape whose predicted time (doubled) exceeds what is left of the budget
    is skipped, not run past the deadline; cheap ones still fill the budget."""
    decodes = [StepFeatures.from_shapes([(64, 1, k)]) for k in range(5)]
    prefill = StepFeatures.from_shapes([(0, 256, 0)])
    grid = decodes + [prefill] + decodes
    ran = []

    def sleepy_step(f: StepFeatures) -> float:
        ran.append(f)
        seconds = 0.002 * f.num_batched_tokens  # the prefill: 0.5 s
        time.sleep(seconds)
        return seconds

    started = time.perf_counter()
    measured = profile(OnlineLinearCostModel(), sleepy_step, budget_seconds=0.25, grid=grid)
    assert measured > len(decodes) and prefill not in ran
    assert time.perf_counter() - started < 0.25 + 0.1


def test_grid_respects_the_token_budget_and_spans_drafts():
    grid = profile_grid(max_num_batched_tokens=64, max_num_seqs=16, max_draft_tokens=4)
    assert all(f.num_batched_tokens <= 64 for f in grid)
    assert {f.num_draft_tokens > 0 for f in grid} == {True, False}
    assert max(f.num_requests for f in grid) == 16


def test_cache_round_trip(tmp_path):
    rng = random.Random(3)
    model = OnlineLinearCostModel()
    for _ in range(40):
        f = random_features(rng)
        model.observe(f, true_seconds(f))
    cache = CostModelCache(tmp_path / "sub" / "cost.json")
    key = ("smollm2", "cpu", "float32", 2)
    assert cache.load(key) is None
    cache.save(key, model.to_params())
    cache.save(("other", "cuda", "bfloat16", None), {"unrelated": True})

    restored = OnlineLinearCostModel()
    restored.load_params(CostModelCache(tmp_path / "sub" / "cost.json").load(key))
    assert restored.fitted
    f = random_features(rng)
    assert restored.predict(f) == pytest.approx(model.predict(f), rel=1e-9)
    assert cache.load(cache_key("smollm2", "cpu", "float32", 2)) is not None  # same key as text


def test_cache_tolerates_a_corrupt_file_and_rejects_foreign_params(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text("{not json")
    assert CostModelCache(path).load("any") is None
    params = OnlineLinearCostModel().to_params() | {"features": ["intercept"]}
    with pytest.raises(ValueError, match="features"):
        OnlineLinearCostModel().load_params(json.loads(json.dumps(params)))


def test_a_cache_of_another_step_features_layout_loads_by_field_name():
    """Rows are saved with their field names: one written by a version with a field this one
    lacks, and without one this one has (its default), restores the same samples; a cache
    written before the names were loads by position."""
    rng = random.Random(5)
    model = OnlineLinearCostModel()
    for _ in range(30):
        f = dataclasses.replace(random_features(rng), num_graph_rows=rng.randint(0, 40))
        model.observe(f, true_seconds(f))
    params = json.loads(json.dumps(model.to_params()))
    names = params["step_fields"]
    assert names[-1] == "num_graph_rows"
    other = dict(params, step_fields=["future_field", *names[:-1]])
    other["samples"] = [[7, *row[:-2], row[-1]] for row in params["samples"]]
    other["anchors"] = []
    restored = OnlineLinearCostModel()
    restored.load_params(other)
    expected = [dataclasses.replace(f, num_graph_rows=0) for f, _ in model._samples]
    assert [f for f, _ in restored._samples] == expected
    positional = {k: v for k, v in params.items() if k != "step_fields"}
    old = OnlineLinearCostModel()
    old.load_params(positional)
    assert [f for f, _ in old._samples] == [f for f, _ in model._samples]


def gpu_like_seconds(f: StepFeatures) -> float:
    """A replayed step is nearly flat in its rows; an eager one (a prefill chunk) costs ~10 ms
    more and much more per row (the shape measured on an H200, docs/benchmarks.md §4e)."""
    seconds = 2.7e-3 + 1e-6 * f.num_batched_tokens + 1.5e-5 * f.num_spec_requests
    seconds += 2e-8 * f.num_kv_tokens
    if f.num_eager_steps:
        seconds += 10e-3 + 4e-5 * f.num_batched_tokens
    return seconds


@pytest.mark.parametrize("seed", range(4))
def test_live_traffic_does_not_distort_shapes_only_the_profile_saw(seed):
    """After a profile, hundreds of live steps from a narrow region (10-16 requests, a few
    speculating, one noisy prefill in ten) fill the window. Every request speculating is a
    shape only the profile measured; its price must stay near the truth. Without the profile's
    anchors, and with prefill rows on the shared row ramps, it rose 1.2-2.7x (so goodput would
    refuse speculation that costs ~nothing)."""
    rng = random.Random(seed)
    model = OnlineLinearCostModel(refit_every=8)
    grid = profile_grid(256, 16, 4, 512, graphs=VERIFY_16)
    model.fit([(f, gpu_like_seconds(f) * rng.gauss(1, 0.02)) for f in grid * 3])
    for _ in range(400):
        shapes = [(rng.randint(100, 700), 1, 0) for _ in range(rng.randint(10, 16))]
        for i in rng.sample(range(len(shapes)), rng.randint(0, 3)):
            shapes[i] = (shapes[i][0], 1, rng.randint(1, 4))
        if rng.random() < 0.1:
            shapes.append((0, rng.randint(100, 300), 0))
        f = StepFeatures.from_shapes(shapes, graphs=VERIFY_16)
        noise = rng.gauss(1, 0.3) if f.num_eager_steps else rng.gauss(1, 0.03)
        model.observe(f, gpu_like_seconds(f) * noise)
    for k in (0, 4):
        f = StepFeatures.from_shapes([(600, 1, k)] * 16, graphs=VERIFY_16)
        assert model.predict(f) == pytest.approx(gpu_like_seconds(f), rel=0.12), k


def test_anchors_survive_the_cache_and_follow_drift():
    """The profile's samples travel with the cached params; live steps still move the fit
    (a 30% slowdown shows as most of it)."""
    rng = random.Random(1)
    model = OnlineLinearCostModel(refit_every=8)
    grid = profile_grid(256, 16, 4, 512, graphs=VERIFY_16)
    model.fit([(f, gpu_like_seconds(f)) for f in grid])
    restored = OnlineLinearCostModel(refit_every=8)
    restored.load_params(json.loads(json.dumps(model.to_params())))
    assert len(restored.to_params()["anchors"]) == len(grid)
    probe = StepFeatures.from_shapes([(400, 1, 2)] * 8, graphs=VERIFY_16)
    for _ in range(300):
        shapes = [(rng.randint(100, 700), 1, rng.choice([0, 0, 2, 4])) for _ in range(8)]
        f = StepFeatures.from_shapes(shapes, graphs=VERIFY_16)
        restored.observe(f, 1.3 * gpu_like_seconds(f))
    assert 1.15 < restored.predict(probe) / gpu_like_seconds(probe) < 1.31


@pytest.mark.parametrize(
    "graphs", [NO_GRAPHS, GraphShapes((1, 2, 4, 8), 1), GraphShapes((1, 2, 4, 8), 5)]
)
def test_predict_drafts_is_predict_of_with_drafts_for_many_plans(graphs):
    """The search's vectorised prediction equals one scalar prediction per plan: eager steps,
    prefill rows, every row ramp, draft passes and speculating requests included."""
    rng = random.Random(3)
    model = OnlineLinearCostModel()
    model.fit(
        [(f, 0.01 + rng.random() * 0.05) for f in profile_grid(draft_model=True, graphs=graphs)]
    )
    for _ in range(100):
        shapes = [
            (rng.randint(0, 2000), rng.choice([1, 1, 1, 37]), 0) for _ in range(rng.randint(1, 70))
        ]
        base = StepFeatures.from_shapes(shapes, graphs=graphs)
        drafts = [rng.randint(0, 300) for _ in range(5)]
        spec = [rng.randint(0, 60) for _ in range(5)]
        passes = [rng.randint(0, 5) for _ in range(5)]
        got = model.predict_drafts(base, drafts, spec, passes, graphs)
        want = [
            model.predict(base.with_drafts(d, s, p, graphs))
            for d, s, p in zip(drafts, spec, passes)
        ]
        assert got.tolist() == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_a_long_step_the_model_cannot_fit_does_not_set_the_short_steps_prices():
    """The Qwen pair's start-up profile (2026-11-26, medians): one request decoding with k
    draft-model drafts takes 46 / 62 / 83 / 114 / 151 ms at k = 0..4, and the draft's catch-up,
    superlinear in tokens, 208 ms for 64 tokens and 1261 ms for 256. Fitted on absolute
    errors, the 1.26 s sample priced the first draft at 0 and the second at 36 ms, so the
    policy never drafted two; fitted on relative errors, each k is within 8%."""
    measured = {0: 0.046, 1: 0.062, 2: 0.083, 3: 0.114, 4: 0.151}
    samples = [
        (StepFeatures.from_shapes([(context, 1, k)], draft_model=True), seconds)
        for context in (16, 64, 512)
        for k, seconds in measured.items()
    ]
    one_draft = StepFeatures.from_shapes([(512, 1, 1)], draft_model=True)
    for tokens, seconds in ((64, 0.208), (256, 1.261)):
        samples.append((dataclasses.replace(one_draft, num_catchup_tokens=tokens), seconds))
    model = OnlineLinearCostModel()
    model.fit(samples)
    for k, seconds in measured.items():
        predicted = model.predict(StepFeatures.from_shapes([(300, 1, k)], draft_model=True))
        assert predicted == pytest.approx(seconds, rel=0.08), k


def test_refits_take_at_most_their_share_of_the_observed_steps(monkeypatch):
    """With refit_share, a prediction refits only once the steps observed since the last refit
    lasted that refit's seconds over the share (here a refit takes 0.5 ms of a fake clock and
    steps 1 ms: one refit per 50 steps at 1%), and still not before refit_every steps."""
    clock = iter(i * 5e-4 for i in range(10**6))
    monkeypatch.setattr(cost_model.time, "perf_counter", lambda: next(clock))
    refits = {"shared": 0, "plain": 0}
    models = {
        "shared": OnlineLinearCostModel(refit_every=8, refit_share=0.01),
        "plain": OnlineLinearCostModel(refit_every=8),
    }
    for name, model in models.items():
        solve = model._solve

        def counted(*args, _solve=solve, _name=name, **kwargs):
            refits[_name] += 1
            return _solve(*args, **kwargs)

        model._solve = counted
        for i in range(500):
            f = StepFeatures.from_shapes([(100 + i, 1, i % 3)])
            model.observe(f, 1e-3)
            model.predict(f)
    assert refits["plain"] == pytest.approx(500 / 8, abs=2)
    assert refits["shared"] == pytest.approx(500 / 50, abs=2)


def test_the_fitted_rows_price_every_step_as_predict_does():
    """feature_vectors (the rows a refit solves over) and predict (written out per feature)
    are one model: a fitted theta dotted with a step's row is its prediction, with eager
    steps, replayed graphs, prefill chunks and every row ramp among the steps."""
    rng = random.Random(5)
    steps = [random_features(rng) for _ in range(300)]
    steps += [StepFeatures.from_shapes([(9, rows, 0)]) for rows in (1, 2, 5, 6, 7, 2048, 4000)]
    model = OnlineLinearCostModel()
    model.fit([(f, true_seconds(f) * (1 + 0.3 * rng.random())) for f in steps])
    rows = cost_model.feature_vectors(steps)
    assert rows.shape == (len(steps), len(cost_model.FEATURE_NAMES))
    want = [model.predict(f) for f in steps]
    assert (rows @ model._theta).tolist() == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_the_refits_median_is_numpys():
    """The refit's medians (relative weights, outlier bounds) by a partial sort: np.median's
    value, odd and even lengths alike."""
    rng = np.random.default_rng(2)
    for n in (1, 2, 3, 4, 255, 256, 317):
        values = rng.random(n)
        assert ridge.median(values) == np.median(values)
        assert ridge.median(np.full(n, 0.5)) == 0.5


def test_the_ring_holds_the_same_rows_written_late_as_written_every_step():
    """Observations reach the ring at the refit that reads them; past a full window of
    them, the ring holds what it would have held written one step at a time, slot for slot."""
    rng = random.Random(8)
    every, late = OnlineLinearCostModel(window=32), OnlineLinearCostModel(window=32)
    for i in range(100):
        f = random_features(rng)
        seconds = true_seconds(f)
        every.observe(f, seconds)
        late.observe(f, seconds)
        every._solve()
        if i in (10, 50):  # late's refits: a partial window, then 40 written over 32 slots
            late._solve()
    late._solve()
    assert late._x.tolist() == every._x.tolist()
    assert late._y.tolist() == every._y.tolist()
