"""goodspeed vs llama.cpp's own server on the same GGUF, same threads, same prompts, one run.

Servers (all started here, one after the other, on 127.0.0.1, each with --threads / -t THREADS):
  gs-f32       goodspeed, no speculation, the GGUF dequantised to float32 (--weights float32)
  gs-off       goodspeed, no speculation, the GGUF's blocks on the native kernels (default)
  gs-goodput   goodspeed, n-gram speculation under the goodput policy
  gs-draft     goodspeed, the draft model (--draft-model) under the goodput policy
  gs-auto      goodspeed, --speculative-proposer auto: n-gram, recycle and the draft model if
               given, the goodput policy choosing per request and step
  gs-int8      gs-off with int8 activations (--weights gguf-int8, llama.cpp's arithmetic)
  gs-int8-goodput  gs-goodput with int8 activations
  llama        llama-server (../shared/tools/llama-server.sh builds it)
  llama-spec   llama-server with its own n-gram speculation (--llama-spec)
  llama-draft  llama-server with the draft model (--llama-draft, then -md DRAFT)
Scenarios (streamed chat completions, greedy, EOS ignored, --max-tokens new tokens):
  chat-b1      open-ended prompts one at a time: decode tok/s = (tokens - 1) / (last chunk -
               first chunk), summed over prompts (prefill excluded)
  copy-b1      copy-heavy prompts (../shared/data/workload_copy.jsonl) one at a time, the same
  code-b1      code editing (benchmarks/data/workload_code_edit.jsonl): a snippet and a small
               change, the answer mostly copies the code; one at a time, the same
  prefill-b1   long prompts for time to first token: 2-3 copy documents joined (500-1000
               tokens; taken from the end of the file, so none is a copy-b1 prompt),
               --prefill-max-tokens new tokens
  chat-cN      --concurrency clients over the chat prompts: generated tokens / wall time
               (chat-c16 is accepted as the old name)
Every request's time to first token and prompt length (usage.prompt_tokens) is kept; the tables
give TTFT mean and median per server and scenario. Before the servers start: the machine's read
bandwidth and the GGUF's bytes per token give the batch-1 decode bound (benchmarks/decode_bound
.py), and every batch-1 figure is shown as a share of it. Each server's start-up (process start
to /health 200, the model files read into the page cache first) and resident memory (VmRSS
after one warm-up request and at the end) are reported beside llama.cpp's; a goodput server's
start-up includes its cost-model profile unless one is cached (~/.cache/goodspeed). Servers
take turns prompt by prompt (b1) or round by round (cN), so load drift hits them alike. Writes
JSON and markdown tables (benchmarks/report.py) with ratios to llama.cpp plain and to its
best speculative config; the tables go into docs/benchmarks.md only under a named `--section`
(a run without one prints them and leaves the docs alone). Every server is stopped on exit,
Ctrl-C and SIGTERM included.

SmolLM2-135M (the embedded model, no draft model):
    .venv/bin/python benchmarks/vs_llamacpp.py --llama-server $(../shared/tools/llama-server.sh) \
        --servers gs-off,gs-goodput,gs-auto,gs-int8,llama,llama-spec --section vs-llamacpp

Qwen2.5-Coder 1.5B Q4_K_M with the 0.5B draft (the issue #23 comparison, 8 clients):
    PAIR=($(PYTHON=.venv/bin/python bash benchmarks/models/qwen_pair.sh))
    .venv/bin/python benchmarks/vs_llamacpp.py --llama-server $(../shared/tools/llama-server.sh) \
        --model ${PAIR[0]} --draft-model ${PAIR[1]} --concurrency 8 \
        --servers gs-off,gs-goodput,gs-draft,gs-auto,llama,llama-spec,llama-draft \
        --section vs-llamacpp-qwen --out docs/bench_vs_llamacpp_qwen.json

Gemma 3 270M Q4_K_M (issue #26; its file has no chat template: llama-server gets
`--chat-template gemma`, ours the same turn format):
    GEMMA=$(PYTHON=.venv/bin/python bash benchmarks/models/gemma3.sh)
    .venv/bin/python benchmarks/vs_llamacpp.py --llama-server $(../shared/tools/llama-server.sh) \
        --model $GEMMA --servers gs-off,gs-goodput,gs-int8,llama,llama-spec \
        --section vs-llamacpp-gemma3 --out docs/bench_vs_llamacpp_gemma3.json
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import vs_llamacpp_report as report  # noqa: E402
from benchmarks.decode_bound import decode_bound, gguf_bytes_per_token, read_bandwidth  # noqa: E402
from benchmarks.report import load_average, machine_description, write_section  # noqa: E402
from benchmarks.spec_sweep import free_port  # noqa: E402
from kernels.cpu.build import load_native  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
WORKLOADS = {
    "chat": DATA / "workload_chat.jsonl",
    "copy": DATA / "workload_copy.jsonl",
    "code_edit": ROOT / "benchmarks" / "data" / "workload_code_edit.jsonl",
}
B1_SCENARIOS = {"chat-b1": "chat", "copy-b1": "copy", "code-b1": "code_edit", "prefill-b1": "long"}
CONCURRENT = "chat-cN"
NAMES = (
    "gs-f32",
    "gs-off",
    "gs-goodput",
    "gs-draft",
    "gs-auto",
    "gs-int8",
    "gs-int8-goodput",
    "llama",
    "llama-spec",
    "llama-draft",
)
NEEDS_DRAFT = ("gs-draft", "llama-draft")  # gs-auto runs without one (n-gram and recycle)
WARM_UP_PROMPT = "Count from one to five."  # in no workload, so it seeds no prefix cache
LONG_PROMPT = "Summarize the following documentation in three sentences:\n\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", required=True, help="path of the llama-server binary")
    parser.add_argument("--model", default=None, help="target GGUF (default: embedded SmolLM2)")
    parser.add_argument("--draft-model", default=None, help="draft GGUF (gs-draft, llama-draft)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prefill-max-tokens", type=int, default=32, help="in prefill-b1")
    parser.add_argument("--num-prompts", type=int, default=6, help="per batch-1 scenario")
    parser.add_argument("--concurrency", type=int, default=16, help="clients of chat-cN")
    parser.add_argument("--rounds", type=int, default=2, help="chat-cN rounds per server")
    parser.add_argument("--llama-spec", default="--spec-type ngram-mod")
    # -md alone loads a plain draft GGUF but drafts nothing: the type must be named.
    parser.add_argument("--llama-draft", default="--spec-type draft-simple")
    parser.add_argument("--scenarios", default=f"chat-b1,copy-b1,code-b1,prefill-b1,{CONCURRENT}")
    parser.add_argument(
        "--servers", default=None, help="comma list, a subset of " + ",".join(NAMES)
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench_vs_llamacpp.json"))
    parser.add_argument("--markdown", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument(
        "--section",
        default=None,
        help="markdown section of --markdown to write (or rewrite); none: print the tables only",
    )
    args = parser.parse_args(argv)
    try:
        args.scenarios = parse_scenarios(args.scenarios)
        args.servers = parse_servers(args.servers, args.draft_model)
    except ValueError as error:
        parser.error(str(error))
    return args


def parse_scenarios(text: str) -> list[str]:
    """Scenario names, any chat-c<number> spelled chat-cN (its clients are --concurrency)."""
    scenarios = [re.sub(r"^chat-c\d+$", CONCURRENT, s) for s in text.split(",") if s]
    unknown = [s for s in scenarios if s not in (*B1_SCENARIOS, CONCURRENT)]
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}: use {[*B1_SCENARIOS, CONCURRENT]}")
    return scenarios


def parse_servers(text: str | None, draft_model: str | None) -> list[str]:
    """The servers asked for; by default every one whose inputs are there."""
    if text is None:
        return [n for n in NAMES if draft_model or n not in NEEDS_DRAFT]
    servers = [s for s in text.split(",") if s]
    unknown = [s for s in servers if s not in NAMES]
    if unknown:
        raise ValueError(f"unknown servers {unknown}: use a subset of {list(NAMES)}")
    if not draft_model and any(s in NEEDS_DRAFT for s in servers):
        raise ValueError(f"{[s for s in servers if s in NEEDS_DRAFT]} need --draft-model")
    return servers


def model_path(args: argparse.Namespace) -> str:
    if args.model:
        return args.model
    from engine.models.loader import resolve_model_path

    return str(resolve_model_path("smollm2-135m-instruct"))


def scenario_name(scenario: str, args: argparse.Namespace) -> str:
    return f"chat-c{args.concurrency}" if scenario == CONCURRENT else scenario


def server_commands(args: argparse.Namespace, port: int) -> dict[str, list[str]]:
    gguf, threads, draft = model_path(args), str(args.threads), args.draft_model
    python = str(Path(sys.executable))
    goodspeed = [python, "-m", "goodspeed.cli", "serve", "--model", gguf, "--threads", threads]
    goodspeed += ["--max-num-seqs", str(args.concurrency), "--host", "127.0.0.1"]
    goodput = ["--spec-policy", "goodput"]
    llama = [args.llama_server, "-m", gguf, "-t", threads, "--host", "127.0.0.1"]
    llama += ["-np", str(args.concurrency), "-c", str(args.concurrency * 2048)]
    llama += llama_chat_template(gguf)
    commands = {
        "gs-f32": goodspeed + ["--spec-policy", "off", "--weights", "float32"],
        "gs-off": goodspeed + ["--spec-policy", "off"],
        "gs-goodput": goodspeed + ["--speculative-proposer", "ngram", *goodput],
        "gs-auto": goodspeed
        + ["--speculative-proposer", "auto", *goodput]
        + (["--draft-model", draft] if draft else []),
        "gs-int8": goodspeed + ["--spec-policy", "off", "--weights", "gguf-int8"],
        "gs-int8-goodput": goodspeed
        + ["--speculative-proposer", "ngram", *goodput, "--weights", "gguf-int8"],
        "llama": llama,
        "llama-spec": llama + shlex.split(args.llama_spec),
    }
    if draft:
        commands["gs-draft"] = goodspeed + [
            *("--speculative-proposer", "draft", "--draft-model", draft),
            *goodput,
        ]
        commands["llama-draft"] = llama + shlex.split(args.llama_draft) + ["-md", draft]
    return commands


# GGUF architecture -> llama-server's built-in template of that family, for files that carry no
# chat template (goodspeed supplies the same format: engine/models/chat_templates.py).
LLAMA_TEMPLATES = {"gemma3": "gemma"}


def llama_chat_template(gguf: str) -> list[str]:
    """`--no-jinja --chat-template NAME` when the file has no template and its family has one,
    so both servers see the same chat prompt; else nothing. `--no-jinja` first: with Jinja on
    (llama-server's default) NAME is read as the template's own text, and every prompt renders
    as the word itself (3 tokens for "gemma")."""
    if not Path(gguf).is_file():
        return []
    from engine.models.gguf_file import read_gguf

    metadata = read_gguf(Path(gguf)).metadata
    name = LLAMA_TEMPLATES.get(metadata.get("general.architecture"))
    if name is None or metadata.get("tokenizer.chat_template"):
        return []
    return ["--no-jinja", "--chat-template", name]


@dataclass
class Server:
    name: str
    url: str
    pid: int
    startup_s: float


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the benchmark dies, even by SIGKILL, so no
    server outlives it (Linux prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


@contextmanager
def running(name: str, command: list[str], log_dir: Path, cwd: Path = ROOT):
    """Start a server, wait for /health, yield it as a Server; stop it however the block ends.
    `cwd`: the checkout whose packages `python -m goodspeed.cli` runs (benchmarks/startup.py
    starts two)."""
    port = free_port()
    command = [*command, "--port", str(port)]
    log_path = log_dir / f"{name}.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    start = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, preexec_fn=_die_with_parent
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log_path)
        yield Server(name, url, process.pid, time.perf_counter() - start)
    finally:
        stop(process)
        log.close()


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(30)  # goodspeed drains in-flight requests on SIGTERM
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_ready(url: str, process: subprocess.Popen, log_path: Path, timeout: float = 600) -> None:
    """Poll /health every 50 ms (the start-up time's resolution) until it answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"server exited early; see {log_path}:\n{log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    sys.exit(f"server not ready after {timeout} s; see {log_path}")


def resident_memory(pid: int) -> dict:
    return report.parse_status(Path(f"/proc/{pid}/status").read_text())


def read_into_page_cache(paths: list[str]) -> None:
    """Read the model files once, so no server's start-up pays the disk for the others."""
    for path in paths:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def read_prompts(workload: str) -> list[str]:
    lines = WORKLOADS[workload].read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines if line.strip()]


def load_prompts(name: str, count: int) -> list[str]:
    """The first `count` prompts of a ../shared/data file (also used by c16_probe and
    http_overhead)."""
    lines = (DATA / name).read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines if line.strip()][:count]


