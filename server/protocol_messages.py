"""Chat messages and tool definitions of the OpenAI API, and how they reach a chat template.

Roles: system, developer (rendered as system), user, assistant (content, or tool_calls, or
both) and tool (the result of a tool call, naming its tool_call_id). Tool-call arguments are
JSON strings on the wire; templates (Qwen2.5's, Hermes-style ones) expect objects, so
arguments that parse as a JSON object are handed to the template as one (as vLLM does).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from server.errors import bad_request


class Strict(BaseModel):
    """Strict types, no NaN, and no unknown fields: a field we do not know is a 400 naming it
    (docs/api.md lists what is honoured and what is accepted without effect)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")


class TextPart(Strict):
    type: Literal["text"]
    text: str


class FunctionCall(Strict):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema
    strict: bool | None = None  # accepted; arguments are always held to `parameters` when forced


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant only
    tool_call_id: str | None = None  # tool only
    refusal: str | None = None  # accepted without effect (the SDK echoes it back)

    def text(self) -> str:
        content = self.content
        if isinstance(content, list):
            return "".join(part.text for part in content)
        return content or ""

    def as_template_dict(self) -> dict[str, Any]:
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [_template_tool_call(call) for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _template_tool_call(call: ToolCall) -> dict[str, Any]:
    try:
        arguments: Any = json.loads(call.function.arguments)
    except ValueError:
        arguments = call.function.arguments
    if not isinstance(arguments, dict):
        arguments = call.function.arguments
    function = {"name": call.function.name, "arguments": arguments}
    return {"id": call.id, "type": "function", "function": function}


def check_messages(messages: list[ChatMessage]) -> None:
    """What a template needs to render each message: content (an assistant message may carry
    tool_calls instead), tool_calls only from the assistant, tool results naming their call."""
    for index, message in enumerate(messages):
        prefix = f"messages.{index}"
        if message.tool_calls is not None and message.role != "assistant":
            raise bad_request(f"{prefix}.tool_calls: only assistant messages carry tool_calls",
                              f"{prefix}.tool_calls")  # fmt: skip
        if message.role == "tool" and message.tool_call_id is None:
            param = f"{prefix}.tool_call_id"
            raise bad_request(f"{param} is required (tool messages answer a tool call)", param)
        if message.tool_call_id is not None and message.role != "tool":
            param = f"{prefix}.tool_call_id"
            raise bad_request(f"{param}: only tool messages carry tool_call_id", param)
        if message.content is None and not (message.role == "assistant" and message.tool_calls):
            param = f"{prefix}.content"
            raise bad_request(f"{param} is required ({message.role} messages need content)", param)
