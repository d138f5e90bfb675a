"""Serving benchmark: Poisson arrivals of streamed requests against a running server.

    python benchmarks/serve.py --base-url http://127.0.0.1:8000 --request-rate 2 \\
        --dataset ../shared/data/workload_chat.jsonl --num-prompts 40 --output out.json

Metrics follow vLLM's serving benchmark: TTFT (request sent -> first content), TPOT
((e2e - TTFT) / (output tokens - 1), requests with > 1 token), ITL (gaps between content
chunks; a speculative step can put several tokens in one chunk), e2e latency, request and
token throughput over the benchmark's wall time. Output tokens come from the server's usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "workload_chat.jsonl"
PERCENTILES = (50, 90, 95, 99)


@dataclass
class Result:
    ok: bool = False
    error: str = ""
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    ttft: float = 0.0  # seconds
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)


def load_prompts(paths: list[str]) -> list[str]:
    prompts = []
    for path in paths:
        with open(path) as lines:
            prompts += [json.loads(line)["prompt"] for line in lines if line.strip()]
    if not prompts:
        sys.exit(f"no prompts in {paths}")
    return prompts


def request_body(args: argparse.Namespace, model: str, prompt: str) -> dict:
    body = {
        "model": model,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": args.ignore_eos,
    }
    if args.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def content_of(chunk: dict) -> str:
    choice = chunk["choices"][0]
    if "delta" in choice:
        return choice["delta"].get("content") or ""
    return choice.get("text") or ""


async def send(client: httpx.AsyncClient, path: str, body: dict) -> Result:
    result = Result()
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    return result
                if chunk.get("usage"):
                    result.num_prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.num_output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk["choices"] or not content_of(chunk):
                    continue
                now = time.perf_counter()
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
        result.e2e = time.perf_counter() - start
        result.ok = True
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run(args: argparse.Namespace) -> dict:
    prompts = load_prompts(args.dataset)
    rng = random.Random(args.seed)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.max_concurrency or 1000)
    timeout = httpx.Timeout(args.timeout)
    async with httpx.AsyncClient(
        base_url=args.base_url, headers=headers, limits=limits, timeout=timeout
    ) as client:
        model = args.model or (await client.get("/v1/models")).json()["data"][0]["id"]
        path = "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions"
        gate = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

        async def one(prompt: str) -> Result:
            if gate is None:
                return await send(client, path, request_body(args, model, prompt))
            async with gate:
                return await send(client, path, request_body(args, model, prompt))

        tasks = []
        start = time.perf_counter()
        for i in arrival_indices(args, len(prompts), start):
            tasks.append(asyncio.create_task(one(prompts[i % len(prompts)])))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return summarize(args, model, results, duration)


def arrival_indices(args: argparse.Namespace, num_prompts: int, start: float):
    """Prompt indices in arrival order: a fixed count, or as many as fit in --duration."""
    count = args.num_prompts if args.num_prompts is not None else num_prompts
    i = 0
    while True:
        if args.duration is not None:
            if time.perf_counter() - start >= args.duration:
                return
        elif i >= count:
            return
        yield i
        i += 1


def stats_ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, **{f"p{p}": 0.0 for p in PERCENTILES}}
    array = np.asarray(values) * 1000.0
    return {"mean": float(array.mean())} | {
        f"p{p}": float(np.percentile(array, p)) for p in PERCENTILES
    }


def summarize(args: argparse.Namespace, model: str, results: list[Result], duration: float) -> dict:
    done = [r for r in results if r.ok]
    num_input = sum(r.num_prompt_tokens for r in done)
    num_output = sum(r.num_output_tokens for r in done)
    tpots = [(r.e2e - r.ttft) / (r.num_output_tokens - 1) for r in done if r.num_output_tokens > 1]
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
        "config": {k: v for k, v in vars(args).items() if k != "api_key"},
        "model": model,
        "num_requests": len(results),
        "num_completed": len(done),
        "num_failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:10],
        "duration_s": duration,
        "total_input_tokens": num_input,
        "total_output_tokens": num_output,
        "request_throughput": len(done) / duration,
        "output_throughput": num_output / duration,
        "total_token_throughput": (num_input + num_output) / duration,
        "ttft_ms": stats_ms([r.ttft for r in done]),
        "tpot_ms": stats_ms(tpots),
        "itl_ms": stats_ms([gap for r in done for gap in r.itls]),
        "e2el_ms": stats_ms([r.e2e for r in done]),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    parser.add_argument("--dataset", nargs="+", default=[str(DEFAULT_DATA)], help="JSONL files")
    parser.add_argument("--model", default=None, help="default: the server's first model")
    parser.add_argument("--num-prompts", type=int, default=None, help="default: the dataset size")
    parser.add_argument("--duration", type=float, default=None, help="seconds; wins over count")
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="req/s; inf")
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--output", default=None, help="also write the JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(run(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0 if report["num_completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