def long_prompts(copy_prompts: list[str], count: int, low=2400, high=3800) -> list[str]:
    """`count` prompts of `low` to `high` characters (500-1000 tokens of these documents): the
    documents of the copy prompts, last first, joined under one instruction; a document that
    would pass `high` is skipped."""
    documents = [p.split("\n\n", 1)[-1] for p in reversed(copy_prompts)]
    prompts, group = [], []
    for document in documents:
        if len(prompts) == count:
            break
        if sum(map(len, group)) + len(document) > high:
            continue
        group.append(document)
        if sum(map(len, group)) >= low:
            prompts.append(LONG_PROMPT + "\n\n".join(group))
            group = []
    return prompts


def scenario_prompts(workload: str, count: int) -> list[str]:
    if workload == "long":
        return long_prompts(read_prompts("copy"), count)
    return read_prompts(workload)[:count]


async def stream_one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed chat completion: its send time, the times of its first and last content
    chunks, its token counts (usage) and speculation counts (ours: usage.speculation,
    llama.cpp's: timings.draft_n)."""
    body = {
        "model": await model_id(client, url),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    run = dict(tokens=0, prompt_tokens=0, drafted=0, accepted=0, first=0.0, last=0.0)
    run["start"] = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                read_chunk(json.loads(line[6:]), run)
    return run


def read_chunk(chunk: dict, run: dict) -> None:
    """Fold one streamed chunk into `run`."""
    if any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
        run["last"] = time.perf_counter()
        run["first"] = run["first"] or run["last"]
    usage = chunk.get("usage") or {}
    if usage:
        run["tokens"], run["prompt_tokens"] = usage["completion_tokens"], usage["prompt_tokens"]
    if usage.get("speculation"):
        run["drafted"] = usage["speculation"]["draft_tokens"]
        run["accepted"] = usage["speculation"]["accepted_tokens"]
    if (chunk.get("timings") or {}).get("draft_n"):
        run["drafted"] = chunk["timings"]["draft_n"]
        run["accepted"] = chunk["timings"]["draft_n_accepted"]


async def model_id(client: httpx.AsyncClient, url: str) -> str:
    response = await client.get(f"{url}/v1/models")
    return response.json()["data"][0]["id"]


async def batch1(urls: dict[str, str], prompts: list[str], max_tokens: int) -> dict:
    """Servers take turns prompt by prompt; {server: its runs}."""
    runs = {name: [] for name in urls}
    async with httpx.AsyncClient(timeout=600) as client:
        for prompt in prompts:
            for name, url in urls.items():
                run = await stream_one(client, url, prompt, max_tokens)
                runs[name].append(run)
                print(
                    f"  {name}: {run['prompt_tokens']} prompt tokens, TTFT "
                    f"{run['first'] - run['start']:.2f} s, {run['tokens']} tokens",
                    flush=True,
                )
    return {name: b1_summary(name_runs) for name, name_runs in runs.items()}


def b1_summary(runs: list[dict]) -> dict:
    return dict(tok_s=report.decode_rate(runs), **report.request_stats(runs))


async def concurrent(urls: dict[str, str], prompts: list[str], args) -> dict:
    """`concurrency` clients each send their prompt; generated tokens / wall time over the
    rounds, and the requests' TTFT under that load."""
    tokens = {name: 0 for name in urls}
    seconds = {name: 0.0 for name in urls}
    runs = {name: [] for name in urls}
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as client:
        for _ in range(args.rounds):
            for name, url in urls.items():
                batch = [prompts[i % len(prompts)] for i in range(args.concurrency)]
                start = time.perf_counter()
                done = await asyncio.gather(
                    *(stream_one(client, url, p, args.max_tokens) for p in batch)
                )
                seconds[name] += time.perf_counter() - start
                tokens[name] += sum(run["tokens"] for run in done)
                runs[name] += done
                print(f"  {name}: {tokens[name] / seconds[name]:.1f} tok/s so far", flush=True)
    return {
        name: dict(tok_s=tokens[name] / seconds[name], **report.request_stats(runs[name]))
        for name in urls
    }


def run_scenario(scenario: str, urls: dict[str, str], args: argparse.Namespace) -> dict:
    if scenario == CONCURRENT:
        return asyncio.run(concurrent(urls, load_prompts("workload_chat.jsonl", 40), args))
    workload = B1_SCENARIOS[scenario]
    prompts = scenario_prompts(workload, args.num_prompts)
    max_tokens = args.prefill_max_tokens if workload == "long" else args.max_tokens
    return asyncio.run(batch1(urls, prompts, max_tokens))


def measure_bound(args: argparse.Namespace, repeats: int = 5) -> dict:
    """The batch-1 decode bound of the target on this machine, measured before any server runs."""
    bandwidth = read_bandwidth(args.threads, repeats=repeats)
    per_token = gguf_bytes_per_token(model_path(args))
    bound = dict(bandwidth=bandwidth, bytes_per_token=per_token, threads=args.threads)
    bound.update(repeats=repeats, tok_s=decode_bound(bandwidth, per_token))
    print(report.bound_line(bound), flush=True)
    return bound


def start_all(stack: ExitStack, commands: dict, args: argparse.Namespace) -> dict:
    """Start the servers one at a time (start-up timed alone), each warmed by one request;
    {name: Server}, stopped when `stack` closes."""
    log_dir = Path("/tmp/vs_llamacpp_logs")
    log_dir.mkdir(exist_ok=True)
    servers = {}
    for name, command in commands.items():
        server = stack.enter_context(running(name, command, log_dir))
        asyncio.run(warm_up(server.url))
        print(f"{name}: ready in {server.startup_s:.1f} s (log {log_dir}/{name}.log)", flush=True)
        servers[name] = server
    return servers


async def warm_up(url: str) -> None:
    """First-request costs (lazy allocations, thread pools) outside the measured runs."""
    async with httpx.AsyncClient(timeout=600) as client:
        await stream_one(client, url, WARM_UP_PROMPT, 8)


def bench(args: argparse.Namespace) -> dict:
    commands = {k: v for k, v in server_commands(args, 0).items() if k in args.servers}
    bound = measure_bound(args)
    read_into_page_cache([model_path(args)] + ([args.draft_model] if args.draft_model else []))
    load_native()  # built here if the sources changed: a server that built them would time it
    results, info = {}, {}
    with ExitStack() as stack:
        servers = start_all(stack, commands, args)
        for name, server in servers.items():
            info[name] = dict(startup_s=server.startup_s, rss_warm=resident_memory(server.pid))
            info[name]["draft"] = "--draft-model" in commands[name] or "-md" in commands[name]
        urls = {name: server.url for name, server in servers.items()}
        for scenario in args.scenarios:
            print(f"== {scenario_name(scenario, args)}", flush=True)
            results[scenario_name(scenario, args)] = run_scenario(scenario, urls, args)
        for name, server in servers.items():
            info[name]["rss_end"] = resident_memory(server.pid)
    return dict(
        date=datetime.now().isoformat(timespec="seconds"),
        command=" ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        machine=machine_description(),
        load_average=load_average(),
        model=model_path(args),
        args={k: v for k, v in vars(args).items() if k not in ("out", "markdown")},
        commands={name: shlex.join(cmd) for name, cmd in commands.items()},
        bound=bound,
        servers=info,
        results=results,
    )


def _exit_on_sigterm(signum, frame) -> None:
    print("SIGTERM: stopping the servers", file=sys.stderr, flush=True)
    sys.exit(128 + signum)  # SystemExit unwinds the ExitStack: every server is stopped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    results = bench(args)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    text = report.markdown(results)
    if args.section is not None:
        write_section(Path(args.markdown), args.section, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
