"""Statistical losslessness: speculative output is distributed exactly as sampling from p.

Set-up: a fixed Markov "target" P[prev] over V = 8 tokens and a different Markov "draft" Q.
Each test runs NUM_TRIALS seeded trials at once through the batched verification cores (the
same maths the per-request functions call, see test_verify.py), chaining verify steps until
every trial has emitted SEQ_LEN tokens, and compares the joint law of those tokens with
P[root, t1] * P[t1, t2] * P[t2, t3] by a chi-square goodness-of-fit test (cells with expected
count < 5 pooled). Lossless runs must give p-value > ALPHA; the planted-bug runs (residual not
subtracted, ratio test ignoring q) must give p-value < BUG_ALPHA, which shows the check can fail.
"""

from __future__ import annotations

import pytest
import torch

import engine.speculation.verify as verify
from engine.speculation.tree import path_to
from kernels.sampling import inverse_cdf, sample_from_probs
from tests.stats import chi_square_pvalue

VOCAB = 8
ROOT = 3
SEQ_LEN = 3
NUM_TRIALS = 40_000
ALPHA = 1e-3  # a correct verifier fails at this rate per test (fixed seeds make it repeatable)
BUG_ALPHA = 1e-9
# Tree shape: two root children (tried in order), each with a child; node 2 has a child too.
TREE_PARENTS = (None, None, 0, 1, 2)


def markov(seed: int, scale: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(VOCAB, VOCAB, generator=generator), dim=-1)


TARGET = markov(0, 1.0)
DRAFT = markov(1, 1.0)


def _joint_probs() -> torch.Tensor:
    probs = TARGET[ROOT]  # [V]
    for _ in range(SEQ_LEN - 1):
        last = torch.arange(probs.numel()) % VOCAB
        probs = (probs[:, None] * TARGET[last]).flatten()
    return probs


def encode(sequences: torch.Tensor) -> torch.Tensor:
    codes = torch.zeros(sequences.shape[0], dtype=torch.long)
    for j in range(SEQ_LEN):
        codes = codes * VOCAB + sequences[:, j]
    return codes


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row, by inverse CDF (faster than torch.multinomial for many tiny rows)."""
    uniforms = torch.rand(probs.shape[0], dtype=torch.float64, generator=generator)
    return inverse_cdf(probs, uniforms)


def draw_chain(prev: torch.Tensor, generator: torch.Generator, k: int, sampled: bool):
    """Drafts [B, k] from Q (sampled) or Q's argmax chain (deterministic), plus q rows or None."""
    drafts, q_rows, current = [], [], prev
    for _ in range(k):
        q = DRAFT[current]
        token = draw(q, generator) if sampled else q.argmax(-1)
        drafts.append(token)
        q_rows.append(q)
        current = token
    return torch.stack(drafts, 1), (torch.stack(q_rows, 1) if sampled else None)


def chain_step(prev, generator, k: int, sampled: bool, shared_uniform: bool = False):
    """One verify step for every trial -> (emitted [B, k + 1] padded, lengths [B]).

    shared_uniform plants a bug: one acceptance uniform reused for every draft of the step.
    """
    drafts, q = draw_chain(prev, generator, k, sampled)
    context = torch.cat([prev[:, None], drafts], dim=1)  # [B, k + 1]
    uniforms = torch.rand(prev.shape[0], k + 1, dtype=torch.float64, generator=generator)
    if shared_uniform:
        uniforms[:, 1:k] = uniforms[:, :1]
    num_accepted, next_token = verify.chain_verify_batch(TARGET[context], drafts, q, uniforms)
    emitted = torch.cat([drafts, next_token[:, None]], dim=1)
    emitted[torch.arange(prev.shape[0]), num_accepted] = next_token
    return emitted, num_accepted + 1


def draw_tree(prev, generator, mode: str):
    """Tokens [B, n] for TREE_PARENTS and the q rows the verifier is told (None: deterministic).

    iid: every node drawn independently from Q at its parent (q given); deterministic: root
    children are Q's best two, deeper nodes Q's argmax; duplicate: the best token twice;
    without-replacement: root children are two distinct draws from Q but q claims i.i.d. (a bug).
    """
    tokens, q_rows = [], []
    top2 = DRAFT[prev].topk(2, dim=-1).indices
    for node, parent in enumerate(TREE_PARENTS):
        q = DRAFT[prev if parent is None else tokens[parent]]
        if mode == "without-replacement" and node == 1:
            q_left = q.scatter(-1, tokens[0][:, None], 0.0)
            token = draw(q_left, generator)
        elif mode in ("iid", "without-replacement"):
            token = draw(q, generator)
        elif parent is None:
            token = top2[:, 0 if mode == "duplicate" else node]
        else:
            token = q.argmax(-1)
        tokens.append(token)
        q_rows.append(q)
    sampled = mode in ("iid", "without-replacement")
    return torch.stack(tokens, 1), (torch.stack(q_rows, 1) if sampled else None)


def tree_step(prev, generator, mode: str):
    tokens, q = draw_tree(prev, generator, mode)
    batch, num_nodes = tokens.shape
    context = torch.cat([prev[:, None], tokens], dim=1)  # rows [root, nodes...]
    uniforms = torch.rand(batch, num_nodes + 1, dtype=torch.float64, generator=generator)
    last_node, next_token = verify.tree_verify_batch(
        TARGET[context], TREE_PARENTS, tokens, q, uniforms
    )
    return _tree_emitted(tokens, last_node, next_token)


