"""What a speculating step costs against a plain one, by phase, at fixed concurrency.

The policy sweep (engine_sweep.py) gives one latency per cell, and on a GPU goodput lost
~10% to no speculation on chat at every load while batch-1 spec_bench runs gained 4%. This
asks why: --concurrency requests of a workload (chat-templated, greedy, EOS ignored) run
together to completion under each policy (n-gram drafts, up to --k), the policies taking turns
--rounds times; every step's phases (LLMEngine.step's six, timed by wrappers) and its shape
are recorded. Per policy and concurrency: decode tokens a second (over steps without a
prefill chunk), tokens a step, drafted and accepted, the steps that rested (no offers, no plan:
engine/speculation/control/rest.py), ms a step per phase, for the steps that
verified drafts and for those that did not apart, and the garbage collector's passes (the
engines' start-up heap is frozen first, as the server's is: engine/front/heap.py). It replaces
benchmarks/step_phases.py, which timed the same phases averaged over one policy's run.

--one-engine builds one engine and swaps its speculation driver per policy (one copy of the
weights and the KV cache): engines built apart differed by build order by ~2-3% at 16 requests.
Which policy runs first in a round still moves the ratio by a few percent (docs/benchmarks.md
§5zc): run both orders.

    python benchmarks/spec_step_costs.py --model M.gguf --device cuda --dtype bfloat16 \\
        --concurrency 1 4 16 --out /tmp/costs.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.engine_sweep import WORKLOADS  # noqa: E402
from engine.config import EngineConfig, SpecConfig  # noqa: E402
from engine.front.heap import CollectorPauses, collection_paused_then_frozen  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.runner.step_timer import StepTimer  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.speculation.build import build_spec_driver  # noqa: E402
from engine.speculation.driver import SpecDriver  # noqa: E402

PHASES = ("plan", "schedule", "propose", "execute", "update", "observe", "collect")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--policies", default="off,goodput,fixed:1,fixed:3")
    parser.add_argument("--workload", default="chat", choices=sorted(WORKLOADS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4, help="most drafts per step")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (engine default)")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument(
        "--one-engine",
        action="store_true",
        help="one engine (one copy of the weights and KV cache), its speculation driver swapped "
        "per policy: engines built apart differ by a few percent by build order",
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON; a .md is written beside")
    return parser.parse_args(argv)


class StepRecorder:
    """Wraps an engine's step phases; one record per step that ran the model."""

    def __init__(self, engine: LLMEngine, drivers: Sequence[SpecDriver] = ()) -> None:
        """drivers: every speculation driver the engine may be given (default: its own)."""
        self.records: list[dict] = []
        self._current: dict = defaultdict(float)
        for driver in drivers or (engine.spec,):
            for name in ("plan", "propose", "observe"):
                self._wrap(driver, name, name)
        owners = (engine.scheduler, engine, engine.scheduler, engine)
        names = ("schedule", "_execute", "update", "_collect")
        for owner, name, phase in zip(owners, names, ("schedule", "execute", "update", "collect")):
            self._wrap(owner, name, phase)
        self._wrap_step(engine)

    def _wrap(self, owner: object, name: str, phase: str) -> None:
        method = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            result = method(*args, **kwargs)
            self._current[phase] += time.perf_counter() - start
            if phase == "execute":
                self._shape(*args, result)
            return result

        setattr(owner, name, timed)

    def _shape(self, sched, drafts, out) -> None:
        outputs = out.outputs.values()
        self._current["requests"] = len(sched.scheduled)
        self._current["prefill"] = any(
            s.num_new_tokens - s.num_draft_tokens > 1 for s in sched.scheduled
        )
        self._current["drafted"] = sum(o.num_draft_tokens for o in outputs)
        self._current["accepted"] = sum(o.num_accepted_tokens for o in outputs)
        self._current["emitted"] = sum(len(o.token_ids) for o in outputs)

    def _wrap_step(self, engine: LLMEngine) -> None:
        step = engine.step

        def recorded():
            self._current = defaultdict(float)
            start = time.perf_counter()
            result = step()
            self._current["step"] = time.perf_counter() - start
            self._current["rested"] = engine.spec.rested  # no offers, no plan (rest.py)
            if self._current.get("requests"):
                self.records.append(dict(self._current))
            return result

        engine.step = recorded


def make_engine(policy: str, args: argparse.Namespace) -> LLMEngine:
    flat = dict(model=args.model, device=args.device, dtype=args.dtype)
    flat.update(enable_prefix_caching=False, max_num_seqs=max(args.concurrency))
    if args.threads is not None:
        flat.update(threads=args.threads)
    if policy != "off":
        flat.update(speculative_proposer="ngram", spec_policy=policy)
        flat.update(num_speculative_tokens=args.k)
    return LLMEngine.from_config(EngineConfig.from_flat(flat))


class SharedEngine:
    """One engine for every policy: a speculation driver per policy built on its runner (`off`:
    no proposer, as an engine built with --spec-policy off has), swapped in before each run."""

    def __init__(self, policies: Sequence[str], args: argparse.Namespace) -> None:
        speculating = next((p for p in policies if p != "off"), "off")
        self.engine = make_engine(speculating, args)
        specs = {policy: _spec_config(self.engine.config.spec, policy) for policy in policies}
        self.drivers = drivers_on(self.engine, speculating, specs)
        self.recorder = StepRecorder(self.engine, list(self.drivers.values()))

    def use(self, policy: str) -> tuple[LLMEngine, StepRecorder]:
        self.engine.spec = self.drivers[policy]
        return self.engine, self.recorder


