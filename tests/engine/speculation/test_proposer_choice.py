"""Proposer choice by goodput (issue #12): the search picks a proposer and k per request, the
policy keeps per-request, per-proposer estimates and probes proposers it has not tried, and
a ProposerSet routes drafts and keeps every proposer's state. Pure Python, milliseconds."""

from __future__ import annotations

import itertools
import random

import pytest

from engine.config import SpecConfig
from engine.outputs import Drafts, RequestStepOutput
from engine.speculation.control.acceptance import expected_emitted
from engine.speculation.control.goodput import GoodputPolicy
from engine.speculation.control.policy import SpecCandidate
from engine.speculation.control.search import SearchProblem, SearchSlot, best_lengths
from engine.speculation.proposers.proposer import Observation, ProposeRequest
from engine.speculation.proposers.proposer_set import ProposerSet
from tests.engine.factories import request_state_in
from tests.engine.speculation.control.test_goodput import (  # noqa: F401 - fresh_records: autouse
    RECORDS,
    LinearCost,
    decode_base,
    fresh_records,
    result,
    spec,
)

NAMES = ("ngram", "recycle", "draft")


def option(name: str, a: float, cap: int = 4, seconds: float = 0.0) -> SearchSlot:
    gains = [a**j for j in range(1, cap + 1)]
    return SearchSlot(gains, range(1, cap + 1), cap, 0, name, name == "draft", seconds)


def choose(rates: list[dict[str, float]], cost, cap: int = 4, seconds=None):
    """The search over requests given {proposer: acceptance} each; (names, ks, result)."""
    seconds = seconds or {}
    slots = [[option(n, a, cap, seconds.get(n, 0.0)) for n, a in r.items()] for r in rates]
    problem = SearchProblem(slots, decode_base(len(rates)), cost)
    result = best_lengths(problem)
    names = [s.proposer for s in problem.chosen(result.picks)]
    return [n if k else "none" for n, k in zip(names, result.ks)], result.ks, result


def test_the_proposer_with_higher_acceptance_per_unit_cost_wins():
    cost = LinearCost(0.01, 1e-3)
    assert choose([{"ngram": 0.8, "recycle": 0.4}], cost)[0] == ["ngram"]
    assert choose([{"ngram": 0.4, "recycle": 0.8}], cost)[0] == ["recycle"]
    # The same acceptances, but n-gram's CPU time per request costs more than it buys.
    slow = {"ngram": 0.02}
    assert choose([{"ngram": 0.8, "recycle": 0.7}], cost, seconds=slow)[0] == ["recycle"]


def test_a_costly_draft_model_loses_to_a_free_ngram_of_equal_acceptance():
    cost = LinearCost(0.01, 1e-3, per_draft_step=0.005)
    names, ks, result = choose([{"ngram": 0.7, "draft": 0.7}] * 4, cost)
    assert names == ["ngram"] * 4 and min(ks) > 0
    assert result.predicted_seconds == pytest.approx(
        cost.predict(decode_base(4).with_drafts(sum(ks), 4))
    )


def test_a_draft_model_of_much_higher_acceptance_wins_despite_its_passes():
    cost = LinearCost(0.01, 1e-3, per_draft_step=0.002)
    names, ks, _ = choose([{"ngram": 0.2, "draft": 0.9}] * 4, cost)
    assert names == ["draft"] * 4 and min(ks) >= 3
    # Mixed batch: only the requests where the draft is much better use it.
    cheap = LinearCost(0.01, 1e-3, per_draft_step=0.0005)
    names, ks, _ = choose([{"ngram": 0.2, "draft": 0.9}, {"ngram": 0.95, "draft": 0.6}], cheap)
    assert names == ["draft", "ngram"]


def test_requests_sharing_the_draft_model_pay_its_passes_once():
    cost = LinearCost(0.01, 1e-4, per_draft_step=0.004)
    names, ks, result = choose([{"ngram": 0.1, "draft": 0.85}] * 8, cost)
    assert names == ["draft"] * 8
    passes = max(ks)  # one pass per depth for the whole batch, not one per request
    features = decode_base(8).with_drafts(sum(ks), 8, passes)
    assert result.predicted_seconds == pytest.approx(cost.predict(features))
    per_request = decode_base(8).with_drafts(sum(ks), 8, sum(ks))
    assert result.predicted_seconds < 0.5 * cost.predict(per_request)


