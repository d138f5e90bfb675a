"""Shadow checks (engine/speculation/shadow.py): model-free chains checked against the emitted
tokens instead of verified. Unit tests in milliseconds, then the engine (tiny random Llama):
every outcome is the emitted tokens' prefix match at the right position, greedy and sampled,
and the output stays what speculation off emits."""

from __future__ import annotations

import dataclasses

import pytest

from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.speculation.proposers.proposer import DRAFT_PROPOSER
from engine.speculation.shadow import SHADOW_SPACING, Shadow, ShadowChecks
from tests.engine.speculation.control.test_goodput import (  # noqa: F401 - fresh_records: autouse
    LinearCost,
    decode_base,
    fresh_records,
    result,
)
from tests.engine.speculation.test_driver import make_llm
from tests.engine.speculation.test_proposer_choice import candidates, choice_policy, spec, teach


def test_a_check_ends_at_its_first_differing_draft_or_when_every_draft_matched():
    shadow = Shadow(10, (1, 2, 3, 4), "")
    assert not shadow.feed([1]) and not shadow.done  # one step, one token: still open
    assert shadow.feed([2, 9, 3]) and shadow.done and shadow.matched == 2
    whole = Shadow(10, (1, 2), "")
    assert whole.feed([1, 2, 7]) and whole.matched == 2  # the bonus token is past the chain
    first = Shadow(10, (5,), "")
    assert first.feed([6]) and first.matched == 0
    assert not first.due(10 + SHADOW_SPACING - 1) and first.due(10 + SHADOW_SPACING)
    assert not Shadow(10, (5,), "").due(100)  # open checks are never replaced


class ChainProposer:
    """Proposes `chain`; with `offers`, says before proposing (as the n-gram proposer does)."""

    def __init__(self, name: str, chain: list[int], offers: tuple[int, str] | None = None):
        self.name, self.chain, self.asked = name, chain, []
        if offers is not None:
            self.offer = lambda memos, token_ids, k, tree: offers

    def propose(self, requests):
        from engine.outputs import Drafts

        self.asked += [(r.request_id, r.num_draft_tokens, r.proposer) for r in requests]
        return Drafts(chains={r.request_id: self.chain[: r.num_draft_tokens] for r in requests})


def make_request(request_id: str) -> Request:
    return Request(request_id, [1, 2, 3], SamplingParams(max_tokens=50))


def test_checks_start_where_a_proposer_does_not_draft_and_not_more_often_than_the_spacing():
    ngram = ChainProposer("ngram", [7, 8, 9], offers=(3, "n2"))
    recycle = ChainProposer("recycle", [4, 5])
    checks = ShadowChecks({"ngram": ngram, "recycle": recycle})
    a, b = make_request("a"), make_request("b")
    checks.start([(a, 3, "ngram"), (b, 2, "")])
    assert ngram.asked == [("b", 2, "ngram")] and recycle.asked == [
        ("a", 3, "recycle"),
        ("b", 2, "recycle"),
    ]
    assert a.spec.shadows.keys() == {"recycle"} and b.spec.shadows.keys() == {"ngram", "recycle"}
    assert b.spec.shadows["ngram"] == Shadow(3, (7, 8), "n2", opened=1)  # the offer's kind
    # Open checks are not replaced; the outcomes come with the emitted tokens.
    checks.start([(a, 3, "ngram"), (b, 2, "")])
    assert len(recycle.asked) == 2 and len(ngram.asked) == 1
    a.output_token_ids.append(4)
    assert checks.check(a) == []  # one draft of two matched so far
    b.output_token_ids += [7, 1]
    outcomes = checks.check(b)
    assert {(r.proposer, r.num_draft_tokens, r.num_accepted_tokens, r.kind) for r in outcomes} == {
        ("ngram", 2, 1, "n2"),
        ("recycle", 2, 0, ""),
    }
    assert all(r.shadow and r.spec is b.spec for r in outcomes)
    checks.start([(b, 2, "")])  # b is at 5 tokens: not yet due (started at 3)
    assert len(ngram.asked) == 1
    b.output_token_ids += [0, 0]
    checks.start([(b, 2, "recycle")])  # due for n-gram; recycle drafts, so it is not checked
    assert len(ngram.asked) == 2 and "recycle" not in b.spec.shadows


