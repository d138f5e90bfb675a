"""Per proposer: realised draft acceptance against what the distributions allow.

Each proposer drafts one token per step (fixed:1 chains, batch 1), so every verified draft is
one trial and realised acceptance = accepted / drafted exactly. At each trial the report takes
the target's processed distribution p at the drafted position (the verifier's own row) and
 - for the draft model, its distribution q there (the proposer's own row): 1 - TV(p, q), the
   acceptance of the optimal coupling (Leviathan et al.'s rejection rule), and the
   exponential race's guarantee (1 - TV) / (1 + TV) (Daliri, Musco & Suresh 2025);
 - for a model-free proposer, p(x) of its draft x: the acceptance of a point-mass draft.
Their means over the trials are set against the realised acceptance, with a 90% interval of
that ratio from resampling whole prompts (a prompt's trials are not independent of each other).
Defaults: the Qwen pair (benchmarks/models/qwen_pair.sh), open-ended chat prompts at T = 1.0.

    .venv/bin/python benchmarks/acceptance_report.py --num-prompts 3 --max-tokens 48
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.models.qwen_pair import FETCH_HINT, pair_paths  # noqa: E402
from benchmarks.report import bootstrap_interval, load_average, machine_description  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.front.llm import LLM  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


class Trials:
    """Hooks the verifier and the draft model's sampler of one engine; one record per draft."""

    def __init__(self, llm: LLM, draft_model: bool) -> None:
        self.records: list[dict] = []
        self.prompt = 0  # the prompt being generated, written on each record
        self._q: torch.Tensor | None = None
        self._p: torch.Tensor | None = None
        verifier = llm.engine.runner.verifier
        self._hook_process(verifier.sampler, "_p")
        if draft_model:
            self._hook_process(llm.engine.spec.proposer.sampler, "_q")
        verify = verifier.verify

        def recording_verify(requests, logits, *args, **kwargs):
            results = verify(requests, logits, *args, **kwargs)
            for rows in requests:
                if rows.draft_token_ids and rows.request.request_id in results:
                    self._record(rows.draft_token_ids[0], results[rows.request.request_id])
            return results

        verifier.verify = recording_verify

    def _hook_process(self, sampler, slot: str) -> None:
        process = sampler.process

        def recording_process(logits, rows, bitmask=None):
            probs = process(logits, rows, bitmask)
            setattr(self, slot, probs[0].double().cpu())  # batch 1: the request's first row
            return probs

        sampler.process = recording_process

    def _record(self, draft: int, verified) -> None:
        p, record = self._p, {"accepted": verified.num_accepted_tokens > 0, "prompt": self.prompt}
        record["p_of_draft"] = float(p[draft])
        if self._q is not None:
            tv = 0.5 * float((p - self._q).abs().sum())
            record.update(one_minus_tv=1.0 - tv, race_bound=(1.0 - tv) / (1.0 + tv))
        self.records.append(record)


def prompts_of(llm: LLM, path: Path, count: int) -> list[list[int]]:
    lines = [line for line in path.read_text().splitlines() if line.strip()][:count]
    return [
        llm.tokenizer.apply_chat_template([{"role": "user", "content": json.loads(line)["prompt"]}])
        for line in lines
    ]


def run(args: argparse.Namespace, proposer: str) -> dict:
    flat = dict(model=args.target, weights="gguf", dtype="float32", threads=args.threads)
    flat.update(num_kv_blocks=128, speculative_proposer=proposer, spec_policy="fixed:1")
    flat.update(num_speculative_tokens=1)
    if proposer == "draft":
        flat.update(draft_model=args.draft)
    llm = LLM(config=EngineConfig.from_flat(flat))
    trials = Trials(llm, proposer == "draft")
    params = [
        SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=i)
        for i in range(args.num_prompts)
    ]
    for i, (prompt, param) in enumerate(
        zip(prompts_of(llm, args.workload, args.num_prompts), params)
    ):
        trials.prompt = i
        llm.generate(prompt, param, use_tqdm=False)
    records = trials.records
    row = {"proposer": proposer, "trials": len(records)}
    row["realised"] = statistics.fmean(r["accepted"] for r in records)
    key = "one_minus_tv" if proposer == "draft" else "p_of_draft"
    row["expected"] = statistics.fmean(r[key] for r in records)
    if proposer == "draft":
        row["race_bound"] = statistics.fmean(r["race_bound"] for r in records)
    row["ratio"] = row["realised"] / row["expected"] if row["expected"] > 0 else None
    row["interval"] = ratio_interval(records, key)
    return row


def ratio_interval(
    records: list[dict], key: str, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """5th and 95th percentiles of realised / expected over prompt-level bootstrap resamples:
    whole prompts drawn with replacement, every trial of a drawn prompt kept. None with fewer
    than two prompts."""
    by_prompt: dict[int, list[tuple[float, float]]] = {}
    for r in records:
        by_prompt.setdefault(r["prompt"], []).append((float(r["accepted"]), r[key]))
    sums = [(sum(a for a, _ in t), sum(e for _, e in t)) for t in by_prompt.values()]

    def realised_over_expected(drawn: list[tuple[float, float]]) -> float | None:
        expected = sum(e for _, e in drawn)
        return sum(a for a, _ in drawn) / expected if expected > 0 else None

    return bootstrap_interval(sums, realised_over_expected, resamples, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proposers", nargs="+", default=["draft", "ngram"])
    parser.add_argument("--num-prompts", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workload", type=Path, default=DATA / "workload_chat.jsonl")
    args = parser.parse_args()
    paths = pair_paths()
    if paths is None:
        parser.error(f"the Qwen pair is missing: {FETCH_HINT}")
    args.target, args.draft = str(paths[0]), str(paths[1])
    torch.set_num_threads(args.threads)
    print(f"{machine_description()}; T = {args.temperature}, {args.num_prompts} prompt(s) of "
          f"{args.workload.name}, {args.max_tokens} new tokens, one draft per step")  # fmt: skip
    for proposer in args.proposers:
        row = run(args, proposer)
        bound = f"  race bound {row['race_bound']:.3f}" if "race_bound" in row else ""
        if row["interval"] is not None:
            bound += f"  ratio 90% interval {row['interval'][0]:.2f}-{row['interval'][1]:.2f} (prompts resampled)"
        expected = "E[1 - TV]" if proposer == "draft" else "E[p(draft)]"
        print(
            f"{proposer:8s} trials {row['trials']:4d}  realised {row['realised']:.3f}  "
            f"{expected} {row['expected']:.3f}  ratio {row['ratio']:.2f}{bound}",
            flush=True,
        )
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
