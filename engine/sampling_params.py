"""SamplingParams: what a request asks of the sampler, validated once at the edge.

Invalid values raise ValueError naming the field and the allowed range, so the server can turn
them into a 400 and the offline API into a clear exception. Every range fits the types the
engine computes with (int64 ids and counts, float32 logits, int32 top-k), so no valid request
can make the sampler overflow. Context-length and vocabulary checks need the model, so they
live in LLMEngine.add_request (engine/request.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 64
MAX_STOP_TOKEN_IDS = 1024  # checked per generated token, on the engine thread all share
MAX_N = 128
MAX_INT64 = 2**63 - 1
MAX_DRAFT_TOKENS = 1024  # a request's own speculation cap (the engine's is usually far lower)
MAX_TOP_K = 2**31 - 1  # sampling kernels take int32 k; the sampler clamps it to the vocabulary
# Below this temperature a request is greedy: softmax(logits / T) is a point mass on the argmax
# anyway, and logits / 1e-50 overflows float32 (inf - inf = NaN probabilities).
GREEDY_TEMPERATURE = 1e-5
# Penalised logits are divided by the penalty (then by the temperature): a floor keeps them
# finite in float32. Values below 1 reward repetition; nobody needs less than this.
MIN_REPETITION_PENALTY = 0.01


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_in(low: int, high: int) -> Callable[[object], bool]:
    return lambda v: _is_int(v) and low <= v <= high  # type: ignore[operator]


def _number_in(low: float, high: float, low_open: bool = False) -> Callable[[object], bool]:
    def ok(v: object) -> bool:
        if not _is_number(v):
            return False
        return (low < v if low_open else low <= v) and v <= high  # type: ignore[operator]

    return ok


def _optional(rule: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or rule(v)


# (field, rule, what is allowed): NaN fails every comparison, so it is refused everywhere.
_RULES: tuple[tuple[str, Callable[[object], bool], str], ...] = (
    ("n", _int_in(1, MAX_N), f"an integer in 1..{MAX_N}"),
    ("temperature", _number_in(0, 100), "a number in [0, 100]"),
    ("top_p", _number_in(0, 1, low_open=True), "a number in (0, 1]"),
    ("top_k", _int_in(-1, MAX_TOP_K), f"-1, 0 (off) or an integer in 1..{MAX_TOP_K}"),
    ("min_p", _number_in(0, 1), "a number in [0, 1]"),
    ("presence_penalty", _number_in(-2, 2), "a number in [-2, 2]"),
    ("frequency_penalty", _number_in(-2, 2), "a number in [-2, 2]"),
    (
        "repetition_penalty",
        _number_in(MIN_REPETITION_PENALTY, 2),
        f"a number in [{MIN_REPETITION_PENALTY}, 2]",
    ),
    ("seed", _optional(_int_in(-MAX_INT64 - 1, MAX_INT64)), "a 64-bit signed integer"),
    ("max_tokens", _optional(_int_in(0, MAX_INT64)), "an integer >= 0"),
    ("min_tokens", _int_in(0, MAX_INT64), "an integer >= 0"),
    ("logprobs", _optional(_int_in(0, MAX_LOGPROBS)), f"an integer in 0..{MAX_LOGPROBS}"),
    ("prompt_logprobs", _optional(_int_in(0, MAX_LOGPROBS)), f"an integer in 0..{MAX_LOGPROBS}"),
    (
        "max_draft_tokens",
        _optional(_int_in(0, MAX_DRAFT_TOKENS)),
        f"an integer in 0..{MAX_DRAFT_TOKENS}",
    ),
)

GuidedKind = Literal["json", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class GuidedDecoding:
    """Structured output: generated text must match this (engine/structured/ compiles it).

    kind: json (spec = a JSON schema, as JSON text), regex, choice (a JSON list of strings)
    or grammar (Lark or GBNF text).
    """

    kind: GuidedKind
    spec: str

    def __post_init__(self) -> None:
        if self.kind not in ("json", "regex", "choice", "grammar"):
            raise ValueError(f"guided decoding kind must be json, regex, choice or grammar, "
                             f"got {_short(self.kind)}")  # fmt: skip
        if not isinstance(self.spec, str):
            raise ValueError(f"guided decoding spec must be a string, got {_short(self.spec)}")


def _require(ok: bool, name: str, allowed: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {_short(value)}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _as_tuple(name: str, value: object) -> tuple:
    try:
        return tuple(value)  # type: ignore[call-overload]
    except TypeError:
        raise ValueError(f"{name} must be a list, got {_short(value)}") from None


def _token_id_keys(bias: object) -> dict[int, float]:
    """logit_bias as {token id: bias}; int-like keys only (the server sends JSON strings)."""
    try:
        return {_token_id(k): float(v) for k, v in dict(bias).items()}  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ValueError(
            f"logit_bias must map token ids (integers >= 0) to numbers, got {_short(bias)}"
        ) from None


def _token_id(key: object) -> int:
    if isinstance(key, str) and not (key.isascii() and key.isdigit()):
        raise ValueError(key)  # "²".isdigit() is True, but int("²") fails
    if isinstance(key, float | bool):
        raise TypeError(key)
    return int(key)  # type: ignore[call-overload]


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # below GREEDY_TEMPERATURE (e.g. 0) = greedy
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
    guided: GuidedDecoding | None = None  # structured output: a constraint the output obeys
    max_draft_tokens: int | None = None  # this request's speculation cap (0: none; None: engine's)

    def __post_init__(self) -> None:
        # Normalise list-typed inputs to tuples so the object stays hashable-ish and immutable.
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        object.__setattr__(self, "stop", _as_tuple("stop", stop))
        object.__setattr__(self, "stop_token_ids", _as_tuple("stop_token_ids", self.stop_token_ids))
        object.__setattr__(self, "logit_bias", _token_id_keys(self.logit_bias))
        self._validate()

    def _validate(self) -> None:
        for name, rule, allowed in _RULES:
            value = getattr(self, name)
            _require(rule(value), name, allowed, value)
        _require(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"<= max_tokens ({self.max_tokens})",
            self.min_tokens,
        )
        _require(
            all(0 <= k <= MAX_INT64 and -100 <= v <= 100 for k, v in self.logit_bias.items()),
            "logit_bias",
            "token ids (integers >= 0) mapped to numbers in [-100, 100]",
            self.logit_bias,
        )
        _require(
            len(self.stop) <= MAX_STOP_STRINGS and all(isinstance(s, str) and s for s in self.stop),
            "stop",
            f"at most {MAX_STOP_STRINGS} non-empty strings",
            self.stop,
        )
        _require(
            len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS
            and all(_is_int(t) and 0 <= t <= MAX_INT64 for t in self.stop_token_ids),
            "stop_token_ids",
            f"at most {MAX_STOP_TOKEN_IDS} token ids (integers >= 0)",
            self.stop_token_ids,
        )

        _require(
            self.guided is None or (not self.ignore_eos and self.min_tokens == 0),
            "guided",
            "used without ignore_eos and min_tokens (a finished grammar allows only EOS)",
            self.guided,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def needs_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )
