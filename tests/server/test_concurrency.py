"""Many clients at once: disconnects abort and free every KV block; concurrent streams complete."""

from __future__ import annotations

import asyncio
import json
import random

import httpx

from tests.server.fake_engine import FakeEngine
from tests.server.harness import wait_until


def sse_payloads(text: str) -> list[dict]:
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


async def _hang_up(client: httpx.AsyncClient, chunks_to_read: int, seed: int) -> None:
    body = {"prompt": f"client {seed}", "max_tokens": 300, "stream": True, "ignore_eos": True}
    if chunks_to_read < 0:  # hang up before the response headers arrive
        try:
            await asyncio.wait_for(client.post("/v1/completions", json=body), timeout=0.001)
        except asyncio.TimeoutError:
            pass
        return
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        read = 0
        async for _ in response.aiter_lines():
            read += 1
            if read >= chunks_to_read:
                break


def test_fifty_clients_hanging_up_abort_and_free_all_blocks(start_server):
    fake = FakeEngine(step_delay=0.003, num_blocks=2048, block_size=4)
    server = start_server(fake)
    rng = random.Random(0)
    plan = [rng.randint(-1, 30) for _ in range(50)]

    async def main() -> None:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:
            await asyncio.gather(*(_hang_up(client, n, i) for i, n in enumerate(plan)))

    asyncio.run(main())

    def idle() -> bool:
        stats = server.async_engine.stats()
        return not fake.requests and stats.num_free_blocks == stats.num_total_blocks

    assert wait_until(idle, timeout=10), (len(fake.requests), fake.num_free_blocks)
    # Clients that hung up before sending may never reach the engine; every one that did was
    # aborted (none could reach 300 tokens).
    assert fake.num_added >= sum(1 for n in plan if n >= 0)
    assert fake.num_aborted == fake.num_added
    assert server.async_engine.num_in_flight == 0
    assert httpx.get(server.url + "/health").status_code == 200


def test_non_streaming_client_timeout_aborts(start_server):
    fake = FakeEngine(step_delay=0.01)
    server = start_server(fake, disconnect_poll_s=0.02)
    body = {"prompt": "slow", "max_tokens": 400, "ignore_eos": True}
    try:
        httpx.post(server.url + "/v1/completions", json=body, timeout=0.2)
    except httpx.TimeoutException:
        pass
    assert wait_until(lambda: fake.num_aborted == 1 and not fake.requests, timeout=5)
    assert fake.num_free_blocks == fake.num_total_blocks


async def _stream_one(client: httpx.AsyncClient, i: int) -> tuple[int, str, dict]:
    max_tokens = 4 + i % 13
    body = {
        "prompt": f"request number {i}",
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "seed": i,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200
    payloads = sse_payloads(response.text)
    text = "".join(p["choices"][0]["text"] for p in payloads if p["choices"])
    return max_tokens, text, payloads[-1]["usage"]


def test_sixty_four_concurrent_streams_complete(start_server):
    server = start_server(FakeEngine(step_delay=0.001, max_num_seqs=16))

    async def main():
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            return await asyncio.gather(*(_stream_one(client, i) for i in range(64)))

    results = asyncio.run(main())
    for i, (max_tokens, text, usage) in enumerate(results):
        assert len(text) == max_tokens  # one character per fake token
        assert usage["completion_tokens"] == max_tokens
        assert usage["prompt_tokens"] == len(f"request number {i}") + 1
        assert usage["total_tokens"] == usage["prompt_tokens"] + max_tokens
    stats = server.async_engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks
