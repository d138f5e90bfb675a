"""Lossless speculative verification of one request's drafts (DESIGN §5).

Terms, for a chain of k drafts x_0..x_{k-1} proposed after the root (the last verified token):
    p_j       target distribution at draft position j: Sampler.process() of the target row that
              predicts x_j (row 0 is the root's). p has k + 1 rows; p_k follows the last draft.
    q_j       the distribution x_j was drawn from (draft model, same sampling transforms), or a
              point mass on x_j for a deterministic proposer (n-gram): q = None.
    accepted  x_j is kept with probability min(1, p_j(x_j) / q_j(x_j)), tested as
              u_j * q_j(x_j) < p_j(x_j) with u_j ~ U[0, 1), while every earlier draft was kept.
    rejected  the first draft not accepted; nothing after it is looked at.
    residual  normalize(max(p_j - q_j, 0)): the mass p_j has beyond what q_j proposes. The
              correction token replacing a rejected x_j is drawn from it.
    bonus     when all k drafts are accepted, one more token is drawn from p_k.
The step emits the accepted drafts and exactly one correction or bonus token; their joint law is
that of sampling from p token by token (Leviathan et al. 2023; Chen et al. 2023).

Trees (SpecInfer, Miao et al. 2024, "multi-step speculative sampling"): at the current node with
residual r (initially p at that node), try its children c in index order; accept c with
probability min(1, r(c) / q_c(c)), moving to c with r = p_c; on rejection set
r <- normalize(max(r - q_c, 0)). When no child is accepted (or the node is a leaf), draw the
final token from r. This is lossless when each child is drawn independently from its q_c, or is
chosen deterministically (q = None: a point mass, so a rejected token's mass is removed and a
repeated sibling token can never be accepted). Greedy: a draft is accepted iff it equals the
target argmax at its parent; greedy trees keep the longest such path.

Randomness: each call draws one uniform per draft / node first, then one Exp(1) noise row; the
final token is argmax(r / noise) (exponential race, kernels.sampling). The batched cores take
these draws as tensors, so tests can run thousands of trials at once through the same maths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.spec.tree import DraftTree, path_to, visible_rows
from kernels.sampling import exponential_noise


@dataclass(frozen=True)
class VerifyResult:
    token_ids: tuple[int, ...]  # accepted drafts, then one correction or bonus token
    accepted_node_ids: tuple[int, ...]  # tree nodes (chains: draft indices) on the accepted path

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_node_ids)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(p - q, 0)) over the last dim; rows with no mass left fall back to p.

    A rejection implies q(x) > p(x), so the residual has positive mass in exact arithmetic; the
    fallback only guards float round-off when p and q agree to the last bit.
    """
    excess = (p - q).clamp(min=0)
    mass = excess.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, excess / mass.clamp(min=torch.finfo(p.dtype).tiny), p)


