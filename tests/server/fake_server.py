"""Serve the fake engine over HTTP in this process: `python tests/server/fake_server.py --port N`.

Used by the SIGTERM drain tests, which need the server as a subprocess they can signal.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from engine.front.async_engine import AsyncEngine  # noqa: E402
from server.cli import serve  # noqa: E402
from server.settings import ServerSettings  # noqa: E402
from tests.server.fake_engine import FakeEngine  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--drain-timeout", type=float, default=10.0)
    parser.add_argument("--step-delay", type=float, default=0.01)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    args = parser.parse_args()
    engine = AsyncEngine(FakeEngine(step_delay=args.step_delay, max_num_seqs=args.max_num_seqs))
    return serve(engine, ServerSettings(), port=args.port, drain_timeout=args.drain_timeout)


if __name__ == "__main__":
    sys.exit(main())
