"""Turns scheduler updates into RequestOutputs: text deltas, stop strings, logprobs, timings.

Each live request carries an OutputState (on Request.output, so it ends with the request) with
its incremental detokenizer and what has already been reported, so each RequestOutput carries
only what is new since the previous one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.output.detokenizer import IncrementalDetokenizer
from engine.outputs import RequestOutput, RequestStepOutput, TokenLogprobs
from engine.request import Request, SpecCounts


@dataclass
class OutputState:
    detokenizer: IncrementalDetokenizer | None
    num_reported_tokens: int = 0
    pending_logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    prompt_logprobs_sent: bool = False
    # Report the request once, finished: no output per step (offline generate). The text is
    # then detokenized once at the end, unless stop strings need it every step.
    final_only: bool = False


class OutputProcessor:
    def __init__(self, tokenizer, proposer: str | None = None) -> None:
        """proposer: the engine's proposer name, reported with each request's spec counts."""
        self.tokenizer = tokenizer
        self.proposer = proposer

    def add(self, request: Request, final_only: bool = False) -> None:
        params = request.sampling_params
        detokenizer = None
        if self.tokenizer is not None:
            detokenizer = IncrementalDetokenizer(
                self.tokenizer,
                request.prompt_token_ids,
                stop=params.stop,
                include_stop_str_in_output=params.include_stop_str_in_output,
                skip_special_tokens=params.skip_special_tokens,
            )
        request.output = OutputState(detokenizer, final_only=final_only and not params.stop)

    def record_step(self, request: Request, step_output: RequestStepOutput) -> None:
        """Keep logprobs produced this step until the tokens they belong to are reported."""
        if not step_output.logprobs and not step_output.prompt_logprobs:
            return
        state = request.output
        if state is None:
            return
        state.pending_logprobs.extend(step_output.logprobs)
        need = request.num_prompt_tokens - len(state.prompt_logprobs)
        if need > 0 and step_output.prompt_logprobs:
            state.prompt_logprobs.extend(step_output.prompt_logprobs[:need])

    def make_output(self, request: Request) -> tuple[RequestOutput | None, str | None]:
        """Build the RequestOutput for a changed request; also return a matched stop string."""
        state = request.output
        if state is None:  # its final output was made already
            return None, None
        if state.final_only and not request.is_finished:
            return None, None  # its tokens wait, unreported, for the final output
        new_ids = request.output_token_ids[state.num_reported_tokens :]  # a fresh list
        state.num_reported_tokens = request.num_output_tokens
        new_text, stop_string = _detokenize(state.detokenizer, new_ids, request.is_finished)
        finished = request.is_finished or stop_string is not None
        if not new_ids and not finished:
            return None, None
        output = RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            new_token_ids=new_ids,
            output_token_ids=list(request.output_token_ids),
            new_text=new_text,
            text=state.detokenizer.text if state.detokenizer is not None else "",
            finished=finished,
            finish_reason="stop" if stop_string is not None else request.status.finish_reason,
            stop_reason=stop_string,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            num_cached_tokens=request.num_cached_tokens,
            logprobs=self._take_logprobs(request, state, len(new_ids)),
            prompt_logprobs=self._take_prompt_logprobs(request, state),
            error=request.error,
            error_param=request.error_param,
            index=request.index,
            group_id=request.group_id,
            metrics=_timings(request, finished),
            spec=self._spec(request),
        )
        if output.finish_reason == "stop" and stop_string is None and request.output_token_ids:
            last = request.output_token_ids[-1]
            if last in request.sampling_params.stop_token_ids:
                output.stop_reason = last
        if finished:
            request.output = None
        return output, stop_string

    def fail(self, request: Request, message: str) -> RequestOutput:
        """The final output of a request whose output could not be made: finish_reason
        "error", no new tokens (the ones it would have carried are not trustworthy)."""
        request.output = None
        request.error = message
        return RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            new_token_ids=[],
            output_token_ids=list(request.output_token_ids),
            finished=True,
            finish_reason="error",
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            error=message,
            index=request.index,
            group_id=request.group_id,
            metrics=_timings(request, finished=True),
        )

    def _spec(self, request: Request) -> SpecCounts | None:
        if self.proposer is None:
            return None
        return request.spec.counts.snapshot(self.proposer)

    @staticmethod
    def _take_logprobs(
        request: Request, state: OutputState, num_new: int
    ) -> list[TokenLogprobs] | None:
        if request.sampling_params.logprobs is None:
            return None
        taken, state.pending_logprobs = (
            state.pending_logprobs[:num_new],
            state.pending_logprobs[num_new:],
        )
        state.pending_logprobs = []  # tokens truncated by a stop condition drop their logprobs
        return taken

    @staticmethod
    def _take_prompt_logprobs(
        request: Request, state: OutputState
    ) -> list[TokenLogprobs | None] | None:
        if request.sampling_params.prompt_logprobs is None or state.prompt_logprobs_sent:
            return None
        if len(state.prompt_logprobs) < request.num_prompt_tokens:
            return None
        state.prompt_logprobs_sent = True
        return list(state.prompt_logprobs)


def _detokenize(
    detokenizer: IncrementalDetokenizer | None, new_ids: list[int], finished: bool
) -> tuple[str, str | None]:
    """(the text released with these tokens, the stop string they completed, if any)."""
    if detokenizer is None:
        return "", None
    return detokenizer.add_tokens(new_ids, finished), detokenizer.stop_string


def _timings(request: Request, finished: bool) -> dict[str, float]:
    timings = {"arrival_time": request.arrival_time}
    if request.first_scheduled_time is not None:
        timings["first_scheduled_time"] = request.first_scheduled_time
    if request.first_token_time is not None:
        timings["first_token_time"] = request.first_token_time
    if finished:
        timings["finished_time"] = time.monotonic()
    return timings
