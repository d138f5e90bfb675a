"""Greedy parity under half precision: identical tokens, or a first difference at a near-tie.

Two correct greedy runs in bfloat16/float16 may part ways where the two best tokens are almost
equally likely: a different kernel (decode vs verify-shaped prefill, a graph vs eager, another
GPU library) rounds differently and flips the argmax. A bug (a wrong mask, a stale cache row)
parts them where one token is clearly better. So at the first difference we ask a float32
reference how far apart the two tokens were given the common prefix: the logprob gap of the
two candidates (equal to their logit gap). A gap above the tolerance is a real divergence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.front.llm import LLM
from engine.sampling_params import SamplingParams

TOP_LOGPROBS = 20


@dataclass(frozen=True)
class Divergence:
    index: int  # first output position where the runs differ
    want: int  # the baseline run's token there
    got: int  # the other run's token there
    gap: float  # float32 logprob(want) - logprob(got); inf when `got` is not in the top 20


def first_difference(got: Sequence[int], want: Sequence[int]) -> int | None:
    for index, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return index
    return None if len(got) == len(want) else min(len(got), len(want))


def divergence(
    reference: LLM, prompt_ids: Sequence[int], got: Sequence[int], want: Sequence[int]
) -> Divergence | None:
    """None when the runs are identical; else where and by how much they first differ."""
    index = first_difference(got, want)
    if index is None:
        return None
    if index >= min(len(got), len(want)):
        return Divergence(index, -1, -1, float("inf"))  # one run stopped early
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=TOP_LOGPROBS, ignore_eos=True)
    [output] = reference.generate([[*prompt_ids, *want[:index]]], params, use_tqdm=False)
    top = dict(output.logprobs[0].top)
    both_in_top = want[index] in top and got[index] in top
    gap = abs(top[want[index]] - top[got[index]]) if both_in_top else float("inf")
    return Divergence(index, want[index], got[index], gap)


def near_tie_report(
    reference: LLM,
    prompts: Sequence[Sequence[int]],
    got: Sequence[Sequence[int]],
    want: Sequence[Sequence[int]],
    tolerance: float,
) -> tuple[int, list[Divergence], list[Divergence]]:
    """(number identical, divergences at near-ties, divergences beyond the tolerance)."""
    identical, ties, real = 0, [], []
    for prompt, a, b in zip(prompts, got, want, strict=True):
        found = divergence(reference, prompt, a, b)
        if found is None:
            identical += 1
        elif found.gap <= tolerance:
            ties.append(found)
        else:
            real.append(found)
    return identical, ties, real
