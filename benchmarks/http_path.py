"""CPU microseconds per streamed token on the HTTP path, counted per thread (not wall clock).

A server runs in this process on the fake engine (tests/server/fake_engine.py: no model, one
token per request per step, `--step-delay` seconds of sleep per step, like a decode step that
uses no CPU of this process). A client in another process streams chat completions at batch 1
(one at a time) and reads every chunk. Per token we report the CPU time of the event-loop
thread (handoff from the engine thread, RequestStream, chunk building, SSE encoding, ASGI
sends, socket writes) and of the engine thread (the fake step, publishing, metrics), read from
each thread's own CPU clock. This is what the HTTP path adds to a decode step on a machine
whose cores are all busy with the model; the end-to-end ratio against in-process decoding on
the real model is benchmarks/http_overhead.py's.

    .venv/bin/python benchmarks/http_path.py --tokens 400 --requests 5
    .venv/bin/python benchmarks/http_path.py --profile 25      # top functions of the loop thread
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server.fake_engine import FakeEngine  # noqa: E402
from tests.server.harness import run_server  # noqa: E402

CLIENT = """
import json, sys, httpx
url, requests, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens,
        "ignore_eos": True, "stream": True}
total = 0
with httpx.Client(timeout=300) as client:
    for _ in range(requests):
        with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    total += sum(bool(c["delta"].get("content")) for c in chunk["choices"])
print(total)
"""


def thread_cpu(thread: threading.Thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def run_client(url: str, requests: int, tokens: int) -> int:
    command = [sys.executable, "-c", CLIENT, url, str(requests), str(tokens)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return int(result.stdout.strip())


def measure(args: argparse.Namespace) -> dict[str, float]:
    server = run_server(FakeEngine(step_delay=args.step_delay, max_model_len=4096))
    loop_thread, engine_thread = server.thread, server.async_engine._worker._thread
    try:
        run_client(server.url, 1, 20)  # warm-up: imports, first connection
        profile = cProfile.Profile() if args.profile else None
        if profile is not None:
            loop = server.async_engine._worker._loop
            loop.call_soon_threadsafe(profile.enable)  # cProfile follows the thread enabling it
        loop_start, engine_start = thread_cpu(loop_thread), thread_cpu(engine_thread)
        num_tokens = run_client(server.url, args.requests, args.tokens)
        loop_cpu = thread_cpu(loop_thread) - loop_start
        engine_cpu = thread_cpu(engine_thread) - engine_start
        if profile is not None:
            loop.call_soon_threadsafe(profile.disable)
            time.sleep(0.2)
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.profile)
            print(out.getvalue())
    finally:
        server.stop()
    return {
        "tokens": num_tokens,
        "loop_us_per_token": 1e6 * loop_cpu / num_tokens,
        "engine_us_per_token": 1e6 * engine_cpu / num_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=400, help="max_tokens of each request")
    parser.add_argument("--requests", type=int, default=5, help="streamed one after another")
    parser.add_argument("--step-delay", type=float, default=0.005, help="seconds per step")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, help="print the N top functions")
    args = parser.parse_args()
    results = [measure(args) for _ in range(1 if args.profile else args.rounds)]
    for key in ("loop_us_per_token", "engine_us_per_token"):
        values = sorted(r[key] for r in results)
        print(f"{key}: median {values[len(values) // 2]:.1f}  all {[round(v, 1) for v in values]}")
    print(f"tokens per round: {results[0]['tokens']}")


if __name__ == "__main__":
    main()
