"""Tool calling round trip with the openai SDK on a tiny random Qwen2-architecture model whose
tokenizer (characters plus `<tool_call>` / `</tool_call>` tokens) carries a tool-capable
Hermes-style chat template built here. `required` and a named function are enforced by the
grammar, so even random weights produce valid calls; the follow-up turn (assistant tool_calls
+ tool result) renders; a template without tool support is a 400."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from openai import BadRequestError, OpenAI

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.server.harness import run_server
from tests.tiny_tokenizer import save_char_tokenizer

TOOL_TEMPLATE = (
    '{%- if tools %}system: call a tool as <tool_call>{"name": ..., "arguments": ...}'
    "</tool_call>\n{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}assistant: "
    "{%- for call in m.tool_calls %}<tool_call>\n"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}"
    "\n</tool_call>{%- endfor %}\n"
    "{%- elif m.role == 'tool' %}tool: {{ m.content }}\n"
    "{%- else %}{{ m.role }}: {{ m.content }}\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}assistant: {% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "maximum": 99}, "b": {"type": "integer", "maximum": 99}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}  # fmt: skip
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, ADD)}
USER = [{"role": "user", "content": "weather in Paris?"}]


# A Llama 3.1-style template: the reply is one JSON object (server/tool_formats.py llama3_json).
LLAMA3_TEMPLATE = (
    '{%- if tools %}system: reply with JSON {"name": ..., "parameters": ...} '
    "(or <|python_tag|> code)\n{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n"
    "{% endif %}{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{%- endfor %}"
    "{%- if add_generation_prompt %}assistant: {% endif %}"
)


def build_tiny_qwen2(path, template=TOOL_TEMPLATE):
    """Random Qwen2 weights (qkv bias) and the character tokenizer with tool tokens."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    save_char_tokenizer(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])  # not special: kept in decoded text
    tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    Qwen2ForCausalLM(config).eval().save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = build_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))
    config = EngineConfig.from_flat(dict(model=str(path), num_kv_blocks=128, threads=1))
    running = run_server(LLMEngine.from_config(config))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server) -> tuple[OpenAI, str]:
    return OpenAI(
        base_url=server.api, api_key="x", max_retries=0, timeout=60
    ), server.async_engine.model_name


def _check_call(call, names):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in names
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_tool_call_round_trip(client):
    api, model = client
    response = api.chat.completions.create(
        model=model, messages=USER, tools=[WEATHER, ADD], tool_choice="required",
        max_tokens=200, seed=1, parallel_tool_calls=False,
    )  # fmt: skip
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    _check_call(call, {"get_weather", "add"})
    follow_up = [
        *USER,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    answer = api.chat.completions.create(
        model=model, messages=follow_up, tools=[WEATHER, ADD], tool_choice="none", max_tokens=8
    )
    assert answer.choices[0].message.tool_calls is None
    assert isinstance(answer.choices[0].message.content, str)


def test_named_function_is_enforced_streamed_and_not(client):
    api, model = client
    choice = {"type": "function", "function": {"name": "add"}}
    for seed in range(2):
        response = api.chat.completions.create(
            model=model, messages=USER, tools=[WEATHER, ADD], tool_choice=choice,
            max_tokens=200, seed=seed, parallel_tool_calls=False,
        )  # fmt: skip
        assert response.choices[0].finish_reason == "tool_calls"
        for call in response.choices[0].message.tool_calls:
            _check_call(call, {"add"})
    stream = api.chat.completions.create(
        model=model, messages=USER, tools=[WEATHER, ADD], tool_choice=choice,
        max_tokens=200, seed=0, stream=True, parallel_tool_calls=False,
    )  # fmt: skip
    calls, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and calls
    assert [c.index for c in calls] == list(range(len(calls)))
    for call in calls:
        _check_call(call, {"add"})


def test_auto_renders_tools_and_returns_text_without_a_call(client, server):
    api, model = client
    response = api.chat.completions.create(
        model=model, messages=USER, tools=[WEATHER], max_tokens=6, temperature=0
    )
    assert response.choices[0].message.tool_calls is None
    with_tools = httpx.post(server.url + "/tokenize", json={"messages": USER}).json()["count"]
    assert response.usage.prompt_tokens > with_tools  # the tool definitions were rendered


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
         "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}],
          "tool_choice": "required"}, "tools"),
    ],
)  # fmt: skip
def test_bad_tool_requests_are_400(client, extra, param):
    api, model = client
    with pytest.raises(BadRequestError) as info:
        api.chat.completions.create(model=model, messages=USER, max_tokens=4, extra_body=extra)
    assert info.value.body["param"] == param


def test_template_without_tool_support_is_400(fake_server):
    response = httpx.post(
        fake_server.url + "/v1/chat/completions", json={"messages": USER, "tools": [WEATHER]}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "tools" and "does not support tools" in error["message"]


@pytest.fixture(scope="module")
def llama3_client(tmp_path_factory):
    path = build_tiny_qwen2(tmp_path_factory.mktemp("tiny-llama3-tools"), LLAMA3_TEMPLATE)
    config = EngineConfig.from_flat(dict(model=str(path), num_kv_blocks=128, threads=1))
    running = run_server(LLMEngine.from_config(config))
    yield OpenAI(base_url=running.api, api_key="x", max_retries=0, timeout=60), running
    running.stop()


def test_llama3_json_calls_are_enforced_and_parsed(llama3_client):
    """The template asks for Llama 3 JSON: `required` makes the reply one JSON object with
    `parameters`, which comes back as tool_calls, streamed and not."""
    api, running = llama3_client
    model = running.async_engine.model_name
    kwargs = dict(model=model, messages=USER, tools=[WEATHER, ADD], tool_choice="required",
                  max_tokens=200, seed=1)  # fmt: skip
    response = api.chat.completions.create(**kwargs)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    _check_call(call, {"get_weather", "add"})
    calls, finish = [], None
    for chunk in api.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        (call.function.name, call.function.arguments)
    ]
