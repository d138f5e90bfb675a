"""A character tokenizer for the tiny random test models (vocab 256), saved beside a model so
that text prompts, chat templates and detokenization run end to end without a downloaded one."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def save_char_tokenizer(path: Path) -> Path:
    """One token per character (ids 3..255), <pad> <s> </s> = 0 1 2, and a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["\n", *map(chr, range(32, 127)), *map(chr, range(161, 161 + 157))]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return path