def brute_force(rates: list[dict[str, float]], cost, cap: int, seconds: dict[str, float]) -> float:
    """Every (proposer, k) per request; draft passes = the deepest draft-model chain."""
    base, best = decode_base(len(rates)), 0.0
    choices = [[(n, k) for n in r for k in range(cap + 1)] for r in rates]
    for plan in itertools.product(*choices):
        ks = [k for _, k in plan]
        passes = max((k for n, k in plan if n == "draft"), default=0)
        features = base.with_drafts(sum(ks), sum(k > 0 for k in ks), passes)
        extra = sum(seconds.get(n, 0.0) for n, k in plan if k)
        emitted = sum(expected_emitted(r[n], k) for r, (n, k) in zip(rates, plan))
        best = max(best, emitted / (cost.predict(features) + extra))
    return best


def test_search_with_proposer_choice_reaches_the_brute_force_optimum():
    rng = random.Random(7)
    for _ in range(40):
        names = rng.sample(NAMES, rng.randint(2, 3))
        rates = [{n: rng.random() for n in names} for _ in range(rng.randint(1, 3))]
        cost = LinearCost(
            rng.uniform(0.005, 0.03),
            rng.uniform(1e-4, 5e-3),
            per_draft_step=rng.choice([0.0, rng.uniform(0, 0.02)]),
            per_spec_request=rng.choice([0.0, rng.uniform(0, 0.01)]),
        )
        seconds = {n: rng.choice([0.0, rng.uniform(0, 0.005)]) for n in names if n != "draft"}
        best = brute_force(rates, cost, 3, seconds)
        assert choose(rates, cost, 3, seconds)[2].goodput >= 0.99 * best


def test_dominated_model_free_options_are_dropped_before_the_search():
    slots = [[option("ngram", 0.5), option("recycle", 0.7), option("draft", 0.2)]]
    problem = SearchProblem(slots, decode_base(1), LinearCost(0.01, 1e-3))
    assert [o.proposer for o in problem.options[0]] == ["recycle", "draft"]  # draft: own kind
    costly = [[option("ngram", 0.5), option("recycle", 0.7, seconds=0.01)]]
    problem = SearchProblem(costly, decode_base(1), LinearCost(0.01, 1e-3))
    assert [o.proposer for o in problem.options[0]] == ["ngram", "recycle"]  # a trade-off
    twins = [[option("ngram", 0.5), option("recycle", 0.5)]]
    problem = SearchProblem(twins, decode_base(1), LinearCost(0.01, 1e-3))
    assert [o.proposer for o in problem.options[0]] == ["ngram"]  # a tie keeps the first


# ---- the policy ----------------------------------------------------------------------------
def choice_policy(cost=None, **options) -> GoodputPolicy:
    cost = cost or LinearCost(0.01, 1e-3, per_draft_step=0.002)
    return GoodputPolicy(cost, max_draft_tokens=4, proposers=NAMES, draft_model=True, **options)


def teach(policy: GoodputPolicy, request_id: str, rates: dict[str, float]) -> None:
    rng = random.Random(request_id)
    for name, a in rates.items():
        for _ in range(40):
            accepted = 0
            while accepted < 4 and rng.random() < a:
                accepted += 1
            policy.observe([result(request_id, 4, accepted, name)], decode_base(1), 0.01)


def candidates(*request_ids: str) -> list[SpecCandidate]:
    return [SpecCandidate(request_id, 200, 4, spec(request_id)) for request_id in request_ids]


def chosen(*request_ids: str) -> dict[str, str]:
    """The proposer the last plan chose for each request that speculates."""
    return {r: spec(r).proposer for r in request_ids if spec(r).proposer}


def test_the_policy_keeps_estimates_per_request_and_proposer_and_picks_per_request():
    policy = choice_policy(LinearCost(0.01, 1e-3, per_draft_step=0.0005), explore_interval=1000)
    teach(policy, "copy", {"ngram": 0.9, "recycle": 0.3, "draft": 0.5})
    teach(policy, "chat", {"ngram": 0.05, "recycle": 0.3, "draft": 0.85})
    plan = policy.plan(candidates("copy", "chat"), decode_base(2))
    assert plan.keys() == {"copy", "chat"}
    assert chosen("copy", "chat") == {"copy": "ngram", "chat": "draft"}
    assert policy.rate(spec("copy"), "ngram") > 0.8 and policy.rate(spec("chat"), "draft") > 0.75
    assert spec("copy").acceptance.keys() == set(NAMES)  # on the request, one per proposer
    assert not request_state_in(policy, lambda key: key in RECORDS)


