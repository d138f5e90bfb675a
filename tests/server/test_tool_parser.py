"""Hermes `<tool_call>` parsing: whole texts, and the streaming parser fed in every split."""

from __future__ import annotations

import json

import pytest

from server.tool_parser import ToolCallStream, parse_tool_calls
from tests.server.tool_streams import feed_in_pieces

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
OTHER = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'


@pytest.mark.parametrize(
    ("text", "content", "names"),
    [
        ("plain answer", "plain answer", []),
        (CALL, None, ["get_weather"]),
        (CALL + "\n" + OTHER + "\n", None, ["get_weather", "add"]),
        ("Let me check. " + CALL, "Let me check.", ["get_weather"]),
        ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
        ("<tool_call>" + '{"name": "x"', "<tool_call>" + '{"name": "x"', []),  # never closed
        ("a < b and <tool_ca", "a < b and <tool_ca", []),
    ],
)
def test_parse_and_stream_agree(text, content, names):
    got_content, calls = parse_tool_calls(text)
    assert got_content == content and [c.name for c in calls] == names
    for size in (1, 3, 7, len(text)):
        streamed, streamed_calls = feed_in_pieces(ToolCallStream(), text, size)
        assert [c.name for c in streamed_calls] == names
        assert [json.loads(c.arguments) for c in streamed_calls] == [
            json.loads(c.arguments) for c in calls
        ]
        assert streamed.strip() == (content or "").strip()


def test_arguments_are_json_text_and_ids_are_unique():
    _, calls = parse_tool_calls(CALL + OTHER)
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    assert calls[0].id != calls[1].id and calls[0].id.startswith("call_")
