"""Greedy outputs of SmolLM2 on the shared workloads, with and without each proposer: a
fingerprint to check that a refactor (or a new kernel path) changed no token.

For every config (off; n-gram, Token Recycling and a self-draft, as chains and as trees, under
fixed policies) the first --num-prompts copy-heavy prompts (user text cut to 340 tokens) and
chat prompts, through the chat template, are generated in one batch, greedy, --max-tokens new
tokens each, EOS ignored. Writes {config: [token ids per prompt]} as JSON; with --compare FILE
it also reports every (config, prompt) whose tokens differ from FILE's, and exits 1 if any do.

    .venv/bin/python benchmarks/greedy_fingerprint.py --out /tmp/before.json
    .venv/bin/python benchmarks/greedy_fingerprint.py --out /tmp/after.json --compare /tmp/before.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CHAIN = dict(spec_policy="fixed:4", spec_tree_nodes=0)
TREE = dict(spec_policy="fixed:8", spec_tree_nodes=8)
CONFIGS = {
    "off": {},
    "ngram-chain": dict(speculative_proposer="ngram", **CHAIN),
    "ngram-tree": dict(speculative_proposer="ngram", **TREE),
    "recycle-chain": dict(speculative_proposer="recycle", **CHAIN),
    "recycle-tree": dict(speculative_proposer="recycle", **TREE),
    "draft-chain": dict(speculative_proposer="draft", draft_model="self:4", **CHAIN),
    "draft-tree": dict(speculative_proposer="draft", draft_model="self:4", **TREE),
}


def prompts(llm: LLM, count: int) -> list[list[int]]:
    tok = llm.tokenizer
    texts = []
    for name, cut in (("workload_copy.jsonl", 340), ("workload_chat.jsonl", None)):
        lines = (DATA / name).read_text().splitlines()[:count]
        for line in lines:
            text = json.loads(line)["prompt"]
            texts.append(tok.decode(tok.encode(text)[:cut]) if cut else text)
    return [tok.apply_chat_template([{"role": "user", "content": t}]) for t in texts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare", default=None)
    parser.add_argument("--num-prompts", type=int, default=4, help="per workload")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--weights", default=None, help="passed to the engine when given")
    args = parser.parse_args()
    base = dict(model="smollm2-135m-instruct", dtype="float32", threads=args.threads)
    base.update(num_kv_blocks=600, spec_profile_seconds=0)
    if args.weights:
        base["weights"] = args.weights
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    results, batch = {}, None
    for name in args.configs.split(","):
        start = time.perf_counter()
        llm = LLM(config=EngineConfig.from_flat({**base, **CONFIGS[name]}))
        batch = batch or prompts(llm, args.num_prompts)
        outputs = llm.generate(batch, params, use_tqdm=False)
        results[name] = [o.output_token_ids for o in outputs]
        print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
        del llm
    Path(args.out).write_text(json.dumps(results))
    if args.compare is None:
        return 0
    before = json.loads(Path(args.compare).read_text())
    differ = [
        (name, i)
        for name, runs in results.items()
        for i, tokens in enumerate(runs)
        if before.get(name, [None] * len(runs))[i] != tokens
    ]
    same = sum(len(runs) for runs in results.values()) - len(differ)
    print(f"identical: {same}; different: {differ or 'none'}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
