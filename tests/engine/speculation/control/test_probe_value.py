"""The probe screen (control/probe_value.py): a forced probe runs only where the probed option,
every draft accepted, could beat the request's best other option. Pure Python, milliseconds."""

from __future__ import annotations

from engine.speculation.control.probe_value import could_win
from engine.speculation.control.search import SearchSlot
from kernels.graph_shapes import NO_GRAPHS
from tests.engine.speculation.control.test_goodput import (  # noqa: F401 - fresh_records: autouse
    LinearCost,
    decode_base,
    fresh_records,
    spec,
)
from tests.engine.speculation.test_proposer_choice import candidates, choice_policy, teach

COST = LinearCost(0.01, 1e-3, per_draft_step=0.002)  # 10 ms + 1 ms a row, a pass 2 ms
CHEAP = LinearCost(0.01, 1e-3, per_draft_step=1e-4)


def chain(a: float, proposer: str = "ngram", draft: bool = False, seconds: float = 0.0):
    gains = [a**j for j in range(1, 5)]
    return SearchSlot(gains, range(1, 5), 4, 0, proposer, draft, seconds)


def test_a_draft_model_that_could_not_win_even_accepting_everything_is_not_probed():
    """n-gram at 0.95 emits 4.52 tokens in a 15 ms step (301/s); the draft model, all four
    accepted, 5 in 23 ms (217/s): no acceptance a probe could find makes it the choice. Where
    n-gram has nothing, plain decoding (100/s) is the bar, and the probe could pay off."""
    draft = chain(0.3, "draft", draft=True)
    assert not could_win([chain(0.95), draft], 1, decode_base(1), COST, NO_GRAPHS, 1)
    assert could_win([chain(0.0), draft], 1, decode_base(1), COST, NO_GRAPHS, 1)
    assert could_win([chain(0.95), draft], 1, decode_base(1), CHEAP, NO_GRAPHS, 1)


def test_plain_decoding_is_the_bar_for_a_lone_option():
    """A draft model whose passes cost 50 ms could not beat decoding plainly even at full
    acceptance (5 tokens in 214 ms against 1 in 11 ms)."""
    dear = LinearCost(0.01, 1e-3, per_draft_step=0.05)
    draft = chain(0.3, "draft", draft=True)
    assert not could_win([draft], 0, decode_base(1), dear, NO_GRAPHS, 1)
    assert could_win([draft], 0, decode_base(1), COST, NO_GRAPHS, 1)


def test_a_probe_is_judged_without_the_catchup_it_pays_once():
    """The draft option's slot carries its share of catching up (0.2 s here: unknown length,
    all of it); after the probe the draft model is in step, so the screen prices it at the
    proposing seconds it is given, and a probe that could pay is not refused for it."""
    behind = chain(0.3, "draft", draft=True, seconds=0.2)
    assert could_win([chain(0.0), behind], 1, decode_base(1), COST, NO_GRAPHS, 1)
    assert not could_win([chain(0.0), behind], 1, decode_base(1), COST, NO_GRAPHS, 1, 0.0, 0.2)


def test_the_policy_probes_the_draft_model_only_where_it_could_be_chosen():
    """Request "a": n-gram accepts 0.95, the draft model (verified elsewhere) cannot win even
    at full acceptance: over 32 plans it is never probed (before the screen, one in four plans
    was a probe of it, each a draft-model pass and, on a real pair, its catch-up). Request
    "b": n-gram accepts nothing, and the draft model is probed."""
    policy = choice_policy(LinearCost(0.01, 1e-3, per_draft_step=0.002), explore_interval=4)
    policy.exploration.shadowed = frozenset({"ngram", "recycle"})  # as under goodput
    teach(policy, "a", {"ngram": 0.95})
    teach(policy, "b", {"ngram": 0.0})
    teach(policy, "elsewhere", {"draft": 0.3})
    runs = {"a": [], "b": []}
    for request_id, plans in runs.items():
        for _ in range(32):
            plan = policy.plan(candidates(request_id), decode_base(1))
            plans.append(spec(request_id).proposer if plan else "")
    assert "draft" not in runs["a"] and runs["a"].count("ngram") >= 30
    assert runs["b"].count("draft") >= 4