def drivers_on(engine: LLMEngine, own: str, specs: dict[str, SpecConfig]) -> dict[str, SpecDriver]:
    """A speculation driver per name on `engine`'s runner, to swap in as `engine.spec`: the
    engine's own under `own`, one built from its SpecConfig for each other name (a goodput
    one seeded by its own start-up profile, timed on the engine's runner)."""
    config = engine.config
    timer = StepTimer(engine.runner, engine.scheduler.block_manager, seed=config.model.seed)
    drivers = {own: engine.spec}
    for name, spec in specs.items():
        if name not in drivers:
            drivers[name] = build_spec_driver(spec, engine.runner, config.scheduler, timer)
    return drivers


def _spec_config(spec: SpecConfig, policy: str) -> SpecConfig:
    if policy == "off":
        return dataclasses.replace(spec, proposer="none", spec_policy="off")
    return dataclasses.replace(spec, spec_policy=policy)


def load_prompts(engine: LLMEngine, args: argparse.Namespace) -> list[list[int]]:
    path = Path(args.data) / WORKLOADS[args.workload]
    texts = [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
    chat = engine.tokenizer.apply_chat_template
    return [chat([{"role": "user", "content": text}]) for text in texts]


def run(engine: LLMEngine, recorder: StepRecorder, prompts: list[list[int]], n: int, args) -> list:
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    for i in range(n):
        engine.add_request(f"c{n}-{i}-{time.monotonic_ns()}", prompts[i % len(prompts)], params)
    first = len(recorder.records)
    while engine.has_unfinished_requests():
        engine.step()
    return recorder.records[first:]


def summarize(records: list[dict]) -> dict:
    decode = [r for r in records if not r["prefill"]]
    seconds = sum(r["step"] for r in decode)
    emitted = sum(r["emitted"] for r in decode)
    summary = dict(steps=len(records), decode_steps=len(decode))
    summary.update(decode_tok_s=round(emitted / seconds, 1) if seconds else None)
    summary.update(tokens_per_step=round(emitted / max(1, len(decode)), 3))
    summary.update(drafted=sum(r["drafted"] for r in records))
    summary.update(accepted=sum(r["accepted"] for r in records))
    summary.update(rested=sum(bool(r["rested"]) for r in records))
    for label, group in (
        ("verify", [r for r in decode if r["drafted"]]),
        ("plain", [r for r in decode if not r["drafted"]]),
    ):
        summary[f"{label}_steps"] = len(group)
        if group:
            summary[f"{label}_ms"] = {
                phase: round(1e3 * statistics.fmean(r.get(phase, 0.0) for r in group), 3)
                for phase in (*PHASES, "step")
            }
            summary[f"{label}_rows"] = round(statistics.fmean(r["requests"] for r in group), 2)
    return summary


def markdown(cells: list[dict]) -> str:
    lines = [
        "| n | policy | decode tok/s | tok/step | drafted / accepted | verify steps: "
        "step (plan, propose, execute) ms | plain steps: step (plan, execute) ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        v, p = c.get("verify_ms"), c.get("plain_ms")
        vs = (
            f"{c['verify_steps']}: {v['step']} ({v['plan']}, {v['propose']}, {v['execute']})"
            if v
            else "-"
        )
        ps = f"{c['plain_steps']}: {p['step']} ({p['plan']}, {p['execute']})" if p else "-"
        lines.append(
            f"| {c['concurrency']} | {c['policy']} (r{c['round']}) | {c['decode_tok_s']} "
            f"| {c['tokens_per_step']} | {c['drafted']} / {c['accepted']} | {vs} | {ps} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    policies = args.policies.split(",")
    with collection_paused_then_frozen():  # as the server's start-up heap is
        use = _engines(policies, args)
    prompts = load_prompts(use(policies[0])[0], args)
    for policy in policies:  # warm-up: graphs, caches, the controller's first fit
        run(*use(policy), prompts, max(args.concurrency), args)
    cells = []
    for round_ in range(args.rounds):
        for n in args.concurrency:
            for policy in policies:
                with CollectorPauses() as pauses:
                    records = run(*use(policy), prompts, n, args)
                cell = dict(concurrency=n, policy=policy, round=round_, **summarize(records))
                cells.append(cell | pauses.as_dict())
                print(json.dumps(cells[-1]), flush=True)
    meta = dict(date=str(date.today()), args={k: str(v) for k, v in vars(args).items()})
    args.out.write_text(json.dumps(dict(meta=meta, cells=cells), indent=1))
    args.out.with_suffix(".md").write_text(markdown(cells))
    print(markdown(cells))


def _engines(
    policies: Sequence[str], args: argparse.Namespace
) -> Callable[[str], tuple[LLMEngine, StepRecorder]]:
    """policy -> (its engine, its recorder): one engine per policy, or with --one-engine one
    engine whose driver is swapped."""
    if args.one_engine:
        return SharedEngine(policies, args).use
    engines = {policy: make_engine(policy, args) for policy in policies}
    recorders = {policy: StepRecorder(engine) for policy, engine in engines.items()}
    return lambda policy: (engines[policy], recorders[policy])


if __name__ == "__main__":
    main()
