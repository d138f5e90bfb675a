"""The start-up profile's fitted cost models on disk: one JSON file keyed by (model, device,
dtype, threads), so a server's next start loads its fit instead of profiling again
(profiler.py writes and reads it; OnlineLinearCostModel.to_params / load_params are the values).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def cache_key(model: str, device: str, dtype: str, threads: int | None) -> str:
    return f"{model}|{device}|{dtype}|{threads if threads is not None else 'default'}"


class CostModelCache:
    """A JSON file of fitted cost models keyed by (model, device, dtype, threads)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}  # a missing or corrupt cache only costs a re-profile
        return data if isinstance(data, dict) else {}

    def load(self, key: str | tuple) -> dict[str, Any] | None:
        return self._read().get(_key_text(key))

    def save(self, key: str | tuple, params: dict[str, Any]) -> None:
        data = self._read()
        data[_key_text(key)] = params
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(data))
        os.replace(partial, self.path)  # atomic: a concurrent reader sees old or new, never half


def _key_text(key: str | tuple) -> str:
    return key if isinstance(key, str) else cache_key(*key)
