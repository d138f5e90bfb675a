"""Whether a forced probe could pay off: a probe buys one look at a proposer's acceptance on a
request, which is worth its cost only where that proposer, once known, could be chosen.

The screen is optimistic: every draft of the probed option accepted, at its cap. If even
then its tokens per second fall short of the best the request's other options (and not
drafting) reach at their current estimates, no acceptance the probe could find would make
the policy choose it, and the probe is refused. On the Qwen pair's code editing the n-gram
proposer drafts four tokens at ~0.95: the 0.5B draft model, all four accepted, reaches ~35
tok/s against its ~52, yet each of its probes fed it the whole prompt first (0.3-0.6 s), and
such probes cost `auto` 3-10% of a run against the n-gram proposer alone
(docs/benchmarks.md §5zp). Where the n-gram proposer finds nothing (the edit's new code),
plain decoding is the best other option and the probe goes ahead.

Each option is priced as the only drafts of the step, beside its other decodes and prefill
chunks; exact for one request, a screen for more. Pure Python over the cost model.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.speculation.control.cost_model import StepCostModel
from engine.speculation.control.search_problem import SearchSlot
from engine.speculation.control.step_features import StepFeatures
from kernels.graph_shapes import GraphShapes


def could_win(
    options: Sequence[SearchSlot],
    probed: int,
    base: StepFeatures,
    cost_model: StepCostModel,
    graphs: GraphShapes,
    num_decoding: int,
    sunk_seconds: float = 0.0,
    propose_seconds: float = 0.0,
) -> bool:
    """Whether options[probed], every draft accepted at its cap, beats the best of not
    drafting and of the request's other options at their estimates (SearchSlot.cumulative:
    their valued gains). num_decoding: the step's decodes (each emits one token);
    sunk_seconds: the step's seconds that emit nothing (prefill chunks); propose_seconds:
    the probed option's CPU seconds once it has run (its SearchSlot's include a draft model's
    share of catching up, which the probe pays once and which then stays paid)."""
    probe = options[probed]
    if probe.cap <= 0:
        return False

    def rate(option: SearchSlot, k: int, tokens: float, extra: float) -> float:
        passes = option.depths[k - 1] if k and option.draft else 0
        features = base.with_drafts(k, 1 if k else 0, passes, graphs, k) if k else base
        seconds = cost_model.predict(features) - sunk_seconds + extra
        return (num_decoding + tokens) / max(seconds, 1e-9)

    best = rate(probe, 0, 0.0, 0.0)  # not drafting
    for index, option in enumerate(options):
        for k in range(1, option.cap + 1) if index != probed else ():
            best = max(best, rate(option, k, option.cumulative[k], option.propose_seconds))
    return rate(probe, probe.cap, float(probe.cap), propose_seconds) > best
