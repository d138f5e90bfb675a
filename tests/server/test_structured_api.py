"""Structured output over HTTP with the openai SDK, on a real tiny engine (random Llama,
character tokenizer, n-gram speculation on): response_format on chat, vLLM's guided_* extras on
both routes, streamed and not, and the 400s for malformed or conflicting constraints."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from openai import BadRequestError, OpenAI

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.conftest import build_tiny_llama
from tests.server.harness import run_server
from tests.tiny_tokenizer import save_char_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "rain": {"type": "boolean"},
        "days": {"type": "array", "items": {"type": "integer", "maximum": 9}, "maxItems": 3},
    },
    "required": ["city", "rain", "days"],
    "additionalProperties": False,
}
USER = [{"role": "user", "content": "weather as JSON"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = save_char_tokenizer(build_tiny_llama(tmp_path_factory.mktemp("tiny-api")))
    flags = dict(model=str(path), num_kv_blocks=96, threads=1, proposer="ngram",
                 spec_policy="fixed:3", num_speculative_tokens=3)  # fmt: skip
    running = run_server(LLMEngine.from_config(EngineConfig.from_flat(flags)))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=server.api, api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(server) -> str:
    return server.async_engine.model_name


def test_chat_json_schema_parses_and_validates(client, model):
    response_format = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
    for seed in range(3):
        response = client.chat.completions.create(
            model=model, messages=USER, max_tokens=80, seed=seed, response_format=response_format
        )
        assert response.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(response.choices[0].message.content), SCHEMA)
    stream = client.chat.completions.create(
        model=model, messages=USER, max_tokens=80, seed=5, stream=True,
        response_format=response_format,
    )  # fmt: skip
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_chat_json_object(client, model):
    response = client.chat.completions.create(
        model=model, messages=USER, max_tokens=120, temperature=0,
        response_format={"type": "json_object"},
    )  # fmt: skip
    if response.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(response.choices[0].message.content), dict)
    else:  # a random model may write a long object: what it wrote is still JSON so far
        assert response.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("route", ["completions", "chat"])
@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
        ({"guided_regex": r"\d{3}-[a-z]{2}"}, lambda t: re.fullmatch(r"\d{3}-[a-z]{2}", t)),
        ({"guided_json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ],
    ids=["choice", "regex", "json"],
)
def test_guided_extras_on_both_routes(client, model, route, extra, check):
    for stream in (False, True):
        common = dict(model=model, max_tokens=80, n=2, seed=1, extra_body=extra, stream=stream)
        if route == "completions":
            result = client.completions.create(prompt="answer:", **common)
            texts = _texts(result, stream, lambda c: c.text)
        else:
            result = client.chat.completions.create(messages=USER, **common)
            texts = _texts(result, stream, _chat_text)
        assert len(texts) == 2 and all(check(t) for t in texts), texts


def _chat_text(choice) -> str | None:
    return choice.delta.content if hasattr(choice, "delta") else choice.message.content


def _texts(result, stream: bool, text_of) -> list[str]:
    if not stream:
        return [text_of(c) for c in result.choices]
    texts: dict[int, str] = {}
    for chunk in result:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (text_of(choice) or "")
    return [texts[i] for i in sorted(texts)]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_regex": "[a-"}, "guided_regex"),
        ({"guided_json": "{nope"}, "guided_json"),
        ({"guided_choice": []}, "guided_choice"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"guided_regex": "a", "ignore_eos": True}, "guided"),
        ({"guided_json": {"type": 5}}, "guided_json"),
    ],
)
def test_bad_constraints_are_400_naming_the_field(client, model, extra, param):
    with pytest.raises(BadRequestError) as info:
        client.chat.completions.create(model=model, messages=USER, max_tokens=5, extra_body=extra)
    assert info.value.body["param"] == param


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_grammar_the_vocabulary_cannot_begin_is_400_at_admission(client, model, route):
    # \x91 is no token of the character tokenizer (found by benchmarks/fuzz_api.py: a 500)
    extra = {"guided_regex": '\x91"\x0b'}
    with pytest.raises(BadRequestError) as info:
        if route == "chat":
            client.chat.completions.create(
                model=model, messages=USER, max_tokens=5, extra_body=extra
            )
        else:
            client.completions.create(model=model, prompt="x", max_tokens=5, extra_body=extra)
    assert info.value.body["param"] == "guided_regex"
    assert "cannot begin with any token" in info.value.body["message"]


def test_a_grammar_the_vocabulary_cannot_continue_is_400_naming_it(client, model):
    # every choice begins "ab" and then needs \x91: the request fails at its third token
    extra = {"guided_choice": ["ab\x91", "ab\x91x"]}
    with pytest.raises(BadRequestError) as info:
        client.completions.create(model=model, prompt="x", max_tokens=8, extra_body=extra)
    assert info.value.body["param"] == "guided_choice"
    assert "can continue the grammar after 2 output tokens" in info.value.body["message"]
    # streamed: the 200 is sent, so the error comes as an event with the same body
    events = client.completions.create(
        model=model, prompt="x", max_tokens=8, stream=True, extra_body=extra
    )
    with pytest.raises(Exception) as streamed:
        list(events)
    assert "can continue the grammar" in str(streamed.value)
    # the server goes on serving (greedy: a sampled request could end early at an EOS)
    ok = client.completions.create(model=model, prompt="x", max_tokens=3, temperature=0)
    assert ok.choices[0].finish_reason == "length"
