"""Is goodput's cost under 16 clients speculation, or noise? Server metrics per run.

Starts gs-off and gs-goodput (the servers of benchmarks/vs_llamacpp.py) in turn, `--pairs`
times, runs its chat-c16 scenario (16 concurrent clients x `--rounds` rounds, 128 tokens,
greedy) on each, and prints the throughput with the server's own counters: draft and accepted
tokens, model steps and their summed seconds. Equal step counts and near-zero drafts with
unequal step seconds mean the difference is the machine, not the policy.

    .venv/bin/python benchmarks/c16_probe.py --pairs 2
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import vs_llamacpp  # noqa: E402

COUNTERS = (
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
    "step_time_seconds_count",
    "step_time_seconds_sum",
)


def counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    found = {}
    for name in COUNTERS:
        match = re.search(rf"^goodspeed:{name}{{[^}}]*}} (\S+)$", text, re.MULTILINE)
        found[name] = float(match.group(1)) if match else float("nan")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    own = parser.parse_args()
    args = vs_llamacpp.parse_args(
        ["--llama-server", "unused", "--rounds", str(own.rounds), "--threads", str(own.threads)]
    )
    commands = vs_llamacpp.server_commands(args, 0)
    prompts = vs_llamacpp.load_prompts("workload_chat.jsonl", 40)
    log_dir = Path("/tmp/c16_probe_logs")
    log_dir.mkdir(exist_ok=True)
    for _ in range(own.pairs):
        for name in ("gs-off", "gs-goodput"):
            with vs_llamacpp.running(name, commands[name], log_dir) as server:
                urls = {name: server.url}
                tok_s = asyncio.run(vs_llamacpp.concurrent(urls, prompts, args))[name]["tok_s"]
                seen = counters(server.url)
            print(name, f"{tok_s:.1f} tok/s", {k: round(v, 2) for k, v in seen.items()}, flush=True)


if __name__ == "__main__":
    main()
