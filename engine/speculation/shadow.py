"""Shadow checks: a model-free proposer's chain, never verified, checked against the tokens the
target goes on to emit, so that its acceptance estimate stays current while another proposer
(or none) drafts for the request.

Verification is drafter-invariant (engine/sample/verify.py): every emitted token is the token
plain decoding emits at that position, greedy or sampled, whatever was drafted. A chain
proposed at position n would therefore have been accepted up to its first draft that differs
from the token emitted at that draft's position. The check is exact, and it costs the
proposer's CPU time, not a verify row that every request in the step waits for (which is what a
forced exploration probe costs: control/goodput.py). A draft model's proposal is not checked
this way: it costs a draft pass.

Per request and proposer one check at a time, a new one at most every SHADOW_SPACING tokens:
most chains fail at their first draft, and each check would otherwise cost a proposal on every
step. Per step and proposer at most SHADOW_BUDGET checks start, the requests checked longest
ago first, so the CPU time stays bounded in a large batch (~7 us per proposal and request on
the 2-core VM: 64 requests would otherwise add ~1 ms to every step). A check lives on the
request's SpecState (`shadows`) and ends with it; a request that ends before its check
resolves leaves no outcome. A check is fed the request's own tokens since its last feed, so the
driver may check on some steps only (a resting driver tends one step in four: driver.py) and
the outcome is the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from engine.request import Request
from engine.speculation.control.policy import SpecResult
from engine.speculation.proposers.proposer import Proposer, ProposeRequest

# Tokens from the start of one check to the start of the next, per request and proposer.
SHADOW_SPACING = 4
# Checks started per step and proposer at most.
SHADOW_BUDGET = 8


@dataclass(slots=True)
class Shadow:
    """One chain waiting for the tokens it predicts."""

    start: int  # the position of the token its first draft predicts
    draft: tuple[int, ...]
    kind: str  # the proposal's kind (SpecCandidate.kind: the n-gram's matched order)
    opened: int = 0  # the ShadowChecks step it started in
    matched: int = 0  # drafts equal to the emitted tokens so far
    done: bool = False

    def feed(self, token_ids: Sequence[int]) -> bool:
        """Compare the next emitted tokens with the drafts; True once the outcome is known
        (a draft differs, or every draft matched)."""
        for token in token_ids:
            if token != self.draft[self.matched]:
                self.done = True
                return True
            self.matched += 1
            if self.matched == len(self.draft):
                self.done = True
                return True
        return False

    def due(self, num_tokens: int) -> bool:
        """Whether a new check may start for a request now at `num_tokens` tokens."""
        return self.done and num_tokens >= self.start + SHADOW_SPACING


class ShadowChecks:
    """The shadow checks of some model-free proposers (by name)."""

    def __init__(self, proposers: Mapping[str, Proposer], budget: int = SHADOW_BUDGET) -> None:
        self.proposers = dict(proposers)
        self.budget = budget  # checks started per step and proposer at most
        self._step = 0  # start() calls so far

    def start(self, requests: Sequence[tuple[Request, int, str]]) -> None:
        """Propose for each (request, cap, proposer drafting for it this step, "" if none)
        with every checked proposer but that one, where the request's last check of it is
        done and due (the time is the driver's proposing time). A proposer that drafts for
        the request drops its open check: the verified outcome supersedes it."""
        self._step += 1
        for name, proposer in self.proposers.items():
            due = []
            for request, cap, drafting in requests:
                shadows = request.spec.shadows
                if drafting == name:
                    shadows.pop(name, None)
                    continue
                old = shadows.get(name)
                if old is None or old.due(request.num_tokens):
                    due.append((-1 if old is None else old.opened, len(due), request, cap))
            if len(due) > self.budget:
                due = sorted(due)[: self.budget]
            if not due:
                continue
            chain_of = getattr(proposer, "shadow_chain", None)
            if chain_of is not None:  # one call a request, no ProposeRequest (n-gram)
                for _, _, request, cap in due:
                    chain, kind = chain_of(request.spec.memos, request.token_view(), cap)
                    self._open(request, name, chain, kind)
            else:
                self._propose(proposer, [(r, self._ask(r, cap, name)) for _, _, r, cap in due])

    def _ask(self, request: Request, cap: int, name: str) -> ProposeRequest:
        return ProposeRequest(
            request.request_id, request.token_view(), cap, proposer=name, memos=request.spec.memos
        )

    def _propose(self, proposer: Proposer, asks: list[tuple[Request, ProposeRequest]]) -> None:
        """Each request's chain, kept as its open check; a proposer that can say before
        proposing (`offer`) gives the kind, and is not asked where it has nothing. (One that
        gives a request's chain and kind in one call, `shadow_chain`, is asked that instead.)"""
        offer = getattr(proposer, "offer", None)
        kinds: dict[str, str] = {}
        kept = asks
        if offer is not None:
            kept = []
            for request, ask in asks:
                count, kinds[ask.request_id] = offer(
                    ask.memos, ask.token_ids, ask.num_draft_tokens, False
                )
                if count:
                    kept.append((request, ask))
        chains = proposer.propose([ask for _, ask in kept]).chains if kept else {}
        for request, ask in asks:
            chain = chains.get(ask.request_id, ())
            self._open(request, ask.proposer, chain, kinds.get(ask.request_id, ""))

    def _open(self, request: Request, name: str, chain: Sequence[int], kind: str) -> None:
        """The request's new check of proposer `name`; with nothing proposed a check already
        done, so the request waits its turn again."""
        shadow = Shadow(request.num_tokens, tuple(chain), kind, self._step)
        shadow.done = not chain
        request.spec.shadows[name] = shadow

    def check(self, request: Request) -> list[SpecResult]:
        """Feed each open check the request's tokens since it was last fed (the driver checks
        on some steps only: SpecDriver.tends); the outcomes now known, as results
        (shadow=True) for the proposers' estimates."""
        results = []
        num_tokens = request.num_tokens
        for name, shadow in request.spec.shadows.items():
            if shadow.done:
                continue
            fed = shadow.start + shadow.matched
            if not shadow.feed(request.token_ids_between(fed, num_tokens)):
                continue
            results.append(
                SpecResult(
                    request.request_id,
                    len(shadow.draft),
                    shadow.matched,
                    name,
                    spec=request.spec,
                    kind=shadow.kind,
                    shadow=True,
                )
            )
        return results
