"""A model's tokenizer converted once by transformers, then loaded without it.

The first load of a GGUF file or HF directory runs transformers' AutoTokenizer (seconds: its
import, the GGUF's vocabulary converted) and keeps what transformers configured: its Rust
tokenizer (`tokenizer.json`, padding and truncation off, as transformers' encode leaves them)
and the facts it keeps beside it (`facts.json`, TokenizerFacts below). Later loads
read those two files (the Rust parse of tokenizer.json, which holds the GIL: ~0.3 s for
Qwen's 152k tokens, ~0.9 s for Gemma's 262k, on the 2-core EPYC VM).

Cache: $GOODSPEED_CACHE_DIR/tokenizers (default ~/.cache/goodspeed/tokenizers), one directory
per source, keyed by the source's identity (path, sizes, mtimes) and the transformers and
tokenizers versions; written into a temporary sibling and renamed into place, so a reader sees
a whole entry or none. An entry that does not load is logged, converted again and replaced.
When a conversion writes an entry, entries whose source changed or is gone are removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

FORMAT = 1  # of an entry's files; a change makes every old entry a miss
_FACTS, _BACKEND = "facts.json", "tokenizer.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# The methods through which transformers' tokenizer encodes, decodes and renders chats; a class
# that overrides one does something in Python that the Rust tokenizer alone would not.
_TEXT_METHODS = (
    "__call__",
    "encode",
    "_encode_plus",
    "decode",
    "_decode",
    "convert_ids_to_tokens",
    "apply_chat_template",
    "get_chat_template",
)


@dataclass(frozen=True)
class TokenizerFacts:
    """What transformers' tokenizer keeps beside its Rust tokenizer, as far as we use it."""

    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token, ... -> text
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    all_special_ids: tuple[int, ...] = ()
    chat_template: str | dict[str, str] | None = None  # a dict: named templates
    clean_up_spaces: bool = False  # transformers' clean_up_tokenization runs on decoded text
    split_special_tokens: bool = False  # special tokens' texts are encoded as plain text
    architecture: str | None = None  # GGUF `general.architecture`: picks a fallback template

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "all_special_ids": list(self.all_special_ids)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TokenizerFacts:
        """KeyError/TypeError when `data` is not what to_json wrote."""
        facts = cls(**{name: data[name] for name in cls.__dataclass_fields__})
        return cls(**{**facts.__dict__, "all_special_ids": tuple(facts.all_special_ids)})


def load_tokenizer(source: Path) -> tuple[Any, TokenizerFacts] | None:
    """(Rust tokenizer, facts) of a GGUF file or HF directory (cached); None when it carries
    no tokenizer."""
    key = _source_key(source)
    if key is None:
        return None
    entry = _entry_dir(source, key)
    cached = _read_entry(entry, key)
    if cached is not None:
        return cached
    hf = transformers_tokenizer(source)
    if hf is None:
        return None
    backend, facts = convert(hf, _architecture(source))
    _write_entry(entry, key, source, backend, facts)
    return backend, facts


def transformers_tokenizer(source: Path) -> Any | None:
    """transformers' AutoTokenizer of the source; None when it has no tokenizer."""
    if source.is_dir():
        if not any((source / name).is_file() for name in _TOKENIZER_FILES):
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source)
    if "tokenizer.ggml.tokens" not in _gguf_metadata(source):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)


def convert(hf: Any, architecture: str | None = None) -> tuple[Any, TokenizerFacts]:
    """(Rust tokenizer, facts) that encode, decode and template like transformers' `hf`.
    ValueError for a tokenizer whose class changes any of that in Python."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    overridden = [
        name
        for name in _TEXT_METHODS
        if getattr(type(hf), name, None) is not getattr(PreTrainedTokenizerFast, name)
    ]
    if not isinstance(hf, PreTrainedTokenizerFast) or overridden:
        what = f"overrides {', '.join(overridden)}" if overridden else "is not a fast tokenizer"
        raise ValueError(
            f"the model's tokenizer class {type(hf).__name__} {what}: goodspeed runs a "
            "tokenizer through the `tokenizers` library as transformers configured it, and "
            "cannot reproduce tokenizer code written in Python"
        )
    backend = tokenizers.Tokenizer.from_str(hf.backend_tokenizer.to_str())  # a copy
    backend.no_padding()
    backend.no_truncation()
    model_type = type(hf.backend_tokenizer.model).__name__
    force_bpe = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
    facts = TokenizerFacts(
        special_tokens=dict(hf.special_tokens_map),
        bos_token_id=hf.bos_token_id,
        eos_token_id=hf.eos_token_id,
        all_special_ids=tuple(hf.all_special_ids),
        chat_template=hf.chat_template,
        # transformers skips the clean-up on BPE tokenizers unless forced (_decode)
        clean_up_spaces=bool(hf.clean_up_tokenization_spaces)
        and (model_type != "BPE" or bool(getattr(hf, force_bpe, False))),
        split_special_tokens=bool(hf.split_special_tokens),
        architecture=architecture,
    )
    return backend, facts


# ---- entries -----------------------------------------------------------------------------
def _source_key(source: Path) -> str | None:
    """What the converted tokenizer depends on: the source's files and the converting
    libraries' versions. None: no tokenizer files."""
    files = _source_files(source)
    if files is None:
        return None
    versions = [_version("transformers"), _version("tokenizers")]
    return json.dumps([FORMAT, str(source.resolve()), files, versions])


