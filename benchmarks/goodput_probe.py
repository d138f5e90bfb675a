"""Why goodput speculates as it does on a machine: its cost model's view against measured steps.

Builds one goodput engine (n-gram, up to --k drafts), prints the start-up fit's coefficients and
its predicted step time for uniform batches (b requests x k drafts each), then runs chat and
copy prompts alone and as one batch, logging every step: its features, the measured seconds,
the seconds predicted for it just before, and the drafts planned. Summaries group steps by
(batch size, drafts in the step > 0): mean measured vs predicted. Written to --out as JSON.
With --phases each step also carries the runner's phases (benchmarks/runner_phases.py, synced
on a GPU) and the summary the drafting steps' phases at the largest batch, first of their
token count against repeats, with the slowest steps.

    python benchmarks/goodput_probe.py --model M.gguf --device cuda --dtype bfloat16 --out p.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.runner_phases import RunnerPhases, phase_summary  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.front.llm import LLM  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.speculation.control.step_features import StepFeatures  # noqa: E402

WORKLOADS = {"copy": "workload_copy.jsonl", "chat": "workload_chat.jsonl"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--phases", action="store_true", help="time the runner's phases")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def prompts(llm: LLM, workload: str, count: int, data: str) -> list[list[int]]:
    lines = (Path(data) / WORKLOADS[workload]).read_text().splitlines()
    texts = [json.loads(line)["prompt"] for line in lines if line.strip()]
    chat = llm.tokenizer.apply_chat_template
    return [chat([{"role": "user", "content": texts[i % len(texts)]}]) for i in range(count)]


def predictions(driver, k_max: int) -> dict:
    """Predicted seconds of b requests x k drafts (context 600), as the search prices them."""
    table = {}
    for batch in (1, 4, 16, 64):
        base = StepFeatures.from_shapes([(600, 1, 0)] * batch, graphs=driver.graphs)
        row = {}
        for k in range(k_max + 1):
            features = base.with_drafts(batch * k, batch if k else 0, 0, driver.graphs)
            row[k] = driver.cost_model.predict(features)
        table[batch] = row
    return table


def record_steps(llm: LLM, phases: RunnerPhases | None = None) -> list[dict]:
    """Wrap the cost model's observe: every step's features, measured and predicted seconds
    (and with `phases` the runner's phases of the step)."""
    model, steps = llm.engine.spec.cost_model, []
    observe = model.observe

    def logged(features: StepFeatures, seconds: float) -> None:
        steps.append(
            dict(
                requests=features.num_requests,
                tokens=features.num_batched_tokens,
                drafts=features.num_draft_tokens,
                eager=features.num_eager_steps,
                measured=seconds,
                predicted=model.predict(features),
                **(phases.take() if phases is not None else {}),
            )
        )
        observe(features, seconds)

    model.observe = logged
    return steps


def summary(steps: list[dict]) -> list[dict]:
    groups = defaultdict(list)
    for step in steps:
        groups[(step["requests"], step["drafts"] > 0, step["eager"])].append(step)
    rows = []
    for (requests, drafted, eager), group in sorted(groups.items()):
        rows.append(
            dict(
                requests=requests,
                drafted=drafted,
                eager=eager,
                steps=len(group),
                mean_drafts=statistics.mean(s["drafts"] for s in group),
                measured_ms=1e3 * statistics.median(s["measured"] for s in group),
                predicted_ms=1e3 * statistics.median(s["predicted"] for s in group),
            )
        )
    return rows


def main() -> None:
    args = parse_args()
    flat = dict(model=args.model, device=args.device, dtype=args.dtype)
    flat.update(speculative_proposer="ngram", spec_policy="goodput", num_speculative_tokens=args.k)
    llm = LLM(config=EngineConfig.from_flat(flat))
    driver = llm.engine.spec
    result = dict(
        seed=str(driver.seed_report),
        coefficients=driver.cost_model.coefficients(),
        predicted_before=predictions(driver, args.k),
    )
    phases = RunnerPhases(llm.engine.runner).install() if args.phases else None
    steps = record_steps(llm, phases)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    for workload in ("chat", "copy"):
        batch = prompts(llm, workload, args.batch, args.data)
        for prompt in batch[:2]:
            llm.generate(prompt, params, use_tqdm=False)
        llm.generate(batch, params, use_tqdm=False)
        result[f"acceptance_after_{workload}"] = driver.policy.acceptance.prior()
    result.update(
        coefficients_after=driver.cost_model.coefficients(),
        predicted_after=predictions(driver, args.k),
        summary=summary(steps),
        phases=phase_summary(steps),
        steps=steps,
    )
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({key: result[key] for key in result if key != "steps"}, indent=1))


if __name__ == "__main__":
    main()
