"""Server start-up time (process start to /health 200, the GGUFs in the page cache) of one or
more goodspeed checkouts beside llama-server, interleaved: every round starts each server once,
in turn, so load drift hits them alike. Servers are launched by vs_llamacpp.py's `running` with
its commands (gs-off, gs-goodput, llama, ...); a goodspeed server runs the packages of its
checkout (`--tree NAME=DIR`: `python -m goodspeed.cli` with DIR as the working directory).
Each start-up is kept with the load average read just before it; prints medians and ratios to
llama-server and writes JSON.

    .venv/bin/python benchmarks/startup.py \
        --llama-server $(../shared/tools/llama-server.sh) \
        --model ~/.cache/goodspeed/models/qwen-pair/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --tree before=/tmp/before --tree after=. --servers gs-off,llama --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import vs_llamacpp  # noqa: E402
from benchmarks.report import load_average, machine_description  # noqa: E402

LOG_DIR = Path("/tmp/startup_logs")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", required=True, help="path of the llama-server binary")
    parser.add_argument("--model", action="append", required=True, help="GGUF (repeatable)")
    parser.add_argument("--tree", action="append", default=None, help="NAME=DIR (repeatable)")
    parser.add_argument("--servers", default="gs-off,llama", help="vs_llamacpp.py names")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16, help="-np / --max-num-seqs")
    parser.add_argument("--out", default="/tmp/startup.json")
    args = parser.parse_args(argv)
    args.trees = dict(_tree(text) for text in args.tree or [f"this={vs_llamacpp.ROOT}"])
    args.servers = vs_llamacpp.parse_servers(args.servers, None)
    return args


def _tree(text: str) -> tuple[str, Path]:
    name, _, path = text.partition("=")
    if not path or not Path(path).is_dir():
        raise SystemExit(f"--tree wants NAME=DIR, got {text!r}")
    return name, Path(path).resolve()


def launches(args: argparse.Namespace, model: str) -> list[tuple[str, list[str], Path]]:
    """(label, command, working directory) of every server to time on `model`."""
    commands = vs_llamacpp.server_commands(_server_args(args, model), 0)
    out = []
    for server in args.servers:
        if server.startswith("llama"):
            out.append((server, commands[server], vs_llamacpp.ROOT))
            continue
        for tree, path in args.trees.items():
            out.append((f"{server}@{tree}", commands[server], path))
    return out


def _server_args(args: argparse.Namespace, model: str) -> argparse.Namespace:
    return argparse.Namespace(
        model=model,
        draft_model=None,
        threads=args.threads,
        concurrency=args.concurrency,
        llama_server=args.llama_server,
        llama_spec="--spec-type ngram-mod",
        llama_draft="--spec-type draft-simple",
    )


def time_startup(label: str, command: list[str], cwd: Path) -> dict:
    load = load_average()
    with vs_llamacpp.running(label.replace("@", "-"), command, LOG_DIR, cwd) as server:
        return dict(startup_s=server.startup_s, load=load)


def summary(samples: dict[str, list[dict]]) -> dict[str, dict]:
    medians = {k: statistics.median(s["startup_s"] for s in v) for k, v in samples.items()}
    llama = medians.get("llama")
    return {
        label: dict(
            median_s=round(median, 2),
            runs_s=[round(s["startup_s"], 2) for s in samples[label]],
            vs_llama=round(median / llama, 2) if llama else None,
        )
        for label, median in medians.items()
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    LOG_DIR.mkdir(exist_ok=True)
    vs_llamacpp.read_into_page_cache(args.model)
    results = {}
    for model in args.model:
        samples: dict[str, list[dict]] = {}
        todo = launches(args, model)
        for round_index in range(args.rounds):
            for label, command, cwd in todo:
                sample = time_startup(label, command, cwd)
                samples.setdefault(label, []).append(sample)
                print(
                    f"{Path(model).name} round {round_index + 1} {label}: "
                    f"{sample['startup_s']:.2f} s ({sample['load']})",
                    flush=True,
                )
        results[model] = dict(samples=samples, summary=summary(samples))
        for label, row in results[model]["summary"].items():
            print(f"{Path(model).name} {label}: {row}", flush=True)
    record = dict(
        date=datetime.now().isoformat(timespec="seconds"),
        command=" ".join(["python", *sys.argv]),
        machine=machine_description(),
        trees={name: str(path) for name, path in args.trees.items()},
        results=results,
    )
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