def _source_files(source: Path) -> list[list[Any]] | None:
    """[name, size, mtime] of the file, or of every file of the directory; None for a
    directory without tokenizer files."""
    if not source.is_dir():
        stat = source.stat()
        return [[source.name, stat.st_size, stat.st_mtime_ns]]
    files = sorted(
        [e.name, e.stat().st_size, e.stat().st_mtime_ns] for e in os.scandir(source) if e.is_file()
    )
    if not any(name in _TOKENIZER_FILES for name, _, _ in files):
        return None
    return files


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _cache_root() -> Path:
    root = os.environ.get("GOODSPEED_CACHE_DIR", "~/.cache/goodspeed")
    return Path(root).expanduser() / "tokenizers"


def _entry_dir(source: Path, key: str) -> Path:
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return _cache_root() / f"{source.stem}-{digest}"


def _read_entry(entry: Path, key: str) -> tuple[Any, TokenizerFacts] | None:
    """The cached (Rust tokenizer, facts), or None when there is no entry or it does not load
    (logged)."""
    import tokenizers

    try:
        data = json.loads((entry / _FACTS).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("ignoring the tokenizer cache entry %s: %s", entry, exc)
        return None
    try:
        if data.get("key") != key:
            raise ValueError("it was written for another source")
        facts = TokenizerFacts.from_json(data["facts"])
        backend = tokenizers.Tokenizer.from_file(str(entry / _BACKEND))
    except Exception as exc:  # noqa: BLE001 - a bad entry only costs a conversion
        logger.warning("ignoring the tokenizer cache entry %s: %s", entry, exc)
        return None
    return backend, facts


def _write_entry(entry: Path, key: str, source: Path, backend: Any, facts: TokenizerFacts) -> None:
    """Write the entry into a temporary sibling and rename it into place (replacing a bad
    one). Failure (a read-only home, a lost race) only costs the next start a conversion."""
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
        (tmp / _BACKEND).write_text(_backend_json(backend))
        record = {"key": key, "source": str(source.resolve()), "facts": facts.to_json()}
        (tmp / _FACTS).write_text(json.dumps(record))
        _replace_dir(tmp, entry)
        tmp = None
        _remove_stale_entries(entry.parent)
    except OSError as exc:
        logger.info("tokenizer not cached in %s: %s", entry, exc)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _backend_json(backend: Any) -> str:
    """The Rust tokenizer as JSON, its BPE merges as "a b" strings when no token holds a
    space: tokenizers reads that older form 10-20% faster than [a, b] pairs (Gemma's 262k
    tokens 0.85-0.94 s instead of 1.02-1.09 s, Qwen's 152k 0.30-0.32 s instead of 0.33-0.36).
    Used only when it reads back to the same tokenizer."""
    import tokenizers

    text = backend.to_str()
    data = json.loads(text)
    merges = (data.get("model") or {}).get("merges") or []
    if not merges or not all(
        isinstance(pair, list) and len(pair) == 2 and " " not in pair[0] + pair[1]
        for pair in merges
    ):
        return text
    data["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    legacy = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return legacy if tokenizers.Tokenizer.from_str(legacy).to_str() == text else text


def _replace_dir(new: Path, target: Path) -> None:
    """Rename `new` to `target`; an existing `target` (a bad entry) is moved aside first."""
    try:
        os.rename(new, target)
        return
    except OSError:
        if not target.exists():
            raise
    old = Path(tempfile.mkdtemp(dir=target.parent, prefix=".old-"))
    with contextlib.suppress(OSError):
        os.rename(target, old / "entry")
    os.rename(new, target)
    shutil.rmtree(old, ignore_errors=True)


def _remove_stale_entries(root: Path) -> None:
    """Remove entries whose source changed or is gone, so converted copies of deleted or
    rewritten models do not pile up (entries of other library versions stay: another
    environment may share the cache)."""
    for entry in root.iterdir():
        try:
            record = json.loads((entry / _FACTS).read_text())
            source, files = Path(record["source"]), json.loads(record["key"])[2]
            stale = not source.exists() or _source_files(source) != files
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue  # not an entry of this format, or one being written: leave it
        if stale:
            shutil.rmtree(entry, ignore_errors=True)


def _architecture(source: Path) -> str | None:
    return None if source.is_dir() else _gguf_metadata(source).get("general.architecture")


def _gguf_metadata(path: Path) -> dict[str, Any]:
    from engine.models.gguf_file import read_gguf

    return read_gguf(path).metadata
