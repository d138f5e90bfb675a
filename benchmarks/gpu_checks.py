"""Engine-level checks of the GPU path on a real model (SmolLM2), written to --out as JSON + md.

1. parity: greedy tokens (32 new, 4 chat prompts) of our engine with the reference backend in
   float32 and bfloat16, FlashInfer eager and FlashInfer + CUDA graphs (bfloat16), and of HF
   transformers on the same GPU in float32 and bfloat16. Pairs are compared with
   tests/parity.py: identical, or a first difference at a near-tie (the judge engine's logprob
   gap of the two candidates under --near-tie). The bf16 noise level that justifies the
   tolerance is measured too: the largest |logprob(bf16) - logprob(fp32)| of the chosen token
   over positions where the two runs still agree.
2. speculation: FlashInfer + graphs, bfloat16, 8 prompts x 64 tokens in one batch; n-gram and
   Token Recycling, chains (fixed:4) and trees (8 nodes), against plain decoding.
3. engine throughput: LLM.generate of B prompts x --new-tokens (EOS ignored) for FlashInfer
   eager and + graphs at B = 1, 8, 32, 64: generated tokens / wall time (prefill included).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.config import EngineConfig  # noqa: E402
from engine.front.heap import CollectorPauses, collection_paused_then_frozen  # noqa: E402
from engine.front.llm import LLM  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from tests.parity import near_tie_report  # noqa: E402

ENGINES = {
    "ref-fp32": dict(dtype="float32", attention_backend="reference"),
    "ref-bf16": dict(dtype="bfloat16", attention_backend="reference"),
    "fi-eager": dict(dtype="bfloat16", attention_backend="flashinfer", cuda_graphs=False),
    "fi-graphs": dict(dtype="bfloat16", attention_backend="flashinfer"),
}
# (got, want = judge): the judge is the engine that produced `want`.
PAIRS = [
    ("hf-fp32", "ref-fp32"),
    ("fi-eager", "ref-bf16"),
    ("fi-graphs", "fi-eager"),
    ("hf-bf16", "fi-graphs"),
    ("fi-graphs", "ref-fp32"),
]
SPEC = {
    "ngram-chain": dict(speculative_proposer="ngram", spec_policy="fixed:4"),
    "ngram-tree": dict(speculative_proposer="ngram", spec_policy="fixed:8", spec_tree_nodes=8),
    "recycle-chain": dict(speculative_proposer="recycle", spec_policy="fixed:4"),
    "recycle-tree": dict(speculative_proposer="recycle", spec_policy="fixed:8", spec_tree_nodes=8),
}


def make_llm(model: str, **flat) -> LLM:
    base = dict(model=model, device="cuda", num_kv_blocks=2048, spec_profile_seconds=0)
    return LLM(config=EngineConfig.from_flat({**base, **flat}))


def load_prompts(llm: LLM, data: Path, count: int, cut: int) -> list[list[int]]:
    """count/2 copy-heavy prompts (user text cut to `cut` tokens) and count/2 chat prompts."""
    tok = llm.tokenizer
    texts = []
    for name in ("workload_copy.jsonl", "workload_chat.jsonl"):
        lines = (data / name).read_text().splitlines()[: count // 2]
        texts += [json.loads(line)["prompt"] for line in lines]
    texts = [tok.decode(tok.encode(t)[:cut]) for t in texts]
    return [tok.apply_chat_template([{"role": "user", "content": t}]) for t in texts]


def greedy(llm: LLM, prompts, new_tokens: int) -> tuple[list[list[int]], list[list[float]]]:
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, logprobs=0)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [o.output_token_ids for o in outputs], [[e.logprob for e in o.logprobs] for o in outputs]


@torch.inference_mode()
def hf_greedy(model_path: str, dtype: torch.dtype, prompts, new_tokens: int):
    from benchmarks.gpu_bounds import hf_model_for

    model = hf_model_for(model_path, dtype, {})
    model.generation_config.eos_token_id = None  # plain greedy past EOS, like ignore_eos
    tokens, logprobs = [], []
    for prompt in prompts:
        ids = torch.tensor([prompt], device="cuda")
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        new = out.sequences[0, len(prompt) :].tolist()
        scores = torch.stack(out.logits)[:, 0].float().log_softmax(-1)
        tokens.append(new)
        logprobs.append(scores[torch.arange(len(new)), torch.tensor(new)].tolist())
    del model
    torch.cuda.empty_cache()
    return tokens, logprobs


def noise(a_tokens, a_lp, b_tokens, b_lp) -> float:
    """Largest chosen-token |logprob difference| over positions where both runs agree so far."""
    worst = 0.0
    for ta, la, tb, lb in zip(a_tokens, a_lp, b_tokens, b_lp):
        for x, y, p, q in zip(ta, tb, la, lb):
            if x != y:
                break
            worst = max(worst, abs(p - q))
    return worst


def report(judge: LLM, prompts, got, want, tolerance: float) -> dict:
    identical, ties, real = near_tie_report(judge, prompts, got, want, tolerance)
    return dict(
        identical=identical,
        of=len(prompts),
        near_ties=[(d.index, round(d.gap, 4)) for d in ties],
        beyond=[(d.index, round(d.gap, 4)) for d in real],
    )


def check_parity(args, prompts) -> dict:
    runs, llms = {}, {}
    for name, flat in ENGINES.items():
        llms[name] = make_llm(args.model, **flat)
        runs[name] = greedy(llms[name], prompts, args.parity_tokens)
    for name, dtype in (("hf-fp32", torch.float32), ("hf-bf16", torch.bfloat16)):
        runs[name] = hf_greedy(args.model, dtype, prompts, args.parity_tokens)
    result = {"noise_bf16_vs_fp32": noise(*runs["ref-bf16"], *runs["ref-fp32"])}
    result["noise_hf_fp32_vs_ref_fp32"] = noise(*runs["hf-fp32"], *runs["ref-fp32"])
    result["noise_fi_vs_ref_bf16"] = noise(*runs["fi-eager"], *runs["ref-bf16"])
    for got, want in PAIRS:
        result[f"{got} vs {want}"] = report(
            llms[want], prompts, runs[got][0], runs[want][0], args.near_tie
        )
    return result


def check_speculation(args, prompts) -> dict:
    plain = make_llm(args.model, **ENGINES["fi-graphs"])
    want, _ = greedy(plain, prompts, args.spec_tokens)
    result = {}
    for name, flat in SPEC.items():
        llm = make_llm(args.model, **ENGINES["fi-graphs"], **flat)
        got, _ = greedy(llm, prompts, args.spec_tokens)
        stats = llm.engine.stats()
        row = report(plain, prompts, got, want, args.near_tie)
        row["acceptance"] = stats.spec_num_accepted_tokens_total / max(
            1, stats.spec_num_draft_tokens_total
        )
        row["pool_whole"] = stats.num_free_blocks == stats.num_total_blocks
        result[name] = row
        del llm
    return result


def engine_throughput(args, prompts) -> dict:
    """Per engine and batch size: tok/s over the whole generate call (prefill included) and
    decode tok/s, from the moment every request has its first token to the last token (what
    the decode harness of gpu_bench.py measures, without the engine's prefill), both with an
    output per step (on_output: how a stream runs); then the same batch with one output per
    request (offline generate, final_only): its total tok/s, and its decode tok/s estimated as
    the tokens after the first ones over its time less the streamed run's prefill time."""
    result = {}
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    for name in args.throughput_engines.split(","):
        with collection_paused_then_frozen():  # as the server's start-up heap is
            llm = make_llm(args.model, **ENGINES[name], max_num_seqs=64)
        llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up
        result[name] = {}
        for size in (1, 8, 32, 64):
            batch = [prompts[i % len(prompts)] for i in range(size)]
            marks: dict[str, list[tuple[float, int]]] = {}

            def on_output(output, marks=marks) -> None:
                marks.setdefault(output.request_id, []).append(
                    (time.perf_counter(), len(output.output_token_ids))
                )

            with CollectorPauses() as pauses:
                torch.cuda.synchronize()
                start = time.perf_counter()
                outputs = llm.generate(batch, params, use_tqdm=False, on_output=on_output)
                seconds = time.perf_counter() - start
                tokens = sum(len(o.output_token_ids) for o in outputs)
                prefill = max(series[0][0] for series in marks.values()) - start
                torch.cuda.synchronize()
                start = time.perf_counter()
                llm.generate(batch, params, use_tqdm=False)  # one output per request
                final = time.perf_counter() - start
            result[name][size] = dict(
                total_tok_s=tokens / seconds,
                decode_tok_s=decode_rate(marks),
                final_total_tok_s=tokens / final,
                final_decode_tok_s=(tokens - size) / max(final - prefill, 1e-9),
                **pauses.as_dict(),  # the collector's passes in both runs
            )
            print(f"engine {name} batch {size}: {result[name][size]}", flush=True)
        del llm
    return result


def decode_rate(marks: dict[str, list[tuple[float, int]]]) -> float:
    """Tokens emitted after every request had its first one, per second until the last."""
    begin = max(series[0][0] for series in marks.values())
    end = max(series[-1][0] for series in marks.values())
    before = sum(max(n for t, n in series if t <= begin) for series in marks.values())
    after = sum(series[-1][1] for series in marks.values())
    return (after - before) / (end - begin) if end > begin else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default="parity,speculation,throughput")
    parser.add_argument("--near-tie", type=float, default=0.5)
    parser.add_argument("--parity-tokens", type=int, default=32)
    parser.add_argument("--spec-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--throughput-engines", default="fi-eager,fi-graphs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    probe = make_llm(args.model, **ENGINES["ref-fp32"], num_kv_blocks=16)
    parts = {
        "parity": lambda: check_parity(args, load_prompts(probe, args.data, 4, 200)),
        "speculation": lambda: check_speculation(args, load_prompts(probe, args.data, 8, 340)),
        "throughput": lambda: engine_throughput(args, load_prompts(probe, args.data, 8, 120)),
    }
    results = {"device": torch.cuda.get_device_name(), "near_tie": args.near_tie}
    for part in args.parts.split(","):
        start = time.perf_counter()
        try:
            results[part] = parts[part]()
        except Exception as exc:  # a failing part must not lose the others' results
            import traceback

            traceback.print_exc()
            results[part] = f"FAILED {type(exc).__name__}: {exc}"
        print(f"== {part} ({time.perf_counter() - start:.0f} s)", flush=True)
        print(json.dumps(results[part], indent=1), flush=True)
        (args.out / "gpu_checks.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
