"""Request fields that constrain or steer generation beyond sampling: structured output
(OpenAI's `response_format`, vLLM's `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar`) and our `speculation` extension. Each becomes a SamplingParams field; a
request may ask for one kind of structured output at most.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from engine.sampling_params import GuidedDecoding
from engine.structured.grammar import check_guided
from server.errors import bad_request
from server.protocol_messages import Strict

_ANY_OBJECT = '{"type": "object"}'


class JsonSchemaFormat(Strict):
    name: str
    # "schema" on the wire; the attribute would shadow BaseModel.schema.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None  # accepted: the output is always held to the schema


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SpeculationOptions(Strict):
    """Extension: cap (or, with 0, turn off) speculative decoding for this request."""

    max_draft_tokens: int


class GuidedFields(Strict):
    response_format: ResponseFormat | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    speculation: SpeculationOptions | None = None

    def sampling_fields(self) -> dict[str, Any]:
        """These fields as SamplingParams arguments, each only when asked for: `guided` and
        `max_draft_tokens`."""
        fields: dict[str, Any] = {}
        guided = self._guided_decoding()
        if guided is not None:
            fields["guided"] = guided
        if self.speculation is not None:
            fields["max_draft_tokens"] = self.speculation.max_draft_tokens
        return fields

    def _guided_decoding(self) -> GuidedDecoding | None:
        """The one structured-output constraint this request asks for, if any."""
        asked = [
            (name, value)
            for name, value in (
                ("response_format", self._response_format()),
                ("guided_json", self._guided_json()),
                ("guided_regex", _kind("regex", self.guided_regex)),
                ("guided_choice", self._guided_choice()),
                ("guided_grammar", _kind("grammar", self.guided_grammar)),
            )
            if value is not None
        ]
        if len(asked) > 1:
            names = " and ".join(name for name, _ in asked)
            raise bad_request(f"{names}: ask for one kind of structured output", asked[1][0])
        if not asked:
            return None
        name, guided = asked[0]
        try:
            check_guided(guided)
        except ValueError as exc:
            raise bad_request(f"{name}: {str(exc).removeprefix('guided: ')}", name) from None
        return guided

    @property
    def guided_field(self) -> str:
        """The field that set the request's structured output (names engine refusals)."""
        fields = ("response_format", "guided_json", "guided_regex", "guided_choice")
        return next((f for f in fields if getattr(self, f) is not None), "guided_grammar")

    def _response_format(self) -> GuidedDecoding | None:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            if fmt is not None and fmt.json_schema is not None:
                raise bad_request(
                    "response_format.json_schema needs type json_schema", "response_format"
                )
            return None
        if fmt.type == "json_object":
            return GuidedDecoding("json", _ANY_OBJECT)
        if fmt.json_schema is None:
            raise bad_request(
                "response_format.json_schema is required with type json_schema",
                "response_format.json_schema",
            )
        schema = fmt.json_schema.schema_
        return GuidedDecoding("json", json.dumps(schema) if schema is not None else _ANY_OBJECT)

    def _guided_json(self) -> GuidedDecoding | None:
        value = self.guided_json
        if value is None:
            return None
        return GuidedDecoding("json", value if isinstance(value, str) else json.dumps(value))

    def _guided_choice(self) -> GuidedDecoding | None:
        if self.guided_choice is None:
            return None
        if not self.guided_choice:
            raise bad_request("guided_choice must list at least one string", "guided_choice")
        return GuidedDecoding("choice", json.dumps(self.guided_choice))


def _kind(kind: str, value: str | None) -> GuidedDecoding | None:
    return None if value is None else GuidedDecoding(kind, value)  # type: ignore[arg-type]
