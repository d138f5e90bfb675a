"""Build and load the native CPU kernels (csrc/) once per source version, or say why not.

The extension is compiled with `torch.utils.cpp_extension.load` (g++ and ninja) into
`$GOODSPEED_KERNEL_CACHE/<hash>` (default `~/.cache/goodspeed/kernels/<hash>`), where the hash
covers the sources, the compiler flags and the torch and Python versions; a later process
imports the built library directly, without a compiler. The code is not compiled for the build
machine's CPU (no -march=native): AVX2 and AVX-512 functions carry target attributes and are
chosen at run time from the CPU's features, so a cached library is safe on any x86-64 CPU.

If the build cannot run (no compiler, no ninja: checked first, so torch logs nothing), fails (a
compile error) or `GOODSPEED_NATIVE_KERNELS=0`, `load_native()` returns None after logging ONE
warning that says why; callers then use the PyTorch fallback. Decided once per process.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import platform
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = (
    "qlinear.cpp",
    "qint_avx512.cpp",
    "qint_avx2.cpp",
    "qint_scalar.cpp",
    "decode_ops.cpp",
    "stack.cpp",
    "race.cpp",
    "ngram_index.cpp",
    "topk.cpp",
)  # translation units; the headers are included
# No FMA contraction outside explicit intrinsics: the scalar path's arithmetic stays as written.
# -fopenmp: at::parallel_for is a header template that only fans out when the extension itself
# is compiled with OpenMP (as ATen is); without it every call ran on one thread.
CFLAGS = ("-O3", "-std=c++17", "-ffp-contract=off", "-fopenmp")
LDFLAGS = ("-fopenmp",)
DEFAULT_CACHE = "~/.cache/goodspeed/kernels"
_DISABLE_ENV = "GOODSPEED_NATIVE_KERNELS"
_CACHE_ENV = "GOODSPEED_KERNEL_CACHE"
TORCH_LOCK = "lock"  # torch.utils.cpp_extension's FileBaton in the build directory


@functools.cache
def _sources_hashed() -> hashlib._Hash:
    """The sources' names and bytes, hashed once a process: a start asks for the build's
    identity three times, and on a cold page cache each read of the 24 files took ~10 ms."""
    digest = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest


def source_hash() -> str:
    """Identity of a build: sources, flags, torch, Python and machine."""
    digest = _sources_hashed().copy()
    for part in (*CFLAGS, *LDFLAGS, torch.__version__, sys.version, platform.machine()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    root = Path(os.environ.get(_CACHE_ENV) or DEFAULT_CACHE).expanduser()
    return root / source_hash()


def _module_name() -> str:
    # Unique per source version: Python cannot load two libraries under one module name.
    return f"goodspeed_cpu_{source_hash()}"


def _import_built(directory: Path, name: str) -> ModuleType | None:
    if name in sys.modules:  # loaded earlier in this process (e.g. before a cache_clear)
        return sys.modules[name]
    library = directory / f"{name}.so"
    if not library.is_file():
        return None
    loader = importlib.machinery.ExtensionFileLoader(name, str(library))
    spec = importlib.util.spec_from_file_location(name, library, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


def load_build(source_hash: str) -> ModuleType | None:
    """An earlier build in the kernel cache, by its source hash (benchmarks A/B two versions in
    one process); None if it was never built here."""
    directory = Path(DEFAULT_CACHE).expanduser() / source_hash
    return _import_built(directory, f"goodspeed_cpu_{source_hash}")


def missing_tool() -> str | None:
    """Why a build cannot even start (no compiler, no ninja), or None."""
    from torch.utils.cpp_extension import is_ninja_available

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler: {compiler!r} is not on PATH (install g++ or set CXX)"
    if not is_ninja_available():
        return "ninja is not installed (pip install ninja)"
    return None


def _compile(directory: Path, name: str) -> ModuleType:
    from torch.utils.cpp_extension import load

    reason = missing_tool()
    if reason is not None:
        raise BuildUnavailable(reason)
    directory.mkdir(parents=True, exist_ok=True)
    with _one_builder(directory):
        built = _import_built(directory, name)  # another process built it while this one waited
        if built is not None:
            return built
        _drop_stale_torch_lock(directory)
        logger.info("compiling the native CPU kernels, once per source version (~2 min on 2 cores)")
        start = time.perf_counter()
        module = load(
            name=name,
            sources=[str(CSRC / name) for name in SOURCES],
            extra_cflags=list(CFLAGS),
            extra_ldflags=list(LDFLAGS),
            build_directory=str(directory),
            verbose=False,
        )
    sys.modules[name] = module  # as _import_built does: one library object per process
    logger.info(
        "compiled the native CPU kernels in %.1f s into %s", time.perf_counter() - start, directory
    )
    return module


@contextlib.contextmanager
def _one_builder(directory: Path) -> Iterator[None]:
    """One builder per build directory across processes, by an flock the OS releases when its
    holder dies (torch's own `lock` file outlives a killed build)."""
    with open(directory / "goodspeed-build.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process's build of the native CPU kernels")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _drop_stale_torch_lock(directory: Path) -> None:
    """Under _one_builder no other build runs, so a `lock` file torch left is a killed build's,
    and torch would wait on it forever."""
    stale = directory / TORCH_LOCK
    if stale.exists():
        logger.warning("removing %s, left by an interrupted build", stale)
        stale.unlink()


@functools.cache
def load_native() -> ModuleType | None:
    """The compiled extension, or None (after one warning) when it cannot be had."""
    if os.environ.get(_DISABLE_ENV, "1") == "0":
        logger.warning("native CPU kernels disabled (%s=0): using the PyTorch path", _DISABLE_ENV)
        return None
    directory, name = build_dir(), _module_name()
    try:
        return _import_built(directory, name) or _compile(directory, name)
    except Exception as error:  # noqa: BLE001 - any build failure means "use the fallback"
        logger.warning("native CPU kernels unavailable (%s): using the PyTorch path", _why(error))
        return None


class BuildUnavailable(RuntimeError):
    """A tool the build needs is missing."""


def _why(error: BaseException) -> str:
    """One short line: the compiler's first `error:` line when there is one."""
    if isinstance(error, BuildUnavailable):
        return str(error)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    line = (errors or lines or ["no message"])[0]
    return f"{type(error).__name__}: {line[:300]}"
