"""Long fuzzing run of the HTTP API (issue 16): the fuzzers of tests/server/test_api_fuzz.py for
minutes instead of seconds, against a live server on the fake engine or on a real engine with
a tiny random Llama and a character tokenizer, then the issue's poison requests.

Reports the cases tried, the answers by status class, and each distinct failure (a 5xx, an
error body not in OpenAI's shape, a dropped connection, a dead or leaking server after) with a
body that reproduces it; writes .bench/fuzz_api_<engine>.json and a section of
docs/reliability.md.

    python benchmarks/fuzz_api.py --minutes 10 --engine tiny
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import schemathesis  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from benchmarks.fuzz_report import Tally, poison_phase, write_report  # noqa: E402
from server.openapi import json_body  # noqa: E402
from server.protocol import (  # noqa: E402
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from tests.server.harness import run_server  # noqa: E402
from tests.strategies import CONDITIONAL_FIELDS, hostile_bodies  # noqa: E402

BODIES = {
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}
CHUNK = 100  # examples per Hypothesis run; runs repeat (fresh seeds) until the phase's time is up


def make_engine(kind: str):
    if kind == "fake":
        from tests.server.fake_engine import FakeEngine

        return FakeEngine(max_model_len=256)
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from tests.conftest import build_tiny_llama
    from tests.tiny_tokenizer import save_char_tokenizer

    model = save_char_tokenizer(build_tiny_llama(Path(tempfile.mkdtemp(prefix="fuzz-tiny-"))))
    # 8 blocks of 16 = 128 tokens, less than the 1024-token context: some requests can never
    # fit, requests preempt each other, and a chat without max_tokens ends soon.
    flat = {"model": str(model), "num_kv_blocks": 8, "max_num_batched_tokens": 128}
    return LLMEngine.from_config(EngineConfig.from_flat(flat))


def openapi_document(app) -> dict:
    """The app's own schema; request bodies added where a route does not state its own."""
    document = app.openapi()
    for path, model in BODIES.items():
        document["paths"][path]["post"].setdefault("requestBody", json_body(model)["requestBody"])
    return document


def repeat_until(deadline: float, run_chunk) -> None:
    while time.monotonic() < deadline:
        try:
            run_chunk()
        except Unsatisfiable:  # no invalid input exists for this operation
            return


def schemathesis_phase(server, document, tally: Tally, seconds: float) -> None:
    schema = schemathesis.openapi.from_dict(document)
    operations = [result.ok() for result in schema.get_all_operations()]
    deadline = time.monotonic() + seconds
    for index, operation in enumerate(operations):
        share = (deadline - time.monotonic()) / (len(operations) - index)
        has_inputs = len(operation.body) + len(operation.path_parameters) + len(operation.query)
        modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)[: 2 if has_inputs else 1]
        for mode in modes:

            @settings(max_examples=CHUNK, deadline=None, suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def fuzz(case):
                tally.send(lambda: case.call(base_url=server.url, timeout=60), case)

            repeat_until(time.monotonic() + share / 2, fuzz)


def hostile_phase(server, tally: Tally, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for index, path in enumerate(BODIES):
            share = (deadline - time.monotonic()) / (len(BODIES) - index)
            repeat_until(time.monotonic() + share, _hostile_fuzzer(client, path, tally))


def _hostile_fuzzer(client: httpx.Client, path: str, tally: Tally):
    schema = json_body(BODIES[path])["requestBody"]["content"]["application/json"]["schema"]

    @settings(max_examples=CHUNK, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=hostile_bodies(schema, omit=CONDITIONAL_FIELDS))
    def fuzz(body):
        content = json.dumps(body).encode()  # NaN and Infinity as Python writes them
        headers = {"content-type": "application/json"}
        tally.send(lambda: client.post(path, content=content, headers=headers), body, path)

    return fuzz


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--engine", choices=("fake", "tiny"), default="fake")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "reliability.md")
    args = parser.parse_args()
    server = run_server(make_engine(args.engine))
    tally, seconds = Tally(), args.minutes * 60
    started = time.monotonic()
    try:
        document = openapi_document(server.server.config.app)
        schemathesis_phase(server, document, tally.phase("schemathesis"), 0.45 * seconds)
        hostile_phase(server, tally.phase("hostile fields"), 0.5 * seconds)
        poison_phase(server, tally.phase("issue 16 poison + 4 normal"))
        tally.check_alive(server)
    finally:
        server.stop()
    elapsed = time.monotonic() - started
    report = write_report(tally, args.engine, args.minutes, elapsed, args.out, REPO)
    print(report)
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
