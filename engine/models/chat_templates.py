"""Chat templates for files that carry none, by GGUF architecture.

Some GGUFs omit `tokenizer.chat_template` (the Gemma 3 270M one on the package index does); a
family's turn format is a fact of the family, so it is supplied here, written from the format's
description: Gemma turns are `<start_of_turn>{user|model}\\n...<end_of_turn>\\n` after `<bos>`,
a system message is prefixed to the first user turn, and generation starts a model turn.
"""

from __future__ import annotations

GEMMA = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\\n\\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)

# GGUF `general.architecture` -> the template to use when the file has none.
FALLBACK_TEMPLATES = {"gemma3": GEMMA}


def fallback_template(architecture: str | None) -> str | None:
    return FALLBACK_TEMPLATES.get(architecture or "")
