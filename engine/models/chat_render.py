"""Render a chat template to text exactly as transformers' `apply_chat_template` does, without
importing transformers.

The environment: Jinja's immutable sandbox with `trim_blocks` and `lstrip_blocks`, the loop
controls extension, a `{% generation %}` block (rendered as its body), `tojson` as Python's
`json.dumps` (no HTML escaping, non-ASCII kept), and the globals templates call:
`raise_exception` (a TemplateError), `strftime_now`, `dict` and a `namespace` that refuses
underscore names. The template sees `messages` (keys whose value is None dropped, everything
rebuilt from plain JSON types, a message's reasoning under each of its names), `tools`,
`documents` (None), `add_generation_prompt` and the special tokens' texts (`bos_token`, ...).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The names a message's reasoning may come under; templates read the first (gpt-oss: the
# second), so a reasoning given under any name is passed under both.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def render_chat(
    template: str,
    messages: list[Any],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    special_tokens: Mapping[str, str] | None = None,
) -> str:
    """The text `template` makes of `messages` (dicts, dataclasses or pydantic models) and
    `tools` (JSON schemas); `special_tokens` maps `bos_token`, `eos_token`, ... to their text.
    TemplateError when the template raises; ValueError or TypeError for unusable input."""
    if not messages:
        raise ValueError("cannot apply the chat template to an empty conversation")
    if tools is not None and not all(isinstance(tool, dict) for tool in tools):
        raise ValueError("tools must be JSON schemas (dicts)")
    chat = [_with_reasoning_aliases(m) for m in _plain(_without_none_keys(messages))]
    return _compiled(template).render(
        messages=chat,
        tools=_plain(tools),
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **_plain(dict(special_tokens or {})),
    )


def _without_none_keys(messages: list[Any]) -> list[dict[str, Any]]:
    """Messages as dicts without the keys whose value is None (templates test for a key's
    presence; OpenAI clients send `content: null` beside tool calls)."""
    out = []
    for message in messages:
        message = _as_data(message)
        if not isinstance(message, dict):
            raise TypeError(f"chat messages must be dicts, got {message!r}")
        out.append({key: value for key, value in message.items() if value is not None})
    return out


def _as_data(value: Any) -> Any:
    """Message objects (mappings, dataclasses, pydantic models), nested ones too, as dicts."""
    if isinstance(value, Mapping):
        return {key: _as_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_as_data(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _as_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _as_data(value.model_dump())
    return value


def _plain(value: Any) -> Any:
    """`value` rebuilt from plain JSON types, so the sandbox never sees an object's own methods:
    subclasses of str/int/float as their base type, numpy scalars as Python ones, anything else
    unknown as a placeholder naming its type (templates only test such values' presence)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    numpy = sys.modules.get("numpy")  # a numpy scalar can only come from a loaded numpy
    if numpy is not None and isinstance(value, numpy.generic):
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _with_reasoning_aliases(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    reasoning = next(
        (message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None
    )
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


@lru_cache(maxsize=16)
def _compiled(template: str) -> jinja2.Template:
    return _environment().from_string(template)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _SafeDict()
    env.globals["namespace"] = _Namespace
    return env


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _SafeDict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without the type object itself (its
    attributes would reach past the sandbox)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's namespace refusing attributes that start with an underscore (a way towards
    CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Namespace's own signature
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set underscore attributes on a namespace: {name!r}"
            )


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (it marks the assistant's tokens for training
    masks): its body, rendered in its own scope like a call block."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()
