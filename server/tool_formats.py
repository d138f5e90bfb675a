"""Tool-call formats by family, picked from the model's chat template.

  hermes       `<tool_call>{json}</tool_call>` blocks among text (Qwen, Hermes; the default):
               server/tool_parser.py
  llama3_json  the whole reply is one JSON object `{"name": ..., "parameters": {...}}`
               (Llama 3.1+ templates; `<|python_tag|>` before it, when the text keeps it)
  mistral      the whole reply is `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`
               (the marker is a control token that decoding usually drops: a bare list counts)

The two whole-reply formats stream by holding back a reply whose first characters could open
a call until it ends, then parsing it; a reply that is not a call is given back as text.
"""

from __future__ import annotations

import json

from server.tool_parser import ParsedCall, ToolCallStream, call_of_value, parse_tool_calls

HERMES, LLAMA3_JSON, MISTRAL = "hermes", "llama3_json", "mistral"
FORMATS = (HERMES, LLAMA3_JSON, MISTRAL)
MARKERS = {LLAMA3_JSON: "<|python_tag|>", MISTRAL: "[TOOL_CALLS]"}
# What a chat template says when it asks for each whole-reply format.
_TEMPLATE_SIGNS = {MISTRAL: ("[TOOL_CALLS]", "[AVAILABLE_TOOLS]"), LLAMA3_JSON: ("<|python_tag|>",)}


def tool_format(chat_template: str | None) -> str:
    """The format a chat template asks its model to call tools in (hermes when it names none)."""
    for name, signs in _TEMPLATE_SIGNS.items():
        if any(sign in (chat_template or "") for sign in signs):
            return name
    return HERMES


def parse_calls(text: str, fmt: str = HERMES) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of a whole reply in format `fmt` (content None when only calls)."""
    if fmt == HERMES:
        return parse_tool_calls(text)
    body = text.strip()
    if body.startswith(MARKERS[fmt]):
        body = body[len(MARKERS[fmt]) :].strip()
    try:
        value = json.loads(body)
    except ValueError:
        return text, []
    items = value if isinstance(value, list) else [value]
    calls = [call_of_value(item) for item in items]
    if not calls or any(call is None for call in calls):
        return text, []
    return None, calls


class WholeReplyStream:
    """ToolCallStream's interface for llama3_json and mistral (module docstring)."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self._held = ""
        self._holding: bool | None = None  # None: undecided (only spaces or a marker prefix)
        self.num_calls = 0

    def feed(self, delta: str) -> tuple[str, list[ParsedCall]]:
        if self._holding is False:
            return delta, []
        self._held += delta
        start, marker = self._held.lstrip(), MARKERS[self.fmt]
        if not start or (marker.startswith(start) and start != marker):
            return "", []
        self._holding = start[0] in "{[" or start.startswith(marker)
        if self._holding:
            return "", []
        released, self._held = self._held, ""
        return released, []

    def finish(self) -> tuple[str, list[ParsedCall]]:
        held, self._held = self._held, ""
        if not self._holding:
            return held, []
        content, calls = parse_calls(held, self.fmt)
        self.num_calls += len(calls)
        return content or "", calls


def call_stream(fmt: str) -> ToolCallStream | WholeReplyStream:
    return ToolCallStream() if fmt == HERMES else WholeReplyStream(fmt)