def _tree_emitted(tokens, last_node, next_token):
    """Path tokens of each trial's last node followed by its next token, padded."""
    from engine.speculation.tree import DraftTree

    shape = DraftTree(token_ids=(0,) * len(TREE_PARENTS), parent_ids=TREE_PARENTS)
    paths = [path_to(shape, None)] + [path_to(shape, n) for n in range(len(TREE_PARENTS))]
    max_len = max(len(p) for p in paths) + 1
    emitted = torch.zeros(tokens.shape[0], max_len, dtype=torch.long)
    lengths = torch.zeros(tokens.shape[0], dtype=torch.long)
    for row, path in enumerate(paths):
        trials = last_node == row - 1
        for depth, node in enumerate(path):
            emitted[trials, depth] = tokens[trials, node]
        emitted[trials, len(path)] = next_token[trials]
        lengths[trials] = len(path) + 1
    return emitted, lengths


def generate(step, seed: int) -> torch.Tensor:
    """Chain verify steps until every trial has SEQ_LEN tokens -> codes of the first SEQ_LEN."""
    generator = torch.Generator().manual_seed(seed)
    sequences = torch.zeros(NUM_TRIALS, SEQ_LEN + 1, dtype=torch.long)  # last column: overflow
    filled = torch.zeros(NUM_TRIALS, dtype=torch.long)
    prev = torch.full((NUM_TRIALS,), ROOT, dtype=torch.long)
    rows = torch.arange(NUM_TRIALS)
    while bool((filled < SEQ_LEN).any()):
        emitted, lengths = step(prev, generator)
        for j in range(emitted.shape[1]):
            valid = j < lengths
            column = torch.where(valid, (filled + j).clamp(max=SEQ_LEN), SEQ_LEN)
            sequences[rows, column] = torch.where(valid, emitted[:, j], sequences[rows, column])
        filled = filled + lengths
        prev = emitted[rows, lengths - 1]
    return encode(sequences[:, :SEQ_LEN])


def pvalue_of(step, seed: int = 0) -> float:
    codes = generate(step, seed)
    counts = torch.bincount(codes, minlength=VOCAB**SEQ_LEN)
    return chi_square_pvalue(counts, _joint_probs())


STEPS = {
    "chain-draft-model": lambda prev, g: chain_step(prev, g, k=2, sampled=True),
    "chain-deterministic": lambda prev, g: chain_step(prev, g, k=2, sampled=False),
    "tree-draft-model": lambda prev, g: tree_step(prev, g, "iid"),
    "tree-deterministic": lambda prev, g: tree_step(prev, g, "deterministic"),
    "tree-duplicate-siblings": lambda prev, g: tree_step(prev, g, "duplicate"),
}


def test_joint_probs_is_a_distribution():
    probs = _joint_probs()
    assert probs.shape == (VOCAB**SEQ_LEN,)
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-5)
    # Spot check one cell against the chain rule.
    t1, t2, t3 = 5, 0, 7
    expected = TARGET[ROOT, t1] * TARGET[t1, t2] * TARGET[t2, t3]
    assert probs[(t1 * VOCAB + t2) * VOCAB + t3].item() == pytest.approx(expected.item())


@pytest.mark.parametrize("name", list(STEPS))
def test_speculative_output_matches_target(name):
    pvalue = pvalue_of(STEPS[name])
    assert pvalue > ALPHA, f"{name}: p-value {pvalue:.3g}"


def test_direct_sampling_passes_the_same_check():
    """The reference itself (sample_from_probs on P) passes: the check is calibrated."""

    def direct(prev, generator):
        token = torch.multinomial(TARGET[prev], 1, generator=generator)
        return token, torch.ones_like(prev)

    assert pvalue_of(direct) > ALPHA


def test_sampler_kernel_matches_probs():
    probs = TARGET[ROOT].expand(NUM_TRIALS, VOCAB).contiguous()
    torch.manual_seed(0)
    tokens = sample_from_probs(probs, [None] * NUM_TRIALS)
    assert chi_square_pvalue(torch.bincount(tokens, minlength=VOCAB), TARGET[ROOT]) > ALPHA


def _keep_p(p, q):  # planted bug: correction drawn from p instead of the residual
    return p


@pytest.mark.parametrize(
    "name", ["chain-draft-model", "chain-deterministic", "tree-draft-model", "tree-deterministic"]
)
def test_check_rejects_residual_not_subtracted(monkeypatch, name):
    monkeypatch.setattr(verify, "residual", _keep_p)
    pvalue = pvalue_of(STEPS[name])
    assert pvalue < BUG_ALPHA, f"{name}: planted bug not detected, p-value {pvalue:.3g}"


def test_check_rejects_correlated_uniforms():
    """Planted bug through a parameter: one uniform reused for every draft of a step."""
    step = lambda prev, g: chain_step(prev, g, k=2, sampled=True, shared_uniform=True)  # noqa: E731
    assert pvalue_of(step) < BUG_ALPHA


def test_check_rejects_siblings_drawn_without_replacement_but_called_iid():
    """The pitfall for tree proposers: distinct siblings must not claim i.i.d. q rows."""
    assert pvalue_of(lambda prev, g: tree_step(prev, g, "without-replacement")) < BUG_ALPHA
