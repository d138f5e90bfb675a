"""Schema-driven fuzzing of the HTTP API (issue 16), bounded for CI: requests generated from
the app's own OpenAPI schema (Schemathesis: valid and schema-violating data), then plausible
bodies with hostile fields, sent to a live server on the fake engine. No answer may be a 5xx,
every 4xx is OpenAI-shaped, and the server serves normally afterwards with every block free.
The long run of the same fuzzers is benchmarks/fuzz_api.py."""

from __future__ import annotations

import json
import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from engine.front.async_engine import AsyncEngine
from server.app import build_app
from server.openapi import json_body
from server.protocol import ChatCompletionRequest, CompletionRequest
from tests.server.fake_engine import FakeEngine
from tests.server.harness import run_server, wait_until
from tests.server.test_bad_inputs import assert_still_serving
from tests.strategies import CONDITIONAL_FIELDS, hostile_bodies

EXAMPLES = int(os.environ.get("GOODSPEED_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
# The schema of an app built as the served one is (the parametrization needs it at import).
SCHEMA = schemathesis.openapi.from_dict(build_app(AsyncEngine(FakeEngine())).openapi())
SCHEMA.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
JSON = {"content-type": "application/json"}
ROUTES = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}


@pytest.fixture(scope="module")
def server():
    server = run_server(FakeEngine(max_model_len=256))
    yield server
    server.stop()


def check_answer(status: int, content_type: str, body: bytes, sent: object) -> None:
    assert status < 500, (status, body[:500], sent)
    if status >= 400 and content_type.startswith("application/json"):
        error = httpx.Response(status, content=body).json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], body


@SCHEMA.parametrize()
@FUZZ
def test_schema_generated_requests_never_get_a_5xx(case, server):
    response = case.call(base_url=server.url, timeout=30)
    content_type = (response.headers.get("content-type") or [""])[0]  # header -> list of values
    check_answer(response.status_code, content_type, response.content, case.body)


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_hostile_fields_never_get_a_5xx(server, path):
    schema = json_body(ROUTES[path])["requestBody"]["content"]["application/json"]["schema"]

    @FUZZ
    @given(body=hostile_bodies(schema, omit=CONDITIONAL_FIELDS))
    def fuzz(body):
        content = json.dumps(body).encode()  # NaN and Infinity as Python writes them
        response = client.post(path, content=content, headers=JSON)
        check_answer(response.status_code, response.headers["content-type"], response.content, body)

    with httpx.Client(base_url=server.url, timeout=30) as client:
        fuzz()


def test_the_server_is_alive_and_leak_free_after_fuzzing(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/health").status_code == 200
        assert_still_serving(client)
    engine = server.engine
    assert wait_until(lambda: engine.num_free_blocks == engine.num_total_blocks, timeout=10)
    assert server.async_engine.num_in_flight == 0
