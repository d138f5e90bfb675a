"""HF checkpoint directories: config.json + safetensors (one file, or shards listed in
model.safetensors.index.json) -> ModelArchConfig + (name, tensor) pairs in stored dtype.

Gemma's RMSNorm scales by (1 + w); its norm weights come out as 1 + w (float32), the form the
decoder's RMSNorm takes and the form GGUF files store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.models.arch_config import ModelArchConfig

INDEX_FILE = "model.safetensors.index.json"
# model_type values whose checkpoints store norm weights as w for a (1 + w) scale.
_UNIT_OFFSET_NORMS = ("gemma3_text",)


def hf_config(model_dir: Path) -> ModelArchConfig:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{model_dir} has no config.json; expected an HF model directory")
    config = json.loads(config_path.read_text())
    generation = model_dir / "generation_config.json"
    if generation.is_file():  # its eos_token_id (often a list) adds to config.json's
        extra = json.loads(generation.read_text()).get("eos_token_id")
        config["eos_token_id"] = _id_list(config.get("eos_token_id")) + [
            t for t in _id_list(extra) if t not in _id_list(config.get("eos_token_id"))
        ]
    return ModelArchConfig.from_hf_config(config)


def _id_list(value: int | list[int] | None) -> list[int]:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files: the shards named by the index, or every *.safetensors file."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"{model_dir} has no *.safetensors weights (.bin checkpoints are not supported)"
        )
    return files


def count_hf_weights(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in safetensors_files(model_dir):
        with safe_open(path, framework="pt") as f:
            total += len(list(f.keys()))
    return total


def iter_hf_weights(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from every weight file, one tensor in memory at a time (Gemma's
    norm weights as 1 + w, see the module docstring)."""
    from safetensors import safe_open

    model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    unit_offset = model_type in _UNIT_OFFSET_NORMS
    for path in safetensors_files(model_dir):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                if unit_offset and name.endswith("norm.weight"):
                    tensor = 1.0 + tensor.float()
                yield name, tensor
