"""SpecDriver in a running engine (tiny random Llama, token ids, float32, one thread).

Goodput control must choose k per request and per step (not one constant), and speculation
must stay lossless: greedy output token-identical to speculation off.
"""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.outputs import EngineStats
from engine.sampling_params import SamplingParams
from engine.speculation.control.goodput import GoodputPolicy
from tests.engine.factories import request_state_in

GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
# Repeated motifs give the n-gram proposer something to match, so some drafts are accepted
# and some rejected: acceptance estimates then differ by request and over time.
PROMPTS = [
    [5, 6, 7, 8, 9] * 6,
    [20, 21, 22, 23] * 5 + [40, 41, 42],
    [100 + (i * 7) % 50 for i in range(40)],
    [60, 61, 62, 60, 61, 63, 60, 61, 62, 60, 61],
]


def make_llm(model_dir, tmp_path, **flat) -> LLM:
    base = dict(
        model=str(model_dir),
        num_kv_blocks=128,
        threads=1,  # a shared 2-core box: two spinning OpenMP threads can be 100x slower
        spec_profile_seconds=0.3,
        spec_cost_cache=str(tmp_path / "cost_models.json"),
    )
    return LLM(config=EngineConfig.from_flat({**base, **flat}))


def record_plans(llm: LLM) -> list[dict[str, int]]:
    """Wrap the driver's plan() so the test sees every SpecPlan the engine used."""
    plans: list[dict[str, int]] = []
    original = llm.engine.spec.plan

    def plan(running, waiting=()):
        result = original(running, waiting)
        plans.append(dict(result))
        return result

    llm.engine.spec.plan = plan
    return plans


def generate(llm: LLM) -> list[list[int]]:
    return [o.output_token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory) -> list[list[int]]:
    return generate(make_llm(tiny_model_dir, tmp_path_factory.mktemp("off"), spec_policy="off"))


def test_goodput_varies_k_and_is_greedy_lossless(tiny_model_dir, tmp_path, reference):
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram")
    spec = llm.engine.spec
    assert isinstance(spec.policy, GoodputPolicy) and spec.cost_model.fitted  # profiled
    plans = record_plans(llm)
    assert generate(llm) == reference
    chosen = [k for plan in plans for k in plan.values()]
    assert len(set(chosen)) >= 2, f"goodput chose a single k: {set(chosen)}"
    assert any(len(set(plan.values())) >= 2 for plan in plans) or len(set(chosen)) >= 3
    # Planned slots are an upper bound: the n-gram proposer drafts only what it can match.
    assert 0 < spec.tally.totals.num_draft_tokens <= sum(chosen)
    assert 0 < spec.tally.totals.num_accepted_tokens < spec.tally.totals.num_draft_tokens
    # Every step was observed by the online model (profile samples + one per step).
    steps = llm.engine.stats().num_steps_total
    assert spec.cost_model.num_observations >= steps


def test_goodput_trees_plan_node_budgets_and_are_greedy_lossless(
    tiny_model_dir, tmp_path, reference
):
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram", spec_tree_nodes=6)
    policy = llm.engine.spec.policy
    assert isinstance(policy, GoodputPolicy) and policy.tree and policy.max_draft_tokens == 6
    assert policy.token_budget == llm.engine.config.scheduler.max_num_batched_tokens
    plans = record_plans(llm)
    assert generate(llm) == reference
    budgets = {k for plan in plans for k in plan.values()}
    assert budgets and max(budgets) <= 6
    assert llm.engine.spec.tally.totals.num_draft_tokens > 0


@pytest.mark.parametrize("policy", ["goodput", "fixed:3"])
def test_ngram_offers_bound_the_plan(tiny_model_dir, tmp_path, reference, policy):
    """The n-gram proposer says before the plan what it can draft: a request without a match
    is not planned (its estimate sees no phantom rejection), and every planned draft comes."""
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram", spec_policy=policy)
    plans = record_plans(llm)
    assert generate(llm) == reference
    planned = sum(k for plan in plans for k in plan.values())
    assert planned > 0 and llm.engine.spec.tally.totals.num_draft_tokens == planned
    assert any(plan == {} for plan in plans[len(PROMPTS) :])  # steps with no match plan none


def test_fixed_policy_does_not_profile_and_is_lossless(tiny_model_dir, tmp_path, reference):
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram", spec_policy="fixed:3")
    assert llm.engine.spec.seed_report is None
    assert not (tmp_path / "cost_models.json").exists()
    plans = record_plans(llm)
    assert generate(llm) == reference
    assert {k for plan in plans for k in plan.values()} <= {1, 2, 3}
    assert llm.engine.spec.tally.totals.num_draft_tokens > 0


