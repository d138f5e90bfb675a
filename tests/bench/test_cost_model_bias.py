"""cost_model_accuracy.py's bias by kind: the live model's measured / predicted seconds,
median, for steps that verified drafts and for plain ones apart (steps it predicted only)."""

from __future__ import annotations

from benchmarks.cost_model_accuracy import bias_by_kind, bias_text
from engine.speculation.control.step_features import StepFeatures


def step(drafts: int, seconds: float, predicted: float | None):
    return StepFeatures.from_shapes([(100, 1, drafts)], False), seconds, predicted


def test_drafting_and_plain_steps_are_apart_and_unpredicted_steps_left_out():
    steps = [step(2, 1.2, 1.0), step(3, 1.5, 1.0), step(1, 1.1, 1.0), step(0, 1.0, 1.0)]
    steps += [step(0, 1.05, 1.0), step(0, 9.0, None)]
    bias = bias_by_kind(steps)
    assert bias["drafts"] == {"n": 3, "median": 1.2}
    assert bias["plain"]["n"] == 2 and abs(bias["plain"]["median"] - 1.025) < 1e-12
    assert bias_text(bias) == "steps that verified drafts 1.200 (3), plain steps 1.025 (2)"


def test_a_kind_without_steps_says_so():
    bias = bias_by_kind([step(0, 1.0, 1.0)])
    assert bias_text(bias) == "no steps that verified drafts, plain steps 1.000 (1)"
