"""Per-token cost of a streamed chat completion over HTTP vs the same request in-process.

One run, interleaved prompt by prompt so load drift hits both alike:
  http       `goodspeed serve` as benchmarks/vs_llamacpp.py starts gs-off (same GGUF, threads,
             --max-num-seqs 16, --spec-policy off); one streamed chat completion, greedy, EOS
             ignored; ms/token = (last content chunk - first) / (tokens - 1)
  inproc     an LLMEngine built from the same flags in this process, the same prompt token ids
             and params; the engine is stepped in a loop with nothing else running;
             ms/token = (last output - first output) / (tokens - 1)
  step       in-process: the median wall time of one `LLMEngine.step()` during decode
  srv-step   the server's own measured model step time (goodspeed:step_time_seconds, mean)
  base       with --baseline DIR: a second server run from another source tree (e.g.
             `git archive main | tar -x -C DIR`), taking turns with the first

    .venv/bin/python benchmarks/http_overhead.py --repeats 3 --num-prompts 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import load_average  # noqa: E402
from benchmarks.spec_sweep import free_port  # noqa: E402
from benchmarks.vs_llamacpp import load_prompts, model_path, stream_one, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SERVER_FLAGS = ["--max-num-seqs", "16", "--spec-policy", "off"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-inproc", action="store_true", help="only the server (profiling)")
    parser.add_argument("--baseline", default=None, help="source tree of a second server")
    return parser.parse_args()


@contextmanager
def server(command: list[str], root: Path, log: Path):
    """`command` run from `root` (also its PYTHONPATH) on a free port; yields its URL."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(root)}
    with open(log, "w") as out:
        process = subprocess.Popen(
            [*command, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, cwd=root, env=env
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, process, log)
            yield url
        finally:
            process.terminate()
            process.wait(30)


def build_engine(gguf: str, threads: int):
    from engine.arg_utils import add_engine_arguments, config_from_args
    from engine.llm_engine import LLMEngine

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    flags = ["--model", gguf, "--threads", str(threads), *SERVER_FLAGS]
    return LLMEngine.from_config(config_from_args(parser.parse_args(flags)))


def run_inproc(engine, prompt: str, max_tokens: int, tag: str) -> dict:
    from engine.sampling_params import SamplingParams

    messages = [{"role": "user", "content": prompt}]
    ids = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    engine.add_request(tag, ids, params)
    token_times, steps, tokens = [], [], 0
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        outputs = engine.step()
        end = time.perf_counter()
        steps.append(end - start)
        for output in outputs:
            if output.new_text:
                token_times.append(end)
            tokens = output.num_output_tokens
    return {
        "tokens": tokens,
        "ms_per_token": 1e3 * (token_times[-1] - token_times[0]) / max(1, tokens - 1),
        "step_ms": 1e3 * statistics.median(steps[1:]),  # decode steps (the first is prefill)
    }


def server_step_ms(url: str) -> tuple[float, int]:
    text = httpx.get(f"{url}/metrics").text
    values = {}
    for line in text.splitlines():
        for key in ("step_time_seconds_sum", "step_time_seconds_count"):
            if line.startswith(f"goodspeed:{key}"):
                values[key] = float(line.split()[-1])
    return values["step_time_seconds_sum"], int(values["step_time_seconds_count"])


async def run_http(url: str, prompt: str, max_tokens: int) -> dict:
    before = server_step_ms(url)
    async with httpx.AsyncClient(timeout=600) as client:
        run = await stream_one(client, url, prompt, max_tokens)
    after = server_step_ms(url)
    steps = after[1] - before[1]
    return {
        "tokens": run["tokens"],
        "ms_per_token": 1e3 * (run["last"] - run["first"]) / max(1, run["tokens"] - 1),
        "srv_step_ms": 1e3 * (after[0] - before[0]) / max(1, steps),
    }


def main() -> None:
    args = parse_args()
    gguf = model_path(args)
    command = [sys.executable, "-m", "goodspeed.cli", "serve", "--model", gguf]
    command += ["--threads", str(args.threads), "--host", "127.0.0.1", *SERVER_FLAGS]
    command += ["--log-level", "warning"]
    roots = {"http": ROOT}
    if args.baseline:
        roots["base"] = Path(args.baseline).resolve()
    engine = None if args.skip_inproc else build_engine(gguf, args.threads)
    prompts = load_prompts("workload_chat.jsonl", args.num_prompts)
    rows: dict[str, list[float]] = {}
    with ExitStack() as stack:
        urls = {
            name: stack.enter_context(server(command, root, Path(f"/tmp/http_overhead_{name}.log")))
            for name, root in roots.items()
        }
        for url in urls.values():
            asyncio.run(run_http(url, prompts[0], 8))  # warm-up
        if engine is not None:
            run_inproc(engine, prompts[0], 8, "warm")
        for repeat in range(args.repeats):
            for i, prompt in enumerate(prompts):
                line = []
                for name, url in urls.items():
                    http = asyncio.run(run_http(url, prompt, args.max_tokens))
                    rows.setdefault(name, []).append(http["ms_per_token"])
                    rows.setdefault(f"{name}_srv_step", []).append(http["srv_step_ms"])
                    line.append(
                        f"{name} {http['ms_per_token']:.2f} (step {http['srv_step_ms']:.2f})"
                    )
                if engine is not None:
                    local = run_inproc(engine, prompt, args.max_tokens, f"r{repeat}p{i}")
                    rows.setdefault("inproc", []).append(local["ms_per_token"])
                    rows.setdefault("step", []).append(local["step_ms"])
                    line.append(f"inproc {local['ms_per_token']:.2f} (step {local['step_ms']:.2f})")
                print("  ".join(line), flush=True)
    summary = {k: round(statistics.median(v), 2) for k, v in rows.items()}
    for name in urls:
        if engine is not None:
            ratios = [h / i for h, i in zip(rows[name], rows["inproc"], strict=True)]
            summary[f"{name}/inproc"] = round(statistics.median(ratios), 3)
    summary["load_average"] = load_average()
    summary["runs"] = len(rows["http"])
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
