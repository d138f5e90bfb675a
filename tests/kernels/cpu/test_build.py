"""Building and caching the native kernels; without a compiler, one log line and the fallback."""

from __future__ import annotations

import logging
import sys

import pytest
import torch
import torch.nn.functional as F
import torch.utils.cpp_extension

from kernels.cpu import build, native_available, qlinear
from tests.kernels.cpu.quant_cases import Q


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """A fresh process's view: an empty kernel cache, no library loaded, no outcome decided.
    The real state comes back after the test."""
    monkeypatch.setenv("GOODSPEED_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.delitem(sys.modules, build._module_name(), raising=False)
    build.load_native.cache_clear()
    yield tmp_path / "kernels"
    build.load_native.cache_clear()


def warnings_logged(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def check_fallback_results(case) -> None:
    x = torch.randn(3, case.weight.in_features)
    bias = torch.randn(case.weight.out_features)
    assert torch.equal(qlinear(x, case.weight, bias), F.linear(x, case.reference, bias))
    out = torch.zeros(3, case.weight.out_features + 2)
    qlinear(x, case.weight, out=out[:, 1:-1])
    assert torch.equal(out[:, 1:-1], F.linear(x, case.reference))


def test_missing_compiler_logs_one_line_and_computes_with_the_fallback(
    fresh_build, monkeypatch, caplog, quant_cases
):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with caplog.at_level(logging.DEBUG):
        assert not native_available()
        check_fallback_results(quant_cases[Q.Q4_1])
        assert not native_available()  # decided once: no second attempt, no second line
    [record] = warnings_logged(caplog)
    assert "no C++ compiler" in record.getMessage() and "/nonexistent/c++" in record.getMessage()
    assert not fresh_build.exists() or not any(fresh_build.rglob("*.so"))


def test_a_failing_compile_logs_its_error_line(fresh_build, monkeypatch, caplog, quant_cases):
    def failing_load(**kwargs):
        raise RuntimeError("Error building extension\nqlinear.cpp:1:1: error: something broke")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", failing_load)
    with caplog.at_level(logging.DEBUG):
        check_fallback_results(quant_cases[Q.Q8_0])
    [record] = warnings_logged(caplog)
    assert "error: something broke" in record.getMessage()


def test_disabled_by_environment(fresh_build, monkeypatch, caplog):
    monkeypatch.setenv("GOODSPEED_NATIVE_KERNELS", "0")
    with caplog.at_level(logging.DEBUG):
        assert not native_available()
    [record] = warnings_logged(caplog)
    assert "GOODSPEED_NATIVE_KERNELS=0" in record.getMessage()


def test_cache_key_follows_the_sources(monkeypatch, tmp_path):
    monkeypatch.setenv("GOODSPEED_KERNEL_CACHE", str(tmp_path))
    first = build.build_dir()
    assert first.parent == tmp_path and len(first.name) == 16
    monkeypatch.setattr(build, "CFLAGS", (*build.CFLAGS, "-DCHANGED"))
    assert build.build_dir() != first


def test_a_built_library_is_imported_without_compiling(native, monkeypatch):
    """The second process path: the cached .so is loaded directly (no compiler, no ninja)."""
    monkeypatch.delitem(sys.modules, native.__name__, raising=False)

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled although a built library is cached")

    monkeypatch.setattr(build, "_compile", no_compile)
    build.load_native.cache_clear()
    try:
        assert build.load_native() is not None
    finally:
        build.load_native.cache_clear()


def test_a_lock_left_by_a_killed_build_is_removed(fresh_build, monkeypatch, caplog):
    """torch waits forever on the `lock` file a killed build leaves; the build removes it (under
    its own flock, no other build can be running) before compiling."""
    directory = build.build_dir()
    directory.mkdir(parents=True)
    (directory / build.TORCH_LOCK).touch()
    compiled = type(sys)("stub_kernels")

    def load(**kwargs):
        assert not (directory / build.TORCH_LOCK).exists()
        return compiled

    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    with caplog.at_level(logging.DEBUG):
        assert build.load_native() is compiled
    [record] = warnings_logged(caplog)
    assert "interrupted build" in record.getMessage()
