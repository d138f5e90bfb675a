"""Greedy tokens of SmolLM2's GGUF against transformers', float32 vs int8 activations.

The test suite asserts parity for the float32-activation path (tests/engine/models/
test_smollm2_parity.py); this measures how far `--weights gguf-int8` drifts on the same six
prompts (64 new tokens, the engine's CPU path: native attention and decoder stack): per prompt
"same" or (first differing output index, transformers' logit gap between its top two tokens
there).

    .venv/bin/python benchmarks/int8_parity.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.models.loader import load_model, read_arch_config, resolve_model_path  # noqa: E402
from kernels.cpu.paged_attention import CpuPagedBackend  # noqa: E402
from tests.engine.models import hf_gguf  # noqa: E402
from tests.engine.models.conftest import PagedDriver  # noqa: E402
from tests.engine.models.test_smollm2_parity import (  # noqa: E402
    CHAT_PROMPTS,
    MAX_NEW_TOKENS,
    TEXT_PROMPTS,
)


def main() -> None:
    path = resolve_model_path("smollm2-135m-instruct")
    tokenizer, hf_model = hf_gguf.hf_tokenizer(path), hf_gguf.hf_model(path)
    prompts = hf_gguf.encode_prompts(tokenizer, CHAT_PROMPTS, TEXT_PROMPTS)
    eos = read_arch_config(path).eos_token_ids[:1]
    expected = [hf_gguf.hf_greedy(hf_model, ids, eos, MAX_NEW_TOKENS) for ids in prompts]
    for weights in ("gguf", "gguf-int8"):
        model, _ = load_model(path, torch.float32, "cpu", CpuPagedBackend(), weights)
        ours = hf_gguf.our_greedy_batch(model, prompts, eos, MAX_NEW_TOKENS, PagedDriver)
        for ids, got, want in zip(prompts, ours, expected, strict=True):
            parted = hf_gguf.first_divergence_gap(hf_model, ids, got, want)
            print(weights, "same" if parted is None else parted, repr(tokenizer.decode(ids))[:40])


if __name__ == "__main__":
    main()
