"""Each model family through the whole engine, on tiny random models built with transformers'
own config classes: greedy tokens equal transformers' greedy tokens, alone, batched, with
prefill in small chunks and with n-gram speculation; the same from a Q8_0 GGUF on the native
CPU path (its tokens equal the dequantised float32 path of the same file). Prompts are longer
than the sliding windows (5-6 positions), so local layers run past them."""

from __future__ import annotations

import random

import pytest
import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams
from tests.engine.models.conftest import build_hf_model
from tests.engine.models.test_gguf_loader import GGUF_ARCH, GGUF_FAMILY_OVERRIDES, write_gguf

FAMILIES = ["qwen3", "mistral", "phi3", "gemma3_text"]
NUM_NEW = 12
GREEDY = SamplingParams(max_tokens=NUM_NEW, temperature=0, ignore_eos=True)
SETTINGS = {
    "alone": dict(),
    "batched": dict(),
    "chunked": dict(max_num_batched_tokens=8),
    "ngram": dict(speculative_proposer="ngram", spec_policy="fixed:3"),
}


def prompts(count: int = 3, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(9, 30))] for _ in range(count)]


def make_llm(path, **flat) -> LLM:
    base = dict(model=str(path), dtype="float32", num_kv_blocks=64, block_size=8)
    return LLM(config=EngineConfig.from_flat({**base, **flat}))


def run(llm: LLM, setting: str) -> list[list[int]]:
    if setting == "alone":
        return [llm.generate(p, GREEDY, use_tqdm=False)[0].output_token_ids for p in prompts()]
    return [o.output_token_ids for o in llm.generate(prompts(), GREEDY, use_tqdm=False)]


def hf_greedy(hf_model, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_family_greedy_matches_transformers_in_every_setting(tmp_path, model_type):
    path, hf_model = build_hf_model(tmp_path, model_type)
    want = [hf_greedy(hf_model, p) for p in prompts()]
    for setting, flat in SETTINGS.items():
        assert run(make_llm(path, **flat), setting) == want, setting


@pytest.mark.parametrize("model_type", FAMILIES)
def test_family_q8_0_gguf_on_the_native_path(tmp_path, model_type):
    from kernels.cpu import native_available

    if not native_available():
        pytest.skip("the native CPU kernels are unavailable here")
    import gguf

    overrides = GGUF_FAMILY_OVERRIDES.get(model_type, {})
    hf_dir, _ = build_hf_model(tmp_path / "hf", model_type, **overrides)
    path = write_gguf(
        tmp_path / "m.gguf", hf_dir, gguf.GGMLQuantizationType.Q8_0, arch=GGUF_ARCH[model_type]
    )
    want = run(make_llm(path, weights="float32", attention_backend="reference"), "batched")
    for setting, flat in SETTINGS.items():
        got = run(make_llm(path, weights="gguf-f32", **flat), setting)
        assert got == want, setting
