"""Issue 14, items 3 and 4 on the fake engine: no field is ignored silently; X-Request-Id,
CORS, model aliases, tool messages, chat-template errors and never-admissible requests."""

from __future__ import annotations

import logging

import httpx
import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from openai import BadRequestError, OpenAI

from tests.server.fake_engine import FakeEngine, FakeTokenizer

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def http(fake_server):
    with httpx.Client(base_url=fake_server.url, timeout=30) as client:
        yield client


def error_of(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (COMPLETIONS, {"prompt": "x", "frobnicate": True}, "frobnicate"),
        (
            COMPLETIONS,
            {"prompt": "x", "guided_decoding_backend": "outlines"},
            "guided_decoding_backend",
        ),
        (CHAT, {"messages": USER, "functions": []}, "functions"),
        (CHAT, {"messages": USER, "audio": {"voice": "x"}}, "audio"),
        (CHAT, {"messages": [{"role": "user", "content": "hi", "extra": 1}]}, "messages.0.extra"),
        (CHAT, {"messages": USER, "stream": True, "stream_options": {"x": 1}}, "stream_options.x"),
        (CHAT, {"messages": USER, "speculation": {"k": 1}}, "speculation.k"),
    ],
)
def test_unknown_fields_are_400_naming_them(http, path, body, param):
    error = error_of(http.post(path, json=body))
    assert error["param"] == param and param in error["message"]


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_documented_no_op_fields_are_accepted(http, path):
    extras = {"user": "u1", "metadata": {"k": "v"}, "store": False, "service_tier": "auto"}
    body = {"prompt": "x"} if path == COMPLETIONS else {"messages": USER}
    plain = http.post(path, json={**body, "max_tokens": 4, "temperature": 0})
    with_extras = http.post(path, json={**body, **extras, "max_tokens": 4, "temperature": 0})
    assert plain.status_code == with_extras.status_code == 200
    choice = with_extras.json()["choices"][0]
    assert choice == plain.json()["choices"][0]


def test_request_id_is_taken_generated_echoed_and_logged(http, caplog):
    given = http.post(COMPLETIONS, json={"prompt": "x"}, headers={"X-Request-Id": "trace-42"})
    assert given.status_code == 200 and given.headers["x-request-id"] == "trace-42"
    made = http.post(COMPLETIONS, json={"prompt": "x"})
    first, second = made.headers["x-request-id"], http.get("/health").headers["x-request-id"]
    assert len(first) == 32 and first != second
    with caplog.at_level(logging.INFO, logger="server.errors"):
        bad = http.post(COMPLETIONS, json={"prompt": "x", "n": 0}, headers={"X-Request-Id": "b-1"})
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "b-1"
    assert any("request b-1 (cmpl-" in r.getMessage() for r in caplog.records)
    unusable = http.post(COMPLETIONS, json={"prompt": "x"}, headers={"X-Request-Id": "a b"})
    assert unusable.headers["x-request-id"] != "a b"


def test_request_id_is_echoed_on_guard_refusals(start_server):
    server = start_server(api_key="k")
    refused = httpx.post(server.url + COMPLETIONS, json={}, headers={"X-Request-Id": "r-401"})
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "r-401"


def test_cors_is_off_by_default(http):
    response = http.options(
        CHAT, headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    )
    assert "access-control-allow-origin" not in response.headers
    simple = http.post(COMPLETIONS, json={"prompt": "x"}, headers={"Origin": "https://a.example"})
    assert "access-control-allow-origin" not in simple.headers


def test_cors_allows_the_configured_origins(start_server):
    server = start_server(allowed_origins=("https://app.example",), api_key="k")
    preflight = httpx.options(
        server.url + CHAT,
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert preflight.status_code == 200  # before the API-key check: preflights carry no key
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    answer = httpx.post(
        server.url + COMPLETIONS,
        json={"prompt": "x"},
        headers={"Origin": "https://app.example", "Authorization": "Bearer k"},
    )
    assert answer.headers["access-control-allow-origin"] == "https://app.example"
    assert "x-request-id" in answer.headers["access-control-expose-headers"].lower()
    other = httpx.options(
        server.url + CHAT,
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert other.headers.get("access-control-allow-origin") != "https://evil.example"


def test_served_model_name_aliases(start_server):
    server = start_server(served_model_names=("main", "alias-a", "alias-b"))
    models = httpx.get(server.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["main", "alias-a", "alias-b"]
    for name in ("main", "alias-b"):
        ok = httpx.post(server.url + COMPLETIONS, json={"model": name, "prompt": "x"})
        assert ok.status_code == 200 and ok.json()["model"] == "main"
    assert httpx.get(server.url + "/v1/models/alias-a").json()["id"] == "alias-a"
    missing = httpx.post(server.url + COMPLETIONS, json={"model": "other", "prompt": "x"})
    assert error_of(missing, 404)["code"] == "model_not_found"


def test_tool_messages_and_assistant_tool_calls_are_accepted(fake_server):
    client = OpenAI(base_url=fake_server.api, api_key="x", max_retries=0)
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    response = client.chat.completions.create(model="fake-model", messages=messages, max_tokens=3)
    assert response.choices[0].finish_reason == "length"
    with pytest.raises(BadRequestError, match="tool_call_id"):
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "tool", "content": "x"}], max_tokens=3
        )


class _StrictTemplateTokenizer(FakeTokenizer):
    """Renders with jinja2 the way HF does, and refuses non-alternating roles."""

    TEMPLATE = (
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
        "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )

    def apply_chat_template(self, messages, add_generation_prompt=True):
        def raise_exception(message):
            raise jinja2.TemplateError(message)

        env = ImmutableSandboxedEnvironment()
        text = env.from_string(self.TEMPLATE).render(
            messages=messages, raise_exception=raise_exception
        )
        return self.encode(text)


def test_chat_template_errors_are_400(start_server):
    engine = FakeEngine()
    engine.tokenizer = _StrictTemplateTokenizer()
    server = start_server(engine)
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    response = httpx.post(server.url + CHAT, json={"messages": messages})
    error = error_of(response)
    assert error["param"] == "messages" and "roles must alternate" in error["message"]
    assert httpx.post(server.url + CHAT, json={"messages": USER}).status_code == 200


def test_never_admissible_n_is_400_transient_overload_is_503(start_server):
    server = start_server(FakeEngine(step_delay=0.05), max_num_in_flight=2)
    too_many = httpx.post(server.url + COMPLETIONS, json={"prompt": "x", "n": 3})
    error = error_of(too_many)
    assert error["param"] == "n" and "at most 2" in error["message"]
    fits = httpx.post(server.url + COMPLETIONS, json={"prompt": "x", "n": 2, "max_tokens": 2})
    assert fits.status_code == 200
