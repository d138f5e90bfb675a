"""SpecTally: what the engine's speculation has verified, as EngineStats shows it (DESIGN §3's
metrics): drafts, their tokens and the accepted ones, overall and per proposer (the proposers
listed at zero before they first draft), and the drafts accepted at each position. SpecDriver
counts each verified draft here and reads the fields out beside its last step's readings;
pure Python."""

from __future__ import annotations

from collections.abc import Sequence

from engine.request import SpecCounts


class SpecTally:
    def __init__(self, proposers: Sequence[str] = ()) -> None:
        self.totals = SpecCounts(by_proposer={name: SpecCounts(name) for name in proposers})
        self.accepted_per_position: list[int] = []  # drafts accepted at each position

    def count(self, proposer: str, num_draft_tokens: int, num_accepted: int) -> None:
        """One verified draft of `proposer`'s and how many of its tokens were accepted."""
        self.totals.add(num_draft_tokens, num_accepted, proposer)
        positions = self.accepted_per_position
        positions.extend([0] * (num_accepted - len(positions)))
        for position in range(num_accepted):
            positions[position] += 1

    def fields(self) -> dict:
        """EngineStats's cumulative speculation counters."""
        totals = self.totals
        return dict(
            spec_num_drafts_total=totals.num_drafts,
            spec_num_draft_tokens_total=totals.num_draft_tokens,
            spec_num_accepted_tokens_total=totals.num_accepted_tokens,
            spec_accepted_per_position_total=tuple(self.accepted_per_position),
            spec_proposer_totals=tuple(
                (name, c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens)
                for name, c in totals.by_proposer.items()
            ),
        )
