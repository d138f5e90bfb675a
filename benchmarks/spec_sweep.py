"""Speculation policy sweep through the HTTP server: latency vs load, per policy (SmartSpec,
arXiv 2406.14066: fixed speculation helps at light load and hurts under load; goodput adapts).

    python benchmarks/spec_sweep.py --threads 1            # the full sweep (long)
    python benchmarks/spec_sweep.py --quick --threads 1    # a few minutes, end to end

For each policy (off, fixed:1, fixed:3, fixed:5, goodput; `goodput@recycle`, `goodput@auto`
name other proposers) one `goodspeed serve` subprocess (n-gram by default, up to 5 drafts, prefix caching off so repeated prompts cannot make later
cells cheaper, the default cost-model cache reused) serves Poisson arrivals
(benchmarks/serve.py, chat completions, greedy) of both workloads at rates that are multiples of
1 / (mean latency of one request alone, policy off): x1 is about one request in flight, the top
rate saturates the server. Each (workload, policy, multiplier) cell is appended to the JSON
output as soon as it finishes, and cells already there are skipped, so an interrupted sweep
resumes. Then a markdown section (docs/bench_goodput.md) and a PNG plot are written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import serve as loadgen  # noqa: E402
from report import load_average, machine_description, write_section  # noqa: E402
from spec_sweep_report import MAX_K, POLICIES, markdown, plot  # noqa: E402

DATA = HERE.parents[1] / "shared" / "data"
WORKLOADS = {"copy": DATA / "workload_copy.jsonl", "chat": DATA / "workload_chat.jsonl"}
# Half copy-heavy, half open-ended, alternating (the proposer-choice workload of issue #12).
WORKLOADS["mixed"] = Path(tempfile.gettempdir()) / "goodspeed_workload_mixed.jsonl"


def write_mixed_workload() -> None:
    copy, chat = (WORKLOADS[name].read_text().splitlines() for name in ("copy", "chat"))
    lines = [line for pair in zip(copy, chat) for line in pair]
    WORKLOADS["mixed"].write_text("\n".join(lines) + "\n")


FULL = dict(multipliers=(0.5, 1.0, 2.0, 4.0, 8.0), num_prompts=24, max_tokens=64, calibrate=4)
QUICK = dict(multipliers=(1.0, 4.0, 16.0), num_prompts=3, max_tokens=16, calibrate=2)
FULL.update(interleave=True)  # 50 server starts (~20 s each) buy policies measured side by side
QUICK.update(interleave=False)
SPEC_COUNTERS = (
    "goodspeed:spec_decode_num_draft_tokens_total",
    "goodspeed:spec_decode_num_accepted_tokens_total",
    "goodspeed:spec_decode_chosen_k_sum",
    "goodspeed:spec_decode_chosen_k_count",
    "goodspeed:generation_tokens_total",
)


# ---- the server -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(policy: str, args: argparse.Namespace):
    """`goodspeed serve` for one policy; yields its base URL, stops it (SIGTERM) on exit."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "goodspeed"), "serve", "--port", str(port)]
    # "goodput@auto": the policy, then the proposer(s) (default n-gram), e.g. goodput@recycle.
    policy, _, proposer = policy.partition("@")
    command += ["--speculative-proposer", proposer or "ngram", "--spec-policy", policy]
    command += ["--num-speculative-tokens", str(MAX_K), "--no-prefix-caching"]
    for flag in ("model", "threads", "spec_cost_cache"):
        if getattr(args, flag) is not None:
            command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    log_path = Path(args.server_log)
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            base_url = f"http://127.0.0.1:{port}"
            wait_healthy(base_url, process, log_path, args.start_timeout)
            yield base_url
        finally:
            process.terminate()  # SIGTERM: the server drains (nothing is in flight) and exits
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_healthy(base_url: str, process: subprocess.Popen, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text()[-2000:]
            raise RuntimeError(f"server exited with {process.returncode}:\n{tail}")
        try:
            if httpx.get(base_url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"server not healthy after {timeout:.0f} s; see {log_path}")


def scrape(base_url: str) -> dict[str, float]:
    """Sums of the speculation counters over all label sets."""
    text = httpx.get(base_url + "/metrics", timeout=10.0).text
    totals = dict.fromkeys(SPEC_COUNTERS, 0.0)
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:]+)(?:\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if match and match.group(1) in totals:
            totals[match.group(1)] += float(match.group(2))
    return totals


# ---- load -----------------------------------------------------------------------------------
def drive(base_url: str, workload: str, rate: float, count: int, args, concurrency=None) -> dict:
    argv = ["--base-url", base_url, "--dataset", str(WORKLOADS[workload]), "--endpoint", "chat"]
    argv += ["--num-prompts", str(count), "--request-rate", str(rate), "--seed", str(args.seed)]
    argv += ["--max-tokens", str(args.max_tokens), "--temperature", "0"]
    if concurrency is not None:
        argv += ["--max-concurrency", str(concurrency)]
    return asyncio.run(loadgen.run(loadgen.parse_args(argv)))


def calibrate(base_url: str, workload: str, args) -> float:
    """Mean e2e seconds of one request alone: the time scale of the rates."""
    report = drive(base_url, workload, float("inf"), args.calibrate, args, concurrency=1)
    if not report["num_completed"]:
        raise RuntimeError(f"calibration of {workload} failed: {report['errors']}")
    return report["e2el_ms"]["mean"] / 1000.0


def run_cell(base_url: str, workload: str, policy: str, multiplier: float, scale: float, args):
    rate = multiplier / scale
    before = scrape(base_url)
    report = drive(base_url, workload, rate, args.num_prompts, args)
    after = scrape(base_url)
    spec = {name.split(":")[1]: after[name] - before[name] for name in SPEC_COUNTERS}
    keep = ("num_completed", "num_failed", "errors", "duration_s", "request_throughput")
    keep += ("output_throughput", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
    return dict(
        workload=workload,
        policy=policy,
        multiplier=multiplier,
        rate=rate,
        uptime=load_average(),
        spec=spec,
        **{key: report[key] for key in keep},
    )


# ---- results --------------------------------------------------------------------------------
def load_results(path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"calibration_s": {}, "cells": []}


def save_results(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(results, indent=2) + "\n")
    partial.replace(path)


def server_runs(results: dict, args: argparse.Namespace) -> list[tuple[str, list]]:
    """(policy, [(workload, multiplier)...]) per server start, cells already done left out:
    one server per policy, or with --interleave one per cell, the policies adjacent in time at
    each (workload, rate), so that load drift on a shared machine hits every policy alike."""
    done = {(c["workload"], c["policy"], c["multiplier"]) for c in results["cells"]}
    cells = [
        (workload, multiplier, policy)
        for workload in args.workloads
        for multiplier in args.multipliers
        for policy in args.policies
        if (workload, policy, multiplier) not in done
    ]
    if args.interleave:
        return [(policy, [(workload, multiplier)]) for workload, multiplier, policy in cells]
    by_policy = {policy: [(w, m) for w, m, p in cells if p == policy] for policy in args.policies}
    return [(policy, todo) for policy, todo in by_policy.items() if todo]


def sweep(args: argparse.Namespace) -> dict:
    output = Path(args.output)
    results = load_results(output)
    runs = server_runs(results, args)
    if runs:  # record the runs that measured something
        command = "python " + " ".join(sys.argv)
        results.setdefault("runs", []).append(dict(command=command, date=time.strftime("%F %R")))
        results.update(machine=machine_description(), max_tokens=args.max_tokens)
        results.update(num_prompts=args.num_prompts)
    print(f"[sweep] {sum(len(todo) for _, todo in runs)} cells to measure", flush=True)
    for policy, todo in runs:
        with running_server(policy, args) as base_url:
            for workload, multiplier in todo:
                scales = results["calibration_s"]
                if workload not in scales:
                    scales[workload] = calibrate(base_url, workload, args)
                    results.setdefault("calibration_policy", {})[workload] = policy
                    alone = f"{scales[workload]:.2f} s ({policy})"
                    print(f"[sweep] {workload}: one request alone {alone}", flush=True)
                cell = run_cell(base_url, workload, policy, multiplier, scales[workload], args)
                results["cells"].append(cell)
                save_results(output, results)
                print(
                    f"[sweep] {workload} {policy} x{multiplier:g} ({cell['rate']:.3f} req/s): "
                    f"mean e2e {cell['e2el_ms']['mean'] / 1000:.2f} s, "
                    f"{cell['num_completed']} ok, {cell['num_failed']} failed",
                    flush=True,
                )
    return results


# ---- report ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rates, 3 requests, 16 tokens")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES))
    parser.add_argument(
        "--workloads", nargs="+", choices=tuple(WORKLOADS), default=["copy", "chat"]
    )
    parser.add_argument("--multipliers", type=float, nargs="+", default=None)
    parser.add_argument("--num-prompts", type=int, default=None, help="requests per cell")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--calibrate", type=int, default=None, help="requests timing the scale")
    parser.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one server per cell, policies side by side (default: on, off with --quick)",
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=None, help="server torch threads")
    parser.add_argument("--spec-cost-cache", default=None, help="default: the engine's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--server-log", default=str(Path(tempfile.gettempdir()) / "spec_sweep.log"))
    parser.add_argument("--output", default=None, help="JSON (default docs/bench_goodput.json)")
    parser.add_argument("--markdown", default=str(HERE.parent / "docs" / "bench_goodput.md"))
    parser.add_argument("--plot", default=None, help="PNG (default docs/bench_goodput[_quick].png)")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    suffix = "_quick" if args.quick else ""
    args.output = args.output or str(HERE.parent / "docs" / f"bench_goodput{suffix}.json")
    args.plot = args.plot or str(HERE.parent / "docs" / f"bench_goodput{suffix}.png")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    write_mixed_workload()
    results = sweep(args)
    section = "policy-sweep-quick" if args.quick else "policy-sweep"
    title = "# Goodput-driven speculation: results"
    write_section(Path(args.markdown), section, markdown(results, args), title)
    plot(results, Path(args.plot))
    print(f"[sweep] wrote {args.output}, {args.markdown} ({section}), {args.plot}")
    return 0 if all(c["num_completed"] for c in results["cells"]) else 1


if __name__ == "__main__":
    sys.exit(main())
