"""Fault isolation for one model step: when the batched step raises, find the requests that
make it fail, fail only those, and give every other request the output it would have had.

Why running a step again is safe: the model runner keeps no per-request state and never touches
what the scheduler owns (token lists, num_computed_tokens, block tables); its only side effects
are K/V writes into the slots the scheduler reserved for this step (copy-on-write copies and
tree-path compaction included, all inside those slots). Computing the same tokens at the same
slots again writes the same values, and random numbers are a function of (seed, position)
(engine/sample/rng.py), so a request re-run in a smaller batch emits exactly the tokens it would have
emitted in the full one. Requests advance once, in Scheduler.update, from the merged output.

Search: split the failing batch in halves and run each; a half that succeeds contributes its
outputs, a half that fails is split again, down to single requests, which fail with the error
they raised. k faulty requests among n cost O(k log n) extra runs; a fault that needs the whole
batch to show (say, running out of memory) ends with every half succeeding.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from engine.outputs import (
    Drafts,
    ModelOutput,
    RequestStepOutput,
    ScheduledRequest,
    SchedulerOutput,
)

logger = logging.getLogger(__name__)

_MAX_ERROR_CHARS = 500  # an exception's text can hold whole tensors


class StepRunner(Protocol):
    def execute(self, scheduler_output: SchedulerOutput, drafts: Drafts) -> ModelOutput: ...


def execute_isolating(runner: StepRunner, sched: SchedulerOutput, drafts: Drafts) -> ModelOutput:
    """runner.execute(sched, drafts); if it raises, the outputs of every request that runs
    without the failing ones, and an error output for each failing one."""
    start = time.perf_counter()
    try:
        return runner.execute(sched, drafts)
    except Exception as exc:
        logger.debug("step failure traceback", exc_info=True)
        if len(sched.scheduled) == 1:
            outputs = _failed(sched.scheduled[0], exc)
        else:
            outputs = _bisect(runner, sched, drafts, sched.scheduled)
        failed = [i for i, o in outputs.items() if o.error is not None]
        # One line per faulty step; each failed request is logged by whoever reports it.
        logger.warning(
            "a step of %d requests failed (%s); re-run in parts, %d failed: %s",
            len(sched.scheduled),
            describe(exc),
            len(failed),
            ", ".join(failed) or "none (the fault needed the whole batch)",
        )
    return ModelOutput(outputs=outputs, step_time=time.perf_counter() - start)


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


def _bisect(
    runner: StepRunner,
    sched: SchedulerOutput,
    drafts: Drafts,
    part: Sequence[ScheduledRequest],
) -> dict[str, RequestStepOutput]:
    half = len(part) // 2
    outputs: dict[str, RequestStepOutput] = {}
    for piece in (part[:half], part[half:]):
        outputs.update(_run_piece(runner, sched, drafts, piece))
    return outputs


def _run_piece(
    runner: StepRunner,
    sched: SchedulerOutput,
    drafts: Drafts,
    piece: Sequence[ScheduledRequest],
) -> dict[str, RequestStepOutput]:
    try:
        return dict(runner.execute(_sub_step(sched, piece), _sub_drafts(drafts, piece)).outputs)
    except Exception as exc:
        if len(piece) == 1:
            return _failed(piece[0], exc)
        logger.debug("part of %d requests failed: %s", len(piece), describe(exc))
        return _bisect(runner, sched, drafts, piece)


def _sub_step(sched: SchedulerOutput, piece: Sequence[ScheduledRequest]) -> SchedulerOutput:
    """The step restricted to `piece`, with the copy-on-write copies into its blocks (a copy's
    destination is a block the copying request just allocated for itself)."""
    own_blocks = {block for s in piece for block in s.request.block_ids}
    own_window_blocks = {block for s in piece for block in s.request.window_block_ids}
    return SchedulerOutput(
        scheduled=tuple(piece),
        block_copies=tuple(
            c
            for c in sched.block_copies
            if c.dst in (own_window_blocks if c.window else own_blocks)
        ),
        num_batched_tokens=sum(s.num_new_tokens for s in piece),
    )


def _sub_drafts(drafts: Drafts, piece: Sequence[ScheduledRequest]) -> Drafts:
    ids = {s.request_id for s in piece}
    return Drafts(
        chains={i: c for i, c in drafts.chains.items() if i in ids},
        trees={i: t for i, t in drafts.trees.items() if i in ids},
        target_topk=drafts.target_topk,
    )


def _failed(scheduled: ScheduledRequest, exc: Exception) -> dict[str, RequestStepOutput]:
    request_id = scheduled.request_id
    message = f"the model step failed for this request: {describe(exc)}"
    logger.debug("request %s failed: %s", request_id, message, exc_info=exc)
    return {request_id: RequestStepOutput(request_id, (), error=message)}
