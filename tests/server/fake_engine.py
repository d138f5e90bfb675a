"""A fake LLMEngine for server tests: same interface, no model, deterministic and fast.

Tokenizer: one token per printable ASCII character (ids 4..98) plus specials <pad>=0, <s>=1,
</s>=2 (EOS), <unk>=3. Generated tokens are lowercase letters chosen from the prompt, the
position and the seed, so greedy output is reproducible. Each step emits one token per running
request (at most `max_num_seqs` run at once; the rest wait), holds KV "blocks" for prompt +
output, and honours max_tokens, stop strings (held back while they could still match),
stop_token_ids, ignore_eos, n > 1 (children f"{id}-{i}"), logprobs and prompt_logprobs.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from engine.outputs import EngineStats, RequestOutput, TokenLogprobs
from engine.sampling_params import SamplingParams

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
BOS, EOS, UNK = 1, 2, 3
VOCAB_SIZE = len(SPECIALS) + 95
_LETTERS = [ord(c) - 32 + len(SPECIALS) for c in "abcdefghijklmnopqrstuvwxyz "]


class FakeTokenizer:
    eos_token_id = EOS
    vocab_size = VOCAB_SIZE

    def __init__(self, has_chat_template: bool = True) -> None:
        self.has_chat_template = has_chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [ord(c) - 32 + len(SPECIALS) if 32 <= ord(c) < 127 else UNK for c in text]
        return [BOS, *ids] if add_special_tokens else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        parts = []
        for token_id in ids:
            if token_id < len(SPECIALS):
                parts.append("" if skip_special_tokens else SPECIALS[token_id])
            else:
                parts.append(chr(token_id - len(SPECIALS) + 32))
        return "".join(parts)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True
    ) -> list[int]:
        if not self.has_chat_template:
            raise ValueError("this tokenizer has no chat template")
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return self.encode(text + ("assistant: " if add_generation_prompt else ""))


@dataclass
class _FakeRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    rng: random.Random
    index: int = 0
    group_id: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_sent_chars: int = 0
    num_blocks: int = 0
    arrival_time: float = 0.0
    first_token_time: float | None = None
    prompt_logprobs_sent: bool = False


class FakeEngine:
    def __init__(
        self,
        step_delay: float = 0.0,
        num_blocks: int = 512,
        block_size: int = 16,
        max_model_len: int = 512,
        max_num_seqs: int = 64,
        eos_after: int | None = None,
        fail_at_step: int | None = None,
    ) -> None:
        self.tokenizer = FakeTokenizer()
        self.model_name = "fake-model"
        self.max_model_len = max_model_len
        self.vocab_size = VOCAB_SIZE
        self.step_delay = step_delay
        self.block_size = block_size
        self.num_total_blocks = num_blocks
        self.num_free_blocks = num_blocks
        self.max_num_seqs = max_num_seqs
        self.eos_after = eos_after  # emit EOS at this output position (unless ignore_eos)
        self.fail_at_step = fail_at_step  # raise inside step() number N (engine-death tests)
        self.requests: dict[str, _FakeRequest] = {}
        self.groups: dict[str, list[str]] = {}
        self.num_steps = 0
        self.num_added = 0  # sequences (n > 1 children count one each)
        self.num_aborted = 0
        self._started_ids: list[str] = []
        self._aborted: list[RequestOutput] = []

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        """LLMEngine.add_request: the checks, then admit()."""
        if request_id in self.requests or request_id in self.groups:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("prompt must not be empty")
        if any(not 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        if len(prompt_token_ids) + (params.max_tokens or 0) > self.max_model_len:
            raise ValueError(f"max_tokens: prompt + max_tokens must be <= {self.max_model_len}")
        self.admit(request_id, prompt_token_ids, params, arrival_time)

    def admit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        """LLMEngine.admit: a request AsyncEngine checked on the event loop."""
        ids = [request_id] if params.n == 1 else [f"{request_id}-{i}" for i in range(params.n)]
        for index, child_id in enumerate(ids):
            seed = None if params.seed is None else params.seed + index
            self.requests[child_id] = _FakeRequest(
                request_id=child_id,
                prompt_token_ids=list(prompt_token_ids),
                params=params,
                rng=random.Random(seed),
                index=index,
                group_id=request_id if params.n > 1 else None,
                arrival_time=arrival_time if arrival_time is not None else time.monotonic(),
            )
        if params.n > 1:
            self.groups[request_id] = ids
        self.num_added += len(ids)

    def abort_request(self, request_id: str) -> None:
        for child_id in self.groups.pop(request_id, [request_id]):
            request = self.requests.pop(child_id, None)
            if request is not None:
                self.num_aborted += 1
                self.num_free_blocks += request.num_blocks
                # Reported by the next step, as LLMEngine does (metrics count it).
                text = self.tokenizer.decode(request.output_token_ids)
                self._aborted.append(self._output(request, [], "", text, "abort"))

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._aborted)

    def _running(self) -> list[_FakeRequest]:
        return list(self.requests.values())[: self.max_num_seqs]

    def step(self) -> list[RequestOutput]:
        self.num_steps += 1
        if self.fail_at_step is not None and self.num_steps >= self.fail_at_step:
            raise RuntimeError("injected engine failure")
        if self.step_delay:
            time.sleep(self.step_delay)
        aborted, self._aborted = self._aborted, []
        outputs = []
        self._started_ids = []
        for request in self._running():
            if not self._grow_blocks(request):
                continue  # out of blocks: wait, like a preempted request
            if request.first_token_time is None and request.index == 0:
                self._started_ids.append(request.group_id or request.request_id)
            outputs.append(self._advance(request))
        for output in outputs:
            if output.finished:
                self._release(output.request_id)
        return aborted + outputs

    def started_request_ids(self) -> list[str]:
        return self._started_ids

    def _grow_blocks(self, request: _FakeRequest) -> bool:
        num_tokens = len(request.prompt_token_ids) + len(request.output_token_ids) + 1
        need = -(-num_tokens // self.block_size) - request.num_blocks
        if need > self.num_free_blocks:
            return False
        self.num_free_blocks -= max(need, 0)
        request.num_blocks += max(need, 0)
        return True

    def _release(self, request_id: str) -> None:
        request = self.requests.pop(request_id)
        self.num_free_blocks += request.num_blocks
        group = request.group_id
        if group is not None and not any(r.group_id == group for r in self.requests.values()):
            self.groups.pop(group, None)

    def _next_token(self, request: _FakeRequest) -> int:
        position = len(request.output_token_ids)
        if request.params.temperature == 0:
            base = sum(request.prompt_token_ids) + 7 * position
            return _LETTERS[base % len(_LETTERS)]
        return request.rng.choice(_LETTERS)

    def _advance(self, request: _FakeRequest) -> RequestOutput:
        params = request.params
        new_ids: list[int] = []
        finish_reason = None
        if params.max_tokens == 0:
            finish_reason = "length"
        else:
            token = self._next_token(request)
            if self.eos_after is not None and not params.ignore_eos:
                if len(request.output_token_ids) >= self.eos_after:
                    token = EOS
            new_ids = [token]
            request.output_token_ids.append(token)
            request.first_token_time = request.first_token_time or time.monotonic()
            if token == EOS or token in params.stop_token_ids:
                finish_reason = "stop"
            elif len(request.output_token_ids) >= (params.max_tokens or self.max_model_len):
                finish_reason = "length"
        text, visible, stop_hit = self._text(request)
        if stop_hit:
            finish_reason = "stop"
        if finish_reason is not None:
            visible = len(text)
        new_text = text[request.num_sent_chars : visible]
        request.num_sent_chars = visible
        return self._output(request, new_ids, new_text, text, finish_reason)

    def _text(self, request: _FakeRequest) -> tuple[str, int, bool]:
        """(text truncated at a matched stop string, length safe to release, stop matched)."""
        params = request.params
        text = self.tokenizer.decode(request.output_token_ids, params.skip_special_tokens)
        hits = [(text.find(s), s) for s in params.stop if s in text]
        if hits:
            at, stop = min(hits)
            end = at + len(stop) if params.include_stop_str_in_output else at
            return text[:end], end, True
        held = 0
        for stop in params.stop:
            for size in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:size]):
                    held = size
                    break
        return text, len(text) - held, False

    def _output(
        self,
        request: _FakeRequest,
        new_ids: list[int],
        new_text: str,
        text: str,
        finish_reason: str | None,
    ) -> RequestOutput:
        params = request.params
        logprobs = None
        if params.logprobs is not None:
            logprobs = [_fake_logprobs(t, params.logprobs) for t in new_ids]
        prompt_logprobs = None
        if params.prompt_logprobs is not None and not request.prompt_logprobs_sent:
            request.prompt_logprobs_sent = True
            rest = request.prompt_token_ids[1:]
            prompt_logprobs = [None] + [_fake_logprobs(t, params.prompt_logprobs) for t in rest]
        timings = {"arrival_time": request.arrival_time}
        if request.first_token_time is not None:
            timings["first_token_time"] = request.first_token_time
        if finish_reason is not None:
            timings["finished_time"] = time.monotonic()
        return RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            new_token_ids=new_ids,
            output_token_ids=list(request.output_token_ids),
            new_text=new_text,
            text=text,
            finished=finish_reason is not None,
            finish_reason=finish_reason,
            num_prompt_tokens=len(request.prompt_token_ids),
            num_output_tokens=len(request.output_token_ids),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            index=request.index,
            group_id=request.group_id,
            metrics=timings,
        )

    def stats(self) -> EngineStats:
        num_running = len(self._running())
        return EngineStats(
            num_running=num_running,
            num_waiting=len(self.requests) - num_running,
            num_free_blocks=self.num_free_blocks,
            num_total_blocks=self.num_total_blocks,
            num_steps_total=self.num_steps,
        )


def _fake_logprobs(token_id: int, num_top: int) -> TokenLogprobs:
    """The sampled token gets -0.5; alternatives follow with decreasing logprobs."""
    alternatives = [token_id] + [t for t in _LETTERS if t != token_id]
    top = tuple((t, -0.5 - i) for i, t in enumerate(alternatives[:num_top]))
    return TokenLogprobs(token_id=token_id, logprob=-0.5, top=top)
