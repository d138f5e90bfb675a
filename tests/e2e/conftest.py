"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import pytest

from tests import kquants
from tests.engine.models.conftest import KQUANT_DIMS, build_hf_model
from tests.engine.models.test_gguf_loader import write_gguf


@pytest.fixture(scope="module")
def kquant_gguf(tmp_path_factory):
    """A tiny random Llama written as a GGUF in llama.cpp's Q4_K_M mix (Q4_K and Q6_K blocks)."""
    root = tmp_path_factory.mktemp("kquant")
    hf_dir, _ = build_hf_model(root / "hf", **KQUANT_DIMS)
    return write_gguf(root / "k.gguf", hf_dir, qtype=kquants.q4_k_m)
