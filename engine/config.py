"""Engine configuration: frozen dataclasses split by concern, validated at construction.

Each component receives only its own part. Runtime facts (the number of KV blocks actually
allocated, the EOS id, the model's context length) live in runtime objects, never here.
YAML profiles in configs/ use the flat field names below; command-line flags override them.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_COST_CACHE = "~/.cache/goodspeed/cost_models.json"
_DTYPES = ("float32", "bfloat16", "float16")
_WEIGHTS = ("auto", "gguf", "gguf-f32", "gguf-int16", "gguf-int8", "q8_0", "float32")
_PROPOSERS = ("none", "ngram", "recycle", "draft")
_AUTO_PROPOSERS = ("ngram", "recycle")  # + draft when a draft model is given
_BACKENDS = ("auto", "reference", "cpu", "flashinfer")
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
}


def parse_size(text: str | int) -> int:
    """'2GiB' -> 2147483648; plain integers are bytes."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"kv_cache_memory: cannot parse {text!r}; use e.g. '512MiB' or '2GiB'")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class ModelConfig:
    model: str = DEFAULT_MODEL  # path to an HF dir or a .gguf file, or a built-in name
    dtype: str = "float32"
    max_model_len: int | None = None  # None: the model's own context length
    seed: int = 0
    # How a GGUF's quantized linear weights run: gguf = their blocks on the native CPU kernels
    # (activations quantized to int16 per row and group of 32), float32 = dequantised at load;
    # auto = gguf for a .gguf on the CPU in float32, else float32; gguf-f32 / gguf-int16 /
    # gguf-int8 = gguf with that activation arithmetic (int8: llama.cpp's);
    # q8_0 = a safetensors model's linear weights and embedding quantized to Q8_0 at load.
    weights: str = "auto"

    def __post_init__(self) -> None:
        _check(self.dtype in _DTYPES, f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        _check(self.weights in _WEIGHTS, f"weights must be one of {_WEIGHTS}, got {self.weights!r}")
        _check(
            self.max_model_len is None or self.max_model_len > 0,
            f"max_model_len must be > 0, got {self.max_model_len}",
        )


KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None  # wins over kv_cache_memory when set
    kv_cache_memory: str = "1GiB"
    enable_prefix_caching: bool = True
    # What the KV cache stores: auto (the model's dtype), float32, float16 or bfloat16. The CPU
    # kernels read 16-bit caches directly (half the bytes per token); FlashInfer needs --dtype's.
    kv_cache_dtype: str = "auto"
    # Sliding-window layers on a block pool of their own, holding only the blocks their window
    # reads (engine/core/kv_budget.py); False: they keep every block, as full layers do.
    sliding_window_pool: bool = True

    def __post_init__(self) -> None:
        _check(
            self.block_size in (8, 16, 32, 64, 128),
            f"block_size must be a power of two in 8..128, got {self.block_size}",
        )
        _check(
            self.num_kv_blocks is None or self.num_kv_blocks >= 2,
            f"num_kv_blocks must be >= 2, got {self.num_kv_blocks}",
        )
        parse_size(self.kv_cache_memory)
        _check(
            self.kv_cache_dtype in KV_CACHE_DTYPES,
            f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}",
        )

    @property
    def kv_cache_bytes(self) -> int:
        return parse_size(self.kv_cache_memory)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = (
        512  # token budget of one step (prefill chunks + decodes + drafts)
    )
    max_num_seqs: int = 64  # running requests at once

    def __post_init__(self) -> None:
        _check(
            self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}",
        )
        _check(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")


# The default chain caps. On a CPU a verified chain's rows cost little more than their share of
# the weights' read, and code editing's copied spans accept whole chains: at one request a cap
# of 16 gave the Qwen 1.5B 1.04-1.05x the goodput of a cap of 8 (the rest's chain_cap grows a
# chain past 4 only from a whole one; docs/benchmarks.md §5zf). On a GPU chain verification is
# graph-captured up to 8 drafts (engine/runner/graphs.py), and a longer chain runs eagerly.
CHAIN_CAP_CPU = 16
CHAIN_CAP_GPU = 8


@dataclass(frozen=True)
class SpecConfig:
    # none | ngram | recycle | draft, or several chosen per request by goodput: a comma list
    # (ngram,recycle,draft) or auto (ngram, recycle, and draft when draft_model is set)
    proposer: str = "none"
    draft_model: str | None = None
    # Chains: the cap on num_draft_tokens; None: the device's (EngineConfig: CHAIN_CAP_CPU or
    # CHAIN_CAP_GPU), or CHAIN_CAP_CPU where no device is known (a SpecConfig alone).
    num_speculative_tokens: int | None = None
    spec_tree_nodes: int = 0  # 0: chains; > 0: trees of at most this many nodes
    spec_policy: str | None = None  # off | fixed:K | goodput; None: goodput if a proposer is set
    ngram_max: int = 4
    ngram_min: int = 1
    # The draft model's head over the first N token ids only (0: the whole vocabulary). Its
    # step reads fewer head bytes; a target token past N can then never be drafted (output is
    # unchanged: the target verifies every draft).
    draft_vocab: int = 0
    # How the draft model's weights run: auto = the target's --weights, but int8 activations
    # where that means a GGUF's blocks on the CPU kernels (the draft's arithmetic cannot change
    # the output, and int8 does half the integer work); or any --weights value.
    draft_weights: str = "auto"
    # Added for the goodput policy's start-up profile (engine/speculation/control/profiler.py): seconds of
    # synthetic steps that seed the step-time cost model (0 = no profile and no cache: learn
    # online), and the JSON file caching fits by (model, device, dtype, threads).
    spec_profile_seconds: float = 3.0
    # goodput with chains: the model-free proposers not drafting for a request propose anyway,
    # and their chains are checked against the emitted tokens for their acceptance estimates
    # (engine/speculation/shadow.py); False: only forced probes keep those estimates current.
    spec_shadow_checks: bool = True
    spec_cost_cache: str | None = DEFAULT_COST_CACHE  # None, "" or "none": no cache

    def __post_init__(self) -> None:
        self._check_proposers()
        _check(
            self.num_speculative_tokens is None or 0 <= self.num_speculative_tokens <= 64,
            f"num_speculative_tokens must be in 0..64, got {self.num_speculative_tokens}",
        )
        _check(
            0 <= self.spec_tree_nodes <= 256,
            f"spec_tree_nodes must be in 0..256, got {self.spec_tree_nodes}",
        )
        _check(1 <= self.ngram_min <= self.ngram_max, "need 1 <= ngram_min <= ngram_max")
        _check(
            isinstance(self.draft_vocab, int) and self.draft_vocab >= 0,
            f"draft_vocab must be an integer >= 0 (0 = the whole vocabulary), "
            f"got {self.draft_vocab!r}",
        )
        _check(
            self.draft_weights in _WEIGHTS,
            f"draft_weights must be one of {_WEIGHTS}, got {self.draft_weights!r}",
        )
        _check(
            self.draft_vocab == 0 or bool(self.draft_model),
            "draft_vocab limits a draft model's head: it needs --draft-model",
        )
        seconds = self.spec_profile_seconds
        _check(
            isinstance(seconds, int | float) and 0 <= seconds <= 600,
            f"spec_profile_seconds must be a number in 0..600 (0 = no profile), got {seconds!r}",
        )
        _check(
            self.spec_cost_cache is None or isinstance(self.spec_cost_cache, str),
            f"spec_cost_cache must be a file path or 'none', got {self.spec_cost_cache!r}",
        )

    @property
    def chain_cap(self) -> int:
        """The cap on a chain's drafts: num_speculative_tokens, CHAIN_CAP_CPU if unset."""
        cap = self.num_speculative_tokens
        return CHAIN_CAP_CPU if cap is None else cap

    def _check_proposers(self) -> None:
        names = self.proposers
        known = (*_PROPOSERS, "auto", "a comma list of ngram, recycle, draft")
        _check(
            self.proposer in _PROPOSERS or (len(names) > 1 and len(set(names)) == len(names)),
            f"speculative_proposer must be one of {known}, got {self.proposer!r}",
        )
        _check(
            all(name in _PROPOSERS[1:] for name in names),
            f"speculative_proposer {self.proposer!r}: each name must be one of {_PROPOSERS[1:]}",
        )
        _check(
            "draft" not in names or bool(self.draft_model),
            "speculative_proposer=draft needs --draft-model PATH",
        )
        _check(
            len(names) <= 1 or self.policy == "goodput",
            f"several proposers ({self.proposer}) are chosen by the goodput policy: "
            f"use --spec-policy goodput, not {self.policy!r}",
        )

    @property
    def proposers(self) -> tuple[str, ...]:
        """The proposers to load: () for none; auto = ngram, recycle (+ draft with a draft model)."""
        text = self.proposer.strip().lower() if isinstance(self.proposer, str) else ""
        if text == "auto":
            return (*_AUTO_PROPOSERS, "draft") if self.draft_model else _AUTO_PROPOSERS
        names = tuple(name.strip() for name in text.split(",") if name.strip())
        return () if names == ("none",) else names

    @property
    def policy(self) -> str:
        if self.spec_policy is not None:
            return self.spec_policy
        return "off" if self.proposer == "none" else "goodput"

    @property
    def cost_cache_path(self) -> str | None:
        """The cost-model cache file, or None when caching is off."""
        text = (self.spec_cost_cache or "").strip()
        return None if text.lower() in ("", "none") else text


@dataclass(frozen=True)
class DeviceConfig:
    device: str = "cpu"  # cpu | cuda | cuda:N
    threads: int | None = None  # torch intra-op threads; None: torch's default
    # adaptive: the CPU kernels run as many of `threads` as the cores other processes leave
    # free (kernels/cpu/thread_policy.py); static: always `threads`.
    thread_policy: str = "adaptive"
    attention_backend: str = "auto"
    # Capture decode steps as CUDA graphs (FlashInfer backend on CUDA only; no effect
    # elsewhere). False = eager, like vLLM's --enforce-eager.
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        _check(
            self.attention_backend in _BACKENDS,
            f"attention_backend must be one of {_BACKENDS}, got {self.attention_backend!r}",
        )
        _check(
            self.threads is None or self.threads >= 1, f"threads must be >= 1, got {self.threads}"
        )
        _check(
            self.thread_policy in ("adaptive", "static"),
            f"thread_policy must be adaptive or static, got {self.thread_policy!r}",
        )


_SECTIONS = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "spec": SpecConfig,
    "device": DeviceConfig,
}
_ALIASES = {"speculative_proposer": "proposer"}


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)

    def __post_init__(self) -> None:
        """An unset chain cap becomes the device's (CHAIN_CAP_CPU, CHAIN_CAP_GPU)."""
        if self.spec.num_speculative_tokens is None:
            cap = CHAIN_CAP_CPU if self.device.device == "cpu" else CHAIN_CAP_GPU
            spec = dataclasses.replace(self.spec, num_speculative_tokens=cap)
            object.__setattr__(self, "spec", spec)

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> EngineConfig:
        """Build from flat field names ({'dtype': 'float32', 'block_size': 16, ...}).

        Unknown keys are an error so that a typo in a YAML profile is not silently ignored.
        Keys whose value is None are skipped (an unset flag keeps the default).
        """
        parts: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
        owners = {
            f.name: name for name, klass in _SECTIONS.items() for f in dataclasses.fields(klass)
        }
        for key, value in values.items():
            key = _ALIASES.get(key.replace("-", "_"), key.replace("-", "_"))
            if value is None:
                continue
            if key not in owners:
                raise ValueError(f"unknown config key {key!r}; known keys: {sorted(owners)}")
            parts[owners[key]][key] = value
        return cls(**{name: _SECTIONS[name](**kw) for name, kw in parts.items()})

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> EngineConfig:
        import yaml

        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of config keys")
        data.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls.from_flat(data)

    def replace(self, **flat: Any) -> EngineConfig:
        """A copy with some flat fields changed."""
        current = {
            f.name: getattr(getattr(self, s), f.name)
            for s, k in _SECTIONS.items()
            for f in dataclasses.fields(k)
        }
        current.update(flat)
        return EngineConfig.from_flat(current)
