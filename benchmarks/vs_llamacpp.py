"""goodspeed vs llama.cpp's own server on the same GGUF, same threads, same prompts, one run.

Servers (all started here, on 127.0.0.1, each with --threads / -t THREADS):
  gs-f32       goodspeed, no speculation, the GGUF dequantised to float32 (--weights float32)
  gs-off       goodspeed, no speculation, the GGUF's blocks on the native kernels (default)
  gs-goodput   goodspeed, n-gram speculation under the goodput policy
  gs-int8      gs-off with int8 activations (--weights gguf-int8, llama.cpp's arithmetic)
  gs-int8-goodput  gs-goodput with int8 activations
  llama        llama-server (../shared/tools/llama-server.sh builds it)
  llama-spec   llama-server with its own n-gram speculation (--spec-type, see --llama-spec)
Scenarios (streamed chat completions, greedy, EOS ignored, --max-tokens new tokens):
  chat-b1      open-ended prompts one at a time: decode tok/s = (tokens - 1) / (last chunk -
               first chunk), summed over prompts (prefill excluded)
  copy-b1      copy-heavy prompts one at a time, the same measure
  chat-c16     16 concurrent clients over the chat prompts: generated tokens / wall time
Servers take turns prompt by prompt (b1) or round by round (c16), so load drift hits them
alike. Writes JSON and a markdown section (benchmarks/report.py) with ratios to llama.cpp.

    .venv/bin/python benchmarks/vs_llamacpp.py --llama-server $(../shared/tools/llama-server.sh)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import load_average, machine_description, write_section  # noqa: E402
from benchmarks.spec_sweep import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
SECTION = "vs-llamacpp"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", required=True, help="path of the llama-server binary")
    parser.add_argument("--model", default=None, help="GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=6, help="per batch-1 scenario")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="c16 rounds per server")
    parser.add_argument("--llama-spec", default="--spec-type ngram-mod")
    parser.add_argument("--scenarios", default="chat-b1,copy-b1,chat-c16")
    parser.add_argument(
        "--servers", default=",".join(NAMES), help="comma list, a subset of " + ",".join(NAMES)
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench_vs_llamacpp.json"))
    parser.add_argument("--markdown", default=str(ROOT / "docs" / "benchmarks.md"))
    return parser.parse_args(argv)


def model_path(args: argparse.Namespace) -> str:
    if args.model:
        return args.model
    from engine.models.loader import resolve_model_path

    return str(resolve_model_path("smollm2-135m-instruct"))


def server_commands(args: argparse.Namespace, port: int) -> dict[str, list[str]]:
    gguf, threads = model_path(args), str(args.threads)
    python = str(Path(sys.executable))
    goodspeed = [python, "-m", "goodspeed.cli", "serve", "--model", gguf, "--threads", threads]
    goodspeed += ["--max-num-seqs", str(args.concurrency), "--host", "127.0.0.1"]
    llama = [args.llama_server, "-m", gguf, "-t", threads, "--host", "127.0.0.1"]
    llama += ["-np", str(args.concurrency), "-c", str(args.concurrency * 2048)]
    return {
        "gs-f32": goodspeed + ["--spec-policy", "off", "--weights", "float32"],
        "gs-off": goodspeed + ["--spec-policy", "off"],
        "gs-goodput": goodspeed + ["--speculative-proposer", "ngram", "--spec-policy", "goodput"],
        "gs-int8": goodspeed + ["--spec-policy", "off", "--weights", "gguf-int8"],
        "gs-int8-goodput": goodspeed
        + ["--speculative-proposer", "ngram", "--spec-policy", "goodput", "--weights", "gguf-int8"],
        "llama": llama,
        "llama-spec": llama + shlex.split(args.llama_spec),
    }


@contextmanager
def running(name: str, command: list[str], log_dir: Path):
    port = free_port()
    command = [*command, "--port", str(port)]
    log = open(log_dir / f"{name}.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log_dir / f"{name}.log")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def wait_ready(url: str, process: subprocess.Popen, log_path: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"server exited early; see {log_path}:\n{log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    sys.exit(f"server not ready after {timeout} s; see {log_path}")


def load_prompts(name: str, count: int) -> list[str]:
    lines = (DATA / name).read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines if line.strip()][:count]


async def stream_one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed chat completion: tokens (usage) and the times of its content chunks."""
    body = {
        "model": await model_id(client, url),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    times, tokens = [], 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                times.append(time.perf_counter())
    return {
        "tokens": tokens,
        "first": times[0] if times else 0.0,
        "last": times[-1] if times else 0.0,
    }


async def model_id(client: httpx.AsyncClient, url: str) -> str:
    response = await client.get(f"{url}/v1/models")
    return response.json()["data"][0]["id"]


async def batch1(urls: dict[str, str], prompts: list[str], max_tokens: int) -> dict:
    """Servers take turns prompt by prompt; decode tok/s summed over the prompts."""
    totals = {name: [0, 0.0] for name in urls}
    async with httpx.AsyncClient(timeout=600) as client:
        for prompt in prompts:
            for name, url in urls.items():
                run = await stream_one(client, url, prompt, max_tokens)
                totals[name][0] += max(0, run["tokens"] - 1)
                totals[name][1] += run["last"] - run["first"]
                print(f"  {name}: {run['tokens']} tokens", flush=True)
    return {
        name: tokens / seconds if seconds else 0.0 for name, (tokens, seconds) in totals.items()
    }


async def concurrent(urls: dict[str, str], prompts: list[str], args) -> dict:
    """`concurrency` clients each send their prompt; generated tokens / wall time, per round."""
    tokens = {name: 0 for name in urls}
    seconds = {name: 0.0 for name in urls}
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as client:
        for _ in range(args.rounds):
            for name, url in urls.items():
                batch = [prompts[i % len(prompts)] for i in range(args.concurrency)]
                start = time.perf_counter()
                runs = await asyncio.gather(
                    *(stream_one(client, url, p, args.max_tokens) for p in batch)
                )
                seconds[name] += time.perf_counter() - start
                tokens[name] += sum(run["tokens"] for run in runs)
                print(f"  {name}: {tokens[name] / seconds[name]:.1f} tok/s so far", flush=True)
    return {name: tokens[name] / seconds[name] for name in urls}


def bench(args: argparse.Namespace) -> dict:
    wanted = args.servers.split(",")
    commands = {k: v for k, v in server_commands(args, 0).items() if k in wanted}
    log_dir = Path("/tmp/vs_llamacpp_logs")
    log_dir.mkdir(exist_ok=True)
    results = {}
    with ExitStack() as stack:
        urls = {
            name: stack.enter_context(running(name, cmd, log_dir)) for name, cmd in commands.items()
        }
        for scenario in args.scenarios.split(","):
            print(f"== {scenario}", flush=True)
            if scenario == "chat-b1":
                prompts = load_prompts("workload_chat.jsonl", args.num_prompts)
                results[scenario] = asyncio.run(batch1(urls, prompts, args.max_tokens))
            elif scenario == "copy-b1":
                prompts = load_prompts("workload_copy.jsonl", args.num_prompts)
                results[scenario] = asyncio.run(batch1(urls, prompts, args.max_tokens))
            elif scenario == "chat-c16":
                prompts = load_prompts("workload_chat.jsonl", 40)
                results[scenario] = asyncio.run(concurrent(urls, prompts, args))
    return dict(
        date=datetime.now().isoformat(timespec="seconds"),
        command=" ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        machine=machine_description(),
        load_average=load_average(),
        args={k: v for k, v in vars(args).items() if k not in ("out", "markdown")},
        commands={name: " ".join(cmd) for name, cmd in commands.items()},
        results=results,
    )


NAMES = ("gs-f32", "gs-off", "gs-goodput", "gs-int8", "gs-int8-goodput", "llama", "llama-spec")


def markdown(results: dict) -> str:
    args = results["args"]
    lines = [
        "### goodspeed vs llama.cpp's server (CPU, same GGUF)",
        "",
        f"`{results['command']}` — {results['date']}, {results['machine']}, "
        f"{results['load_average']} at the end; {args['threads']} threads each, greedy, "
        f"{args['max_tokens']} new tokens, EOS ignored, streamed chat completions. b1: "
        f"{args['num_prompts']} prompts one at a time, decode tok/s (prefill excluded); c16: "
        f"{args['concurrency']} concurrent clients x {args['rounds']} rounds, generated tok/s. "
        f"llama-spec = `{args['llama_spec']}`.",
        "",
        f"| scenario | {' | '.join(NAMES)} | gs-off / llama | gs-goodput / best llama | "
        "gs-goodput / gs-off | gs-int8 / llama | gs-int8-goodput / best llama |",
        "|---|" + "---|" * (len(NAMES) + 5),
    ]
    for scenario, row in results["results"].items():
        best = max(row.get("llama", 0.0), row.get("llama-spec", 0.0)) or 1.0
        cells = [f"{row[n]:.1f}" if n in row else "-" for n in NAMES]
        llama, off = row.get("llama") or 1.0, row.get("gs-off") or 1.0
        lines.append(
            f"| {scenario} | " + " | ".join(cells) + f" | {row.get('gs-off', 0.0) / llama:.2f}x"
            f" | {row.get('gs-goodput', 0.0) / best:.2f}x"
            f" | {row.get('gs-goodput', 0.0) / off:.2f}x"
            f" | {row.get('gs-int8', 0.0) / llama:.2f}x"
            f" | {row.get('gs-int8-goodput', 0.0) / best:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = bench(args)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    text = markdown(results)
    write_section(Path(args.markdown), SECTION, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
