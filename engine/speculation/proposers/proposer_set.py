"""ProposerSet: several proposers behind the Proposer protocol, for proposer choice (issue #12).

Each ProposeRequest names the proposer the policy chose for it (`proposer`); propose() hands
each proposer its own requests and merges the drafts. Every proposer keeps its state
consistent whichever one ran: observe() reaches all of them (the n-gram index and the draft
model sync from ProposeRequest.token_ids when next asked, the recycle matrix learns from every
verified token), and target_topk is the largest any of them wants, asked every step.

The CPU time of model-free proposers is measured per request asked (an exponential average),
for the policy's cost of choosing them; the draft model's time is the cost model's
(draft-pass feature), so it is kept apart (free_seconds: this step's model-free seconds).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from engine.outputs import Drafts
from engine.speculation.proposers.proposer import (
    DRAFT_PROPOSER,
    Observation,
    Proposer,
    ProposeRequest,
    observes,
)

SECONDS_DECAY = 0.9  # weight of the previous CPU-time estimate


class ProposerSet:
    def __init__(self, proposers: Mapping[str, Proposer]) -> None:
        if len(proposers) < 2:
            raise ValueError(f"a ProposerSet needs two or more proposers, got {list(proposers)}")
        self.proposers = dict(proposers)
        self.name = ",".join(self.proposers)
        self.target_topk = max(p.target_topk for p in self.proposers.values())
        self.observes = any(map(observes, self.proposers.values()))
        self.seconds_per_request: dict[str, float] = {}  # model-free proposers only
        self.free_seconds = 0.0  # model-free proposing time of the last propose()

    def propose(self, requests: Sequence[ProposeRequest]) -> Drafts:
        chains: dict = {}
        trees: dict = {}
        total, self.free_seconds, catchup = 0.0, 0.0, 0
        for name, proposer in self.proposers.items():
            asks = [r for r in requests if r.proposer == name]
            if not asks:
                continue
            start = time.perf_counter()
            drafts = proposer.propose(asks)
            seconds = time.perf_counter() - start
            chains.update(drafts.chains)
            trees.update(drafts.trees)
            total, catchup = total + seconds, catchup + drafts.num_catchup_tokens
            if name != DRAFT_PROPOSER:
                self.free_seconds += seconds
                self._measure(name, seconds / len(asks))
        return Drafts(
            chains,
            trees,
            proposer_time=total,
            target_topk=self.target_topk,
            num_catchup_tokens=catchup,
        )

    def offers(
        self, memos: dict, token_ids: Sequence[int], num_draft_tokens: int, tree: bool
    ) -> dict[str, tuple[int, str]]:
        """Each member's offer (NgramProposer.offer: drafts it could give now, their kind),
        for the members that can say before the plan; the others may draft up to the cap."""
        offers = {}
        for name, proposer in self.proposers.items():
            offer = getattr(proposer, "offer", None)
            if offer is not None:
                offers[name] = offer(memos, token_ids, num_draft_tokens, tree)
        return offers

    def catchup_tokens(self, memos: dict, num_tokens: int) -> int:
        """The draft model's catch-up for a request (0 without a draft model)."""
        draft = self.proposers.get(DRAFT_PROPOSER)
        catchup = getattr(draft, "catchup_tokens", None)
        return catchup(memos, num_tokens) if catchup is not None else 0

    def _measure(self, name: str, seconds: float) -> None:
        old = self.seconds_per_request.get(name)
        new = seconds if old is None else SECONDS_DECAY * old + (1 - SECONDS_DECAY) * seconds
        self.seconds_per_request[name] = new

    def observe(self, observations: Sequence[Observation]) -> None:
        for proposer in self.proposers.values():
            if observes(proposer):
                proposer.observe(observations)
