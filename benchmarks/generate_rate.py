"""In-process rates of one checkout, for A/B runs of two checkouts (PYTHONPATH picks which
`engine` is imported; run each version in its own process, taking turns).

  rates    LLM.generate tok/s at batch 1 and 16 (copy-workload prompts cut to 160 tokens,
           64 new tokens, greedy, EOS ignored), one JSON line
  prefill  engine steps of one chat-templated prompt (the first N copy documents joined),
           max_tokens 2: the time at which each step ends, so the prefill chunks show

    PYTHONPATH=. .venv/bin/python benchmarks/generate_rate.py rates [--spec]
    .venv/bin/python benchmarks/generate_rate.py prefill --model Q.gguf --documents 3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "workload_copy.jsonl"


def documents() -> list[str]:
    return [json.loads(line)["prompt"] for line in DATA.read_text().splitlines() if line.strip()]


def rates(llm: LLM) -> dict[int, float]:
    prompts = [llm.tokenizer.encode(text)[:160] for text in documents()]
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    llm.generate([prompts[0]], params)  # warm-up
    result = {}
    for batch in (1, 16):
        chosen = [prompts[i % len(prompts)] for i in range(batch)]
        start = time.perf_counter()
        llm.generate(chosen, params)
        result[batch] = round(64 * batch / (time.perf_counter() - start), 1)
    return result


def prefill(llm: LLM, num_documents: int) -> None:
    chat = llm.tokenizer.apply_chat_template
    llm.generate([chat([{"role": "user", "content": "Hi"}])], SamplingParams(max_tokens=4))
    content = "\n\n".join(documents()[:num_documents]) + " (0)"
    ids = chat([{"role": "user", "content": content}])
    print("prompt tokens", len(ids))
    engine = llm.engine
    engine.add_request("a", ids, SamplingParams(max_tokens=2, temperature=0))
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        outputs = engine.step()
        print(
            "step ends",
            round(time.perf_counter() - start, 2),
            "s, tokens out",
            [len(o.new_token_ids) for o in outputs],
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("rates", "prefill"))
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--spec", action="store_true", help="n-gram drafts, goodput policy")
    parser.add_argument("--documents", type=int, default=3)
    args = parser.parse_args()
    flat = dict(model=args.model, threads=args.threads)
    if args.spec:
        flat.update(speculative_proposer="ngram", spec_policy="goodput")
    elif args.mode == "prefill":
        flat.update(max_num_seqs=16, spec_policy="off")
    llm = LLM(config=EngineConfig.from_flat(flat))
    if args.mode == "rates":
        print(json.dumps(rates(llm)))
    else:
        prefill(llm, args.documents)


if __name__ == "__main__":
    main()
