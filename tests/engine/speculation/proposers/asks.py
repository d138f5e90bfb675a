"""Requests as proposers see them, with each request's memos kept across calls (on an engine
Request they are SpecState.memos): import `fresh_memos` (autouse) to start each test empty."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from engine.outputs import RequestStepOutput
from engine.speculation.proposers.proposer import Observation, ProposeRequest

MEMOS: dict[str, dict] = {}  # request id -> its memos


@pytest.fixture(autouse=True)
def fresh_memos():
    MEMOS.clear()


def memos(request_id: str) -> dict:
    return MEMOS.setdefault(request_id, {})


def ask(
    request_id: str, token_ids: Sequence[int], num_draft_tokens: int, **fields
) -> ProposeRequest:
    return ProposeRequest(
        request_id, token_ids, num_draft_tokens, memos=memos(request_id), **fields
    )


def observation(
    request_id: str,
    token_ids: Sequence[int],
    topk_ids: Sequence[Sequence[int]] | None = None,
    draft_ids: Sequence[int] = (),
    draft_topk_ids: Sequence[Sequence[int]] = (),
) -> Observation:
    """One request's verified step: the emitted tokens, the target's top ids of their rows
    (None: not asked for) and of the drafts' rows."""
    step = RequestStepOutput(
        request_id,
        tuple(token_ids),
        target_topk_ids=tuple(map(tuple, topk_ids or ())),
        draft_topk_ids=tuple(map(tuple, draft_topk_ids)),
    )
    return Observation(step, tuple(draft_ids), memos(request_id))
