"""Where benchmarks/models/gemma3.sh puts Gemma 3 270M (Q4_K_M).

The file name and the GEMMA3_DIR variable must match the script's.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_ENV = "GEMMA3_DIR"
DEFAULT_DIR = "~/.cache/goodspeed/models/gemma3"
FILE = "gemma-3-270m-q4_k_m.gguf"
FETCH_HINT = "run benchmarks/models/gemma3.sh"


def gemma3_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or DEFAULT_DIR).expanduser()


def gemma3_path() -> Path | None:
    """The GGUF's path, or None when it is missing."""
    path = gemma3_dir() / FILE
    return path if path.is_file() else None
