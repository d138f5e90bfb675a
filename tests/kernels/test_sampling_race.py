"""The exponential race (kernels/sampling.py): its noise (native kernel and PyTorch twin, bit
for bit, any thread count), its law (a sample of p; Gumbel-top-k a sample without
replacement), and its coupling (two distributions raced with the same noise agree with
probability >= (1 - TV) / (1 + TV), Daliri, Musco & Suresh 2025)."""

from __future__ import annotations

import pytest
import torch

from engine.sample.rng import race_keys
from kernels.cpu.build import load_native
from kernels.sampling import race_topk, race_uniforms, race_uniforms_torch, sample_from_probs
from tests.stats import chi_square_pvalue

ALPHA = 1e-3


def keys_of(n: int, position: int = 0) -> torch.Tensor:
    return torch.from_numpy(race_keys(range(n), [position] * n))


@pytest.mark.parametrize("vocab_size", [7, 1000, 49152])
def test_native_and_torch_noise_agree_bit_for_bit(vocab_size):
    ops = load_native()
    if ops is None:
        pytest.skip("native CPU kernels unavailable")
    keys = torch.cat([keys_of(5), torch.tensor([0, -1, 2**63 - 1, -(2**63)])])
    native = ops.race_uniforms(keys, vocab_size)
    assert torch.equal(native, race_uniforms_torch(keys, vocab_size))
    assert float(native.min()) > 0.0 and float(native.max()) < 1.0
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(ops.race_uniforms(keys, vocab_size), native)
    finally:
        torch.set_num_threads(threads)


def test_noise_is_uniform_and_depends_on_key_and_token_only():
    u = race_uniforms(keys_of(64), 512)
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    assert torch.equal(race_uniforms(keys_of(64)[3:4], 512), u[3:4])  # alone = batched
    assert torch.equal(race_uniforms(keys_of(64), 100), u[:, :100])


def test_the_race_samples_p_and_never_a_masked_token():
    probs = torch.tensor([0.5, 0.0, 0.2, 0.1, 0.0, 0.15, 0.05])
    tokens = sample_from_probs(probs.expand(20_000, -1).contiguous(), keys_of(20_000))
    counts = torch.bincount(tokens, minlength=probs.numel())
    assert counts[1] == 0 and counts[4] == 0
    assert chi_square_pvalue(counts, probs) > ALPHA


def test_gumbel_top_2_is_a_sample_without_replacement():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    pairs = race_topk(probs.expand(30_000, -1).contiguous(), keys_of(30_000, 7), 2)
    codes = pairs[:, 0] * 4 + pairs[:, 1]
    law = torch.zeros(16, dtype=torch.float64)
    for a in range(4):
        for b in range(4):
            if a != b:
                law[a * 4 + b] = probs[a] * probs[b] / (1 - probs[a])
    assert torch.equal(pairs[:, 0], sample_from_probs(probs.expand(30_000, -1), keys_of(30_000, 7)))
    assert chi_square_pvalue(torch.bincount(codes, minlength=16), law) > ALPHA


def test_raced_pairs_agree_at_least_as_often_as_the_coupling_bound():
    """Random (p, q) over 16 tokens, from near to far apart: the observed agreement of the two
    races, over 4000 keys, is above (1 - TV) / (1 + TV) less four standard errors."""
    generator = torch.Generator().manual_seed(0)
    num_keys, checked = 4000, 0
    keys = keys_of(num_keys, 3)
    for scale in (0.1, 0.5, 1.0, 2.0, 4.0):
        for _ in range(6):
            logits = torch.randn(16, generator=generator) * 2
            p = torch.softmax(logits, -1)
            q = torch.softmax(logits + scale * torch.randn(16, generator=generator), -1)
            tv = 0.5 * float((p - q).abs().sum())
            bound = (1 - tv) / (1 + tv)
            same = sample_from_probs(p.expand(num_keys, -1), keys) == sample_from_probs(
                q.expand(num_keys, -1), keys
            )
            rate = float(same.double().mean())
            error = (bound * (1 - bound) / num_keys) ** 0.5
            assert rate >= bound - 4 * error - 1e-9, (scale, tv, rate, bound)
            assert rate <= 1 - tv + 4 * error + 1e-9  # no coupling beats the optimum
            checked += 1
    assert checked == 30


def test_keys_of_the_wrong_type_are_refused():
    with pytest.raises(ValueError, match="int64"):
        race_uniforms(torch.tensor([0.5], dtype=torch.float64), 8)
    with pytest.raises(ValueError, match="int64"):
        race_uniforms_torch(torch.tensor([0.5], dtype=torch.float64), 8)
