"""Tokenizer: a thin wrapper over a transformers fast tokenizer, from an HF dir or a GGUF file.

`encode(text)` adds special tokens exactly when transformers would by default, so our prompt
ids line up with HF's (SmolLM2's tokenizer adds none: `tokenizer.ggml.add_bos_token` is false
and plain `tok(text)` starts with the first text token; its chat template writes
`<|im_start|>` itself).

Building a tokenizer from GGUF metadata takes seconds (transformers converts 49k tokens and
merges), so the converted tokenizer is saved once under $GOODSPEED_CACHE_DIR (default
~/.cache/goodspeed/tokenizers). Reloading that directory still takes ~1.5 s for Qwen's 152k
tokens (AutoTokenizer scans transformers' model folders, parses tokenizer.json in Python and
converts it again), so the loaded object is also pickled beside it, keyed by the transformers,
tokenizers and Python versions: unpickling restores the same object state in ~0.5 s. A pickle
that fails to load is ignored (the directory is loaded and the pickle rewritten).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from engine.models.chat_templates import fallback_template

logger = logging.getLogger(__name__)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class Tokenizer:
    def __init__(self, hf_tokenizer: Any) -> None:
        self.hf = hf_tokenizer  # raw transformers tokenizer (the detokenizer uses it)
        self._decode = _backend_decode(hf_tokenizer) or hf_tokenizer.decode

    @classmethod
    def from_path(cls, path: str | Path) -> Tokenizer | None:
        """Tokenizer of an HF directory or GGUF file; None when it has no tokenizer."""
        from engine.models.loader import is_gguf, resolve_model_path

        path = resolve_model_path(path)
        if is_gguf(path):
            hf = _load_gguf_tokenizer(path)
            return None if hf is None else cls(hf)
        if not any((path / name).is_file() for name in _TOKENIZER_FILES):
            return None
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(path))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return self.hf.convert_ids_to_tokens(ids)

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template renders tool definitions (it reads `tools`)."""
        return "tools" in (getattr(self.hf, "chat_template", None) or "")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of `messages` (and `tools`) rendered by the model's chat template."""
        if not getattr(self.hf, "chat_template", None):
            raise ValueError(
                "this model's tokenizer has no chat template; use the completions endpoint "
                "(plain prompt) instead of chat"
            )
        encoded = self.hf.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=True,
        )
        return list(encoded["input_ids"])

    @property
    def eos_token_id(self) -> int | None:
        return self.hf.eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce, added tokens included."""
        return len(self.hf)

    @property
    def all_special_ids(self) -> list[int]:
        return list(self.hf.all_special_ids)


def _backend_decode(hf: Any) -> Any | None:
    """The Rust tokenizer's own decode where it returns exactly hf.decode's text: a stock fast
    tokenizer (decode and _decode not overridden) that does not clean up tokenization spaces.
    hf.decode wraps it in ~3 us of Python, which the detokenizer pays twice per token."""
    from transformers import PreTrainedTokenizerFast

    backend = getattr(hf, "_tokenizer", None)
    if (
        backend is None
        or getattr(hf, "clean_up_tokenization_spaces", True)
        or type(hf).decode is not PreTrainedTokenizerFast.decode
        or type(hf)._decode is not PreTrainedTokenizerFast._decode
    ):
        return None
    return backend.decode


def _load_gguf_tokenizer(path: Path) -> Any | None:
    """The GGUF's tokenizer (cached); a file without a chat template gets its family's
    (engine/models/chat_templates.py), if we know one."""
    cache = _cache_dir(path)
    hf = _unpickled(cache)
    if hf is None and cache.is_dir():
        from transformers import AutoTokenizer  # here: its import scans every model folder

        hf = AutoTokenizer.from_pretrained(cache)
        _pickle_to_cache(hf, cache)
    elif hf is None:
        if not _gguf_has_tokenizer(path):
            return None
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        _save_to_cache(hf, cache)
        _pickle_to_cache(hf, cache)
    if not getattr(hf, "chat_template", None):
        hf.chat_template = fallback_template(_gguf_metadata(path).get("general.architecture"))
    return hf


def _gguf_metadata(path: Path) -> dict[str, Any]:
    from engine.models.gguf_file import read_gguf

    return read_gguf(path).metadata


def _gguf_has_tokenizer(path: Path) -> bool:
    return "tokenizer.ggml.tokens" in _gguf_metadata(path)


def _cache_dir(path: Path) -> Path:
    """Keyed by file identity (path, size, mtime) and transformers version."""
    import transformers

    root = os.environ.get("GOODSPEED_CACHE_DIR", "~/.cache/goodspeed")
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(root).expanduser() / "tokenizers" / f"{path.stem}-{digest}"


def _pickle_path(cache: Path) -> Path:
    """The pickle of the tokenizer loaded from `cache`, for these library versions (the
    directory's key already names the file and transformers' version)."""
    import tokenizers
    import transformers

    versions = f"{transformers.__version__}|{tokenizers.__version__}|{sys.version}"
    return cache / f"tokenizer-{hashlib.sha256(versions.encode()).hexdigest()[:16]}.pickle"


def _unpickled(cache: Path) -> Any | None:
    """The pickled tokenizer, or None when there is none or it does not load."""
    try:
        with open(_pickle_path(cache), "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a bad cache entry only costs speed
        logger.warning("ignoring the tokenizer pickle in %s: %s", cache, exc)
        return None


def _pickle_to_cache(hf: Any, cache: Path) -> None:
    """Pickle `hf` beside the directory it was loaded from: into a temporary file, renamed
    into place (a concurrent reader sees the whole pickle or none). Failure only costs speed."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(hf, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, _pickle_path(cache))
    except Exception as exc:  # noqa: BLE001 - read-only cache, an object that won't pickle
        logger.info("tokenizer not cached as a pickle in %s: %s", cache, exc)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _save_to_cache(hf: Any, cache: Path) -> None:
    """Write into a temporary sibling and rename it into place, so a concurrent reader never
    sees a half-written directory. Failure (read-only home, lost race) only costs speed."""
    tmp = None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=cache.parent)
        hf.save_pretrained(tmp)
        os.rename(tmp, cache)
    except OSError:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
