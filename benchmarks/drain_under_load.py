"""SIGTERM drain beside busy processes (issue #25): a `python -m server` on SmolLM2 with default
flags, N streamed completions of 64 tokens running, two CPU-spinning processes beside it, then
SIGTERM; counts the streams that end with finish_reason "length" and [DONE], the drain time and
the exit code. Reuses the server helpers of tests/server/test_real_model.py.

    .venv/bin/python benchmarks/drain_under_load.py --streams 20 --trials 2
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.models.loader import resolve_model_path  # noqa: E402
from tests.server.test_real_model import cli_server, stream_lines  # noqa: E402

SPIN = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end: pass"


def finished(lines: list[str]) -> bool:
    if len(lines) < 2 or lines[-1] != "data: [DONE]":
        return False
    return json.loads(lines[-2][len("data: ") :])["choices"][0]["finish_reason"] == "length"


def trial(model: Path, streams: int, hogs: int, log: Path) -> tuple[int, float, int]:
    """(streams finished, drain seconds, exit code)."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(hogs)]
    try:
        with cli_server(model, log) as (process, url):
            runs = [(threading.Event(), []) for _ in range(streams)]
            clients = [threading.Thread(target=stream_lines, args=(url, 64, e, x)) for e, x in runs]
            for client in clients:
                client.start()
            if not all(started.wait(300) for started, _ in runs):
                raise RuntimeError("not every stream started")
            start = time.monotonic()
            process.send_signal(signal.SIGTERM)
            for client in clients:
                client.join(300)
            drain = time.monotonic() - start
            return sum(finished(lines) for _, lines in runs), drain, process.wait(300)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--trials", type=int, default=1)
    args = parser.parse_args()
    model = Path(resolve_model_path("smollm2-135m-instruct"))
    for i in range(args.trials):
        done, drain, code = trial(model, args.streams, args.hogs, Path(f"/tmp/drain-{i}.log"))
        print(f"trial {i}: {done}/{args.streams} finished, drain {drain:.1f} s, exit {code}")


if __name__ == "__main__":
    main()
