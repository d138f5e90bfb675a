"""Fixtures for the CPU kernel tests: the quantized cases (quant_cases.py) and the native ops."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from kernels.cpu import load_native
from tests.kernels.cpu.quant_cases import Case, Q, write_and_read


@pytest.fixture(scope="session")
def quant_cases(tmp_path_factory) -> dict[Q, Case]:
    return write_and_read(tmp_path_factory.mktemp("gguf") / "w.gguf", np.random.default_rng(0))


@pytest.fixture(scope="session")
def native():
    """The compiled kernels (built on first use). Without a C++ compiler the tests that need
    them skip; with one, a failed build fails them."""
    ops = load_native()
    if ops is None and shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler: the native CPU kernels cannot be built here")
    assert ops is not None, "the native CPU kernels did not build; see the warning logged"
    return ops