def test_without_a_proposer_every_call_is_a_no_op(tiny_model_dir, tmp_path, reference):
    llm = make_llm(tiny_model_dir, tmp_path)
    spec = llm.engine.spec
    plans = record_plans(llm)
    assert generate(llm) == reference
    assert not spec.enabled and spec.proposer is None and spec.seed_report is None
    assert all(plan == {} for plan in plans) and plans
    assert spec.stats_fields()["spec_num_draft_tokens_total"] == 0
    assert spec.cost_model.num_observations == 0  # nothing predicts step times: none timed
    assert spec.last_goodput > 0  # the goodput gauge still reads each step


def test_stats_fields_fill_engine_stats(tiny_model_dir, tmp_path):
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram")
    llm.engine.spec.rest = None  # every step plans: the last one's plan time is read below
    generate(llm)
    fields = llm.engine.spec.stats_fields()
    assert set(fields) <= {f.name for f in dataclasses.fields(EngineStats)}
    stats = llm.engine.stats()
    assert stats.last_predicted_step_time is not None and stats.last_predicted_step_time > 0
    assert stats.last_goodput > 0
    assert 0 < stats.last_plan_time < stats.last_step_time  # planning is part of the step
    per_position = stats.spec_accepted_per_position_total
    assert sum(per_position) == stats.spec_num_accepted_tokens_total
    assert list(per_position) == sorted(per_position, reverse=True)  # prefix acceptance


def test_finished_requests_leave_no_state_behind(tiny_model_dir, tmp_path):
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram")
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert any(o.spec.num_draft_tokens for o in outputs)  # they did speculate
    # What the engine kept about each lived on its Request, and went with it.
    assert not request_state_in(llm.engine, lambda key: str(key).startswith("offline-"))


def test_ngram_results_carry_the_matched_order(tiny_model_dir, tmp_path, reference):
    """Each n-gram candidate's kind ("n<order>") reaches the policy with its result, so the
    acceptance is learned per matched order."""
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram", spec_policy="goodput")
    policy = llm.engine.spec.policy
    kinds: list[str] = []
    original = policy.observe

    def observe(results, features, seconds):
        kinds.extend(r.kind for r in results)
        original(results, features, seconds)

    policy.observe = observe
    assert generate(llm) == reference
    assert kinds and all(k in ("n1", "n2", "n3", "n4") for k in kinds)
    assert len(set(kinds)) >= 2


def test_candidates_carry_the_tokens_their_request_has_left(tiny_model_dir, tmp_path):
    """The policy sees how many tokens each request may still emit (a draft model's
    catch-up is spread over them)."""
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram")
    seen = []
    policy = llm.engine.spec.policy
    original = policy.plan

    def plan(candidates, base):
        seen.extend((c.request_id, c.num_remaining_tokens) for c in candidates)
        return original(candidates, base)

    policy.plan = plan
    llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    left = [n for _, n in seen]
    assert left and left[0] <= GREEDY.max_tokens - 1 and left == sorted(left, reverse=True)
    assert min(left) >= 1


def test_the_policy_sees_every_decode_with_a_cap_of_0_where_it_cannot_draft(
    tiny_model_dir, tmp_path
):
    """A request the n-gram proposer has no match for still decodes: the policy gets it at a
    cap of 0 (its token and its row count in every plan's goodput), so a plan always sees
    the step's whole batch of decodes."""
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram")
    calls = []
    policy = llm.engine.spec.policy
    original = policy.plan

    def plan(candidates, base):
        calls.append(sorted(c.max_draft_tokens for c in candidates))
        return original(candidates, base)

    policy.plan = plan
    llm.engine.spec.rest = None  # plan every step
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert calls and all(any(caps) for caps in calls)  # asked only where some may draft
    assert any(caps[0] == 0 for caps in calls if len(caps) == len(PROMPTS))


@pytest.mark.parametrize(
    "proposers, policy",
    [("ngram", "fixed:2"), ("recycle", "fixed:2"), ("ngram,recycle", "goodput")],
)
def test_observations_reach_only_proposers_that_observe(
    tiny_model_dir, tmp_path, reference, proposers, policy
):
    """The driver builds Observations only for a proposer that observes: the n-gram proposer
    (observes = False, its observe() does nothing) is never handed any, alone or in a set;
    recycle, alone or in a set, gets one per request for every step that emitted tokens.
    Outputs stay greedy-identical."""
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer=proposers, spec_policy=policy)
    proposer = llm.engine.spec.proposer
    members = getattr(proposer, "proposers", {proposer.name: proposer})
    calls: dict[str, int] = {name: 0 for name in members}

    def counted(name, original):
        def observe(observations):
            assert observations
            calls[name] += len(observations)
            original(observations)

        return observe

    for name, member in members.items():
        member.observe = counted(name, member.observe)
    assert generate(llm) == reference
    assert calls.get("ngram", 0) == 0
    if "recycle" in calls:  # every emitted token's step, each request's: at least its outputs
        assert calls["recycle"] >= len(PROMPTS) * GREEDY.max_tokens // (1 + 2)
