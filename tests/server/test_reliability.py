"""Edge behaviour of issue 16 that needs more than one request/response: credentials as bytes,
content types, per-request caps, tokenization off the event loop, and failures that are
answered and logged exactly once, with the connection kept alive."""

from __future__ import annotations

import asyncio
import logging
import threading

import httpx
import pytest

from engine.front.async_engine import AsyncEngine
from server.app import build_app
from server.settings import ServerSettings
from tests.server.fake_engine import FakeEngine
from tests.server.test_bad_inputs import COMPLETIONS, OK, assert_error_shape, assert_still_serving


def test_non_ascii_credentials_are_401_not_500(start_server):
    server = start_server(api_key="sécret")
    with httpx.Client(base_url=server.url) as client:
        for header in ("Bearer sécret-not", "Bearer \u00e9", "Bearer ñ", "ünicode"):
            raw = {"Authorization": header.encode("utf-8")}
            assert_error_shape(client.post(COMPLETIONS, json=OK, headers=raw), 401)
        good = {"Authorization": "Bearer sécret".encode()}
        assert client.post(COMPLETIONS, json=OK, headers=good).status_code == 200


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data; boundary=x", 415),
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("Application/JSON", 200),
        ("application/vnd.api+json", 200),
    ],
)
def test_only_json_bodies_are_accepted(fake_server, content_type, status):
    body = b'{"prompt": "hello", "max_tokens": 3}'
    with httpx.Client(base_url=fake_server.url) as client:
        response = client.post(COMPLETIONS, content=body, headers={"content-type": content_type})
        if status == 200:
            assert response.status_code == 200, response.text
        else:
            assert "application/json" in assert_error_shape(response, status)["message"]


def test_the_per_request_caps_are_configurable(start_server):
    server = start_server(max_seqs_per_request=4, max_tokens_per_request=100)
    with httpx.Client(base_url=server.url) as client:
        five = client.post(COMPLETIONS, json={"prompt": ["a", "b", "c", "d", "e"]})
        assert "at most 4" in assert_error_shape(five, 400)["message"]
        many = client.post(COMPLETIONS, json={"prompt": ["a", "b"], "n": 2, "max_tokens": 30})
        error = assert_error_shape(many, 400)
        assert error["param"] == "max_tokens" and "128 tokens" in error["message"]
        chat = {"messages": [{"role": "user", "content": "hi"}]}  # no max_tokens: up to 512
        assert_error_shape(client.post("/v1/chat/completions", json=chat), 400)
        fits = {"prompt": ["a", "b"], "n": 2, "max_tokens": 20}
        assert client.post(COMPLETIONS, json=fits).status_code == 200


def test_long_text_is_tokenized_off_the_event_loop(start_server):
    server = start_server()
    tokenizer = server.engine.tokenizer
    threads: list[int] = []
    encode, decode = tokenizer.encode, tokenizer.decode

    def recording(work):
        def run(*args, **kwargs):
            threads.append(threading.get_ident())
            return work(*args, **kwargs)

        return run

    tokenizer.encode, tokenizer.decode = recording(encode), recording(decode)
    big = "a" * 3_500_000
    with httpx.Client(base_url=server.url, timeout=60) as client:
        assert client.post("/tokenize", json={"prompt": big}).json()["count"] == len(big) + 1
        chat = {"messages": [{"role": "user", "content": big}]}
        assert client.post("/tokenize", json=chat).status_code == 200
        assert client.post("/detokenize", json={"tokens": [5] * 20_000}).status_code == 200
        assert client.post("/tokenize", json={"prompt": "short"}).status_code == 200
    loop_thread = server.thread.ident
    assert len(threads) >= 4 and threads[-1] == loop_thread  # short text stays on the loop
    assert loop_thread not in threads[:-1]


class BrokenEngine(FakeEngine):
    def admit(self, *args, **kwargs):
        raise RuntimeError("planted bug")


def test_a_bug_is_one_500_one_log_line_and_never_escapes_the_app(caplog):
    app = build_app(AsyncEngine(BrokenEngine()), ServerSettings())

    async def run() -> list[httpx.Response]:
        # raise_app_exceptions: an exception leaving the app (which uvicorn would log with a
        # second traceback) fails the test.
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                return [await client.post(COMPLETIONS, json=OK) for _ in range(2)]

    with caplog.at_level(logging.INFO):
        responses = asyncio.run(run())
    for response in responses:
        assert "RuntimeError" in assert_error_shape(response, 500)["message"]
    failures = [r for r in caplog.records if "failed: 500" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info is None for r in failures)
    assert all("cmpl-" in r.getMessage() and "planted bug" in r.getMessage() for r in failures)
    assert not [r for r in caplog.records if r.exc_info and r.levelno > logging.DEBUG]


def test_client_errors_are_logged_in_one_line(fake_server, caplog):
    with caplog.at_level(logging.INFO), httpx.Client(base_url=fake_server.url) as client:
        assert_error_shape(client.post(COMPLETIONS, json={**OK, "top_k": 10**20}), 400)
        assert_still_serving(client)
    lines = [r.getMessage() for r in caplog.records if "failed: 400" in r.getMessage()]
    assert len(lines) == 1 and "top_k" in lines[0] and "POST /v1/completions" in lines[0]
