"""SamplingParams: what a request asks of the sampler, validated once at the edge.

Invalid values raise ValueError naming the field and the allowed range, so the server can turn
them into a 400 and the offline API into a clear exception. Context-length checks need the
model, so they live in LLMEngine.add_request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 64
MAX_N = 128


def _require(ok: bool, name: str, allowed: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # top-N logprobs of each generated token (0 = sampled token only)
    prompt_logprobs: int | None = None  # same for the prompt tokens (echo + logprobs)
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        # Normalise list-typed inputs to tuples so the object stays hashable-ish and immutable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(
            self, "logit_bias", {int(k): float(v) for k, v in self.logit_bias.items()}
        )
        self._validate()

    def _validate(self) -> None:
        _require(
            isinstance(self.n, int) and 1 <= self.n <= MAX_N,
            "n",
            f"an integer in 1..{MAX_N}",
            self.n,
        )
        _require(
            self.temperature >= 0 and self.temperature <= 100,
            "temperature",
            "in [0, 100]",
            self.temperature,
        )
        _require(0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        _require(
            isinstance(self.top_k, int) and self.top_k >= -1,
            "top_k",
            "-1, 0 (off) or a positive integer",
            self.top_k,
        )
        _require(0 <= self.min_p <= 1, "min_p", "in [0, 1]", self.min_p)
        _require(
            -2 <= self.presence_penalty <= 2,
            "presence_penalty",
            "in [-2, 2]",
            self.presence_penalty,
        )
        _require(
            -2 <= self.frequency_penalty <= 2,
            "frequency_penalty",
            "in [-2, 2]",
            self.frequency_penalty,
        )
        _require(
            0 < self.repetition_penalty <= 2,
            "repetition_penalty",
            "in (0, 2]",
            self.repetition_penalty,
        )
        _require(
            all(-100 <= v <= 100 for v in self.logit_bias.values()),
            "logit_bias",
            "values in [-100, 100]",
            self.logit_bias,
        )
        _require(
            self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 0),
            "max_tokens",
            "an integer >= 0",
            self.max_tokens,
        )
        _require(
            isinstance(self.min_tokens, int) and self.min_tokens >= 0,
            "min_tokens",
            "an integer >= 0",
            self.min_tokens,
        )
        _require(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"<= max_tokens ({self.max_tokens})",
            self.min_tokens,
        )
        _require(
            len(self.stop) <= MAX_STOP_STRINGS,
            "stop",
            f"at most {MAX_STOP_STRINGS} strings",
            len(self.stop),
        )
        _require(
            all(isinstance(s, str) and s for s in self.stop), "stop", "non-empty strings", self.stop
        )
        _require(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "non-negative integers",
            self.stop_token_ids,
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _require(
                value is None or (isinstance(value, int) and 0 <= value <= MAX_LOGPROBS),
                name,
                f"an integer in 0..{MAX_LOGPROBS}",
                value,
            )
        _require(self.seed is None or isinstance(self.seed, int), "seed", "an integer", self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def needs_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )
