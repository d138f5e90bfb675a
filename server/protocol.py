"""Request bodies of the OpenAI API (plus vLLM-style extras), as strict pydantic models.

Strict: a JSON string is not an integer, 1.5 is not an int, NaN/Infinity are refused. An unknown
field is a 400 naming it; the few OpenAI fields accepted without effect (`user`, `metadata`,
`store`, `service_tier`) are listed in docs/api.md. `null` means "the default" for every
optional field, as in OpenAI's API.
Ranges are checked once, by SamplingParams (its ValueError names the field); the models here
only check types and the few rules that are about the API rather than sampling.
"""

from __future__ import annotations

import re
from typing import Any

from engine.sampling_params import MAX_LOGPROBS, SamplingParams
from server.errors import bad_request, from_value_error
from server.protocol_guided import GuidedFields
from server.protocol_messages import ChatMessage, Strict, Tool, check_messages
from server.tools import ToolChoice, ToolSetup

MAX_PROMPTS = 128  # prompts in one /v1/completions batch
MAX_SEED = 2**63 - 1
# A token id key: ASCII digits only ("²".isdigit() is True, but int() refuses it), few enough
# for int() (it refuses more than 4300).
_TOKEN_ID_KEY = re.compile(r"[0-9]{1,19}")


class StreamOptions(Strict):
    include_usage: bool | None = False


class _SamplingRequest(GuidedFields):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    n: int | None = 1
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    # Accepted without effect (docs/api.md): bookkeeping fields of OpenAI's API.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # Extras beyond OpenAI's schema (vLLM names).
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = False
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = True
    include_stop_str_in_output: bool | None = False

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def check_api_rules(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream: true", "stream_options")
        if self.seed is not None and not -MAX_SEED - 1 <= self.seed <= MAX_SEED:
            raise bad_request("seed must be a 64-bit signed integer", "seed")

    def _common_sampling(self, vocab_size: int) -> dict[str, Any]:
        values = {
            "n": self.n,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "seed": self.seed,
            "min_tokens": self.min_tokens,
            "stop": [self.stop] if isinstance(self.stop, str) else self.stop,
            "stop_token_ids": self.stop_token_ids,
            "ignore_eos": self.ignore_eos,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
            "logit_bias": _logit_bias(self.logit_bias, vocab_size),
            **self.sampling_fields(),
        }
        return {k: v for k, v in values.items() if v is not None}


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    if bias is None:
        return None
    result = {}
    for key, value in bias.items():
        if not _TOKEN_ID_KEY.fullmatch(key) or int(key) >= vocab_size:
            raise bad_request(
                f"logit_bias keys must be token ids in [0, {vocab_size}), got {key!r}", "logit_bias"
            )
        result[int(key)] = value
    return result


def build_sampling_params(values: dict[str, Any]) -> SamplingParams:
    """SamplingParams from request values; its range errors become 400s naming the field."""
    try:
        return SamplingParams(**values)
    except ValueError as exc:
        raise from_value_error(exc) from None


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool | None = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def check_api_rules(self) -> None:
        super().check_api_rules()
        if self.suffix is not None:
            raise bad_request("suffix is not supported", "suffix")
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise bad_request("best_of is only supported when equal to n", "best_of")
        if self.max_tokens == 0 and not self.echo:
            raise bad_request("max_tokens must be >= 1 (0 is allowed only with echo)", "max_tokens")

    def sampling_params(self, vocab_size: int) -> SamplingParams:
        values = self._common_sampling(vocab_size)
        values["max_tokens"] = self.max_tokens
        values["logprobs"] = self.logprobs
        if self.echo and self.logprobs is not None:
            values["prompt_logprobs"] = self.logprobs
        return build_sampling_params(values)

    def prompt_list(self) -> list[str] | list[list[int]]:
        """The prompt as a batch: a list of strings or a list of token-id lists."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if isinstance(prompt[0], int):
            return [prompt]  # type: ignore[list-item]
        if len(prompt) > MAX_PROMPTS:
            raise bad_request(f"prompt may hold at most {MAX_PROMPTS} prompts", "prompt")
        return prompt  # type: ignore[return-value]


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool | None = True
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @property
    def guided_field(self) -> str:
        forced = self.tool_choice is not None and self.tool_choice not in ("none", "auto")
        return "tools" if forced else super().guided_field

    def check_api_rules(self) -> None:
        super().check_api_rules()
        if not self.messages:
            raise bad_request("messages must not be empty", "messages")
        check_messages(self.messages)
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            # Checked here because SamplingParams calls this field logprobs.
            raise bad_request(f"top_logprobs must be in 0..{MAX_LOGPROBS}", "top_logprobs")
        for name in ("max_completion_tokens", "max_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise bad_request(f"{name} must be an integer >= 1, got {value}", name)

    def sampling_params(self, vocab_size: int, tools: ToolSetup | None = None) -> SamplingParams:
        values = self._common_sampling(vocab_size)
        if tools is not None and tools.guided is not None:
            if "guided" in values:
                raise bad_request(
                    "tool_choice required or a named function cannot be combined with "
                    "response_format or guided_*",
                    "tool_choice",
                )
            values["guided"] = tools.guided
        limit = self.max_completion_tokens
        values["max_tokens"] = limit if limit is not None else self.max_tokens
        if self.logprobs:
            values["logprobs"] = self.top_logprobs or 0
        return build_sampling_params(values)


class TokenizeRequest(Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = True
    add_generation_prompt: bool | None = True


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[int]
