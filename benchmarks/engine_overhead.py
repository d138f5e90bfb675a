"""The engine's own work per step: everything LLMEngine.step() does outside the model.

The model runner's `execute` is replaced by a stand-in that returns a valid ModelOutput at once:
one token per request that samples (no drafts accepted), cycling through the token ids of a
fixed text, so the detokenizer sees real text and never EOS. What is timed is then scheduling,
speculation bookkeeping, output processing (detokenization, stop checks, RequestOutputs) and,
in `stream` mode, what the server's engine thread adds after each step (EngineStats and the
Prometheus stat logger, engine/front/engine_worker.py). `generate` mode times LLM.generate.

Per batch size B: B requests decode together (ignore_eos, long max_tokens); after --warmup
steps, --steps steps are timed. Host ms = step minus the stand-in's own time; the phases are
timed by wrapping the engine's parts (output = what step() does besides them).

    .venv/bin/python benchmarks/engine_overhead.py --batch 1 8 32 64 --rounds 3
    .venv/bin/python benchmarks/engine_overhead.py --batch 64 --profile
    .venv/bin/python benchmarks/engine_overhead.py --batch 64 --pack   # + the runner's packing
    .venv/bin/python benchmarks/engine_overhead.py --batch 64 --verify # + packing, verification
    .venv/bin/python benchmarks/engine_overhead.py --speculative-proposer ngram --spec-policy goodput

The engine's start-up heap is frozen as the server's is (engine/front/heap.py; --no-freeze
leaves it to the collector's full passes); gc and gc_full are the collector's ms a step.

Runs against whichever `engine` package is imported (PYTHONPATH picks a checkout), so two
checkouts can be compared with the same script (one from before engine/front/heap.py runs
its own copy).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import statistics
import time
from collections.abc import Callable

import torch

from engine.config import EngineConfig
from engine.front.heap import CollectorPauses, collection_paused_then_frozen
from engine.front.llm import LLM
from engine.outputs import ModelOutput, RequestStepOutput
from engine.runner.input_batch import build_model_input
from engine.sampling_params import SamplingParams

TEXT = (
    "The engine runs one step at a time: it plans speculation, schedules the running requests "
    "within the token budget, runs the model once and appends the verified tokens. Naïve "
    "façades, café crème, 東京 and emoji 🚀 make byte-level tokens split characters. "
    'Then it turns every change into an output: {"text": "delta", "finished": false}.\n'
)
PROMPT_TOKENS = 64
PHASES = ("plan", "schedule", "propose", "execute", "update", "observe")


class StandInModel:
    """Returns each sampling request's next token from a fixed cycle, without a model.

    With `block_size`, it also packs the step's inputs as the model runner would
    (engine/runner/input_batch.py: host tensors), timed apart in `pack_seconds`: the runner's own
    per-step host work, which `execute` includes on a real device. With `runner` as well, the
    runner's host work after the model runs too, timed apart in `verify_seconds`: verification
    (engine/sample/batch_verify.py) of logits whose argmax is the cycle's token, and the step's
    RequestStepOutputs. The logits' filling and the targets' reduction (device work on a GPU,
    `Sampler.targets` or `Sampler.greedy_targets`) are the stand-in's own time.
    """

    def __init__(self, token_ids: list[int], block_size: int | None = None, runner=None) -> None:
        self.token_ids = token_ids
        self.block_size = block_size
        self.runner = runner
        self.seconds = 0.0  # its own time, subtracted from the step
        self.pack_seconds = 0.0
        self.verify_seconds = 0.0
        self._device_seconds = 0.0
        self._depth = 0
        if runner is not None:
            sampler = runner.verifier.sampler
            for name in ("targets", "greedy_targets"):  # either one is the step's reduction
                setattr(sampler, name, self._device_part(getattr(sampler, name)))

    def _device_part(self, method):
        def timed(*args):
            self._depth += 1
            start = time.perf_counter()
            try:
                return method(*args)
            finally:
                self._depth -= 1
                if self._depth == 0:  # targets() may call greedy_targets(): count it once
                    self._device_seconds += time.perf_counter() - start

        return timed

    def execute(self, sched, drafts) -> ModelOutput:
        start = time.perf_counter()
        if self.block_size is not None:
            model_input = build_model_input(sched, drafts, self.block_size)
            self.pack_seconds += time.perf_counter() - start
            if self.runner is not None:
                return self._verify(model_input, start)
        ids, size = self.token_ids, len(self.token_ids)
        outputs = {}
        for index, scheduled in enumerate(sched.scheduled):
            if not scheduled.needs_sample:
                continue
            request = scheduled.request
            token = ids[(request.num_output_tokens + 7 * index) % size]
            num_drafts = drafts.num_draft_tokens(request.request_id)
            outputs[request.request_id] = RequestStepOutput(
                request.request_id, (token,), num_draft_tokens=num_drafts
            )
        elapsed = time.perf_counter() - start
        self.seconds += elapsed
        return ModelOutput(outputs=outputs, step_time=elapsed)

    def _verify(self, model_input, start: float) -> ModelOutput:
        """The runner's host work after its model, on logits pointing at the cycle's tokens."""
        ids, size = self.token_ids, len(self.token_ids)
        vocab = self.runner.arch.vocab_size
        num_rows = len(model_input.logits_indices)
        logits = torch.zeros(num_rows, vocab)
        for index, rows in enumerate(model_input.requests):
            token = ids[(rows.request.num_output_tokens + 7 * index) % size]
            logits[list(rows.logit_rows), token] = 1.0
        filled = time.perf_counter()
        self._device_seconds = 0.0
        verified = self.runner.verifier.verify(model_input.requests, logits)
        outputs = self.runner._outputs(model_input, logits, verified)
        end = time.perf_counter()
        self.verify_seconds += end - filled - self._device_seconds
        self.seconds += end - start
        return ModelOutput(outputs=outputs, step_time=end - start)


class PhaseTimer:
    """Wraps the engine's parts so each call adds its seconds to `totals[phase]`."""

    def __init__(self, engine) -> None:
        self.totals = dict.fromkeys(PHASES, 0.0)
        parts = {
            "plan": engine.spec,
            "schedule": engine.scheduler,
            "propose": engine.spec,
            "execute": engine.runner,
            "update": engine.scheduler,
            "observe": engine.spec,
        }
        for phase, owner in parts.items():
            self._wrap(owner, phase)

    def _wrap(self, owner: object, phase: str) -> None:
        method = getattr(owner, phase)
        totals = self.totals

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                totals[phase] += time.perf_counter() - start

        setattr(owner, phase, timed)

    def reset(self) -> None:
        for phase in self.totals:
            self.totals[phase] = 0.0


