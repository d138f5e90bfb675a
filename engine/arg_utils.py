"""Command-line flags for EngineConfig, shared by `goodspeed generate` and `goodspeed serve`.

Flags default to None so that only what the user typed overrides a --config YAML profile.
"""

from __future__ import annotations

import argparse

from engine.config import EngineConfig

# (flag, type, help); the config key is the flag name with dashes turned into underscores.
_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("--model", str, "HF model dir, .gguf file, or built-in name (default: smollm2-135m-instruct)"),
    ("--dtype", str, "float32 | bfloat16 | float16 (CPU default float32)"),
    (
        "--weights",
        str,
        "auto | gguf | gguf-f32 | gguf-int16 | gguf-int8 | q8_0 | float32: run a GGUF's quantized "
        "blocks on the CPU kernels (gguf: activations quantized to int16 per row and group; the "
        "suffix picks float32, int16 or int8 (llama.cpp's) activations), quantize a "
        "safetensors model to Q8_0 at load (q8_0), or dequantise at load",
    ),
    ("--max-model-len", int, "context length cap (default: the model's)"),
    ("--seed", int, "engine seed"),
    ("--block-size", int, "KV cache block size in tokens (default 16)"),
    ("--num-kv-blocks", int, "KV cache blocks (wins over --kv-cache-memory)"),
    ("--kv-cache-memory", str, "KV cache size, e.g. 512MiB or 2GiB (default 1GiB)"),
    (
        "--kv-cache-dtype",
        str,
        "auto (the model's dtype) | float32 | float16 | bfloat16: what the KV cache stores",
    ),
    ("--max-num-batched-tokens", int, "token budget of one step (default 512)"),
    ("--max-num-seqs", int, "running requests at once (default 64)"),
    (
        "--speculative-proposer",
        str,
        "none | ngram | recycle | draft, or several chosen per request by goodput: auto "
        "(ngram, recycle, + draft with --draft-model) or a list, e.g. ngram,recycle,draft",
    ),
    (
        "--draft-model",
        str,
        "draft model path, or self:N = the target's first N layers (with --speculative-proposer draft)",
    ),
    (
        "--draft-vocab",
        int,
        "the draft model's head over the first N token ids only (default 0: all); cheaper "
        "draft steps, output unchanged",
    ),
    (
        "--draft-weights",
        str,
        "how the draft model's weights run (default auto: as --weights, with int8 activations "
        "on a GGUF's blocks); any --weights value",
    ),
    (
        "--num-speculative-tokens",
        int,
        "maximum draft tokens per step (default 16 on the CPU, 8 on a GPU)",
    ),
    ("--spec-tree-nodes", int, "tree node budget (0 = chains)"),
    ("--spec-policy", str, "off | fixed:K | goodput (default goodput when a proposer is set)"),
    ("--spec-profile-seconds", float, "goodput: start-up cost-model profile (default 3; 0 = off)"),
    ("--spec-cost-cache", str, "cost-model cache JSON, none = off (default ~/.cache/goodspeed/)"),
    ("--device", str, "cpu | cuda | cuda:N"),
    ("--threads", int, "torch intra-op threads"),
    (
        "--thread-policy",
        str,
        "adaptive (default: fewer compute threads while other processes hold cores) | static",
    ),
    ("--attention-backend", str, "auto | reference | cpu | flashinfer"),
)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", default=None, help="YAML profile whose keys are config fields (flags override)"
    )
    group = parser.add_argument_group("engine")
    for flag, kind, text in _FLAGS:
        group.add_argument(flag, type=kind, default=None, help=text)
    group.add_argument(
        "--no-prefix-caching", action="store_true", help="disable automatic prefix caching"
    )
    group.add_argument(
        "--no-sliding-window-pool",
        action="store_true",
        help="sliding-window layers keep every block (default: only those their window reads)",
    )
    group.add_argument(
        "--enforce-eager",
        action="store_true",
        help="no CUDA graphs for decode steps (FlashInfer on CUDA captures them by default)",
    )


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    overrides = {
        flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_"))
        for flag, _, _ in _FLAGS
    }
    if getattr(args, "no_prefix_caching", False):
        overrides["enable_prefix_caching"] = False
    if getattr(args, "no_sliding_window_pool", False):
        overrides["sliding_window_pool"] = False
    if getattr(args, "enforce_eager", False):
        overrides["cuda_graphs"] = False
    if args.config:
        return EngineConfig.from_yaml(args.config, overrides)
    return EngineConfig.from_flat(overrides)
