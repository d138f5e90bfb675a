"""Hostile and mistaken requests: each gets a 4xx in OpenAI's error shape, never a 500, and the
server keeps serving normal requests afterwards."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.fake_engine import FakeEngine

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
OK = {"prompt": "hello", "max_tokens": 3}
USER = [{"role": "user", "content": "hi"}]


def completion(**fields):
    return {**OK, **fields}


def chat(**fields):
    return {"messages": USER, "max_tokens": 3, **fields}


# (path, body: dict -> JSON, bytes -> raw, status, param named in the error or None)
CASES = [
    (COMPLETIONS, b"{", 400, None),
    (COMPLETIONS, b"", 400, None),
    (COMPLETIONS, b"[1, 2]", 400, None),
    (COMPLETIONS, b'"just a string"', 400, None),
    (COMPLETIONS, b'{"prompt": "\xff\xfe bad utf-8"}', 400, None),
    (COMPLETIONS, b'{"prompt": "x", "temperature": NaN}', 400, None),
    (COMPLETIONS, {}, 400, "prompt"),
    (COMPLETIONS, {"prompt": 5}, 400, "prompt"),
    (COMPLETIONS, {"prompt": None}, 400, "prompt"),
    (COMPLETIONS, completion(prompt=""), 400, "prompt"),
    (COMPLETIONS, completion(prompt=[]), 400, "prompt"),
    (COMPLETIONS, completion(prompt=[[]]), 400, "prompt"),
    (COMPLETIONS, completion(prompt=[1, "a"]), 400, "prompt"),
    (COMPLETIONS, completion(prompt=[-1, 5]), 400, "prompt"),
    (COMPLETIONS, completion(prompt=[100_000]), 400, "prompt"),
    (COMPLETIONS, completion(prompt=[[5, 6], [99_999]]), 400, "prompt"),
    (COMPLETIONS, completion(prompt=["x"] * 1000), 400, "prompt"),
    (COMPLETIONS, completion(prompt="x" * 4000), 400, "prompt"),
    (COMPLETIONS, completion(prompt="y" * 100_000), 400, "prompt"),  # tokenized off the loop
    (COMPLETIONS, completion(max_tokens="16"), 400, "max_tokens"),
    (COMPLETIONS, completion(max_tokens=-1), 400, "max_tokens"),
    (COMPLETIONS, completion(max_tokens=10**12), 400, "max_tokens"),
    (COMPLETIONS, completion(max_tokens=1.5), 400, "max_tokens"),
    (COMPLETIONS, completion(max_tokens=0), 400, "max_tokens"),
    (COMPLETIONS, completion(temperature=-1), 400, "temperature"),
    (COMPLETIONS, completion(temperature="hot"), 400, "temperature"),
    (COMPLETIONS, b'{"prompt": "x", "temperature": 1e999}', 400, "temperature"),
    (COMPLETIONS, completion(top_p=0), 400, "top_p"),
    (COMPLETIONS, completion(top_p=1.5), 400, "top_p"),
    (COMPLETIONS, completion(n=0), 400, "n"),
    (COMPLETIONS, completion(n=1000), 400, "n"),
    (COMPLETIONS, completion(n=True), 400, "n"),
    (COMPLETIONS, completion(logprobs=1000), 400, "logprobs"),
    (COMPLETIONS, completion(logprobs=-1), 400, "logprobs"),
    (COMPLETIONS, completion(stop=[f"s{i}" for i in range(100)]), 400, "stop"),
    (COMPLETIONS, completion(stop=[""]), 400, "stop"),
    (COMPLETIONS, completion(stop=5), 400, "stop"),
    (COMPLETIONS, completion(presence_penalty=5), 400, "presence_penalty"),
    (COMPLETIONS, completion(frequency_penalty=-3), 400, "frequency_penalty"),
    (COMPLETIONS, completion(seed="abc"), 400, "seed"),
    (COMPLETIONS, completion(seed=2**70), 400, "seed"),
    (COMPLETIONS, completion(logit_bias={"abc": 1}), 400, "logit_bias"),
    (COMPLETIONS, completion(logit_bias={"5": 500}), 400, "logit_bias"),
    (COMPLETIONS, completion(logit_bias={"99999999": 1}), 400, "logit_bias"),
    (COMPLETIONS, completion(suffix="tail"), 400, "suffix"),
    (COMPLETIONS, completion(best_of=3), 400, "best_of"),
    (COMPLETIONS, completion(stream="yes"), 400, "stream"),
    (COMPLETIONS, completion(stream_options={"include_usage": True}), 400, "stream_options"),
    (COMPLETIONS, completion(echo="true"), 400, "echo"),
    (COMPLETIONS, completion(top_k=-5), 400, "top_k"),
    (COMPLETIONS, completion(repetition_penalty=0), 400, "repetition_penalty"),
    (COMPLETIONS, completion(min_tokens=10), 400, "min_tokens"),
    (COMPLETIONS, completion(stop_token_ids=[-1]), 400, "stop_token_ids"),
    (COMPLETIONS, completion(model="no-such-model"), 404, "model"),
    # Issue 16: values that fit JSON but not the engine's int64 / int32 / float32 arithmetic.
    (COMPLETIONS, completion(top_k=2**63 - 1), 400, "top_k"),
    (COMPLETIONS, completion(top_k=10**20), 400, "top_k"),
    (COMPLETIONS, completion(stop_token_ids=[10**20]), 400, "stop_token_ids"),
    (COMPLETIONS, completion(stop_token_ids=[5, 99]), 400, "stop_token_ids"),  # vocab is 99
    (COMPLETIONS, completion(min_tokens=2**64, max_tokens=None), 400, "min_tokens"),
    (COMPLETIONS, completion(repetition_penalty=1e-300), 400, "repetition_penalty"),
    (COMPLETIONS, completion(logit_bias={"²": 1}), 400, "logit_bias"),
    (COMPLETIONS, completion(logit_bias={"٣": 1}), 400, "logit_bias"),
    (COMPLETIONS, completion(logit_bias={"9" * 5000: 1}), 400, "logit_bias"),
    (COMPLETIONS, completion(prompt=["x"] * 128, n=128), 400, "n"),
    (COMPLETIONS, completion(prompt=["x"] * 100, n=100, max_tokens=100), 400, "n"),
    (CHAT, chat(messages=[{"role": "user"}]), 400, "messages.0.content"),
    (
        CHAT,
        chat(messages=[USER[0], {"role": "assistant", "content": None}]),
        400,
        "messages.1.content",
    ),
    ("/tokenize", {"messages": [{"role": "user"}]}, 400, "messages.0.content"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"max_tokens": 3}, 400, "messages"),
    (CHAT, {"messages": "hi"}, 400, "messages"),
    (CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages.0.role"),
    (CHAT, chat(messages=[{"content": "hi"}]), 400, "messages.0.role"),
    (CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "messages.0.content"),
    (
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]),
        400,
        "messages.0.content",
    ),
    (CHAT, chat(top_logprobs=5), 400, "top_logprobs"),
    (CHAT, chat(logprobs=True, top_logprobs=100), 400, "top_logprobs"),
    (CHAT, chat(max_completion_tokens=-5), 400, "max_completion_tokens"),
    (CHAT, chat(max_tokens=0), 400, "max_tokens"),
    (CHAT, chat(logprobs="yes"), 400, "logprobs"),
    (CHAT, chat(max_tokens=100_000), 400, "max_tokens"),
    (CHAT, chat(model="gpt-4"), 404, "model"),
    ("/tokenize", {}, 400, "prompt"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
]


@pytest.fixture(scope="module")
def http(fake_server):
    with httpx.Client(base_url=fake_server.url, timeout=30) as client:
        yield client


def assert_error_shape(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    return error


def assert_still_serving(http: httpx.Client) -> None:
    response = http.post(COMPLETIONS, json=OK)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3


def test_there_are_at_least_forty_bad_inputs():
    assert len(CASES) >= 40


@pytest.mark.parametrize(("path", "body", "status", "param"), CASES)
def test_bad_input(http, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = http.post(path, content=content, headers={"content-type": "application/json"})
    error = assert_error_shape(response, status)
    if param is not None:
        assert error["param"] == param
        assert param.split(".")[0] in error["message"]
    assert_still_serving(http)


def test_unknown_route_and_wrong_method(http):
    assert_error_shape(http.get("/v1/nothing-here"), 404)
    assert_error_shape(http.get(COMPLETIONS), 405)
    assert_still_serving(http)


def test_oversized_body_is_413_with_and_without_content_length(http):
    big = json.dumps({"prompt": "x" * (10 * 2**20)}).encode()
    assert_error_shape(http.post(COMPLETIONS, content=big), 413)

    def chunked():  # no Content-Length: the limit applies while reading
        for start in range(0, len(big), 2**20):
            yield big[start : start + 2**20]

    assert_error_shape(http.post(COMPLETIONS, content=chunked()), 413)
    assert_still_serving(http)


def test_api_key(start_server):
    server = start_server(api_key="sekret")
    with httpx.Client(base_url=server.url) as client:
        assert_error_shape(client.post(COMPLETIONS, json=OK), 401)
        wrong = {"Authorization": "Bearer nope"}
        assert_error_shape(client.post(COMPLETIONS, json=OK, headers=wrong), 401)
        good = {"Authorization": "Bearer sekret"}
        assert client.post(COMPLETIONS, json=OK, headers=good).status_code == 200
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200


def test_full_queue_is_503_with_retry_after(start_server):
    server = start_server(FakeEngine(step_delay=0.02), max_num_in_flight=1)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        body = {"prompt": "x", "max_tokens": 100, "stream": True}
        with client.stream("POST", COMPLETIONS, json=body) as first:
            assert first.status_code == 200
            busy = client.post(COMPLETIONS, json=OK)
            assert_error_shape(busy, 503)
            assert busy.headers["retry-after"] == "1"
        assert server.async_engine.num_in_flight <= 1
