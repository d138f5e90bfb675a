"""Structured output on the real SmolLM2-135M over HTTP with the openai SDK, n-gram speculation
on: JSON-schema output parses and validates, and greedy output is token-identical with the
request's speculation turned off (speculation.max_draft_tokens = 0); tools are a 400 (its ChatML
template has no tool support)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai import BadRequestError, OpenAI

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.server.harness import run_server

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "country": {"type": "string", "maxLength": 24},
        "capital": {"type": "string", "maxLength": 24},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 2000},
    },
    "required": ["country", "capital", "languages", "population_millions"],
    "additionalProperties": False,
}
QUESTIONS = [
    "Describe France as JSON with its capital, languages and population.",
    'Fill in {"country": "Japan", "capital": ...} for Japan, then for Japan again.',
]


@pytest.fixture(scope="module")
def client(smollm2_path):
    flags = dict(model=str(smollm2_path), max_model_len=1024, num_kv_blocks=96, threads=1,
                 proposer="ngram", spec_policy="fixed:4", num_speculative_tokens=4)  # fmt: skip
    server = run_server(LLMEngine.from_config(EngineConfig.from_flat(flags)))
    yield OpenAI(base_url=server.api, api_key="x", max_retries=0, timeout=300)
    server.stop()


def test_json_schema_output_validates_and_is_lossless_under_ngram(client):
    response_format = {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}
    drafted = 0
    for question in QUESTIONS:
        texts = []
        for speculation in ({}, {"speculation": {"max_draft_tokens": 0}}):
            response = client.chat.completions.create(
                model=client.models.list().data[0].id,
                messages=[{"role": "user", "content": question}],
                max_tokens=120,
                temperature=0,
                response_format=response_format,
                extra_body=speculation,
            )
            texts.append(response.choices[0].message.content)
            if not speculation:
                drafted += response.usage.model_extra["speculation"]["draft_tokens"]
            assert response.choices[0].finish_reason == "stop"
            jsonschema.validate(json.loads(texts[-1]), SCHEMA)
        assert texts[0] == texts[1]
    assert drafted > 0


def test_tools_are_400_because_smollm2s_template_has_no_tool_support(client):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(BadRequestError) as info:
        client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": "hi"}],
            tools=[tool],
        )
    assert info.value.body["param"] == "tools"
