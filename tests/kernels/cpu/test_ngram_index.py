"""The native n-gram index (kernels/cpu/ngram_index.py, csrc/ngram_index.cpp) against its
reference, the Python NgramIndex: every query equal after every sync, on random streams of few
symbols (long occurrence chains), of huge token ids, with orders up to the native limit, and
across a sync that shrinks."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from engine.speculation.proposers.ngram import NgramIndex, NgramProposer
from kernels.cpu.ngram_index import MAX_ORDER, NativeNgramIndex, native_ngram_index
from tests.engine.speculation.proposers.asks import ask, fresh_memos, memos  # noqa: F401


@pytest.fixture
def native():
    def make(n_min: int, n_max: int) -> NativeNgramIndex:
        index = native_ngram_index(n_min, n_max)
        if index is None:
            pytest.skip("the native CPU extension is not available")
        return index

    return make


def assert_same(native: NativeNgramIndex, python: NgramIndex, rng: random.Random) -> None:
    length = len(python.token_ids)
    assert len(native) == length
    assert native.tokens_between(0, length) == python.token_ids
    for k in (1, 2, rng.randint(3, 9)):
        assert native.best_match(k) == python.best_match(k), k
        for limit in (1, 3, 8):
            assert native.candidate_ends(k, limit) == python.candidate_ends(k, limit), (k, limit)
    start = rng.randint(0, length)
    assert native.tokens_between(start, start + 4) == python.tokens_between(start, start + 4)


@pytest.mark.parametrize("symbols", [2, 5, 50_000, 1 << 40])
def test_every_query_equals_the_python_index_after_every_sync(native, symbols):
    rng = random.Random(symbols)
    for _ in range(40):
        n_min = rng.randint(1, 3)
        n_max = rng.randint(n_min, 6)
        fast, reference = native(n_min, n_max), NgramIndex(n_min, n_max)
        tokens: list[int] = []
        for _ in range(rng.randint(1, 10)):
            # copied spans, as prompts and outputs repeat themselves
            if tokens and rng.random() < 0.5:
                start = rng.randrange(len(tokens))
                tokens += tokens[start : start + rng.randint(1, 30)]
            tokens += [rng.randrange(symbols) for _ in range(rng.randint(1, 40))]
            fast.sync(tokens)
            reference.sync(tokens)
            assert_same(fast, reference, rng)


def test_long_orders_long_contexts_and_a_shrinking_sync(native):
    rng = random.Random(3)
    tokens = [rng.randrange(3) for _ in range(3000)]
    fast, reference = native(1, MAX_ORDER), NgramIndex(1, MAX_ORDER)
    for end in (1, 17, 400, 3000):
        fast.sync(tokens[:end])
        reference.sync(tokens[:end])
        assert_same(fast, reference, rng)
    fast.sync(tokens[:10])  # fewer tokens: indexed again from scratch, as the Python index
    reference.sync(tokens[:10])
    assert_same(fast, reference, rng)
    assert native_ngram_index(1, MAX_ORDER + 1) is None  # past the native orders: Python


def test_the_proposer_drafts_the_same_with_either_index(native, monkeypatch):
    """The proposer's chains and trees with the native index equal those with the Python one."""
    rng = random.Random(5)
    streams = [[rng.randrange(6) for _ in range(rng.randint(5, 200))] for _ in range(30)]
    asks = [ask(str(i), s, rng.randint(1, 8), tree=i % 2 == 1) for i, s in enumerate(streams)]
    native(1, 4)  # skips without the extension
    with_native = NgramProposer(1, 4).propose(asks)
    assert all(isinstance(memos(a.request_id)["ngram"], NativeNgramIndex) for a in asks)
    monkeypatch.setattr("kernels.cpu.ngram_index.native_ngram_index", lambda *a: None)
    asks = [ask(a.request_id + "p", a.token_ids, a.num_draft_tokens, tree=a.tree) for a in asks]
    with_python = NgramProposer(1, 4).propose(asks)
    assert {k + "p": v for k, v in with_native.chains.items()} == with_python.chains
    assert {k + "p": v for k, v in with_native.trees.items()} == with_python.trees
    assert with_python.chains and with_python.trees
    assert all(isinstance(memos(a.request_id)["ngram"], NgramIndex) for a in asks)


def test_the_proposer_module_imports_no_torch():
    """The n-gram proposer imports the native index (and with it torch) only when it makes an
    index: what sits above the runner stays plain Python to import (DESIGN §1)."""
    code = "import sys, engine.speculation.proposers.ngram; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