def test_a_proposer_never_tried_on_a_request_is_probed_now_and_then():
    # draft passes cheap enough that all four drafts accepted would beat n-gram's 0.95: a
    # probe of it could pay off (control/probe_value.py)
    policy = choice_policy(LinearCost(0.01, 1e-3, per_draft_step=1e-4), explore_interval=4)
    teach(policy, "a", {"ngram": 0.95})  # recycle and draft: never run on "a"
    teach(policy, "b", {"draft": 0.3})  # verified elsewhere: a draft model never verified
    # anywhere is probed at once (test_catchup.py), this test is about the interval
    runs = []
    for _ in range(16):
        plan = policy.plan(candidates("a"), decode_base(1))
        runs.append((chosen("a").get("a"), plan.get("a", 0)))
    probes = [run for run in runs if run[0] != "ngram"]
    assert {name for name, _ in probes} == {"recycle", "draft"}
    assert all(k >= 1 for _, k in probes) and len(probes) <= 6  # one probe per 4 plans
    assert runs.count(("ngram", 4)) >= 10  # the rest of the time the best one runs


def test_with_one_proposer_nothing_is_reported_as_chosen():
    policy = GoodputPolicy(LinearCost(0.01, 1e-4), max_draft_tokens=4, prior=0.9)
    assert policy.plan(candidates("a"), decode_base(1)) == {"a": 4}
    assert chosen("a") == {}


def test_model_free_cpu_time_enters_the_choice():
    policy = choice_policy(LinearCost(0.01, 1e-3), explore_interval=1000)
    teach(policy, "a", {"ngram": 0.8, "recycle": 0.75, "draft": 0.0})
    policy.plan(candidates("a"), decode_base(1))
    assert chosen("a") == {"a": "ngram"}
    policy.propose_seconds["ngram"] = 0.05
    policy.plan(candidates("a"), decode_base(1))
    assert chosen("a") == {"a": "recycle"}


# ---- the proposer set --------------------------------------------------------------------
class FakeProposer:
    """Keeps its per-request state where a proposer must: in the request's memos."""

    def __init__(self, name: str, token: int, target_topk: int = 0) -> None:
        self.name, self.token, self.target_topk = name, token, target_topk
        self.asked: list[str] = []
        self.observed: list[tuple[str, tuple[int, ...]]] = []

    def propose(self, requests):
        self.asked.extend(r.request_id for r in requests)
        for r in requests:
            r.memos[self.name] = len(r.token_ids)
        return Drafts(chains={r.request_id: [self.token] * r.num_draft_tokens for r in requests})

    def observe(self, observations):
        self.observed.extend((o.step.request_id, tuple(o.step.token_ids)) for o in observations)


MEMOS: dict[str, dict] = {}  # request id -> its memos (SpecState.memos on an engine Request)


def ask(request_id: str, proposer: str, k: int = 2) -> ProposeRequest:
    memos = MEMOS.setdefault(request_id, {})
    return ProposeRequest(request_id, [1, 2, 3], k, proposer=proposer, memos=memos)


def test_the_set_routes_each_request_to_its_proposer_and_merges_drafts():
    members = {n: FakeProposer(n, t, topk) for n, t, topk in (("ngram", 7, 0), ("recycle", 8, 8))}
    members["draft"] = FakeProposer("draft", 9)
    proposers = ProposerSet(members)
    assert proposers.name == "ngram,recycle,draft" and proposers.target_topk == 8
    drafts = proposers.propose([ask("a", "ngram"), ask("b", "draft", 3), ask("c", "ngram")])
    assert drafts.chains == {"a": [7, 7], "b": [9, 9, 9], "c": [7, 7]}
    assert members["ngram"].asked == ["a", "c"] and members["recycle"].asked == []
    assert drafts.target_topk == 8 and drafts.proposer_time >= proposers.free_seconds
    assert set(proposers.seconds_per_request) == {"ngram"}  # model-free ones that ran


def test_switching_proposers_keeps_every_state_fed_and_on_the_request():
    members = {n: FakeProposer(n, i) for i, n in enumerate(NAMES)}
    proposers = ProposerSet(members)
    MEMOS.clear()
    for step, name in enumerate(["ngram", "draft", "recycle", "draft", "ngram"]):
        proposers.propose([ask("a", name)])
        step_output = RequestStepOutput("a", (step,))
        proposers.observe([Observation(step_output, memos=MEMOS["a"])])
    for member in members.values():  # every verified token reached every proposer
        assert member.observed == [("a", (step,)) for step in range(5)]
    assert MEMOS["a"].keys() == set(NAMES)  # each member's state, on the request
    assert not request_state_in(proposers, lambda key: key == "a")


def test_config_parses_auto_and_lists_and_refuses_what_cannot_run():
    assert SpecConfig(proposer="auto").proposers == ("ngram", "recycle")
    assert SpecConfig(proposer="auto", draft_model="self:1").proposers == NAMES
    assert SpecConfig(proposer="recycle,ngram").proposers == ("recycle", "ngram")
    assert SpecConfig(proposer="ngram").proposers == ("ngram",) and SpecConfig().proposers == ()
    with pytest.raises(ValueError, match="needs --draft-model"):
        SpecConfig(proposer="ngram,draft")
    with pytest.raises(ValueError, match="goodput"):
        SpecConfig(proposer="auto", spec_policy="fixed:2")
    with pytest.raises(ValueError, match="each name"):
        SpecConfig(proposer="ngram,eagle")
    with pytest.raises(ValueError, match="must be one of"):
        SpecConfig(proposer="ngram,ngram")


