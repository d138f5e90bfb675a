"""Issue 16's proof: each poison request, sent at the same time as 4 normal requests to a server
on a real engine (tiny random Llama with a character tokenizer), gets a 4xx or a sane
completion, and the normal requests (greedy and seeded, streamed and not, completion and chat)
return exactly the text they return without it."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.conftest import build_tiny_llama
from tests.server.harness import run_server, wait_until
from tests.tiny_tokenizer import save_char_tokenizer

KEY = "sécret"
AUTH = {"Authorization": f"Bearer {KEY}".encode()}
NORMAL = [
    ("/v1/completions", {"prompt": "Once upon", "max_tokens": 12, "temperature": 0}),
    ("/v1/completions", {"prompt": "a time", "max_tokens": 12, "seed": 5, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12,
                              "stream": True, "temperature": 0.9, "seed": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "yo"}], "max_tokens": 12,
                              "temperature": 0, "n": 2}),
]  # fmt: skip
BIG = "x" * 3_500_000
# (route, body or raw bytes, extra headers, statuses allowed): the requests of issue 16.
POISON = [
    ("/v1/completions", {"prompt": "p", "temperature": 1e-50}, {}, {200}),
    ("/v1/completions", {"prompt": "p", "temperature": 1e-30, "top_p": 1e-300}, {}, {200}),
    ("/v1/completions", {"prompt": "p", "top_k": 10**20}, {}, {400}),
    ("/v1/completions", {"prompt": "p", "top_k": 2**63 - 1}, {}, {400}),
    ("/v1/completions", {"prompt": "p", "logit_bias": {"²": 1}}, {}, {400}),
    ("/v1/completions", {"prompt": "p", "stop_token_ids": [10**20]}, {}, {400}),
    ("/v1/completions", {"prompt": "p", "repetition_penalty": 5e-324}, {}, {400}),
    # Within the 1024-token context, but more than the whole 512-token KV pool.
    ("/v1/completions", {"prompt": [5] * 600}, {}, {400}),
    ("/v1/completions", {"prompt": [5] * 400, "max_tokens": 200}, {}, {400}),
    ("/v1/completions", {"prompt": [[5, 6]] * 128, "n": 128}, {}, {400}),
    ("/v1/completions", {"prompt": "p"}, {"Authorization": "Bearer sécret-x".encode()}, {401}),
    ("/v1/completions", b'{"prompt": "p"}', {"content-type": "text/plain"}, {415}),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, {}, {400}),
    ("/tokenize", {"prompt": BIG}, {}, {200}),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("tiny-chat"))
    save_char_tokenizer(path)
    # 32 blocks of 16 tokens: a 512-token pool, less than the 1024-token context.
    flat = dict(model=str(path), num_kv_blocks=32, block_size=16, max_num_batched_tokens=256)
    server = run_server(LLMEngine.from_config(EngineConfig.from_flat(flat)), api_key=KEY)
    yield server
    server.stop()


async def _send(client: httpx.AsyncClient, path: str, body, headers=None) -> tuple[int, list]:
    """(status, [text of each choice]) for plain and streamed answers alike."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**AUTH, "content-type": "application/json", **(headers or {})}
    response = await client.post(path, content=content, headers=headers)
    if response.status_code != 200 or path == "/tokenize":
        return response.status_code, []
    if not response.text.startswith("data:"):
        choices = response.json()["choices"]
        return 200, [c.get("text", c.get("message", {}).get("content")) for c in choices]
    texts: dict[int, str] = {}
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            assert "error" not in event, event
            for c in event["choices"]:
                piece = c.get("text", (c.get("delta") or {}).get("content")) or ""
                texts[c["index"]] = texts.get(c["index"], "") + piece
    return 200, [texts[i] for i in sorted(texts)]


async def _normals(client) -> list:
    return await asyncio.gather(*(_send(client, path, body) for path, body in NORMAL))


def test_no_poison_request_changes_a_normal_request(server):
    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            alone = await _normals(client)
            assert all(status == 200 and all(texts) for status, texts in alone), alone
            for path, body, headers, allowed in POISON:
                poison, *beside = await asyncio.gather(
                    _send(client, path, body, headers), _normals(client)
                )
                assert poison[0] in allowed, (body if len(str(body)) < 300 else path, poison)
                assert beside[0] == alone, (path, body)

    asyncio.run(run())
    stats = server.async_engine.stats
    assert wait_until(lambda: stats().num_free_blocks == stats().num_total_blocks, timeout=30)
