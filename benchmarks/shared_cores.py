"""Batch-1 decode beside busy processes: how the compute threads' wait policy holds up when the
cores are shared (issue: shared cores and overload).

For each thread-policy variant (the engine's default adaptive policy, `--thread-policy static`,
one thread, or environment settings read when the OpenMP runtime starts, e.g.
`OMP_WAIT_POLICY=passive`), and each number of CPU-bound "hog"
processes running beside (0, 1, 2), a fresh Python process loads the model, warms up and
decodes --tokens tokens greedily at batch 1 (in process, no HTTP); decode tok/s is reported.
Variants and hog counts are interleaved round by round; medians of --rounds. The ratios that
matter: each variant beside h hogs over the default variant alone (idle), in the same run.

    .venv/bin/python benchmarks/shared_cores.py --rounds 3
    .venv/bin/python benchmarks/shared_cores.py --variants default,passive,spin20k --hogs 0,1
    .venv/bin/python benchmarks/shared_cores.py --variants pin1,pin1-t2,pin1-t2-static --hogs 0

The `pin1*` variants run the probe under `taskset -c 0` (one core; what a CPU limit of 1 or a
one-CPU cpuset gives): `pin1-t2` against `pin1` is the issue's quota check (>= 0.8x).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "default": {},  # the engine's defaults: the adaptive thread policy
    "static": {"POLICY": "static"},  # always --threads compute threads
    "passive": {"OMP_WAIT_POLICY": "passive", "POLICY": "static"},
    "spin20k": {"GOMP_SPINCOUNT": "20000", "POLICY": "static"},
    "threads1": {"THREADS": "1", "POLICY": "static"},  # one compute thread throughout
    # A CPU quota below the threads asked for: pinned to one core (taskset), 2 threads asked.
    "pin1": {"TASKSET": "0", "THREADS": "1", "POLICY": "static"},  # the right count
    "pin1-t2": {"TASKSET": "0", "THREADS": "2"},  # adaptive: reads the affinity
    "pin1-t2-static": {"TASKSET": "0", "THREADS": "2", "POLICY": "static"},
}
PROBE = """
import sys, time
from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams
model, threads, tokens, policy = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
flat = dict(model=model, threads=threads, num_kv_blocks=64, thread_policy=policy)
llm = LLM(config=EngineConfig.from_flat(flat))
params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
prompt = llm.tokenizer.encode("The history of the printing press in Europe")
# Warm-up long enough (~1-2 s) for the adaptive policy's readings, as a running server has had.
llm.generate([prompt], SamplingParams(temperature=0, max_tokens=128, ignore_eos=True), use_tqdm=False)
marks = []
llm.generate([prompt], params, use_tqdm=False, on_output=lambda o: marks.append(time.perf_counter()))
print((len(marks) - 1) / (marks[-1] - marks[0]))
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--variants", default="default,static,threads1,passive")
    parser.add_argument("--hogs", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


@contextmanager
def hogs(count: int, seconds: float = 600.0):
    """`count` CPU-bound processes (a busy loop each), killed on exit or after `seconds`."""
    loop = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def decode_tok_s(variant: str, args: argparse.Namespace) -> float:
    settings = dict(VARIANTS[variant])
    threads = settings.pop("THREADS", str(args.threads))
    policy = settings.pop("POLICY", "adaptive")
    cpus = settings.pop("TASKSET", None)
    env = {**os.environ, **settings, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", PROBE, args.model, threads, str(args.tokens), policy]
    if cpus is not None:
        command = ["taskset", "-c", cpus, *command]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{variant}: probe failed\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parse_args()
    variants = args.variants.split(",")
    counts = [int(h) for h in args.hogs.split(",")]
    samples: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for count in counts:
            with hogs(count):
                for variant in variants:
                    tok_s = decode_tok_s(variant, args)
                    samples.setdefault(f"{variant}|{count}", []).append(tok_s)
                    print(f"{variant:10s} hogs {count}: {tok_s:7.1f} tok/s", flush=True)
    medians = {key: statistics.median(values) for key, values in samples.items()}
    idle = medians.get("default|0") or medians.get("pin1|0")
    baseline = "default" if "default|0" in medians else "pin1"
    print(
        "\n| variant | "
        + " | ".join(f"{c} hogs tok/s" for c in counts)
        + f" | vs {baseline} idle |"
    )
    print("|---|" + "---|" * (len(counts) + 1))
    for variant in variants:
        cells = [f"{medians[f'{variant}|{c}']:.1f}" for c in counts]
        ratios = [f"{medians[f'{variant}|{c}'] / idle:.2f}" for c in counts] if idle else []
        print(f"| {variant} | " + " | ".join(cells) + " | " + " / ".join(ratios) + " |")
    if args.out:
        args.out.write_text(json.dumps(dict(args=vars(args) | {"out": ""}, samples=samples)))


if __name__ == "__main__":
    main()