@pytest.mark.parametrize("every", [1, 2, 5])
def test_a_check_fed_on_some_steps_only_has_the_outcome_of_one_fed_every_step(every):
    """A check reads the request's tokens since it was last fed: checked every step, every
    other step or once after five, a chain of four whose third draft differs reports two."""
    ngram = ChainProposer("ngram", [7, 8, 9, 6], offers=(4, "n1"))
    checks, request = ShadowChecks({"ngram": ngram}), make_request("a")
    checks.start([(request, 4, "")])
    outcomes = []
    for step, token in enumerate([7, 8, 5, 6, 0], 1):
        request.output_token_ids.append(token)
        if step % every == 0:
            outcomes += checks.check(request)
    assert [(r.num_draft_tokens, r.num_accepted_tokens) for r in outcomes] == [(4, 2)]
    assert checks.check(request) == []  # done: reported once


def test_a_proposer_that_offers_nothing_is_not_asked():
    ngram = ChainProposer("ngram", [7], offers=(0, ""))
    checks = ShadowChecks({"ngram": ngram})
    request = make_request("a")
    checks.start([(request, 4, "")])
    assert ngram.asked == []
    waiting = request.spec.shadows["ngram"]  # done at once: the request waits its turn again
    assert waiting.done and waiting.draft == () and not waiting.due(request.num_tokens)
    request.output_token_ids += [1, 2]
    assert checks.check(request) == []


def test_a_shadow_outcome_moves_the_estimate_and_stands_in_for_a_probe_but_is_not_calibrated():
    # draft passes cheap enough for a probe of the draft model to pay off (probe_value.py)
    policy = choice_policy(LinearCost(0.01, 1e-3, per_draft_step=1e-4), explore_interval=4)
    teach(policy, "a", {"ngram": 0.95})
    estimator = policy.estimators["recycle"]
    before, calibration = policy.rate(spec("a"), "recycle"), list(estimator._calibration)
    probes = []
    for _ in range(16):
        plan = policy.plan(candidates("a"), decode_base(1))
        probes.append(spec("a").proposer if plan else "")
        shadow = dataclasses.replace(result("a", 4, 0, "recycle"), shadow=True)
        policy.observe([shadow], decode_base(1), 0.01)
    assert "recycle" not in probes and "draft" in probes  # draft is never checked, so probed
    assert policy.rate(spec("a"), "recycle") < before / 2
    assert estimator._calibration == calibration  # no plan acted on a shadow outcome


def test_a_shadow_checked_proposer_is_never_forced_to_probe():
    """Estimates near 0 for every proposer: only probes draft. Without checks the model-free
    proposers are probed too (a verify row each); where they are checked, only the draft model."""
    probed = {}
    for request_id, shadowed in (("a", frozenset()), ("b", frozenset({"ngram", "recycle"}))):
        policy = choice_policy(explore_interval=4)
        policy.exploration.shadowed = shadowed
        teach(policy, request_id, {"ngram": 0.0, "recycle": 0.0, "draft": 0.0})
        probes = set()
        for _ in range(24):
            if policy.plan(candidates(request_id), decode_base(1)):
                probes.add(spec(request_id).proposer)
        probed[shadowed] = probes
    assert probed[frozenset()] == {"ngram", "recycle", "draft"}
    assert probed[frozenset({"ngram", "recycle"})] == {"draft"}


