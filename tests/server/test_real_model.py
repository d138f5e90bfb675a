"""End to end on the real SmolLM2-135M: one uvicorn server (one model load) for the module,
driven by the openai SDK and raw httpx; plus `python -m server` as a subprocess for SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
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


def test_cli_serves_and_drains_on_sigterm(smollm2_path, tmp_path):
    port = free_port()
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE_FLAGS.items()]
    command = [sys.executable, "-m", "server", "--model", str(smollm2_path), "--port", str(port)]
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(command + flags, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        assert wait_until(healthy, timeout=180), (tmp_path / "server.log").read_text()[-3000:]
        body = {"prompt": PROMPT, "max_tokens": 24, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
            process.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][len("data: ") :])["choices"][0]["finish_reason"] == "length"
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
