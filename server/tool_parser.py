"""Hermes-style tool calls in generated text: `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>` blocks (Qwen2.5's and Hermes' chat templates ask for them) become OpenAI
`tool_calls`; the text around them stays `content`.

parse_tool_calls() reads a whole completion; ToolCallStream does the same incrementally for SSE:
text that could be the start of `<tool_call>` is held back, a call is emitted whole once its
closing tag arrives, and a block that does not parse (or never closes) is given back as text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

START, END = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(START) + r"(.*?)" + re.escape(END), re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text


def _call_of(body: str) -> ParsedCall | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return call_of_value(value)


def call_of_value(value: object) -> ParsedCall | None:
    """A decoded `{"name": ..., "arguments" (or "parameters"): {...}}`, or None."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ParsedCall(f"call_{uuid.uuid4().hex[:24]}", value["name"], json.dumps(arguments))


def parse_tool_calls(text: str) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls): content is the text outside the parsed blocks (None when only
    whitespace remains and there were calls)."""
    calls: list[ParsedCall] = []
    kept: list[str] = []
    position = 0
    for match in _BLOCK.finditer(text):
        call = _call_of(match.group(1))
        if call is None:
            continue  # not a call after all: stays in the content
        kept.append(text[position : match.start()])
        calls.append(call)
        position = match.end()
    kept.append(text[position:])
    content = "".join(kept)
    if calls and not content.strip():
        return None, calls
    return (content.strip() if calls else content), calls


class ToolCallStream:
    """Incremental parse_tool_calls for one choice: feed() text deltas, get (content delta,
    completed calls); finish() returns what is still held back."""

    def __init__(self) -> None:
        self._held = ""  # text not yet released: a possible START prefix, or an open block
        self.num_calls = 0

    def feed(self, delta: str) -> tuple[str, list[ParsedCall]]:
        self._held += delta
        released: list[str] = []
        calls: list[ParsedCall] = []
        while True:
            start = self._held.find(START)
            if start < 0:
                keep = _partial_prefix(self._held, START)
                released.append(self._held[: len(self._held) - keep])
                self._held = self._held[len(self._held) - keep :]
                break
            end = self._held.find(END, start)
            if end < 0:
                released.append(self._held[:start])
                self._held = self._held[start:]
                break
            call = _call_of(self._held[start + len(START) : end])
            block_end = end + len(END)
            if call is None:
                released.append(self._held[:block_end])
            else:
                released.append(self._held[:start])
                calls.append(call)
            self._held = self._held[block_end:]
        self.num_calls += len(calls)
        content = "".join(released)
        if self.num_calls and not content.strip():
            content = ""
        return content, calls

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """(the text still held back, no calls: a block never closed is text)."""
        held, self._held = self._held, ""
        return ("" if self.num_calls and not held.strip() else held), []


def _partial_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
