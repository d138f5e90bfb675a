"""Greedy tokens of a GGUF against transformers', per activation arithmetic of the CPU kernels.

For each `--weights` setting (gguf-f32, gguf-int16, gguf-int8: float32, 16-bit or 8-bit
activations over the same blocks) it generates greedily on the parity prompts of the tests
(tests/engine/models/test_smollm2_parity.py; for the Qwen files those of test_qwen_pair.py),
through the engine's CPU path (native attention and decoder stack), and prints per prompt "same"
or (first differing output index, transformers' float32 logit gap between its two candidates
there). The tests' rule: a divergence counts as a near-tie when that gap is below NEAR_TIE
(1e-4 for SmolLM2, 1e-3 for Qwen).

    .venv/bin/python benchmarks/activation_parity.py
    .venv/bin/python benchmarks/activation_parity.py --model ~/.cache/goodspeed/models/qwen-pair/\\
        qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf --max-tokens 32
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.models.loader import load_model, read_arch_config, resolve_model_path  # noqa: E402
from kernels.cpu.paged_attention import CpuPagedBackend  # noqa: E402
from tests.engine.models import (  # noqa: E402
    hf_gguf,  # noqa: E402
    test_qwen_pair,
    test_smollm2_parity,
)
from tests.engine.models.conftest import PagedDriver  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--weights", default="gguf-f32,gguf-int16,gguf-int8")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    path = resolve_model_path(args.model)
    suite = test_qwen_pair if "qwen" in path.name.lower() else test_smollm2_parity
    tokenizer, hf_model = hf_gguf.hf_tokenizer(path), hf_gguf.hf_model(path)
    prompts = hf_gguf.encode_prompts(tokenizer, suite.CHAT_PROMPTS, suite.TEXT_PROMPTS)
    eos = read_arch_config(path).eos_token_ids
    expected = [hf_gguf.hf_greedy(hf_model, ids, eos, args.max_tokens) for ids in prompts]
    for weights in args.weights.split(","):
        model, _ = load_model(path, torch.float32, "cpu", CpuPagedBackend(), weights)
        ours = hf_gguf.our_greedy_batch(model, prompts, eos, args.max_tokens, PagedDriver)
        for ids, got, want in zip(prompts, ours, expected, strict=True):
            parted = hf_gguf.first_divergence_gap(hf_model, ids, got, want)
            result = "same" if parted is None else f"parts at {parted[0]}, gap {parted[1]:.2e}"
            print(f"{weights}: {result}  {tokenizer.decode(ids)[-40:]!r}", flush=True)


if __name__ == "__main__":
    main()