# ---- driver + scheduler: switching proposers leaks nothing ---------------------------------
class RandomChoice:
    """A SpecPolicy drawing a proposer and k per request and step."""

    last_predicted_step_time = None

    def __init__(self, seed: int) -> None:
        self.rng, self.chosen = random.Random(seed), {}

    def plan(self, candidates, base):
        self.chosen = {c.request_id: self.rng.choice(NAMES) for c in candidates}
        plan = {c.request_id: self.rng.randint(0, c.max_draft_tokens) for c in candidates}
        for c in candidates:
            c.spec.proposer = self.chosen[c.request_id]
        return {request_id: k for request_id, k in plan.items() if k}

    def observe(self, results, features, step_seconds) -> None:
        # Shadow checks (built for goodput, kept here) report the members not chosen.
        assert all(r.proposer == self.chosen[r.request_id] for r in results if not r.shadow)


def test_switching_proposers_every_step_leaks_no_blocks_and_no_state():
    from engine.speculation.build import make_spec_driver
    from tests.engine.factories import FakeModel, check_block_invariants, make_scheduler

    scheduler = make_scheduler(num_blocks=12, block_size=8, max_num_batched_tokens=40)
    members = {n: FakeProposer(n, 5 + i) for i, n in enumerate(NAMES)}
    config = SpecConfig(proposer=",".join(NAMES), draft_model="self:1")
    driver = make_spec_driver(config, ProposerSet(members), token_budget=40)
    driver.policy = RandomChoice(seed=3)
    model, rng, finished = FakeModel(seed=4), random.Random(5), []
    requests = [_request(f"r{i}", rng) for i in range(12)]
    for request in requests:
        scheduler.add_request(request)
    for _ in range(500):
        if not scheduler.has_unfinished_requests():
            break
        sched = scheduler.schedule(driver.plan(scheduler.running, scheduler.waiting))
        drafts = driver.propose(sched)
        # Preempted: their blocks are gone, and so is what the proposers knew of them.
        assert all(not request.spec.memos for request in sched.preempted)
        out = model.execute(sched)
        changed = scheduler.update(sched, out)
        driver.observe(sched, drafts, out)
        check_block_invariants(scheduler)
        finished.extend(request for request in changed if request.is_finished)
    assert len(finished) == len(requests) and scheduler.num_preemptions_total > 0
    assert scheduler.block_manager.num_free_blocks == 12
    ids = {request.request_id for request in requests}
    for member in members.values():
        assert member.asked  # each drafted, and kept nothing of any request
        assert not request_state_in(member, lambda key: key in ids)
        for request in requests:  # and each saw every token of every request
            seen = [t for r, tokens in member.observed if r == request.request_id for t in tokens]
            assert seen == request.output_token_ids
    assert not request_state_in(driver, lambda key: key in ids)
    for request in requests:  # per-proposer stats add up to the request's own
        counts = request.spec.counts
        parts = counts.by_proposer.values()
        assert sum(p.num_draft_tokens for p in parts) == counts.num_draft_tokens


def _request(request_id: str, rng: random.Random):
    from engine.request import Request
    from engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=rng.randint(8, 24))
    prompt = [rng.randint(5, 50) for _ in range(rng.randint(4, 20))]
    return Request(request_id, prompt, params)


def test_with_choice_a_member_that_offers_nothing_is_not_chosen_and_kinds_reach_results():
    """The n-gram member offers no match on "chat" this step (cap 0): the policy drafts with
    another member there even though n-gram's estimate is the best; on "copy" it offers a
    4-gram match, so n-gram drafts (at most what it offered) and the request's record names
    the kind for the result's estimate."""
    policy = choice_policy(LinearCost(0.01, 1e-3, per_draft_step=0.0005), explore_interval=1000)
    for request_id in ("copy", "chat"):
        teach(policy, request_id, {"ngram": 0.95, "recycle": 0.6, "draft": 0.6})
    copy = SpecCandidate("copy", 200, 4, spec("copy"), offers={"ngram": (2, "n4")})
    chat = SpecCandidate("chat", 200, 4, spec("chat"), offers={"ngram": (0, "")})
    plan = policy.plan([copy, chat], decode_base(2))
    assert spec("copy").proposer == "ngram" and spec("chat").proposer in ("recycle", "draft")
    assert 0 < plan["copy"] <= 2
    assert spec("copy").kind == "n4" and spec("chat").kind == ""