def test_only_goodputs_chains_check_and_never_the_draft_model(tiny_model_dir, tmp_path):
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram,recycle")
    assert set(llm.engine.spec.shadows.proposers) == {"ngram", "recycle"}
    assert llm.engine.spec.policy.exploration.shadowed == {"ngram", "recycle"}
    off = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram", spec_shadow_checks=False)
    assert off.engine.spec.shadows is None and not off.engine.spec.policy.exploration.shadowed
    alone = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram")
    assert alone.engine.spec.policy.exploration.shadowed == {""}  # a single proposer's estimate
    fixed = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram", spec_policy="fixed:3")
    assert fixed.engine.spec.shadows is None
    tree = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram", spec_tree_nodes=6)
    assert tree.engine.spec.shadows is None
    assert DRAFT_PROPOSER not in llm.engine.spec.shadows.proposers


PROMPTS = [
    [5, 6, 7, 8, 9] * 6,
    [20, 21, 22, 23] * 5 + [40, 41, 42],
    [100 + (i * 7) % 50 for i in range(40)],
]


def record_checks(llm) -> list[tuple[str, int, tuple[int, ...], int]]:
    """(request id, start, draft, matched) of every outcome the engine's checks report."""
    checks, records = llm.engine.spec.shadows, []
    original = checks.check

    def check(request):
        opened = {name: s for name, s in request.spec.shadows.items() if not s.done}
        results = original(request)
        for r in results:
            shadow = opened[r.proposer]
            records.append((request.request_id, shadow.start, shadow.draft, r.num_accepted_tokens))
        return results

    checks.check = check
    return records


def prefix_match(draft: tuple[int, ...], emitted: list[int]) -> int:
    matched = 0
    while matched < len(draft) and matched < len(emitted) and draft[matched] == emitted[matched]:
        matched += 1
    return matched


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=64, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=64, temperature=1.0, top_k=2, seed=7, ignore_eos=True),
    ],
    ids=["greedy", "sampled"],  # top-k 2: the tiny model's flat rows would match no chain
)
def test_every_outcome_is_the_prefix_the_emitted_tokens_match_and_output_is_unchanged(
    tiny_model_dir, tmp_path, params
):
    off = make_llm(tiny_model_dir, tmp_path, spec_policy="off")
    reference = [o.output_token_ids for o in off.generate(PROMPTS, params, use_tqdm=False)]
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram,recycle")
    records = record_checks(llm)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.output_token_ids for o in outputs] == reference
    tokens = {o.request_id: PROMPTS[i] + o.output_token_ids for i, o in enumerate(outputs)}
    assert len(records) >= 10
    for request_id, start, draft, matched in records:
        emitted = tokens[request_id][start : start + len(draft)]
        assert len(emitted) == len(draft) or matched < len(emitted)  # resolved by real tokens
        assert matched == prefix_match(draft, emitted), (request_id, start, draft)
    # Not vacuous: some check matched drafts and then ended at a differing one. (Which steps are
    # checked follows the controller's timed plans, so no one position's outcome is fixed.)
    assert any(0 < matched < len(draft) for *_, draft, matched in records)


def test_at_most_the_budget_starts_per_step_the_longest_unchecked_first():
    ngram = ChainProposer("ngram", [7], offers=(0, ""))  # nothing: each check done at once
    checks = ShadowChecks({"ngram": ngram}, budget=3)
    requests = [make_request(str(i)) for i in range(7)]
    batch = [(request, 4, "") for request in requests]

    def opened(step: int) -> list[str]:
        return [
            r.request_id
            for r in requests
            if r.spec.shadows.get("ngram", Shadow(0, (), "")).opened == step
        ]

    checks.start(batch)
    assert opened(1) == ["0", "1", "2"]
    for request in requests:
        request.output_token_ids += [0] * SHADOW_SPACING  # every check due again
    checks.start(batch)
    assert opened(2) == ["3", "4", "5"]  # never checked before those checked once
    checks.start(batch)
    assert opened(3) == ["0", "1", "6"]  # then the oldest checks
