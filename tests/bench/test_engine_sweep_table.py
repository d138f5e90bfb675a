"""engine_sweep.py's table: each policy's mean latency over a cell's repeats, its ratio to
off's mean, and the range of the repeat-by-repeat ratios."""

from __future__ import annotations

import argparse

import pytest

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


def test_the_load_unit_is_one_for_all_or_given_per_workload():
    assert parse_units("3.319") == {"": 3.319}
    assert parse_units("chat=3.3, copy=0.9") == {"chat": 3.3, "copy": 0.9}
    with pytest.raises(argparse.ArgumentTypeError):
        parse_units("copy=0")
    with pytest.raises(ValueError):
        parse_units("copy=fast")
