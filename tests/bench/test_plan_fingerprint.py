"""plan_fingerprint.py: the same code hashes the same plans, and a change to what the search
decides changes the hash."""

from __future__ import annotations

from benchmarks import plan_fingerprint
from engine.speculation.control import goodput


def test_the_same_code_gives_the_same_fingerprint():
    assert plan_fingerprint.fingerprint(6, 4) == plan_fingerprint.fingerprint(6, 4)


def test_a_change_to_the_plans_changes_the_fingerprint(monkeypatch):
    before = plan_fingerprint.fingerprint(6, 4)
    monkeypatch.setattr(goodput, "DRAFT_MARGIN", 0.5)  # drafts must beat their floors by half
    assert plan_fingerprint.fingerprint(6, 4) != before


def test_each_scenario_is_listed(capsys):
    plan_fingerprint.fingerprint(3, 2, each=True)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["0", "1", "2"]
