"""usage.speculation: a request's speculation summed over its choices, with each proposer's
share (proposer choice, issue #12)."""

from __future__ import annotations

from engine.outputs import SpecStats
from server.responses import UsageInfo


def test_usage_sums_choices_and_breaks_them_down_by_proposer():
    first = SpecStats(
        "ngram,draft", 9, 5, 4, (SpecStats("ngram", 6, 5, 3), SpecStats("draft", 3, 0, 1))
    )
    second = SpecStats("ngram,draft", 4, 2, 1, (SpecStats("draft", 4, 2, 1),))
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
    plain = UsageInfo.of(3, 4, [SpecStats("ngram", 2, 1, 1)]).model_dump()["speculation"]
    assert plain["proposers"] == {} and plain["draft_tokens"] == 2
