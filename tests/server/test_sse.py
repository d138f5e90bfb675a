"""Raw SSE framing, usage chunks, errors after streaming began, health, tokenize, metrics."""

from __future__ import annotations

import json

import httpx
import pytest

from server.responses import (
    ChatChunkChoice,
    ChatCompletionChunk,
    CompletionChoice,
    CompletionResponse,
    DeltaMessage,
)
from server.streaming import ChunkTemplate, sse_event
from tests.server.fake_engine import FakeEngine
from tests.server.harness import wait_until


def events(response: httpx.Response) -> list[str]:
    assert response.text.endswith("\n\n")
    return response.text[:-2].split("\n\n")


def test_completion_stream_framing_and_usage_chunk(fake_server):
    body = {
        "prompt": "abc",
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = httpx.post(fake_server.url + "/v1/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = events(response)
    assert all(f.startswith("data: ") for f in frames)
    assert frames[-1] == "data: [DONE]"
    chunks = [json.loads(f[len("data: ") :]) for f in frames[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert [c["usage"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}


def test_stream_without_include_usage_has_no_usage_chunk(fake_server):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stream": True}
    response = httpx.post(fake_server.url + "/v1/chat/completions", json=body)
    chunks = [json.loads(f[len("data: ") :]) for f in events(response)[:-1]]
    assert all(c["choices"] for c in chunks)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_engine_death_mid_stream_sends_error_event_then_done(start_server):
    server = start_server(FakeEngine(fail_at_step=4))
    body = {"prompt": "abc", "max_tokens": 50, "stream": True}
    response = httpx.post(server.url + "/v1/completions", json=body)
    assert response.status_code == 200
    frames = events(response)
    assert frames[-1] == "data: [DONE]"
    error = json.loads(frames[-2][len("data: ") :])["error"]
    assert "injected engine failure" in error["message"]
    assert len(frames) == 2 + 3  # three tokens made it out before step 4 failed
    health = httpx.get(server.url + "/health")
    assert health.status_code == 503 and "engine thread died" in health.json()["error"]["message"]
    after = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert after.status_code == 503 and after.json()["error"]["type"]


def test_engine_death_fails_non_streaming_requests(start_server):
    server = start_server(FakeEngine(fail_at_step=2))
    response = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 9})
    assert response.status_code == 503
    assert "injected engine failure" in response.json()["error"]["message"]


def test_tokenize_and_detokenize_round_trip(fake_server):
    url = fake_server.url
    tokens = httpx.post(url + "/tokenize", json={"prompt": "hi there"}).json()
    assert tokens["count"] == len(tokens["tokens"]) == 9 and tokens["max_model_len"] == 512
    text = httpx.post(url + "/detokenize", json={"tokens": tokens["tokens"]}).json()
    assert text == {"prompt": "hi there"}
    chat = httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "x"}]})
    assert chat.json()["count"] == len("user: x\nassistant: ") + 1


def test_metrics_count_generated_tokens(start_server):
    server = start_server()
    httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5})

    def counted() -> bool:
        text = httpx.get(server.url + "/metrics").text
        return 'goodspeed:generation_tokens_total{model_name="fake-model"} 5.0' in text

    assert wait_until(counted)


def test_version_and_served_model_name(start_server):
    server = start_server(served_model_names=("my-alias",))
    assert "version" in httpx.get(server.url + "/version").json()
    models = httpx.get(server.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["my-alias"]
    ok = httpx.post(server.url + "/v1/completions", json={"model": "my-alias", "prompt": "x"})
    assert ok.status_code == 200 and ok.json()["model"] == "my-alias"


class _BrokenTokenizerEngine(FakeEngine):
    def __init__(self) -> None:
        super().__init__()
        self.tokenizer.encode = self._explode  # type: ignore[method-assign]

    @staticmethod
    def _explode(*args, **kwargs):
        raise RuntimeError("tokenizer bug")


def test_a_server_bug_is_a_500_in_error_shape(start_server):
    server = start_server(_BrokenTokenizerEngine())
    response = httpx.post(server.url + "/v1/completions", json={"prompt": "x"})
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "internal error: RuntimeError"
    assert httpx.get(server.url + "/health").status_code == 200


TRICKY_TEXTS = ["", "plain", 'quote " and \\ backslash', "new\nline\ttab\r\x00\x01\x1f\x7f",
                "é ü 中文 😀", "\u2028\u2029", "</script>", "\ufffd"]  # fmt: skip


@pytest.mark.parametrize("text", TRICKY_TEXTS)
@pytest.mark.parametrize("finish_reason", [None, "length"])
def test_pre_encoded_chunks_equal_the_pydantic_ones(text, finish_reason):
    chat = dict(id="chatcmpl-1", created=7, model='m "x"')
    envelope = ChatCompletionChunk(**chat, choices=[])
    choice = ChatChunkChoice(index=2, delta=DeltaMessage(content=text), finish_reason=finish_reason)
    expected = sse_event(ChatCompletionChunk(**chat, choices=[choice]))
    assert ChunkTemplate(envelope).chat(2, text, finish_reason) == expected
    envelope = CompletionResponse(id="cmpl-1", created=7, model="m", choices=[])
    choice = CompletionChoice(index=1, text=text, finish_reason=finish_reason)
    expected = sse_event(CompletionResponse(id="cmpl-1", created=7, model="m", choices=[choice]))
    assert ChunkTemplate(envelope).completion(1, text, finish_reason) == expected
