"""usage.speculation: a request's speculation summed over its choices, with each proposer's
share (proposer choice, issue #12)."""

from __future__ import annotations

from engine.request import SpecCounts
from server.responses import UsageInfo


def counts(proposer: str, drafts: int, tokens: int, accepted: int, *shares) -> SpecCounts:
    by_proposer = {share.proposer: share for share in shares}
    return SpecCounts(proposer, drafts, tokens, accepted, by_proposer)


def test_usage_sums_choices_and_breaks_them_down_by_proposer():
    first = counts("ngram,draft", 4, 9, 5, counts("ngram", 3, 6, 5), counts("draft", 1, 3, 0))
    second = counts("ngram,draft", 1, 4, 2, counts("draft", 1, 4, 2))
    usage = UsageInfo.of(10, 20, [first, None, second]).model_dump()
    assert usage["speculation"] == {
        "proposer": "ngram,draft",
        "draft_tokens": 13,
        "accepted_tokens": 7,
        "verify_steps": 5,
        "proposers": {
            "ngram": {"draft_tokens": 6, "accepted_tokens": 5, "verify_steps": 3},
            "draft": {"draft_tokens": 7, "accepted_tokens": 2, "verify_steps": 2},
        },
    }


def test_usage_without_speculation_leaves_the_field_out():
    assert "speculation" not in UsageInfo.of(3, 4, [None]).model_dump()
    plain = UsageInfo.of(3, 4, [counts("ngram", 1, 2, 1)]).model_dump()["speculation"]
    assert plain["proposers"] == {} and plain["draft_tokens"] == 2
