"""Pick the attention backend by name: "reference", "cpu", "flashinfer" or "auto".

auto = FlashInfer when the device is CUDA, the dtype is one its kernels take (when known) and
flashinfer imports; the native CPU backend (kernels/cpu/paged_attention.py) on the CPU in float32 when
the extension loaded; the reference backend otherwise. One log line says which and why.
"""

from __future__ import annotations

import logging

import torch

from kernels.attention import AttentionBackend

logger = logging.getLogger(__name__)

BACKEND_NAMES = ("auto", "reference", "cpu", "flashinfer")


def flashinfer_unavailable_reason(
    device: torch.device, dtype: torch.dtype | None = None
) -> str | None:
    """Why FlashInfer cannot run here, or None when it can."""
    if device.type != "cuda":
        return f"device is {device.type}, FlashInfer needs CUDA"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {dtype} is not float16/bfloat16"
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA/JIT error raised at import time
        return f"flashinfer does not import ({type(exc).__name__}: {exc})"
    return None


def _reference() -> AttentionBackend:
    from kernels.reference import ReferenceBackend

    return ReferenceBackend()


def cpu_unavailable_reason(device: torch.device, dtype: torch.dtype | None = None) -> str | None:
    """Why the native CPU backend cannot run here, or None when it can."""
    if device.type != "cpu":
        return f"device is {device.type}"
    if dtype is not None and dtype != torch.float32:
        return f"dtype {dtype} is not float32"
    from kernels.cpu.build import load_native

    if load_native() is None:
        return "the native CPU kernels are not built (see the warning above)"
    return None


def _cpu() -> AttentionBackend:
    from kernels.cpu.paged_attention import CpuPagedBackend

    return CpuPagedBackend()


def _flashinfer(device: torch.device) -> AttentionBackend:
    from kernels.flashinfer_backend import FlashInferBackend

    return FlashInferBackend(device)


def make_attention_backend(
    name: str, device: torch.device | str, dtype: torch.dtype | None = None
) -> AttentionBackend:
    """The backend called `name` for `device`; dtype (optional) lets auto avoid float32."""
    device = torch.device(device)
    if name not in BACKEND_NAMES:
        raise ValueError(f"attention_backend must be one of {BACKEND_NAMES}, got {name!r}")
    if name == "reference":
        logger.info("attention backend: reference (requested)")
        return _reference()
    if name == "cpu":
        reason = cpu_unavailable_reason(device, dtype)
        if reason is not None:
            raise ValueError(f"attention_backend=cpu is unavailable: {reason}")
        logger.info("attention backend: cpu (requested)")
        return _cpu()
    reason = flashinfer_unavailable_reason(device, dtype)
    if name == "flashinfer":
        if reason is not None:
            raise ValueError(
                f"attention_backend=flashinfer is unavailable: {reason}; "
                "use attention_backend=reference or auto"
            )
        logger.info("attention backend: flashinfer (requested)")
        return _flashinfer(device)
    if reason is None:
        logger.info("attention backend: flashinfer (auto: CUDA and flashinfer available)")
        return _flashinfer(device)
    cpu_reason = cpu_unavailable_reason(device, dtype)
    if cpu_reason is None:
        logger.info("attention backend: cpu (auto: native CPU kernels, float32)")
        return _cpu()
    logger.info("attention backend: reference (auto: %s; %s)", reason, cpu_reason)
    return _reference()