def tree_attention_mask(tree: DraftTree, device: torch.device | None = None) -> torch.Tensor:
    """[n + 1, n + 1] bool over rows [root, nodes...]: a row sees the root, its ancestors, itself."""
    num_rows = tree.num_nodes + 1
    rows, cols = [], []
    for row, visible in enumerate(visible_rows(tree)):
        rows.extend([row] * len(visible))
        cols.extend(visible)
    mask = torch.zeros(num_rows, num_rows, dtype=torch.bool, device=device)
    mask[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = True
    return mask


def verify_greedy_chain(
    target_token_ids: Sequence[int] | torch.Tensor, draft_token_ids: Sequence[int]
) -> VerifyResult:
    """target_token_ids: the target argmax at [root, drafts...] (k + 1 ids, or rows [k + 1, V])."""
    target = _as_ids(target_token_ids)
    _check_rows(len(target), len(draft_token_ids) + 1, "target rows", "1 + number of drafts")
    num_accepted = 0
    while num_accepted < len(draft_token_ids) and (
        draft_token_ids[num_accepted] == target[num_accepted]
    ):
        num_accepted += 1
    tokens = (*draft_token_ids[:num_accepted], target[num_accepted])
    return VerifyResult(tuple(int(t) for t in tokens), tuple(range(num_accepted)))


def verify_greedy_tree(
    tree: DraftTree, target_token_ids: Sequence[int] | torch.Tensor
) -> VerifyResult:
    """Longest root-to-node path whose every token equals the target argmax at its parent.

    target_token_ids: the argmax at rows [root, node 0, ...]. Ties between equally long paths
    (repeated sibling tokens) go to the lower node index.
    """
    target = _as_ids(target_token_ids)
    _check_rows(len(target), tree.num_nodes + 1, "target rows", "1 + number of tree nodes")
    depths = tree.depths()
    matched = [False] * tree.num_nodes
    best: int | None = None
    for node, (token_id, parent) in enumerate(zip(tree.token_ids, tree.parent_ids)):
        parent_ok = parent is None or matched[parent]
        matched[node] = parent_ok and token_id == target[0 if parent is None else parent + 1]
        if matched[node] and (best is None or depths[node] > depths[best]):
            best = node
    path = path_to(tree, best)
    next_token = target[0 if best is None else best + 1]
    return VerifyResult((*(tree.token_ids[n] for n in path), int(next_token)), tuple(path))


def verify_sampled_chain(
    target_probs: torch.Tensor,
    draft_token_ids: Sequence[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> VerifyResult:
    """target_probs [k + 1, V]; draft_probs [k, V] or None (deterministic proposer)."""
    num_drafts, device = len(draft_token_ids), target_probs.device
    _check_rows(target_probs.shape[0], num_drafts + 1, "target rows", "1 + number of drafts")
    if draft_probs is not None:
        _check_rows(draft_probs.shape[0], num_drafts, "draft_probs rows", "number of drafts")
        draft_probs = draft_probs[None]
    uniforms = torch.rand((1, num_drafts), generator=generator, device=device)
    noise = exponential_noise((1, target_probs.shape[-1]), generator, device)
    drafts = torch.tensor([list(draft_token_ids)], dtype=torch.long, device=device)
    num_accepted, next_token = chain_verify_batch(
        target_probs[None], drafts, draft_probs, uniforms, noise
    )
    num_accepted, next_token = torch.cat([num_accepted, next_token]).tolist()  # one host sync
    tokens = (*draft_token_ids[:num_accepted], next_token)
    return VerifyResult(tuple(int(t) for t in tokens), tuple(range(num_accepted)))


def verify_sampled_tree(
    tree: DraftTree,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> VerifyResult:
    """target_probs [n + 1, V] over rows [root, nodes...]; draft_probs [n, V] (node i's q) or None."""
    num_nodes, device = tree.num_nodes, target_probs.device
    _check_rows(target_probs.shape[0], num_nodes + 1, "target rows", "1 + number of tree nodes")
    if draft_probs is not None:
        _check_rows(draft_probs.shape[0], num_nodes, "draft_probs rows", "number of tree nodes")
        draft_probs = draft_probs[None]
    uniforms = torch.rand((1, num_nodes), generator=generator, device=device)
    noise = exponential_noise((1, target_probs.shape[-1]), generator, device)
    tokens = torch.tensor([tree.token_ids], dtype=torch.long, device=device)
    last_node, next_token = tree_verify_batch(
        target_probs[None], tree.parent_ids, tokens, draft_probs, uniforms, noise
    )
    last_node, next_token = torch.cat([last_node, next_token]).tolist()  # one host sync
    path = path_to(tree, None if last_node < 0 else last_node)
    return VerifyResult((*(tree.token_ids[n] for n in path), int(next_token)), tuple(path))


def chain_verify_batch(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    noise: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """B independent chains at once, no host sync.

    target_probs [B, k + 1, V]; draft_token_ids [B, k] int64; draft_probs [B, k, V] or None;
    uniforms [B, k] in [0, 1); noise [B, V] Exp(1). Returns (num_accepted [B], next_token [B]).
    """
    batch, num_rows, vocab_size = target_probs.shape
    num_drafts = num_rows - 1
    q = _draft_or_point_mass(draft_probs, draft_token_ids, vocab_size)
    p_draft = target_probs[:, :num_drafts]
    p_x = p_draft.gather(-1, draft_token_ids[..., None]).squeeze(-1)
    q_x = q.gather(-1, draft_token_ids[..., None]).squeeze(-1)
    accepted = uniforms * q_x < p_x  # [B, k]; u < p/q without dividing by q
    num_accepted = accepted.long().cumprod(dim=-1).sum(dim=-1)
    # Row j < k: the residual that replaces a rejected x_j; row k: p_k for the bonus token.
    final_rows = torch.cat([residual(p_draft, q), target_probs[:, num_drafts:]], dim=1)
    final = final_rows[torch.arange(batch, device=target_probs.device), num_accepted]
    return num_accepted, (final / noise).argmax(dim=-1)


def tree_verify_batch(
    target_probs: torch.Tensor,
    parent_ids: Sequence[int | None],
    token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    noise: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """B independent trials over one tree shape (tokens may differ per trial), no host sync.

    target_probs [B, n + 1, V] rows [root, nodes...]; token_ids [B, n]; draft_probs [B, n, V] or
    None; uniforms [B, n]; noise [B, V]. Returns (last accepted node [B], -1 = root; next token).
    Visiting nodes in index order visits each trial's tree in its own order: nodes are
    topological and siblings ordered, and a trial only tries the children of its current node.
    """
    vocab_size = target_probs.shape[-1]
    q = _draft_or_point_mass(draft_probs, token_ids, vocab_size)
    current = torch.full((token_ids.shape[0],), -1, dtype=torch.long, device=token_ids.device)
    r = target_probs[:, 0]
    for node, parent in enumerate(parent_ids):
        tried = current == (-1 if parent is None else parent)
        x = token_ids[:, node : node + 1]
        r_x = r.gather(-1, x).squeeze(-1)
        q_x = q[:, node].gather(-1, x).squeeze(-1)
        accept = tried & (uniforms[:, node] * q_x < r_x)
        reject = tried & ~accept
        r = torch.where(reject[:, None], residual(r, q[:, node]), r)
        r = torch.where(accept[:, None], target_probs[:, node + 1], r)
        current = torch.where(accept, node, current)
    return current, (r / noise).argmax(dim=-1)


def _draft_or_point_mass(
    draft_probs: torch.Tensor | None, token_ids: torch.Tensor, vocab_size: int
) -> torch.Tensor:
    """q rows [B, k, V]: the draft distributions, or one-hot rows for a deterministic proposer."""
    if draft_probs is not None:
        return draft_probs.float()
    return torch.nn.functional.one_hot(token_ids, vocab_size).float()


def _as_ids(token_ids: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(token_ids, torch.Tensor):
        return (token_ids.argmax(dim=-1) if token_ids.dim() == 2 else token_ids).tolist()
    return list(token_ids)


def _check_rows(got: int, expected: int, what: str, rule: str) -> None:
    if got != expected:
        raise ValueError(f"{what}: expected {expected} ({rule}), got {got}")
