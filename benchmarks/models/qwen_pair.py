"""Where benchmarks/models/qwen_pair.sh puts the Qwen2.5-Coder target/draft pair.

The file names and the QWEN_PAIR_DIR variable must match the script's.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_ENV = "QWEN_PAIR_DIR"
DEFAULT_DIR = "~/.cache/goodspeed/models/qwen-pair"
TARGET_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
# llama.cpp labels it Q4_K_M (file type 15), but its 896-wide rows are not a multiple of 256,
# so most tensors fell back to Q5_0; converted from Qwen's AWQ checkpoint (general.name).
DRAFT_FILE = "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"
FETCH_HINT = "run benchmarks/models/qwen_pair.sh"


def pair_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or DEFAULT_DIR).expanduser()


def pair_paths() -> tuple[Path, Path] | None:
    """(target, draft) GGUF paths, or None when either file is missing."""
    target, draft = pair_dir() / TARGET_FILE, pair_dir() / DRAFT_FILE
    return (target, draft) if target.is_file() and draft.is_file() else None
