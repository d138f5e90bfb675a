"""Feeding a tool-call stream a reply in pieces, as the server does with a streamed reply."""

from __future__ import annotations

from typing import Any


def feed_in_pieces(stream: Any, text: str, size: int) -> tuple[str, list]:
    """(content the stream let through, the calls it parsed) after `text` in `size`-char pieces."""
    streamed, calls = "", []
    for start in range(0, len(text), size):
        delta, new = stream.feed(text[start : start + size])
        streamed += delta
        calls += new
    held, last = stream.finish()
    return streamed + held, calls + last
