"""End to end on the real SmolLM2-135M: one uvicorn server (one model load) for the module,
driven by the openai SDK and raw httpx; plus `python -m server` as a subprocess for SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.server.harness import free_port, run_server, wait_until

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
REPO = Path(__file__).resolve().parents[2]
ENGINE_FLAGS = {"max_model_len": 1024, "num_kv_blocks": 96, "block_size": 16}


@pytest.fixture(scope="module")
def real_server(smollm2_path):
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    config = EngineConfig.from_flat({"model": str(smollm2_path), **ENGINE_FLAGS})
    server = run_server(LLMEngine.from_config(config), served_model_names=("smollm2",))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(real_server) -> OpenAI:
    return OpenAI(base_url=real_server.api, api_key="unused", max_retries=0, timeout=120)


def all_blocks_free(server) -> bool:
    stats = server.async_engine.stats()
    return stats.num_running == stats.num_waiting == 0 and (
        stats.num_free_blocks == stats.num_total_blocks
    )


def test_greedy_completion_streamed_and_not(client):
    full = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0)
    assert "Paris" in full.choices[0].text
    assert full.usage.completion_tokens == 8 or full.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == full.choices[0].text


def test_chat_non_stream_and_stream(client):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    response = client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=12, temperature=0
    )
    text = response.choices[0].message.content
    assert "Paris" in text
    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=messages,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == response.usage.completion_tokens


def test_n_seed_logprobs_and_echo(client):
    def sample():
        return client.completions.create(
            model="smollm2", prompt=PROMPT, max_tokens=6, n=2, seed=7, temperature=1.0, logprobs=2
        )

    first, second = sample(), sample()
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert all(len(c.logprobs.tokens) == len(c.logprobs.text_offset) for c in first.choices)
    assert all(len(top) <= 2 for c in first.choices for top in c.logprobs.top_logprobs)
    echo = client.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1
    )
    choice = echo.choices[0]
    assert choice.text == PROMPT
    assert choice.logprobs.token_logprobs[0] is None
    assert len(choice.logprobs.tokens) == echo.usage.prompt_tokens
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs[1:])


def test_stop_string(client):
    full = (
        client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=16, temperature=0)
        .choices[0]
        .text
    )
    stop = full.strip().split()[1]  # the second word of the greedy continuation
    expected = full[: full.index(stop)]
    response = client.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop]
    )
    assert response.choices[0].text == expected
    assert response.choices[0].finish_reason == "stop"


def test_bad_inputs_on_the_real_model(real_server):
    url = real_server.api + "/completions"
    outside = httpx.post(url, json={"prompt": [1, 49152], "max_tokens": 2})
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "prompt"
    too_long = httpx.post(url, json={"prompt": PROMPT, "max_tokens": 5000})
    assert too_long.status_code == 400 and "1024" in too_long.json()["error"]["message"]


async def _stream(client: httpx.AsyncClient, i: int, hang_up_after: int | None):
    body = {"prompt": f"{i}. {PROMPT}", "max_tokens": 8, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        lines = []
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                lines.append(json.loads(line[len("data: ") :]))
            if hang_up_after is not None and len(lines) >= hang_up_after:
                return None
        return lines[-1]["usage"]


def test_concurrent_streams_and_disconnects_free_every_block(real_server):
    async def main():
        async with httpx.AsyncClient(base_url=real_server.url, timeout=120) as client:
            plan = [None] * 6 + [1, 2, 3, 1, 2, 0]
            return await asyncio.gather(*(_stream(client, i, n) for i, n in enumerate(plan)))

    results = asyncio.run(main())
    assert all(usage["completion_tokens"] == 8 for usage in results[:6])
    assert wait_until(lambda: all_blocks_free(real_server), timeout=30)


@contextmanager
def cli_server(model: Path, log_path: Path, *flags: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """`python -m server` on SmolLM2 as a subprocess (so it can be signalled), killed at exit."""
    port = free_port()
    engine_flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE_FLAGS.items()]
    command = [sys.executable, "-m", "server", "--model", str(model), "--port", str(port)]
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command + engine_flags + list(flags), cwd=REPO, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(url + "/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        assert wait_until(healthy, timeout=300), log_path.read_text()[-3000:]
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def stream_lines(url: str, max_tokens: int, started: threading.Event, lines: list[str]) -> None:
    """Stream one completion, collecting its `data:` lines; `started` is set at the first."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                lines.append(line)
                started.set()


def assert_finished(lines: list[str], max_tokens: int) -> None:
    assert lines[-1] == "data: [DONE]", lines[-3:]
    last = json.loads(lines[-2][len("data: ") :])
    assert last["choices"][0]["finish_reason"] == "length", last
    text_chunks = [json.loads(x[6:]) for x in lines[:-1]]
    assert sum(1 for c in text_chunks if c["choices"][0]["text"]) <= max_tokens


# The drain must finish what it admitted; how long that takes depends on the machine's load
# (other test runs, other users), so the drain timeout here is generous: what is tested is that
# the streams end with a finish_reason and the process exits 0, not how fast.
DRAIN_FLAGS = ("--drain-timeout=240",)


def test_cli_serves_and_drains_on_sigterm(smollm2_path, tmp_path):
    with cli_server(smollm2_path, tmp_path / "server.log", *DRAIN_FLAGS) as (process, url):
        started, lines = threading.Event(), []
        client = threading.Thread(target=stream_lines, args=(url, 24, started, lines))
        client.start()
        assert started.wait(300)
        process.send_signal(signal.SIGTERM)
        client.join(300)
        assert_finished(lines, 24)
        assert process.wait(300) == 0


@pytest.fixture
def cpu_hogs() -> Iterator[list[subprocess.Popen]]:
    """Two CPU-bound processes beside the test (each stops by itself after 10 minutes), killed
    when the test ends."""
    spin = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    yield hogs
    for hog in hogs:
        hog.kill()
        hog.wait()


def test_drain_finishes_every_stream_beside_two_cpu_hogs(smollm2_path, tmp_path, cpu_hogs):
    """Issue 25: with two busy processes beside the server, SIGTERM while 4 streams run: each
    ends with finish_reason "length" (none with the drain-timeout error), and the exit is 0.
    The default 30 s drain timeout: 4 x 64 tokens need a few seconds at a fair share of the
    cores; a collapse (threads waiting at barriers for descheduled ones: ~1 token/s) cannot
    make it."""
    with cli_server(smollm2_path, tmp_path / "server.log") as (process, url):
        assert all(hog.poll() is None for hog in cpu_hogs)
        runs = [(threading.Event(), []) for _ in range(4)]
        clients = [threading.Thread(target=stream_lines, args=(url, 64, e, x)) for e, x in runs]
        for client in clients:
            client.start()
        assert all(started.wait(300) for started, _ in runs)
        process.send_signal(signal.SIGTERM)
        for client in clients:
            client.join(300)
        for _, lines in runs:
            assert_finished(lines, 64)
        assert process.wait(300) == 0
        assert "drain timeout" not in (tmp_path / "server.log").read_text()