def build_llm(args) -> tuple[LLM, StandInModel]:
    max_len = PROMPT_TOKENS + args.warmup + args.steps + 8
    blocks = max(args.batch) * (max_len // 16 + 2) + 16
    flat = dict(
        model=args.model,
        num_kv_blocks=blocks,
        block_size=args.block_size,
        max_num_seqs=max(args.batch),
        max_num_batched_tokens=max(512, max(args.batch) * PROMPT_TOKENS),
        threads=1,
        speculative_proposer=args.speculative_proposer,
        spec_policy=args.spec_policy,
        spec_profile_seconds=0.0,
    )
    llm = LLM(config=EngineConfig.from_flat(flat))
    eos = set(llm.engine.eos_token_ids)
    token_ids = [t for t in llm.tokenizer.encode(TEXT) if t not in eos]
    runner = llm.engine.runner if args.verify else None
    stand_in = StandInModel(
        token_ids, args.block_size if args.pack or args.verify else None, runner
    )
    llm.engine.runner.execute = stand_in.execute
    return llm, stand_in


def prompt(token_ids: list[int], index: int) -> list[int]:
    """A distinct PROMPT_TOKENS-long prompt per request (no shared prefix)."""
    rotated = token_ids[index % len(token_ids) :] + token_ids
    return [index % 200 + 300, *(rotated * 4)[: PROMPT_TOKENS - 1]]


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


def run_stream(llm: LLM, stand_in: StandInModel, timer: PhaseTimer, batch: int, args) -> dict:
    """Steps as the server's engine thread does, with its stats and metrics per step."""
    from server.metrics import EngineMetrics

    engine = llm.engine
    metrics = EngineMetrics(engine.model_name)
    max_tokens = args.warmup + args.steps + 4
    ids = [f"b{batch}-{i}-{time.monotonic_ns()}" for i in range(batch)]
    for i, request_id in enumerate(ids):
        engine.add_request(request_id, prompt(stand_in.token_ids, i), params(max_tokens))

    def step() -> tuple[float, float]:
        start = time.perf_counter()
        outputs = engine.step()
        middle = time.perf_counter()
        metrics.on_step(engine.stats(), outputs, time.monotonic())
        return middle - start, time.perf_counter() - middle

    for _ in range(args.warmup):
        step()
    timer.reset()
    stand_in.seconds = stand_in.pack_seconds = stand_in.verify_seconds = 0.0
    step_seconds, worker_seconds = 0.0, 0.0
    with CollectorPauses() as pauses:
        for _ in range(args.steps):
            engine_s, worker_s = step()
            step_seconds += engine_s
            worker_seconds += worker_s
    for request_id in ids:
        engine.abort_request(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    return summary(timer, stand_in, step_seconds, args.steps, worker_seconds, pauses)


def run_generate(llm: LLM, stand_in: StandInModel, timer: PhaseTimer, batch: int, args) -> dict:
    """LLM.generate over `batch` prompts, every step timed (prefill included)."""
    engine = llm.engine
    counter = {"steps": 0}
    step = engine.step

    def counted():
        counter["steps"] += 1
        return step()

    engine.step = counted
    prompts = [prompt(stand_in.token_ids, i) for i in range(batch)]
    timer.reset()
    stand_in.seconds = stand_in.pack_seconds = stand_in.verify_seconds = 0.0
    start = time.perf_counter()
    with CollectorPauses() as pauses:
        outputs = llm.generate(prompts, params(args.steps), use_tqdm=False)
    elapsed = time.perf_counter() - start
    if not all(len(o.output_token_ids) == args.steps and o.text for o in outputs):
        raise RuntimeError("the stand-in did not generate --steps tokens of text per request")
    del engine.step
    return summary(timer, stand_in, elapsed, counter["steps"], 0.0, pauses)


def summary(timer: PhaseTimer, stand_in, seconds: float, steps: int, worker: float, pauses) -> dict:
    """ms a step per phase; gc: the collector's passes inside the host time, gc_full: the
    full ones among them."""
    per_step = {phase: 1e3 * value / steps for phase, value in timer.totals.items()}
    per_step["execute"] = 1e3 * (timer.totals["execute"] - stand_in.seconds) / steps
    step_ms = 1e3 * (seconds - stand_in.seconds) / steps
    per_step["output"] = step_ms - sum(per_step[p] for p in PHASES)
    per_step["worker"] = 1e3 * worker / steps
    per_step["host"] = step_ms + per_step["worker"]
    per_step["pack"] = 1e3 * stand_in.pack_seconds / steps
    per_step["verify"] = 1e3 * stand_in.verify_seconds / steps
    per_step["gc"] = 1e3 * pauses.seconds / steps
    per_step["gc_full"] = 1e3 * pauses.full_seconds / steps
    return per_step


def profile(run: Callable[[], dict], top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    print(stream.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=("stream", "generate", "both"), default="both")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--speculative-proposer", default=None)
    parser.add_argument("--spec-policy", default=None)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--pack", action="store_true", help="also time the runner's input packing (apart)"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="also time the runner's verification and step outputs (apart; implies --pack)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the largest batch")
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="leave the start-up heap to the collector's full passes (the server freezes it)",
    )
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    with contextlib.nullcontext() if args.no_freeze else collection_paused_then_frozen():
        llm, stand_in = build_llm(args)
    timer = PhaseTimer(llm.engine)
    modes = ("stream", "generate") if args.mode == "both" else (args.mode,)
    runners = {"stream": run_stream, "generate": run_generate}
    if args.profile:
        batch = max(args.batch)
        profile(lambda: runners[modes[0]](llm, stand_in, timer, batch, args), args.top)
        return
    import engine

    print(json.dumps({"engine": engine.__file__, "args": vars(args)}))
    for mode in modes:
        for batch in args.batch:
            rounds = [runners[mode](llm, stand_in, timer, batch, args) for _ in range(args.rounds)]
            median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
            print(
                json.dumps(
                    {"mode": mode, "batch": batch, **{k: round(v, 3) for k, v in median.items()}}
                )
            )


if __name__ == "__main__":
    main()
