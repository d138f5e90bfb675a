"""Offline throughput: goodspeed vs HF transformers `generate`, same model, dtype and threads, one run.

Measures
  - batch-1 decode tok/s: (N - 1) / (t(N tokens) - t(1 token)) for one short prompt, so prefill
    and start-up costs cancel out;
  - batched throughput: C concurrent requests of P-token prompts and N new tokens each
    (EOS ignored), generated tokens / wall time;
  - where goodspeed's decode time goes: torch.profiler's top ops over a few decode steps.
Prompts come from ../shared/data/workload_copy.jsonl (cut to P tokens).

    python benchmarks/offline.py --threads 2 --out docs/bench_offline.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import date
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "workload_copy.jsonl"


def load_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    texts = [json.loads(line)["prompt"] for line in DATA.read_text().splitlines() if line.strip()]
    prompts = []
    for i in range(count):
        ids = tokenizer.encode(texts[i % len(texts)] + " " + texts[(i + 1) % len(texts)])
        prompts.append(ids[:length])
    return prompts


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(run, prompt: list[int], batch: list[list[int]], new_tokens: int) -> dict:
    """run(prompts, n) generates n tokens for each prompt; the same protocol for both engines."""
    run([prompt], 4)  # warm-up
    t1 = min(timed(lambda: run([prompt], 1)) for _ in range(2))
    tn = timed(lambda: run([prompt], new_tokens))
    tb = timed(lambda: run(batch, new_tokens))
    return {
        "decode_tok_s": (new_tokens - 1) / (tn - t1),
        "batch_tok_s": len(batch) * new_tokens / tb,
        "batch_seconds": tb,
    }


def ours(llm: LLM, prompt: list[int], batch: list[list[int]], new_tokens: int) -> dict:
    def run(prompts, n):
        llm.generate(
            prompts, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True), use_tqdm=False
        )

    return measure(run, prompt, batch, new_tokens)


def hf(model_path: Path, prompt: list[int], batch: list[list[int]], new_tokens: int) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_path.parent, gguf_file=model_path.name, dtype=torch.float32
    ).eval()
    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0

    def run(prompts, n):
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=pad,
            )

    return measure(run, prompt, batch, new_tokens)


def profile_decode(llm: LLM, prompt: list[int], steps: int = 16) -> list[tuple[str, float]]:
    engine = llm.engine
    engine.add_request(
        "profile", prompt, SamplingParams(max_tokens=steps + 2, temperature=0, ignore_eos=True)
    )
    engine.step()  # prefill
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [(e.key, round(100 * e.self_cpu_time_total / total, 1)) for e in events[:12]]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--out", default=None, help="write JSON results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(
        config=EngineConfig.from_flat(
            {
                "model": args.model,
                "dtype": "float32",
                "threads": args.threads,
                "max_num_seqs": max(64, args.concurrency),
            }
        )
    )
    prompt = llm.tokenizer.encode("The history of the printing press")
    batch = load_prompts(llm.tokenizer, args.concurrency, args.prompt_len)
    results = {
        "date": str(date.today()),
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}",
        "args": vars(args),
    }
    results["goodspeed"] = ours(llm, prompt, batch, args.new_tokens)
    results["profile_top_ops_pct"] = profile_decode(llm, prompt)
    if not args.skip_hf:
        results["hf"] = hf(llm.engine.runner.model_path, prompt, batch, args.new_tokens)
        results["ratio_decode"] = (
            results["goodspeed"]["decode_tok_s"] / results["hf"]["decode_tok_s"]
        )
        results["ratio_batch"] = results["goodspeed"]["batch_tok_s"] / results["hf"]["batch_tok_s"]
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
