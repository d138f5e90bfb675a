"""Llama 3 JSON and Mistral tool calls: the format read from the chat template, whole replies
parsed, the streaming parser fed in every split agreeing with them, grammars per format."""

from __future__ import annotations

import json

import pytest

from server.protocol_messages import Tool
from server.tool_formats import (
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    call_stream,
    parse_calls,
    tool_format,
)
from server.tools import tool_setup
from tests.server.tool_streams import feed_in_pieces

LLAMA3 = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
MISTRAL_CALLS = (
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"name": "add", "arguments": {"a": 1, "b": 2}}]'
)
CASES = [
    (LLAMA3_JSON, LLAMA3, None, ["get_weather"]),
    (LLAMA3_JSON, "<|python_tag|>" + LLAMA3, None, ["get_weather"]),
    (LLAMA3_JSON, "  " + LLAMA3 + "\n", None, ["get_weather"]),
    (LLAMA3_JSON, "The weather is fine.", "The weather is fine.", []),
    (LLAMA3_JSON, '{"not": "a call"}', '{"not": "a call"}', []),
    (LLAMA3_JSON, "{broken", "{broken", []),
    (MISTRAL, MISTRAL_CALLS, None, ["get_weather", "add"]),
    (MISTRAL, MISTRAL_CALLS[len("[TOOL_CALLS]") :], None, ["get_weather", "add"]),
    (MISTRAL, "[1, 2] are numbers", "[1, 2] are numbers", []),
    (MISTRAL, "Plain [TOOL_CALLS] later", "Plain [TOOL_CALLS] later", []),
]


@pytest.mark.parametrize(("fmt", "text", "content", "names"), CASES)
def test_parse_and_stream_agree(fmt, text, content, names):
    got_content, calls = parse_calls(text, fmt)
    assert got_content == content and [c.name for c in calls] == names
    for size in (1, 3, 7, len(text)):
        streamed, streamed_calls = feed_in_pieces(call_stream(fmt), text, size)
        assert [c.name for c in streamed_calls] == names
        assert [json.loads(c.arguments) for c in streamed_calls] == [
            json.loads(c.arguments) for c in calls
        ]
        assert streamed == (content or ""), size


def test_arguments_come_from_parameters_in_llama_replies():
    _, [call] = parse_calls(LLAMA3, LLAMA3_JSON)
    assert json.loads(call.arguments) == {"city": "Paris"}


def test_the_template_names_the_format():
    assert tool_format(None) == HERMES
    assert tool_format("{% for m in messages %}<tool_call>{% endfor %}") == HERMES
    assert tool_format("{{- '<|python_tag|>' + tool_call }}") == LLAMA3_JSON
    assert tool_format("{{ '[AVAILABLE_TOOLS]' + tools|tojson }}") == MISTRAL


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3_JSON, MISTRAL])
def test_required_calls_get_a_grammar_in_the_models_format(fmt):
    tool = Tool.model_validate(
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    )
    import llguidance

    from engine.structured.grammar import grammar_text

    setup = tool_setup([tool], "required", None, fmt)
    grammar = setup.guided.spec
    assert setup.parse and setup.format == fmt
    key = "parameters" if fmt == LLAMA3_JSON else "arguments"
    assert f'"{key}"' in grammar
    assert ("<tool_call>" in grammar) == (fmt == HERMES)
    assert llguidance.LLMatcher.validate_grammar(grammar_text(setup.guided)) == ""
