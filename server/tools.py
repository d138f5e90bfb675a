"""`tools` + `tool_choice` of a chat request: what the chat template gets, whether the output
is parsed for tool calls, and the grammar that enforces `required` or a named function.

  none      tools are rendered, nothing is parsed (the model is asked not to call; text stays
            text, as vLLM does)
  auto      tools are rendered; calls in the model's format (server/tool_formats.py: Hermes
            `<tool_call>` blocks, Llama 3 JSON, Mistral's list) become tool_calls
  required  as auto, and a grammar makes the output calls in that format (Hermes: one or more
            `<tool_call>` blocks; Llama 3: one JSON object; Mistral: a JSON list) whose JSON
            names one of the tools and holds arguments valid under its `parameters` schema
  {"type": "function", "function": {"name": N}}   as required, with tool N only
`parallel_tool_calls: false` limits the enforced output to one call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from engine.sampling_params import GuidedDecoding
from server.errors import bad_request
from server.protocol_messages import Strict, Tool
from server.tool_formats import HERMES, LLAMA3_JSON, MISTRAL
from server.tool_parser import END, START

# The enforced JSON is compact (as engine/structured/grammar.py does for schemas).
_X_GUIDANCE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass(frozen=True)
class ToolSetup:
    template_tools: list[dict[str, Any]] | None  # for the chat template; None: no tools
    parse: bool  # read tool calls out of the output
    guided: GuidedDecoding | None  # enforces required / named
    format: str = HERMES  # the model's tool-call format (server/tool_formats.py)


def tool_setup(
    tools: list[Tool] | None,
    choice: ToolChoice | None,
    parallel: bool | None,
    fmt: str = HERMES,
) -> ToolSetup:
    if not tools:
        if choice is not None and choice != "none":
            raise bad_request("tool_choice needs tools", "tool_choice")
        return ToolSetup(None, False, None, fmt)
    template_tools = [tool.model_dump(exclude_none=True) for tool in tools]
    choice = "auto" if choice is None else choice
    if choice in ("none", "auto"):
        return ToolSetup(template_tools, choice == "auto", None, fmt)
    chosen = tools
    if isinstance(choice, NamedToolChoice):
        chosen = [t for t in tools if t.function.name == choice.function.name]
        if not chosen:
            names = ", ".join(t.function.name for t in tools)
            raise bad_request(
                f"tool_choice names {choice.function.name!r}, which is not among the tools "
                f"({names})",
                "tool_choice",
            )
    guided = _calls_grammar(chosen, parallel is not False, fmt)
    return ToolSetup(template_tools, True, guided, fmt)


def _calls_grammar(tools: list[Tool], many: bool, fmt: str) -> GuidedDecoding:
    """Lark (llguidance): calls in `fmt` around JSON that names a tool and holds its
    arguments (Llama 3: `parameters`); llguidance's %json embeds the JSON schema."""
    key = "parameters" if fmt == LLAMA3_JSON else "arguments"
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool.function.name},
                key: tool.function.parameters or {"type": "object"},
            },
            "required": ["name", key],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    schema = {"anyOf": options, "x-guidance": _X_GUIDANCE}
    body = f"body: %json {json.dumps(schema)}\n"
    if fmt == LLAMA3_JSON:  # one object is the whole reply
        return GuidedDecoding("grammar", "start: body\n" + body)
    if fmt == MISTRAL:  # a bare list (the [TOOL_CALLS] marker is a control token)
        more = ' (", " body)*' if many else ""
        return GuidedDecoding("grammar", f'start: "[" body{more} "]"\n' + body)
    lark = (
        f"start: call{'+' if many else ''}\n"
        f"call: {json.dumps(START + chr(10))} body {json.dumps(chr(10) + END + chr(10))}\n"
    )
    return GuidedDecoding("grammar", lark + body)
