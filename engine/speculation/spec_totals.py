"""SpecTotals: the engine's cumulative speculation counters (for EngineStats and /metrics),
overall, per draft position, and per proposer (proposer choice, issue #12)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProposerTotals:
    num_drafts: int = 0  # chains or trees verified
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclass
class SpecTotals:
    """proposers: the engine's proposers, listed (at zero) before they first draft."""

    proposers: tuple[str, ...] = ()
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    by_proposer: dict[str, ProposerTotals] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.proposers:
            self.by_proposer.setdefault(name, ProposerTotals())

    def count(self, proposer: str, num_draft_tokens: int, num_accepted: int) -> None:
        """One verified draft (chain or tree) of `proposer`."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        while len(self.accepted_per_position) < num_accepted:
            self.accepted_per_position.append(0)
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1
        totals = self.by_proposer.setdefault(proposer, ProposerTotals())
        totals.num_drafts += 1
        totals.num_draft_tokens += num_draft_tokens
        totals.num_accepted_tokens += num_accepted

    def stats_fields(self) -> dict:
        """The EngineStats fields these counters fill."""
        return dict(
            spec_num_drafts_total=self.num_drafts,
            spec_num_draft_tokens_total=self.num_draft_tokens,
            spec_num_accepted_tokens_total=self.num_accepted_tokens,
            spec_accepted_per_position_total=tuple(self.accepted_per_position),
            spec_proposer_totals=tuple(
                (name, t.num_drafts, t.num_draft_tokens, t.num_accepted_tokens)
                for name, t in self.by_proposer.items()
            ),
        )
