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

Randomness: each call draws k + 1 uniforms (float64) from the request's generator in one call:
u_0..u_{k-1} for the drafts / nodes in index order, u_k for the final token, which is drawn from
its distribution by inverse CDF (kernels.sampling.inverse_cdf). The batched cores take the
uniforms as a tensor, so tests can run thousands of trials at once through the same maths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.speculation.tree import DraftTree, path_to, visible_rows
from kernels.sampling import inverse_cdf


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
    uniforms = _draw_uniforms(num_drafts + 1, generator, device)
    drafts = torch.tensor([list(draft_token_ids)], dtype=torch.long, device=device)
    num_accepted, next_token = chain_verify_batch(target_probs[None], drafts, draft_probs, uniforms)
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
    uniforms = _draw_uniforms(num_nodes + 1, generator, device)
    tokens = torch.tensor([tree.token_ids], dtype=torch.long, device=device)
    last_node, next_token = tree_verify_batch(
        target_probs[None], tree.parent_ids, tokens, draft_probs, uniforms
    )
    last_node, next_token = torch.cat([last_node, next_token]).tolist()  # one host sync
    path = path_to(tree, None if last_node < 0 else last_node)
    return VerifyResult((*(tree.token_ids[n] for n in path), int(next_token)), tuple(path))


def chain_verify_batch(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """B independent chains at once, no host sync.

    target_probs [B, k + 1, V]; draft_token_ids [B, k] int64; draft_probs [B, k, V] or None;
    uniforms [B, k + 1] in [0, 1). Returns (num_accepted [B], next_token [B]).
    """
    batch, num_rows, vocab_size = target_probs.shape
    num_drafts, rows = num_rows - 1, torch.arange(batch, device=target_probs.device)
    if num_drafts == 0:
        return rows * 0, inverse_cdf(target_probs[:, 0], uniforms[:, 0])
    x = draft_token_ids[..., None]
    p_x = target_probs[:, :num_drafts].gather(-1, x).squeeze(-1)
    q_x = 1.0 if draft_probs is None else draft_probs.gather(-1, x).squeeze(-1)
    accepted = uniforms[:, :num_drafts] * q_x < p_x  # [B, k]; u < p/q without dividing by q
    num_accepted = accepted.long().cumprod(dim=-1).sum(dim=-1)
    # The final token comes from p_k (bonus) or from the residual at the first rejection.
    final = target_probs[rows, num_accepted]
    rejected_at = num_accepted.clamp(max=num_drafts - 1)
    if draft_probs is None:
        q_rejected = _one_hot(draft_token_ids[rows, rejected_at], vocab_size)
    else:
        q_rejected = draft_probs[rows, rejected_at].float()
    final = torch.where((num_accepted < num_drafts)[:, None], residual(final, q_rejected), final)
    return num_accepted, inverse_cdf(final, uniforms[:, num_drafts])


def tree_verify_batch(
    target_probs: torch.Tensor,
    parent_ids: Sequence[int | None],
    token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """B independent trials over one tree shape (tokens may differ per trial), no host sync.

    target_probs [B, n + 1, V] rows [root, nodes...], normalised; token_ids [B, n];
    draft_probs [B, n, V] or None; uniforms [B, n + 1]. Returns (last accepted node [B],
    -1 = root; next token [B]). Visiting nodes in index order visits each trial's tree in its
    own order: nodes are topological and siblings ordered, and a trial only tries the
    children of its current node.
    """
    if draft_probs is None:
        return _tree_point_masses(target_probs, parent_ids, token_ids, uniforms)
    current = torch.full((token_ids.shape[0],), -1, dtype=torch.long, device=token_ids.device)
    r = target_probs[:, 0]
    for node, parent in enumerate(parent_ids):
        tried = current == (-1 if parent is None else parent)
        x = token_ids[:, node : node + 1]
        r_x = r.gather(-1, x).squeeze(-1)
        q = draft_probs[:, node].float()
        accept = tried & (uniforms[:, node] * q.gather(-1, x).squeeze(-1) < r_x)
        r = torch.where((tried & ~accept)[:, None], residual(r, q), r)
        r = torch.where(accept[:, None], target_probs[:, node + 1], r)
        current = torch.where(accept, node, current)
    return current, inverse_cdf(r, uniforms[:, len(parent_ids)])


def _tree_point_masses(
    target_probs: torch.Tensor,
    parent_ids: Sequence[int | None],
    token_ids: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The q = None case without a vocabulary-sized op per node.

    With point masses the residual at the current node is its row p with the rejected sibling
    tokens S removed, so r(c) = p(c) / (1 - p(S)) for c not in S and 0 for a repeated token.
    Only p(S) is tracked per trial; the final row is built once, when every child of the last
    accepted node has been rejected (or it has none).
    """
    batch, num_nodes = token_ids.shape
    device, rows = token_ids.device, torch.arange(batch, device=token_ids.device)
    parent_list = [-1 if p is None else p for p in parent_ids]
    parents = torch.tensor(parent_list, dtype=torch.long, device=device)
    p_token = target_probs[rows[:, None], parents[None, :] + 1, token_ids]  # [B, n] p(c) at parent
    earlier_sibling = (parents[None, :] == parents[:, None]).tril(diagonal=-1)  # [n, n] j < i
    same_token = token_ids[:, :, None] == token_ids[:, None, :]
    repeated = (same_token & earlier_sibling).any(dim=-1)  # [B, n]
    current = torch.full((batch,), -1, dtype=torch.long, device=device)
    removed = torch.zeros(batch, dtype=torch.float64, device=device)  # p(S) at the current node
    for node, parent in enumerate(parent_list):
        fresh = (current == parent) & ~repeated[:, node]
        accept = fresh & (uniforms[:, node] * (1 - removed) < p_token[:, node])
        removed = torch.where(fresh & ~accept, removed + p_token[:, node], removed)
        removed = torch.where(accept, 0.0, removed)
        current = torch.where(accept, node, current)
    is_child = (parents[None, :] == current[:, None]).to(target_probs.dtype)  # [B, n]
    rejected = torch.zeros_like(target_probs[:, 0]).scatter_add_(-1, token_ids, is_child)
    final = residual(target_probs[rows, current + 1], rejected.clamp(max=1))
    return current, inverse_cdf(final, uniforms[:, num_nodes])


def _one_hot(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(token_ids, vocab_size).float()


def _draw_uniforms(
    count: int, generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    return torch.rand((1, count), dtype=torch.float64, generator=generator, device=device)


def _as_ids(token_ids: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(token_ids, torch.Tensor):
        return (token_ids.argmax(dim=-1) if token_ids.dim() == 2 else token_ids).tolist()
    return list(token_ids)


def _check_rows(got: int, expected: int, what: str, rule: str) -> None:
    if got != expected:
        raise ValueError(f"{what}: expected {expected} ({rule}), got {got}")
