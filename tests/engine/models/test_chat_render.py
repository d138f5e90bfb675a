"""render_chat renders chat templates to transformers' exact text (its apply_chat_template with
tokenize=False), on a template that uses what real templates use, and fails where it fails."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from jinja2 import TemplateError

from engine.models.chat_render import render_chat
from tests.tiny_tokenizer import save_char_tokenizer

# Block tags on their own lines (trim_blocks / lstrip_blocks), `in` tests on keys that None
# values lose, tojson with options and non-ASCII, namespace, loop controls, the generation
# block, the reasoning aliases, the special tokens, dict(), strftime_now and raise_exception.
TEMPLATE = """{{ bos_token }}
{% set ns = namespace(system=none, turns=0) %}
{% if messages[0].role == 'system' %}
    {% set ns.system = messages[0].content %}
{% endif %}
{% if tools %}
<tools>
    {% for tool in tools %}
{{ tool | tojson(indent=2, sort_keys=true) }}
    {% endfor %}
</tools>
{% endif %}
{% for m in messages %}
    {% if m.role == 'system' %}{% continue %}{% endif %}
    {% set ns.turns = ns.turns + 1 %}
    {% if m.role == 'assistant' %}
<|assistant|>{% generation %}{{ m.content | trim }}{% endgeneration %}
        {% if 'tool_calls' in m %}
calls: {{ m.tool_calls | tojson }}
        {% endif %}
        {% if m.reasoning_content is defined %}
think: {{ m.reasoning_content }} / {{ m.thinking }}
        {% endif %}
{{ eos_token }}
    {% elif m.role == 'user' %}
<|user|>{{ m.content }}{{ ' (system: ' + ns.system + ')' if ns.system and loop.first }}
    {% elif m.role == 'tool' %}
<|tool|>{{ m.content | tojson }}
    {% else %}
{{ raise_exception('unknown role ' + m.role) }}
    {% endif %}
    {% if ns.turns > 6 %}{% break %}{% endif %}
{% endfor %}
{% if add_generation_prompt %}<|assistant|>{% endif %}
{{ dict(a=1) | tojson }} {{ dict.fromkeys(['x'], 0) | tojson }} {{ strftime_now('%Y')|length }}
{{ documents is none }} {{ unk_token }}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "météo",
            "description": "Weather of a city, «quoted»",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@dataclass
class Message:
    role: str
    content: str


CHATS = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Why café 🙂?"},
        {"role": "assistant", "content": "  Because. ", "tool_calls": None},
        {"role": "user", "content": "<s>More</s>"},
    ],
    [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "météo", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": {"temp": 21.5, "sky": "clair"}},
    ],
    [
        {"role": "user", "content": "think"},
        {"role": "assistant", "content": "done", "reasoning": "hmm"},
    ],
    [Message("user", "a dataclass"), Message("assistant", "ok")],
    [{"role": "user", "content": str(i)} for i in range(12)],  # the loop breaks
]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(save_char_tokenizer(tmp_path_factory.mktemp("char")))


@pytest.mark.parametrize("chat", range(len(CHATS)))
@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("generation", [True, False])
def test_rendered_text_is_transformers(hf, chat, tools, generation):
    messages = CHATS[chat]
    want = hf.apply_chat_template(
        messages,
        chat_template=TEMPLATE,
        tools=tools,
        add_generation_prompt=generation,
        tokenize=False,
    )
    got = render_chat(
        TEMPLATE,
        messages,
        tools=tools,
        add_generation_prompt=generation,
        special_tokens=hf.special_tokens_map,
    )
    assert got == want


def test_failures_are_transformers(hf):
    bad = [{"role": "robot", "content": "beep"}]
    with pytest.raises(TemplateError, match="unknown role robot"):
        hf.apply_chat_template(bad, chat_template=TEMPLATE, tokenize=False)
    with pytest.raises(TemplateError, match="unknown role robot"):
        render_chat(TEMPLATE, bad, special_tokens=hf.special_tokens_map)
    with pytest.raises(ValueError, match="empty conversation"):
        render_chat(TEMPLATE, [])
    with pytest.raises(TypeError, match="must be dicts"):
        render_chat(TEMPLATE, ["just text"])
    escape = "{{ namespace(_x=1) }}"
    with pytest.raises(Exception, match="underscore") as theirs:
        hf.apply_chat_template(CHATS[0], chat_template=escape, tokenize=False)
    with pytest.raises(type(theirs.value), match="underscore"):
        render_chat(escape, CHATS[0])
    sandbox = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(Exception, match="unsafe") as theirs:
        hf.apply_chat_template(CHATS[0], chat_template=sandbox, tokenize=False)
    with pytest.raises(type(theirs.value), match="unsafe"):
        render_chat(sandbox, CHATS[0])
