"""SpecTally: the engine's speculation counters, as EngineStats reads them."""

from __future__ import annotations

from engine.speculation.tally import SpecTally


def test_the_tally_counts_drafts_per_proposer_and_accepted_ones_per_position():
    tally = SpecTally(["ngram", "draft"])
    assert tally.fields()["spec_proposer_totals"] == (("ngram", 0, 0, 0), ("draft", 0, 0, 0))
    tally.count("ngram", 4, 2)
    tally.count("draft", 3, 3)
    tally.count("ngram", 2, 0)
    fields = tally.fields()
    assert fields["spec_num_drafts_total"] == 3
    assert fields["spec_num_draft_tokens_total"] == 9
    assert fields["spec_num_accepted_tokens_total"] == 5
    assert fields["spec_accepted_per_position_total"] == (2, 2, 1)
    assert fields["spec_proposer_totals"] == (("ngram", 2, 6, 2), ("draft", 1, 3, 3))
