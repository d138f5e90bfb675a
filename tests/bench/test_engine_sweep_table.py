"""engine_sweep.py's table: each policy's mean latency over a cell's repeats, its ratio to
off's mean, and the range of the repeat-by-repeat ratios."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import engine_sweep
from benchmarks.engine_sweep import markdown, parse_units


def cell(policy: str, latency: float, repeat: int, multiplier: float = 2.0) -> dict:
    return dict(
        workload="chat", multiplier=multiplier, policy=policy, mean_latency=latency, repeat=repeat
    )


def test_repeats_are_averaged_and_their_ratios_ranged():
    cells = [cell("off", 2.0, 0), cell("goodput", 2.2, 0), cell("off", 4.0, 1)]
    cells += [cell("goodput", 3.8, 1), cell("off", 1.0, 0, 4.0), cell("goodput", 0.9, 0, 4.0)]
    lines = markdown(dict(cells=cells)).splitlines()
    assert lines[0] == "| workload | load | off s | goodput s | goodput/off |"
    # x2: means 3.000 and 3.000, ratio 1.00; the repeats' own ratios 1.10 and 0.95.
    assert lines[2] == "| chat | x2 | 3.000 | 3.000 | 1.00 (0.95-1.10) |"
    assert lines[3] == "| chat | x4 | 1.000 | 0.900 | 0.90 |"  # one repeat: no range


def test_goodput_is_also_read_against_both_offs_and_the_best_fixed_policy():
    cells = [cell("off", 2.0, 0), cell("goodput", 2.1, 0), cell("fixed:1", 1.5, 0)]
    cells += [cell("fixed:3", 3.0, 0), cell("off#2", 1.0, 0)]
    cells += [cell("off", 1.0, 0, 4.0), cell("goodput", 1.2, 0, 4.0), cell("fixed:1", 1.1, 0, 4.0)]
    cells += [cell("fixed:3", 1.6, 0, 4.0), cell("off#2", 0.9, 0, 4.0)]
    lines = markdown(dict(cells=cells)).splitlines()
    assert lines[0].endswith("| off#2/off | goodput/offs | goodput/best fixed |")
    assert lines[1].count("---") == 13
    # x2: 2.1 over both offs' 1.5 and over fixed:1's 1.5 (the twin's 1.0 is no fixed policy)
    assert lines[2].endswith("| 0.50 | 1.400 | 1.40 |")
    assert lines[3].endswith("| 0.90 | 1.263 | 1.20 |")  # 1.2 / 0.95; 1.2 / off's 1.0


def test_the_load_unit_is_one_for_all_or_given_per_workload():
    assert parse_units("3.319") == {"": 3.319}
    assert parse_units("chat=3.3, copy=0.9") == {"chat": 3.3, "copy": 0.9}
    with pytest.raises(argparse.ArgumentTypeError):
        parse_units("copy=0")
    with pytest.raises(ValueError):
        parse_units("copy=fast")


def test_policies_take_turns_in_a_balanced_order_and_a_twin_is_its_own_engine(monkeypatch):
    """Over the sweep's turns every policy runs first equally often (the old product order
    always ran off first and goodput right after it); "off#2" is off built again."""
    built, order = [], []
    monkeypatch.setattr(engine_sweep.EngineConfig, "from_flat", lambda flat: flat)
    monkeypatch.setattr(engine_sweep, "LLM", lambda config: built.append(config) or built[-1])
    monkeypatch.setattr(engine_sweep, "load_prompts", lambda llm, workload, args: [[1, 2]])
    monkeypatch.setattr(engine_sweep, "meta", lambda args: {})
    monkeypatch.setattr(
        engine_sweep, "run_cell", lambda llm, *rest: order.append(llm) or dict(mean_latency=1.0)
    )
    policies = ["off", "goodput", "fixed:1", "off#2"]
    args = engine_sweep.parse_args(
        ["--out", "x.json", "--policies", ",".join(policies), "--workloads", "chat"]
        + ["--multipliers", "1,2", "--repeats", "2", "--unit", "3", "--no-freeze"]
    )
    engine_sweep.sweep(args)
    assert [flat.get("spec_policy") for flat in built] == [None, "goodput", "fixed:1", None]
    assert built[0] is not built[3]
    label = {id(flat): policy for flat, policy in zip(built, policies)}
    turns = [[label[id(llm)] for llm in order[i : i + 4]] for i in range(0, len(order), 4)]
    assert len(turns) == 4 and all(sorted(turn) == sorted(policies) for turn in turns)
    assert sorted(turn[0] for turn in turns) == sorted(policies)


def test_the_speculating_engines_take_the_proposer_and_draft_model_asked_for(monkeypatch):
    """--proposer auto --draft-model D: the speculating engines draft with auto and load D;
    off's engines load no draft model (an engine with policy off would not build with one)."""
    monkeypatch.setattr(engine_sweep.EngineConfig, "from_flat", lambda flat: flat)
    monkeypatch.setattr(engine_sweep, "LLM", lambda config: config)
    args = engine_sweep.parse_args(
        ["--out", "x.json", "--proposer", "auto", "--draft-model", "draft.gguf"]
    )
    built = {p: engine_sweep.make_engine(p, args) for p in ("off", "goodput", "off#2")}
    assert built["goodput"]["speculative_proposer"] == "auto"
    assert built["goodput"]["draft_model"] == "draft.gguf"
    assert "draft_model" not in built["off"] and "draft_model" not in built["off#2"]
    default = engine_sweep.parse_args(["--out", "x.json"])
    assert default.proposer == "ngram" and default.draft_model is None
